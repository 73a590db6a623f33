"""Decode once: an on-disk .npz cache of decoded arrays plus an in-process memo.

Disk cache: ``$RAYSIM_CACHE_DIR/datasets/<name>-<hash>.npz`` (default
``~/.cache/raysim``).  The hash covers a format version, the dataset name,
layout, image_size and every source file's absolute path, size and mtime, so
editing or replacing a source file invalidates the entry.  Entries are written
to a temporary file and moved into place with ``os.replace``, so a killed
process never leaves a half-written cache file; an unreadable entry is treated
as a miss and rebuilt.  Files are uncompressed .npz (loading CIFAR-10 takes a
fraction of a second).

Memo: one ArrayDataset per (name, root, image_size) per process.  Its arrays
are marked read-only because every caller shares them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

from raysim.data.arrays import ArrayDataset
from raysim.data.source import Source

FORMAT_VERSION = 1
log = logging.getLogger("raysim.data")

_MEMO: dict[tuple, ArrayDataset] = {}


def cache_root() -> Path:
    """raysim's disk caches: $RAYSIM_CACHE_DIR, default ~/.cache/raysim."""
    return Path(os.environ.get("RAYSIM_CACHE_DIR") or os.path.join("~", ".cache", "raysim")).expanduser()


def cache_dir() -> Path:
    return cache_root() / "datasets"


def fingerprint(name: str, source: Source, image_size: int | None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT_VERSION, name, source.layout, image_size]).encode())
    for f in source.files:
        st = os.stat(f)
        h.update(f"\0{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def freeze(ds: ArrayDataset) -> ArrayDataset:
    for field in ("train_x", "train_y", "test_x", "test_y", "train_domain", "test_domain"):
        a = getattr(ds, field)
        if a is not None:
            a.flags.writeable = False
    return ds


def _save(path: Path, ds: ArrayDataset) -> None:
    arrays = {
        "name": np.array(ds.name),
        "classes": np.array(ds.classes, dtype=str),
        "train_x": ds.train_x,
        "train_y": ds.train_y,
        "test_x": ds.test_x,
        "test_y": ds.test_y,
    }
    if ds.domains is not None:
        arrays.update(domains=np.array(ds.domains, dtype=str), train_domain=ds.train_domain, test_domain=ds.test_domain)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _load(path: Path) -> ArrayDataset:
    with np.load(path, allow_pickle=False) as z:
        domains = [str(d) for d in z["domains"]] if "domains" in z.files else None
        return ArrayDataset(
            name=str(z["name"]),
            classes=[str(c) for c in z["classes"]],
            train_x=z["train_x"],
            train_y=z["train_y"],
            test_x=z["test_x"],
            test_y=z["test_y"],
            domains=domains,
            train_domain=z["train_domain"] if domains is not None else None,
            test_domain=z["test_domain"] if domains is not None else None,
        )


def get_or_build(name: str, source: Source, image_size: int | None) -> ArrayDataset:
    """The dataset from the disk cache, or built from source and then cached."""
    path = cache_dir() / f"{name}-{fingerprint(name, source, image_size)}.npz"
    if path.is_file():
        try:
            t = time.perf_counter()
            ds = _load(path)
            log.debug("loaded %s from cache %s in %.2fs", name, path, time.perf_counter() - t)
            return ds
        except Exception as exc:  # noqa: BLE001 - corrupt/foreign file: rebuild it
            log.warning("ignoring unreadable dataset cache %s (%s); rebuilding", path, exc)
    t = time.perf_counter()
    log.info("decoding %s from %s (%s layout); cached afterwards in %s", name, source.where, source.layout, path.parent)
    ds = source.build()
    log.info("decoded %s in %.1fs", name, time.perf_counter() - t)
    try:
        _save(path, ds)
    except OSError as exc:
        warnings.warn(
            f"raysim: could not write dataset cache {path} ({exc}); set RAYSIM_CACHE_DIR to a writable folder"
        )
    return ds


def memo_get(key: tuple) -> ArrayDataset | None:
    return _MEMO.get(key)


def memo_put(key: tuple, ds: ArrayDataset) -> ArrayDataset:
    _MEMO[key] = freeze(ds)
    return ds


def clear_memory_cache() -> None:
    """Forget datasets memoised in this process (the disk cache is kept)."""
    _MEMO.clear()
