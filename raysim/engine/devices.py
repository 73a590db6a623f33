"""Honest device choice: CUDA only when the actor was given a GPU and torch can see one."""

from __future__ import annotations

import logging
import warnings

import torch

log = logging.getLogger("raysim")


def pick_device(gpus: float) -> torch.device:
    if gpus > 0:
        if torch.cuda.is_available():
            return torch.device("cuda")
        log.warning("a GPU share was requested but torch sees no CUDA device: training on the CPU")
    return torch.device("cpu")


def configure_torch(cpus: float, device: torch.device, deterministic: bool) -> int:
    """One torch thread per reserved CPU (fractional CPUs get one thread); returns the thread count."""
    threads = max(1, int(cpus))
    torch.set_num_threads(threads)
    # Object-store arrays are read-only; raysim only ever copies out of them.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    if device.type == "cuda" and deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return threads
