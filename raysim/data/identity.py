"""A dataset's identity: what was read, as a digest of the decoded arrays with their shape.

A run records it at its start (run directory's data.json); a resume, or a table whose runs exist,
compares it with the data at hand and refuses a difference in one line naming both, so that one
run never mixes two datasets. The digest covers the decoded images and labels (train and test,
and domains), not the files: the same images and labels in the same order, moved to another folder or
another layout, are the same identity (Fashion-MNIST read from its official IDX archives and from the
Parquet copy here give one digest), while dataset.root changes no number.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raysim.data.arrays import ArrayDataset
from raysim.errors import RaysimError


def array_digest(*arrays: np.ndarray, size: int = 16) -> str:
    """SHA-256 (hex, first `size` bytes) of the arrays' shapes, dtypes and bytes, in order."""
    h = hashlib.sha256()
    for array in arrays:
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return h.hexdigest()[: 2 * size]


@dataclass(frozen=True)
class DataIdentity:
    name: str  # dataset.name as the run gave it
    digest: str
    train: int
    test: int
    image_size: int
    channels: int
    classes: int

    def describe(self) -> str:
        return (
            f"{self.name}, {self.train:,}/{self.test:,} images of {self.image_size}x{self.image_size}x{self.channels}, "
            f"{self.classes} classes, digest {self.digest[:12]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> DataIdentity:
        """Read back a recorded identity; one line if it is not one raysim wrote."""
        fields = {name: (str if name in ("name", "digest") else int) for name in cls.__dataclass_fields__}
        ok = isinstance(data, dict) and all(
            isinstance(data.get(k), t) and not isinstance(data.get(k), bool) for k, t in fields.items()
        )
        if not ok:
            raise RaysimError(
                f"{where} is not a data record raysim wrote: remove it to record the data at hand on the next resume"
            )
        return cls(**{k: data[k] for k in fields})


_DIGESTS: weakref.WeakKeyDictionary[ArrayDataset, str] = weakref.WeakKeyDictionary()


def identity_of(dataset: ArrayDataset, name: str) -> DataIdentity:
    """The identity of a dataset read under `name` (its digest computed once per dataset object:
    about 0.15 s for CIFAR-10)."""
    digest = _DIGESTS.get(dataset)
    if digest is None:
        arrays = [dataset.train_x, dataset.train_y, dataset.test_x, dataset.test_y]
        if dataset.domains is not None:
            arrays += [np.array(dataset.domains, dtype=str), dataset.train_domain, dataset.test_domain]
        digest = _DIGESTS[dataset] = array_digest(*arrays)
    train, test = len(dataset.train_y), len(dataset.test_y)
    return DataIdentity(name, digest, train, test, dataset.image_size, dataset.channels, dataset.num_classes)
