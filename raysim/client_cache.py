"""A disk cache of the one-shot client stage: every client's trained model, keyed by everything
that determines it, so that the one-shot methods compared on one setting train the clients once.

The key hashes the training data and partition (`ctx.data_digest`), each client's architecture,
the local-training settings, the seed, the torch version and whether clients train on GPUs (CPU
and CUDA kernels round differently). Entries live in ``$RAYSIM_CACHE_DIR/client_stage/<key>.pt``
(default ``~/.cache/raysim``), hold only tensors and plain containers (they load with
``weights_only=True``, so an entry cannot run code), and are written to a temporary file and
moved into place, so a killed run never leaves half an entry. An unreadable entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.config import Config, client_architectures
from raysim.data.cache import cache_root

FORMAT_VERSION = 1


def cache_dir() -> Path:
    return cache_root() / "client_stage"


def client_stage_key(config: Config, data_digest: str) -> str:
    described = {
        "version": FORMAT_VERSION,
        "data": data_digest,
        "seed": config.seed,
        "architectures": [asdict(a) for a in client_architectures(config)],
        "local": asdict(config.local),
        "torch": torch.__version__,
        "gpu": config.resources.gpus_per_actor > 0,
        "deterministic": config.resources.deterministic,
    }
    if described["gpu"]:  # only on a GPU, so that the keys of CPU runs stay as they were
        described["tf32"] = config.resources.tf32
    return hashlib.blake2b(json.dumps(described, sort_keys=True).encode(), digest_size=16).hexdigest()


def load(key: str) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, int]] | None:
    """(weights per client, samples per client), or None on a miss."""
    path = cache_dir() / f"{key}.pt"
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, weights_only=True)
        weights = {int(k): {name: t.numpy() for name, t in w.items()} for k, w in entry["weights"].items()}
        return weights, {int(k): int(n) for k, n in entry["num_samples"].items()}
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss, rebuilt by the caller
        return None


def save(key: str, weights: dict[int, dict[str, np.ndarray]], num_samples: dict[int, int]) -> None:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {
        "weights": {int(k): {name: torch.from_numpy(np.array(a)) for name, a in w.items()} for k, w in weights.items()},
        "num_samples": {int(k): int(n) for k, n in num_samples.items()},
    }
    tmp = folder / f".{key}.{uuid.uuid4().hex}.tmp"
    torch.save(entry, tmp)
    os.replace(tmp, folder / f"{key}.pt")
