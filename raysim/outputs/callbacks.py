"""Outputs as callbacks: what the round loop tells the things that record or show a run.

The loop calls, in order: `on_run_start` once (also on a resumed run), `on_round_end` after
every round, `on_run_end` with the summary. The run directory's files (metrics.parquet,
TensorBoard events, checkpoints, summary.json) are callbacks the server runs where it writes;
the progress bar, Tune reporting and benchmarks are callbacks the driver runs on the same
results (without the pictures, which stay on the server).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from raysim.outputs.metrics import MetricsTable
from raysim.outputs.run_dir import RunDir
from raysim.outputs.tensorboard import TensorBoardLogger


@dataclass
class RunStart:
    completed_rounds: int  # > 0 when a run resumes
    rounds: int  # planned
    actors: list = field(default_factory=list)  # client actor handles (driver side only)


@dataclass
class RoundResult:
    round: int
    values: dict[str, float]  # server metrics: accuracy, loss, bytes, times, ...
    client_values: list[tuple[int, str, float]]  # (client, metric, value)
    images: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def without_pictures(self) -> RoundResult:
        return replace(self, images={}, figures={})


class Callback:
    def on_run_start(self, start: RunStart) -> None:
        pass

    def on_round_end(self, result: RoundResult) -> None:
        pass

    def on_run_end(self, summary: dict[str, Any]) -> None:
        pass


class MetricsFile(Callback):
    """metrics.parquet, rewritten after every round (see raysim.outputs.metrics)."""

    def __init__(self, path: Path, completed_rounds: int):

        self.table = MetricsTable(path, resume_through_round=completed_rounds)

    def on_round_end(self, result: RoundResult) -> None:
        for client, name, value in result.client_values:
            self.table.add(result.round, client, name, value)
        for name, value in result.values.items():
            self.table.add(result.round, None, name, value)
        self.table.flush()


def tensorboard_tag(name: str) -> str:
    if name in ("accuracy", "loss") or name.startswith("domain_accuracy"):
        return "test/" + name
    for prefix, group in (("bytes", "comm/"), ("time", "time/")):
        if name.startswith(prefix):
            return group + name
    return "round/" + name


class TensorBoardFile(Callback):
    """Scalars per round, the algorithm's images and figures, the partition picture once."""

    def __init__(self, directory: Path, completed_rounds: int, partition_figure: Callable[[], Any] | None = None):

        self.logger = TensorBoardLogger(directory, purge_step=completed_rounds + 1)
        if completed_rounds == 0 and partition_figure is not None:
            self.logger.figure("partition", partition_figure())

    def on_round_end(self, result: RoundResult) -> None:
        for tag, (images, per_row) in result.images.items():
            self.logger.image_grid(tag, images, result.round, nrow=per_row)
        for tag, figure in result.figures.items():
            self.logger.figure(tag, figure, result.round)
        self.logger.scalars(result.round, {tensorboard_tag(k): v for k, v in result.values.items()})
        self.logger.flush()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.logger.close()


class CheckpointFile(Callback):
    """checkpoints/last.pt (and the one before it, previous.pt) every `every` rounds and after the last;
    final_model.pt at the end. All load with torch.load(weights_only=True) (raysim.outputs.state_files)."""

    def __init__(
        self,
        run_dir: RunDir,
        every: int,
        rounds: int,
        checkpoint: Callable[[], dict[str, Any]],
        final_weights: Callable[[], Any],
    ):
        self.run_dir, self.every, self.rounds = run_dir, every, rounds
        self.checkpoint, self.final_weights = checkpoint, final_weights

    def on_round_end(self, result: RoundResult) -> None:
        if result.round % self.every == 0 or result.round == self.rounds:
            self.run_dir.write_checkpoint(self.checkpoint())

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.run_dir.write_final_model(self.final_weights())


class SummaryFile(Callback):
    """summary.json after every round (finished: false) and at the end."""

    def __init__(self, run_dir: RunDir, summary: Callable[[bool], dict[str, Any]]):
        self.run_dir, self.summary = run_dir, summary

    def on_round_end(self, result: RoundResult) -> None:
        self.run_dir.write_summary(self.summary(False))

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.run_dir.write_summary(summary)
