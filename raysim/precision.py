"""`resources.precision`: the dtype the hot loops compute in, set once per process (each actor's and the
server's, from its config, in raysim.engine.devices.configure_torch).

float32 (the default) changes nothing. bfloat16 runs the models' forward passes - and so their
backward - under torch.autocast in local training, condensation (DM embeddings), DynaFed's unrolled
trajectory steps, and the one-shot methods' generator and student steps, on CUDA and on CPUs (where
PyTorch computes bfloat16 products in float32 if the CPU lacks bfloat16 instructions: slower, not
wrong). Parameters, optimiser states, losses (autocast keeps them in float32), the condensed and
synthetic images, and evaluation stay in float32, so the reported accuracies are measured the same
way at either precision. Results are still the same across actor counts and, on CUDA with
`resources.deterministic`, across runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}
_dtype: torch.dtype | None = None


def set_precision(name: str) -> None:
    _set(PRECISIONS[name])


@contextmanager
def kept() -> Iterator[None]:
    """The process's precision as it was before the block (an in-process run sets its own)."""
    before = _dtype
    try:
        yield
    finally:
        _set(before)


def _set(dtype: torch.dtype | None) -> None:
    global _dtype
    _dtype = dtype


def enabled() -> bool:
    return _dtype is not None


def autocast(device: torch.device | str) -> AbstractContextManager:
    """The hot loops' forward passes: autocast to the process's precision (a no-op at float32)."""
    if _dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=_dtype)
