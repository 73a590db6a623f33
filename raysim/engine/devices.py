"""Honest device choice: CUDA only when the actor was given a GPU and torch can see one."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING

import torch

from raysim.compiled import set_compile
from raysim.precision import set_precision

try:
    import resource
except ImportError:  # Windows: no peak resident set
    resource = None

if TYPE_CHECKING:
    from raysim.config import ResourcesConfig

log = logging.getLogger("raysim")


def pick_device(gpus: float) -> torch.device:
    if gpus > 0:
        if torch.cuda.is_available():
            return torch.device("cuda")
        log.warning("a GPU share was requested but torch sees no CUDA device: training on the CPU")
    return torch.device("cpu")


def configure_torch(cpus: float, device: torch.device, resources: ResourcesConfig) -> int:
    """One torch thread per reserved CPU (fractional CPUs get one thread); returns the thread count.
    From `resources`: on CUDA the kernels' determinism (`deterministic`) and whether convolutions run
    in TF32 (`tf32`, PyTorch's default); the hot loops' autocast dtype (`precision`, raysim.precision)
    and whether their models are compiled (`compile`, raysim.compiled), for this process."""

    set_precision(resources.precision)
    set_compile(resources.compile)
    threads = max(1, int(cpus))
    torch.set_num_threads(threads)
    # Object-store arrays are read-only; raysim only ever copies out of them.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = resources.tf32
    if device.type == "cuda" and resources.deterministic:
        # Same numbers on every run and any number of actors: deterministic cuDNN and cuBLAS
        # kernels, and PyTorch's deterministic variants of the ops that add with atomics (gathers'
        # and index_add's backward). The two ops without such a variant that raysim uses take the
        # routes in raysim.resample. cuBLAS reads its workspace setting when its first handle is
        # made, so it is set here, before the process's first matrix product on the GPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    return threads


# Whether this process's peak so far covers its current run only: false once a kept actor
# (raysim.engine.actor_pool) is given another run on a platform whose peak cannot be reset.
_peak_is_this_runs = True


def reset_peak_memory(device: torch.device) -> None:
    """Start this process's peak memory afresh, for a kept actor's next run: on CUDA the allocator's
    peak; on Linux the peak resident set (`/proc/self/clear_refs`, 5). Elsewhere the peak cannot be
    reset and `peak_memory_mb` says None from now on rather than an earlier run's peak."""
    global _peak_is_this_runs
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        _peak_is_this_runs = False


def peak_memory_mb(device: torch.device) -> float | None:
    """This process's peak memory since its run began, in MiB: on CUDA the most the caching
    allocator held for tensors, on a CPU the peak resident set (the whole process: Python, Ray
    worker, data, tensors). None where the platform does not say (no `resource` module), or where
    the process ran another run before and its peak could not be reset (`reset_peak_memory`)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if not _peak_is_this_runs:
        return None
    try:  # Linux: VmHWM, which reset_peak_memory resets (ru_maxrss is never reset)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except OSError:
        pass
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # macOS: bytes; Linux: KiB
