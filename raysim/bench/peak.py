"""The multiply-accumulates per second a device reaches at a thread count: the yardstick `raysim bench
cell` holds each phase's achieved rate against (its share of the peak).

Two rates, each from the fastest of a few timed blocks after a warm-up (the fastest, not the mean:
a peak is what the hardware can do, and on a shared machine the slower blocks measure the other
processes; the blocks are long enough, MIN_BLOCK_S, for the clock's resolution not to matter):
- the peak: a large square float32 matrix product (BIG_SIZE; larger on a GPU, which a product of
  1024 does not fill), about the best any kernel reaches;
- the small-batch rate: the product of a batch of 64 flattened 28x28 images with a 784x200 weight
  matrix (SMALL_SHAPE), representative of an MLP's first layer at batch 64. A model's own layers are
  as small as they are, so this shows how far what small kernels reach lies below the peak.

A rate is measured with `threads` torch threads (set for the measurement, restored after it), in
`dtype` (float32 by default; bfloat16 for runs at resources.precision=bfloat16, whose hot loops
compute in it), on `device`; on CUDA the device is synchronised before a block's clock starts and
before it stops, as kernels run asynchronously. A CUDA device torch cannot see here gives None:
the rate is not measured rather than measured on another device.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

BIG_SIZE = {"cpu": 1024, "cuda": 4096}  # n of the n x n @ n x n product, per device type
SMALL_SHAPE = (64, 784, 200)  # (batch, inputs, outputs): the MLP's first layer at batch 64
MIN_BLOCK_S = 0.02  # each timed block runs enough products to last at least this long
BLOCKS = 5  # timed blocks after the warm-up; the rate is the fastest's


@dataclass(frozen=True)
class Peak:
    """The rates (GMAC/s) one process reaches on `device` with `threads` torch threads."""

    device: str
    threads: int
    dtype: str
    big_gmacs: float  # the BIG_SIZE square product
    small_gmacs: float  # the SMALL_SHAPE product


def measure_peak(device: torch.device | str, threads: int, dtype: torch.dtype = torch.float32) -> Peak | None:
    """Both rates on `device` with `threads` torch threads; None where `device` is a CUDA device this
    process cannot see."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return None
    size = BIG_SIZE.get(device.type, BIG_SIZE["cpu"])
    with torch_threads(threads):
        big = matmul_gmacs(size, size, size, device, dtype)
        small = matmul_gmacs(*SMALL_SHAPE, device, dtype)
    return Peak(str(device), threads, str(dtype).removeprefix("torch."), big, small)


def matmul_gmacs(m: int, k: int, n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """GMAC/s of an (m x k) @ (k x n) product (m * k * n multiply-accumulates each) on `device`, at
    the process's current thread count: the fastest of BLOCKS timed blocks after a warm-up."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=generator).to(device=device, dtype=dtype)
    _timed_products(a, b, 1, device)  # warm-up: the kernels' set-up and caches
    per_block = math.ceil(MIN_BLOCK_S / max(_timed_products(a, b, 1, device), 1e-7))
    fastest = min(_timed_products(a, b, per_block, device) for _ in range(BLOCKS)) / per_block
    return m * k * n / fastest / 1e9


def _timed_products(a: torch.Tensor, b: torch.Tensor, count: int, device: torch.device) -> float:
    """Seconds `count` products a @ b take, the device synchronised at both ends."""
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(count):
        torch.mm(a, b)
    _synchronize(device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` (at least 1) inside, the caller's restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
