"""What `raysim data get` downloads for each dataset, from where, with which checksum, and how each
archive unpacks into a layout raysim reads.

Each dataset's record (raysim.data.records) says what: for MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100
and SVHN the archives, URLs and MD5 checksums are torchvision's own (read from its dataset classes,
so they are written in one place), unpacked into torchvision's layout, which raysim reads without
decoding images (the fastest of its layouts). CINIC-10 and DomainNet, which torchvision does not
ship: the authors' archives, unpacked into image folders; their checksums are the ones their records
list, each with where it comes from.

A mirror (`--mirror URL`, or RAYSIM_DATA_MIRROR) serves every archive as URL/<dataset>/<file>
(mnist and fashion_mnist share file names); the checksums are raysim's, whatever serves them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from raysim.data.records import DATASET_NAMES, Archive, DatasetRecord, record
from raysim.errors import RaysimError

__all__ = ["DOWNLOADABLE", "Archive", "Entry", "entry"]


@dataclass(frozen=True)
class Entry:
    name: str
    archives: tuple[Archive, ...]
    source: str  # where the URLs and checksums come from

    @property
    def size(self) -> int | None:
        sizes = [a.size for a in self.archives]
        return None if None in sizes else sum(sizes)


def _torchvision(rec: DatasetRecord) -> Entry:
    """The archives torchvision's class for the dataset downloads, unpacked into its layout."""
    # lazy: torchvision takes seconds to import, and only a download (raysim data get) needs this
    import torchvision.datasets

    tv = torchvision.datasets
    assert rec.torchvision is not None and rec.download is not None
    name, kind, sizes = rec.name, rec.torchvision.kind, rec.download.sizes
    cls = getattr(tv, rec.torchvision.cls)
    if kind == "idx":
        archives = tuple(
            Archive(
                file,
                tuple(base + file for base in cls.mirrors),
                f"md5:{md5}",
                sizes.get(file),
                "gunzip",
                f"{cls.__name__}/raw",
            )
            for file, md5 in cls.resources
        )
    elif kind == "cifar":
        archives = (Archive(cls.filename, (cls.url,), f"md5:{cls.tgz_md5}", sizes.get(cls.filename), "tar"),)
    else:  # svhn: the train and test splits (raysim does not read the 531k 'extra' images)
        archives = tuple(
            Archive(file, (url,), f"md5:{md5}", sizes.get(file))
            for split, (url, file, md5) in cls.split_list.items()
            if split in ("train", "test")
        )
    return Entry(name, archives, f"torchvision {torchvision.__version__}, torchvision.datasets.{cls.__name__}")


# the datasets with a download in their record (the embedded sample ships with raysim)
DOWNLOADABLE = tuple(name for name in DATASET_NAMES if record(name).download is not None)


@functools.cache
def entry(name: str) -> Entry:
    """The catalogue entry of a dataset raysim can download; one line for any other name."""
    if name not in DOWNLOADABLE:
        raise RaysimError(
            f"raysim cannot download '{name}': choose among {', '.join(DOWNLOADABLE)} "
            "(the embedded sample ships with raysim)"
        )
    rec = record(name)
    assert rec.download is not None
    if rec.download.archives:
        return Entry(name, rec.download.archives, rec.download.source)
    return _torchvision(rec)
