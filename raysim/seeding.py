"""Every random draw is a pure function of (seed, purpose, round, client).

That is what makes a run give the same numbers whatever the number of actors,
the order results arrive in, or a resume from a checkpoint.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

# Purposes, so two draws with the same (round, client) never share a stream.
CLIENT_TRAIN = 1
CLIENT_SAMPLING = 2
MODEL_INIT = 3
PARTITION = 4
SERVER = 5
VALIDATION = 6


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed from the run seed and any number of integer/string keys."""
    ints = [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    sequence = np.random.SeedSequence([seed & 0xFFFFFFFF, *ints])
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, *keys))
    return generator
