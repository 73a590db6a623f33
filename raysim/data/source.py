"""A located dataset: which layout, which files (for the cache key), and how to build it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raysim.data.arrays import ArrayDataset


@dataclass(frozen=True)
class Source:
    layout: str  # "parquet", "torchvision", "image_folder", "domainnet", "embedded"
    files: tuple[Path, ...]  # every file the arrays are built from (cache fingerprint)
    build: Callable[[], ArrayDataset]  # decode the files (slow); called on a cache miss only
    where: str = ""  # human-readable origin, for log lines


def one_line(text: object, limit: int = 300) -> str:
    """Collapse an exception message to one short line for a RaysimError."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."
