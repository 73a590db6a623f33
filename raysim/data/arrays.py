"""The in-memory dataset every raysim component consumes: uint8 images + int64 labels."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A train/test image-classification dataset held as numpy arrays.

    Images are uint8 with shape (N, H, W, C), H == W, C = 1 (grey) or 3 (RGB);
    labels are int64 indices into ``classes``.  For domain-skew data
    (DomainNet-style) ``domains`` names the domains and ``train_domain`` /
    ``test_domain`` give each image's domain index (all three set, or none).

    Arrays returned by ``load_dataset`` are read-only: they are shared by the
    in-process memo (and Ray hands out read-only arrays anyway); copy before
    editing in place.  ``eq=False``: datasets compare by identity.
    """

    name: str
    classes: list[str]
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    domains: list[str] | None = None
    train_domain: np.ndarray | None = None
    test_domain: np.ndarray | None = None

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x = getattr(self, f"{split}_x")
            y = getattr(self, f"{split}_y")
            if x.dtype != np.uint8 or x.ndim != 4 or x.shape[3] not in (1, 3):
                raise ValueError(f"{self.name}: {split}_x must be uint8 (N, H, W, 1|3), got {x.dtype} {x.shape}")
            if x.shape[1] != x.shape[2]:
                raise ValueError(f"{self.name}: {split}_x images must be square, got {x.shape[1]}x{x.shape[2]}")
            if y.dtype != np.int64 or y.shape != (x.shape[0],):
                raise ValueError(
                    f"{self.name}: {split}_y must be int64 of shape ({x.shape[0]},), got {y.dtype} {y.shape}"
                )
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError(
                f"{self.name}: train images {self.train_x.shape[1:]} and test images {self.test_x.shape[1:]} differ"
            )
        has_domain = [self.domains is not None, self.train_domain is not None, self.test_domain is not None]
        if any(has_domain) and not all(has_domain):
            raise ValueError(f"{self.name}: set domains, train_domain and test_domain together or not at all")
        if self.domains is not None:
            for split in ("train", "test"):
                d = getattr(self, f"{split}_domain")
                if d.dtype != np.int64 or d.shape != getattr(self, f"{split}_y").shape:
                    raise ValueError(f"{self.name}: {split}_domain must be int64 with one entry per {split} image")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[3])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[1])

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel float32 mean and std of ``train_x / 255`` (shape (C,) each), computed once
        per dataset (its arrays are read-only once loaded: raysim.data.cache.freeze)."""
        if self.train_x.flags.writeable:
            return _mean_std(self.train_x)
        known = _MEAN_STD.get(self)
        if known is None:
            known = _MEAN_STD[self] = _mean_std(self.train_x)
        return known[0].copy(), known[1].copy()


# (mean, std) of each loaded (read-only) dataset: the name check and the normalisation both ask
_MEAN_STD: weakref.WeakKeyDictionary[ArrayDataset, tuple[np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


def _mean_std(train_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = train_x.shape[3]
    flat = train_x.reshape(-1, c)
    total = np.zeros(c, np.float64)
    total_sq = np.zeros(c, np.float64)
    step = 1 << 22  # pixels per chunk: bounded float64 temporaries
    for start in range(0, flat.shape[0], step):
        chunk = flat[start : start + step].astype(np.float64)
        total += chunk.sum(axis=0)
        total_sq += np.square(chunk).sum(axis=0)
    n = max(flat.shape[0], 1)
    mean = total / n
    var = np.maximum(total_sq / n - mean**2, 0.0)
    return (mean / 255.0).astype(np.float32), (np.sqrt(var) / 255.0).astype(np.float32)


def with_validation_split(dataset: ArrayDataset, fraction: float, rng: np.random.Generator) -> ArrayDataset:
    """`dataset` with `fraction` of every class of its training split held out as its test split
    (eval.split: validation): the training images that remain are what clients are partitioned
    over, and the test split proper is not used. Each class keeps at least one training image."""
    held = []
    for label in np.unique(dataset.train_y):
        members = np.flatnonzero(dataset.train_y == label)
        take = min(max(1, round(fraction * len(members))), len(members) - 1)
        held.append(rng.choice(members, size=take, replace=False))
    val = np.sort(np.concatenate(held))
    keep = np.setdiff1d(np.arange(len(dataset.train_y)), val)
    domain = dataset.train_domain
    return ArrayDataset(
        name=dataset.name,
        classes=dataset.classes,
        train_x=dataset.train_x[keep],
        train_y=dataset.train_y[keep],
        test_x=dataset.train_x[val],
        test_y=dataset.train_y[val],
        domains=dataset.domains,
        train_domain=None if domain is None else domain[keep],
        test_domain=None if domain is None else domain[val],
    )
