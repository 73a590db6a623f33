"""`raysim reproduce --list`'s time estimates: a table's recorded minutes per run (on the reference
machine its `minutes` were measured on) scaled to the machine at hand.

The scale factor is a calibration: a fixed small CNN's training steps on one thread, timed here and
compared with the same steps on the reference machine (this project's 2-core CI host, measured once:
REFERENCE_SECONDS). Runs of 2-core configs go side by side where there are more cores. A rough guide,
not a promise: the cost of a table's runs grows with the work, not only with the clock.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from raysim.reproduce.table_file import Table

REFERENCE_SECONDS = 0.12  # calibrate() on the reference 2-core machine, idle (the least of 5), 2026-11-27
REFERENCE_CORES = 2


def calibrate(steps: int = 20) -> float:
    """Seconds for `steps` training steps of a small CNN on one thread (the first step not counted)."""

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 14 * 14, 10)
        )
        x = torch.randn(64, 1, 28, 28, generator=generator)
        y = torch.randint(0, 10, (64,), generator=generator)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = 0.0
        for step in range(steps + 1):
            if step == 1:
                start = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def table_minutes(table: Table, scale: str, runs_per_method: int, speed: float) -> tuple[float | None, int]:
    """(estimated minutes for the table's cells at `scale`, number of cells x methods without a
    recorded figure). `speed` is calibrate() here over REFERENCE_SECONDS. A cell's own minutes at
    `scale` replace the table's there (a cell of a larger model or dataset takes longer)."""
    cells = [c for c in table.cells.values() if scale in c.config]
    if not cells:
        return None, 0
    total, missing = 0.0, 0
    for cell in cells:
        recorded = cell.minutes.get(scale, table.minutes.get(scale, {}))
        for method in table.methods:
            if method in recorded:
                total += recorded[method] * runs_per_method
            else:
                missing += 1
    if scale == "cpu":  # recorded on the reference machine: its speed, and runs side by side on more cores
        side_by_side = max(1, len(os.sched_getaffinity(0)) // REFERENCE_CORES)
        total = total * speed / side_by_side
    return (total if total else None), missing
