"""A disk cache of the one-shot client stage: every client's trained model, keyed by everything
that determines it, so that the one-shot methods compared on one setting train the clients once.

The key hashes the training data and partition (`ctx.data_digest`), the normalisation the clients
train with (resolved: the configured or the computed mean and std), the torch and numpy versions,
the torch threads each client trains with (`client_threads`: multi-threaded CPU kernels add in
another order with another count, so 1 and 2 threads give other last digits), and the whole
resolved config except what cannot change the client stage (`NOT_CLIENT_STAGE`, `SCHEDULING`): the
key is derived from the config, not from a hand-kept list of what matters, so a key added to the
config later is in it (a needless miss at worst, never a wrong hit). Of the `algorithm` section
(the server's) only the client stage's own parameters are in it (`CLIENT_STAGE_PARAMS`:
`client_init`), each where it differs from what the stage did before it existed: entries written
before then are still found, and a shared-initialisation entry never serves independent ones (an
entry's shapes cannot tell them apart, so the key must). Entries live in
``$RAYSIM_CACHE_DIR/client_stage/<key>.pt`` (default ``~/.cache/raysim``), hold only tensors and
plain containers (they load with ``weights_only=True``, so an entry cannot run code), and are
written to a temporary file and moved into place, so a killed run never leaves half an entry.
An entry is checked before use (`Expected`: every client, each tensor's name and shape against its
model, finite values, each client's sample count); an unreadable or failing entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.config import Config, client_architectures
from raysim.data.cache import cache_root

FORMAT_VERSION = 3  # 3: the clients' thread count and numpy version in the key

# Config sections the client stage never sees: the server's side and the outputs.
NOT_CLIENT_STAGE = ("algorithm", "rounds", "eval", "output")
# Dataset keys that change no number: where the data lie and whether their name was checked (their
# content is in the data digest).
NOT_THE_DATA = ("root", "verify")
# The algorithm parameters that decide the client stage (every one-shot method's, OneShotParams), each
# with the value that is the behaviour before it existed: at that value it stays out of the key.
CLIENT_STAGE_PARAMS = {"client_init": "shared"}
# Where and on how many processes a run goes: results are equal across these (tested), so they
# stay out; whether clients train on a GPU (CPU and CUDA kernels round differently) stays in, and
# so does the thread count cpus_per_actor gives each client (`client_threads`), not its raw value.
SCHEDULING = (
    "actors",
    "cpus_per_actor",
    "gpus_per_actor",
    "server_gpus",
    "server_threads",
    "num_cpus",
    "num_gpus",
    "object_store_mb",
    "max_restarts",
    "max_task_retries",
    "address",
    "in_process",
)


def cache_dir() -> Path:
    return cache_root() / "client_stage"


def client_threads(config: Config) -> int:
    """The torch threads a client trains with, in an actor and in process alike: the count
    raysim.engine.devices.configure_torch sets from resources.cpus_per_actor (in process,
    raysim.engine.in_process gives the runtime's count to each call)."""
    return max(1, int(config.resources.cpus_per_actor))


def client_stage_key(config: Config, data_digest: str, mean: np.ndarray, std: np.ndarray) -> str:
    """The entry's name: a hash of everything that decides the clients' trained models."""
    whole = config.to_dict()
    tree = {k: v for k, v in whole.items() if k not in NOT_CLIENT_STAGE}
    algorithm = whole["algorithm"]
    stage = {k: algorithm[k] for k, before in CLIENT_STAGE_PARAMS.items() if algorithm.get(k, before) != before}
    if stage:
        tree["algorithm"] = stage
    tree["dataset"] = {k: v for k, v in tree["dataset"].items() if k not in NOT_THE_DATA}
    resources = tree.pop("resources")
    tree["resources"] = {k: v for k, v in resources.items() if k not in SCHEDULING}
    tree["resources"]["gpu"] = resources["gpus_per_actor"] > 0
    tree["resources"]["threads"] = client_threads(config)
    if not tree["resources"]["gpu"]:
        tree["resources"].pop("tf32")  # TF32 is a CUDA setting: CPU clients train the same without it
    described = {
        "version": FORMAT_VERSION,
        "config": tree,
        "architectures": [asdict(a) for a in client_architectures(config)],
        "data": data_digest,
        "mean": np.asarray(mean, dtype=np.float64).round(8).tolist(),
        "std": np.asarray(std, dtype=np.float64).round(8).tolist(),
        "torch": torch.__version__,
        "numpy": np.__version__,  # the seeds (SeedSequence, raysim.seeding) and numpy draws of a client step
    }
    return hashlib.blake2b(json.dumps(described, sort_keys=True).encode(), digest_size=16).hexdigest()


@dataclass
class Expected:
    """What a usable entry holds: each client's tensor shapes (name -> shape) and sample count."""

    shapes: dict[int, dict[str, tuple[int, ...]]]
    num_samples: dict[int, int] | None  # None: not known here, only checked to be positive

    def accepts(self, weights: dict[int, dict[str, np.ndarray]], num_samples: dict[int, int]) -> bool:
        if sorted(weights) != sorted(self.shapes) or sorted(num_samples) != sorted(self.shapes):
            return False
        if self.num_samples is not None and num_samples != self.num_samples:
            return False
        if any(n <= 0 for n in num_samples.values()):
            return False
        for k, tensors in weights.items():
            if {name: tuple(a.shape) for name, a in tensors.items()} != self.shapes[k]:
                return False
            if any(np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all() for a in tensors.values()):
                return False
        return True


def load(key: str, expected: Expected) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, int]] | None:
    """(weights per client, samples per client), or None on a miss: no entry, an unreadable one, or
    one that `expected` does not accept."""
    path = cache_dir() / f"{key}.pt"
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, weights_only=True)
        weights = {int(k): {name: t.numpy() for name, t in w.items()} for k, w in entry["weights"].items()}
        sizes = {int(k): int(n) for k, n in entry["num_samples"].items()}
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss, rebuilt by the caller
        return None
    return (weights, sizes) if expected.accepts(weights, sizes) else None


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
