"""One record per dataset: everything raysim knows about a dataset name, in one entry of `RECORDS`.

A record says what the data are (name, class names, channels and native size), what the name
promises and every load checks (image counts, per-channel mean: raysim.data.known), where
dataset.root may hold them (its layouts, tried in order; the torchvision root's files) and what
`raysim data get` downloads for it (archives, checksums, sizes: raysim.data.catalogue). The
tables the other modules read (DATASET_NAMES, PROMISES, SPECS, ...) are derived from these
entries; adding a dataset is adding one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raysim.data.classnames import CIFAR10, CIFAR100, DIGITS, FASHION_MNIST

# What dataset.root holds, one clause per layout (errors and `raysim datasets`).
FOLDER_HINT = "train/<class>/*.png and test/<class>/*.png"
PARQUET_HINT = "train.parquet/test.parquet (Hugging Face layout)"
DOMAINNET_HINT = "<domain>/train/<class>/*.jpg and <domain>/test/<class>/*.jpg for each domain"

STANDARD_LAYOUTS = ("parquet", "torchvision", "image_folder")

DOMAINNET_DEFAULT_SIZE = 64


@dataclass(frozen=True)
class Promise:
    channels: int
    size: int  # native side in pixels
    classes: int
    train: int  # published image counts: a dataset read under the name holds at most these
    test: int
    mean: tuple[float, ...]  # per-channel mean of the training images / 255 (published values)
    what: str

    def shape_text(self) -> str:
        colour = "grey" if self.channels == 1 else "RGB"
        return f"{self.size}x{self.size} {colour}, {self.classes} classes, {self.train // 1000}k/{self.test // 1000}k"


@dataclass(frozen=True)
class TorchvisionSpec:
    cls: str  # class in torchvision.datasets
    folder: str  # folder under the torchvision root holding the files ("" = the root itself)
    files: tuple[str, ...]  # files torchvision needs, relative to folder
    hint: str  # what to put where, for error messages
    kind: str = "idx"  # how torchvision's class is built and read: idx (MNIST family), cifar or svhn
    classes_from_files: bool = False  # class names from torchvision's meta file, not the record's


@dataclass(frozen=True)
class Archive:
    file: str  # its name in the download folder and in a mirror's <dataset>/ folder
    urls: tuple[str, ...]  # official locations, tried in order
    checksum: str  # "md5:<hex>" or "sha256:<hex>"
    size: int | None = None  # bytes, where published (`raysim data list`; a download reads it from the server)
    unpack: str = "copy"  # copy (as it is), gunzip, tar or zip
    into: str = ""  # folder, under the dataset's, that it is copied or unpacked into


@dataclass(frozen=True)
class Download:
    """What `raysim data get` fetches: `archives` as listed, or, when none are, torchvision's own
    (URLs and MD5s read from its dataset class, the record's `torchvision.cls`)."""

    source: str = ""  # where the URLs and checksums come from (torchvision's: its version, written then)
    archives: tuple[Archive, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of torchvision's archives (it records none)


@dataclass(frozen=True)
class DatasetRecord:
    name: str  # dataset.name
    what: str  # what the data are, in a few words
    classes: tuple[str, ...] | None  # names by label, for layouts that store integer labels only
    channels: int
    size: int | None  # native side in pixels (None: any, resized to default_image_size)
    train: int = 0  # published image counts (the promise: at most these)
    test: int = 0
    mean: tuple[float, ...] = ()  # published per-channel training mean / 255; () : no promise checked
    layouts: tuple[str, ...] = STANDARD_LAYOUTS  # what dataset.root may hold, tried in order
    torchvision: TorchvisionSpec | None = None
    download: Download | None = None  # None: nothing to download
    default_image_size: int | None = None  # dataset.image_size when unset (None: native size)
    root_hint: str = ""  # what dataset.root holds, when not said by its layouts
    note: str = ""  # said after the shape in `raysim datasets`
    summary: str = ""  # the whole of what `raysim datasets` says, when not what + shape + note

    @property
    def promise(self) -> Promise | None:
        """What the name promises (raysim.data.known); None: any data (domainnet)."""
        if not self.mean:
            return None
        assert self.size is not None and self.classes is not None
        return Promise(self.channels, self.size, len(self.classes), self.train, self.test, self.mean, self.what)

    def describe(self) -> str:
        """What it is, for `raysim data list` and errors."""
        if self.summary:
            return self.summary
        promise = self.promise
        assert promise is not None
        return f"{self.what} ({promise.shape_text()}){self.note}"

    def hint(self) -> str:
        """What to put under dataset.root for this dataset, as one clause."""
        if self.root_hint:
            return self.root_hint
        clauses = []
        if "torchvision" in self.layouts and self.torchvision is not None:
            clauses.append(f"{self.torchvision.hint} (torchvision layout)")
        clauses += [hint for layout, hint in _LAYOUT_HINTS if layout in self.layouts]
        return ", or ".join(clauses)


_LAYOUT_HINTS = (("parquet", PARQUET_HINT), ("image_folder", FOLDER_HINT), ("domainnet", DOMAINNET_HINT))

_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# --- DomainNet's download: six domains' zips and their split lists ------------------------------

_DOMAINNET_BASE = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
# (domain, zip path under the base, zip bytes, zip SHA-256, train list SHA-256, test list SHA-256): the
# cleaned release, as tensorflow/datasets@90b6623 records it (image_classification/domainnet/checksums.tsv)
DOMAINNET_RELEASE = (
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


def _domainnet_archives() -> tuple[Archive, ...]:
    archives = []
    for domain, path, size, sha, train_sha, test_sha in DOMAINNET_RELEASE:
        archives.append(Archive(f"{domain}.zip", (_DOMAINNET_BASE + path,), f"sha256:{sha}", size, "zip"))
        for split, digest, split_size in zip(("train", "test"), (train_sha, test_sha), _SPLIT_SIZES[domain]):
            file = f"{domain}_{split}.txt"
            url = f"{_DOMAINNET_BASE}domainnet/txt/{file}"
            archives.append(Archive(file, (url,), f"sha256:{digest}", split_size, "copy", "splits"))
    return tuple(archives)


# --- the records ---------------------------------------------------------------------------------
# Means: the published per-channel training means (the constants the papers' code normalises with).
# Download sizes of torchvision's archives: the servers' Content-Length.

RECORDS: tuple[DatasetRecord, ...] = (
    DatasetRecord(
        "embedded",
        "Fashion-MNIST sample shipped with raysim",
        tuple(FASHION_MNIST),
        channels=1,
        size=28,
        train=10_000,
        test=2_000,
        mean=(0.2860,),
        layouts=("embedded",),  # raysim/data/embedded/{train,test}.parquet: no root, nothing to download
    ),
    DatasetRecord(
        "mnist",
        "MNIST handwritten digits",
        tuple(DIGITS),
        channels=1,
        size=28,
        train=60_000,
        test=10_000,
        mean=(0.1307,),
        torchvision=TorchvisionSpec(
            "MNIST", "MNIST/raw", _IDX, "MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte"
        ),
        download=Download(
            sizes={
                "train-images-idx3-ubyte.gz": 9_912_422,
                "train-labels-idx1-ubyte.gz": 28_881,
                "t10k-images-idx3-ubyte.gz": 1_648_877,
                "t10k-labels-idx1-ubyte.gz": 4_542,
            }
        ),
    ),
    DatasetRecord(
        "fashion_mnist",
        "Fashion-MNIST clothing",
        tuple(FASHION_MNIST),
        channels=1,
        size=28,
        train=60_000,
        test=10_000,
        mean=(0.2860,),
        torchvision=TorchvisionSpec(
            "FashionMNIST", "FashionMNIST/raw", _IDX, "FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte"
        ),
        download=Download(
            sizes={
                "train-images-idx3-ubyte.gz": 26_421_880,
                "train-labels-idx1-ubyte.gz": 29_515,
                "t10k-images-idx3-ubyte.gz": 4_422_102,
                "t10k-labels-idx1-ubyte.gz": 5_148,
            }
        ),
    ),
    DatasetRecord(
        "cifar10",
        "CIFAR-10",
        tuple(CIFAR10),
        channels=3,
        size=32,
        train=50_000,
        test=10_000,
        mean=(0.4914, 0.4822, 0.4465),
        torchvision=TorchvisionSpec(
            "CIFAR10",
            "cifar-10-batches-py",
            tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta"),
            "cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}",
            kind="cifar",
        ),
        download=Download(sizes={"cifar-10-python.tar.gz": 170_498_071}),
    ),
    DatasetRecord(
        "cifar100",
        "CIFAR-100 fine labels",
        tuple(CIFAR100),
        channels=3,
        size=32,
        train=50_000,
        test=10_000,
        mean=(0.5071, 0.4865, 0.4409),
        torchvision=TorchvisionSpec(
            "CIFAR100",
            "cifar-100-python",
            ("train", "test", "meta"),
            "cifar-100-python/{train,test,meta}",
            kind="cifar",
            classes_from_files=True,
        ),
        download=Download(sizes={"cifar-100-python.tar.gz": 169_001_437}),
    ),
    DatasetRecord(
        "svhn",
        "SVHN cropped digits",
        tuple(DIGITS),
        channels=3,
        size=32,
        train=73_257,
        test=26_032,
        mean=(0.4377, 0.4438, 0.4728),
        torchvision=TorchvisionSpec(
            "SVHN", "", ("train_32x32.mat", "test_32x32.mat"), "train_32x32.mat and test_32x32.mat", kind="svhn"
        ),
        # the train and test splits (raysim does not read the 531k 'extra' images)
        download=Download(
            sizes={
                "train_32x32.mat": 182_040_794,  # tensorflow/datasets url_checksums/svhn_cropped.txt
                "test_32x32.mat": 64_275_384,
            }
        ),
    ),
    DatasetRecord(
        "cinic10",
        "CINIC-10",
        tuple(CIFAR10),
        channels=3,
        size=32,
        # CINIC-10's test split is 90,000 images (its valid/ split, used when there is no test/, too)
        train=90_000,
        test=90_000,
        mean=(0.4789, 0.4723, 0.4305),
        layouts=("image_folder", "parquet"),
        root_hint=f"{FOLDER_HINT} (CINIC-10 layout), or {PARQUET_HINT}",
        note=": ImageNet+CIFAR images; valid/ used only if no test/",
        download=Download(
            "URL: BayesWatch/cinic-10 README (doi 10.7488/ds/2448); MD5: the server's ETag, as recorded by open_lth "
            "(devinkwok/open_lth@a3f70be datasets/cinic10.py)",
            (
                Archive(
                    "CINIC-10.tar.gz",
                    ("https://datashare.is.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz",),
                    "md5:6ee4d0c996905fe93221de577967a372",
                    unpack="tar",  # train/, valid/, test/ at its top: raysim's image-folder layout
                ),
            ),
        ),
    ),
    DatasetRecord(
        "domainnet",
        "DomainNet-style domain-skew data",
        None,  # any domains and classes: the folders' names
        channels=3,
        size=None,
        layouts=("domainnet",),
        default_image_size=DOMAINNET_DEFAULT_SIZE,
        summary=(
            f"DomainNet-style domain-skew data (RGB, resized to image_size, default {DOMAINNET_DEFAULT_SIZE}; "
            "one domain per folder)"
        ),
        download=Download(
            "URLs and SHA-256: tensorflow/datasets@90b6623 (domainnet/checksums.tsv), the cleaned release of "
            "Peng et al. 2019; the split lists sort each image into <domain>/train or <domain>/test",
            _domainnet_archives(),
        ),
    ),
)

BY_NAME: dict[str, DatasetRecord] = {r.name: r for r in RECORDS}
DATASET_NAMES = tuple(BY_NAME)


def record(name: str) -> DatasetRecord:
    """The record of a dataset name (normalised, one of DATASET_NAMES)."""
    return BY_NAME[name]


def known_classes(name: str) -> list[str] | None:
    """The class names a dataset's name gives its labels, or None (unknown name, or names from the data)."""
    rec = BY_NAME.get(name)
    return None if rec is None or rec.classes is None else list(rec.classes)
