"""What `raysim data get` downloads for each dataset, from where, with which checksum, and how each
archive unpacks into a layout raysim reads.

MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100 and SVHN: the archives, URLs and MD5 checksums are
torchvision's own (read from its dataset classes, so they are written in one place), unpacked into
torchvision's layout, which raysim reads without decoding images (the fastest of its layouts).
CINIC-10 and DomainNet, which torchvision does not ship: the authors' archives, unpacked into
image folders; their checksums are the ones recorded below, each with where it comes from.

A mirror (`--mirror URL`, or RAYSIM_DATA_MIRROR) serves every archive as URL/<dataset>/<file>
(mnist and fashion_mnist share file names); the checksums are raysim's, whatever serves them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from raysim.data.loading import DATASET_NAMES
from raysim.errors import RaysimError


@dataclass(frozen=True)
class Archive:
    file: str  # its name in the download folder and in a mirror's <dataset>/ folder
    urls: tuple[str, ...]  # official locations, tried in order
    checksum: str  # "md5:<hex>" or "sha256:<hex>"
    size: int | None = None  # bytes, where published (`raysim data list`; a download reads it from the server)
    unpack: str = "copy"  # copy (as it is), gunzip, tar or zip
    into: str = ""  # folder, under the dataset's, that it is copied or unpacked into


@dataclass(frozen=True)
class Entry:
    name: str
    archives: tuple[Archive, ...]
    source: str  # where the URLs and checksums come from

    @property
    def size(self) -> int | None:
        sizes = [a.size for a in self.archives]
        return None if None in sizes else sum(sizes)


# Archive sizes in bytes (the servers' Content-Length; torchvision records none).
_SIZES = {
    ("mnist", "train-images-idx3-ubyte.gz"): 9_912_422,
    ("mnist", "train-labels-idx1-ubyte.gz"): 28_881,
    ("mnist", "t10k-images-idx3-ubyte.gz"): 1_648_877,
    ("mnist", "t10k-labels-idx1-ubyte.gz"): 4_542,
    ("fashion_mnist", "train-images-idx3-ubyte.gz"): 26_421_880,
    ("fashion_mnist", "train-labels-idx1-ubyte.gz"): 29_515,
    ("fashion_mnist", "t10k-images-idx3-ubyte.gz"): 4_422_102,
    ("fashion_mnist", "t10k-labels-idx1-ubyte.gz"): 5_148,
    ("cifar10", "cifar-10-python.tar.gz"): 170_498_071,
    ("cifar100", "cifar-100-python.tar.gz"): 169_001_437,
    ("svhn", "train_32x32.mat"): 182_040_794,  # tensorflow/datasets url_checksums/svhn_cropped.txt
    ("svhn", "test_32x32.mat"): 64_275_384,
}


def _torchvision(name: str) -> Entry:
    import torchvision.datasets as tv

    if name in ("mnist", "fashion_mnist"):
        cls = tv.MNIST if name == "mnist" else tv.FashionMNIST
        archives = tuple(
            Archive(
                file,
                tuple(base + file for base in cls.mirrors),
                f"md5:{md5}",
                _SIZES.get((name, file)),
                "gunzip",
                f"{cls.__name__}/raw",
            )
            for file, md5 in cls.resources
        )
    elif name in ("cifar10", "cifar100"):
        cls = tv.CIFAR10 if name == "cifar10" else tv.CIFAR100
        archives = (Archive(cls.filename, (cls.url,), f"md5:{cls.tgz_md5}", _SIZES.get((name, cls.filename)), "tar"),)
    else:  # svhn: the train and test splits (raysim does not read the 531k 'extra' images)
        cls = tv.SVHN
        archives = tuple(
            Archive(file, (url,), f"md5:{md5}", _SIZES.get((name, file)))
            for split, (url, file, md5) in cls.split_list.items()
            if split in ("train", "test")
        )
    import torchvision

    return Entry(name, archives, f"torchvision {torchvision.__version__}, torchvision.datasets.{cls.__name__}")


_CINIC10 = Entry(
    "cinic10",
    (
        Archive(
            "CINIC-10.tar.gz",
            ("https://datashare.is.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz",),
            "md5:6ee4d0c996905fe93221de577967a372",
            unpack="tar",  # train/, valid/, test/ at its top: raysim's image-folder layout
        ),
    ),
    "URL: BayesWatch/cinic-10 README (doi 10.7488/ds/2448); MD5: the server's ETag, as recorded by open_lth "
    "(devinkwok/open_lth@a3f70be datasets/cinic10.py)",
)

_DOMAINNET_BASE = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
# (domain, zip path under the base, zip bytes, zip SHA-256, train list SHA-256, test list SHA-256): the
# cleaned release, as tensorflow/datasets@90b6623 records it (image_classification/domainnet/checksums.tsv)
_DOMAINNET = (
    (
        "clipart",
        "groundtruth/clipart.zip",
        1_270_909_081,
        "f8f248a3e8bbc9868c523ae24e6601b4c2ad102afc60c0efeb4f3255df22354d",
        "affdadf5f95a7583e6b98030a3d35007e2613ee4dd942393c5a705ec2b429312",
        "62c8e36aaba1c41ad9e249099739707220a44c08f167b37ef420f34a31628a6b",
    ),
    (
        "infograph",
        "infograph.zip",
        4_338_659_804,
        "891e14f476317e97b6f06d6498c11d0a5b8d0c8b57210765ed9beb072da611fa",
        "36b44cbd41a2915e0dc73b4f4be8862a6f3c220f93c8d63fb2439beeae3aefda",
        "413cfa54ac92e7e6b242f4f09fbd9c8ace85c4deaf3cb6c81ff6b68264460136",
    ),
    (
        "painting",
        "groundtruth/painting.zip",
        3_679_366_174,
        "fa47e6d405503ea0286cabd767f176bd30e988b63ddd7b9db16cf030c9770015",
        "f1da38d50a702fddf1329f85bc607d7a2abcae7e6aec75e1fd49cc1bd340d47b",
        "11472b13b5188e09f06918b12eebb660588c97a20e43e268d9b02e3e37eb8f97",
    ),
    (
        "quickdraw",
        "quickdraw.zip",
        459_920_701,
        "9f37df2a8c3733703dbb35ad9964202a65f675ca30137756457537536b485d84",
        "3a5edd3bc215772010eebc87f158707703dd7e48091d13b816af81326a9d1c0f",
        "2a00a60650a453c65c356da748fec54084a197272137c440e7d52d08947357bf",
    ),
    (
        "real",
        "real.zip",
        6_062_039_589,
        "d7fe010b430c5b510f85d657d38c4a1924822695fabea4fef57bd00dba251d63",
        "19d483256d24aef19e581b65eda8333fd918aef3eb733fe499ff384120e3a289",
        "2b3f75bcde309aeb5931292084b2162e936b5f189e3bb1ad716f0f74c460864c",
    ),
    (
        "sketch",
        "sketch.zip",
        2_633_992_926,
        "23a7dbae7016b343e934399beaa8a68728fb5e570ebe2c71df9b75cf91c499fc",
        "72f4bc6afa5702a1ccba800d0053c1427de87439dfaf246dbc9a2e71abfec54f",
        "3fb48fca18c507c4321f007c3f62b308ec232ff6928cbfe2af64e76ec366e840",
    ),
)
_SPLIT_SIZES = {  # the split lists' bytes (the same source)
    "clipart": (1_443_819, 628_917),
    "infograph": (1_683_098, 728_028),
    "painting": (2_241_901, 971_888),
    "quickdraw": (5_164_600, 2_213_400),
    "real": (4_440_944, 1_911_327),
    "sketch": (1_960_222, 850_581),
}


def _domainnet() -> Entry:
    archives = []
    for domain, path, size, sha, train_sha, test_sha in _DOMAINNET:
        archives.append(Archive(f"{domain}.zip", (_DOMAINNET_BASE + path,), f"sha256:{sha}", size, "zip"))
        for split, digest, split_size in zip(("train", "test"), (train_sha, test_sha), _SPLIT_SIZES[domain]):
            file = f"{domain}_{split}.txt"
            url = f"{_DOMAINNET_BASE}domainnet/txt/{file}"
            archives.append(Archive(file, (url,), f"sha256:{digest}", split_size, "copy", "splits"))
    return Entry(
        "domainnet",
        tuple(archives),
        "URLs and SHA-256: tensorflow/datasets@90b6623 (domainnet/checksums.tsv), the cleaned release of "
        "Peng et al. 2019; the split lists sort each image into <domain>/train or <domain>/test",
    )


DOWNLOADABLE = tuple(name for name in DATASET_NAMES if name != "embedded")  # the embedded sample ships with raysim


@functools.cache
def entry(name: str) -> Entry:
    """The catalogue entry of a dataset raysim can download; one line for any other name."""
    if name not in DOWNLOADABLE:
        raise RaysimError(
            f"raysim cannot download '{name}': choose among {', '.join(DOWNLOADABLE)} "
            "(the embedded sample ships with raysim)"
        )
    if name == "cinic10":
        return _CINIC10
    if name == "domainnet":
        return _domainnet()
    return _torchvision(name)
