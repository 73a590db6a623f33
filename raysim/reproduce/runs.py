"""Running a table: one ordinary run directory per (cell, method, seed), finished ones skipped,
unfinished ones resumed, side by side when the Ray cluster has room for more than one."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raysim.config import Config
from raysim.errors import RaysimError, user_message
from raysim.outputs.run_dir import RunDir
from raysim.reproduce.table_file import Table


@dataclass
class PlannedRun:
    cell: str
    method: str
    seed: int
    config: Config
    run_dir: RunDir

    @property
    def name(self) -> str:
        return f"{self.cell}/{self.method}/s{self.seed}"


def plan_runs(
    table: Table,
    scale: str,
    seeds: list[int],
    cells: list[str],
    methods: list[str],
    out: Path,
    data_root: str | Path | None,
) -> list[PlannedRun]:
    """Every run of the selection, its config built and validated now (before anything runs)."""
    runs = []
    for cell in cells:
        for method in methods:
            for seed in seeds:
                tree = table.config_tree(cell, method, scale, seed, data_root)
                dataset = tree.get("dataset") or {}
                if dataset.get("name", "embedded") != "embedded" and not dataset.get("root"):
                    raise RaysimError(
                        f"table {table.name}, cell {cell} reads {dataset['name']}: give --data-root DIR, the "
                        f"folder holding {dataset['name']}/ (or set RAYSIM_DATA)"
                    )
                try:
                    config = table.config(cell, method, scale, seed, data_root)
                except RaysimError as exc:
                    raise RaysimError(f"table {table.name}, cell {cell}, method {method}: {exc}") from None
                runs.append(PlannedRun(cell, method, seed, config, RunDir(out / cell / method / f"s{seed}")))
    return runs


def run_state(run: PlannedRun) -> str:
    """'finished', 'unfinished' (started: resumed from its checkpoint) or 'new'. A run directory
    holding another config than the table's is refused in one line (its figures would be mixed in)."""
    if not run.run_dir.holds_run():
        return "new"
    stored = yaml.safe_load(run.run_dir.config_file.read_text()) or {}
    wanted = run.config.to_dict()
    differing = sorted(
        key for key in set(stored) | set(wanted) if key != "resources" and stored.get(key) != wanted.get(key)
    )
    if differing:
        raise RaysimError(
            f"'{run.run_dir}' holds a run of another config than the table's (differs in {', '.join(differing)}): "
            "remove that folder, or give another --out"
        )
    summary = run.run_dir.read_summary()
    return "finished" if summary.get("finished") else "unfinished"


def slots(runs: list[PlannedRun]) -> int:
    """How many runs fit on the Ray cluster at once (each with its config's actors and GPU shares)."""
    import ray

    total = ray.cluster_resources()
    fits = []
    for run in runs:
        res = run.config.resources
        if res.actors is None or res.in_process:  # auto takes what is there; in-process runs in this process
            return 1
        cpus = res.actors * res.cpus_per_actor
        gpus = res.actors * res.gpus_per_actor + res.server_gpus
        fit = int(total.get("CPU", 0) // cpus) if cpus else len(runs)
        if gpus:
            fit = min(fit, int(total.get("GPU", 0) // gpus))
        fits.append(fit)
    return max(1, min(fits or [1]))


class TableProgress:
    """One line per run over the whole table: which run, how it ended, time spent and left."""

    def __init__(self, total: int, parallel: int, stream=sys.stderr):
        self.total, self.parallel, self.stream = total, parallel, stream
        self.done, self.started = 0, time.perf_counter()
        self.run_seconds: list[float] = []
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        with self.lock:
            print(text, file=self.stream, flush=True)

    def finished(self, run: PlannedRun, what: str, seconds: float | None = None) -> None:
        with self.lock:
            self.done += 1
            if seconds is not None:
                self.run_seconds.append(seconds)
            left = self.total - self.done
            elapsed = (time.perf_counter() - self.started) / 60
            estimate = ""
            if self.run_seconds and left:
                per_run = sum(self.run_seconds) / len(self.run_seconds) / 60
                estimate = f", about {per_run * left / self.parallel:.1f} min left"
            print(
                f"[{self.done}/{self.total}] {run.name}: {what} ({elapsed:.1f} min so far{estimate})",
                file=self.stream,
                flush=True,
            )


def execute(
    runs: list[PlannedRun], address: str | None, parallel: int | None, bars: bool = True
) -> list[tuple[PlannedRun, str]]:
    """Run what is not finished; returns the runs that failed, each with its one-line error."""
    from raysim.engine.ray_session import ray_session

    states = {run.name: run_state(run) for run in runs}
    todo = [run for run in runs if states[run.name] != "finished"]
    skipped = len(runs) - len(todo)
    if skipped:
        print(f"{skipped} of {len(runs)} runs finished already: skipped", file=sys.stderr)
    if not todo:
        return []
    failures: list[tuple[PlannedRun, str]] = []
    with ray_session(todo[0].config.resources, address):
        width = parallel or slots(todo)
        progress = TableProgress(len(todo), width)
        if width > 1:
            progress.line(f"{len(todo)} runs, {width} side by side")
        one = _runner(states, progress, failures, bars and width == 1)
        if width == 1:
            for run in todo:
                one(run)
        else:
            with ThreadPoolExecutor(max_workers=width) as pool:
                list(pool.map(one, todo))
    return failures


def _runner(states: dict[str, str], progress: TableProgress, failures: list, bar: bool) -> Callable[[PlannedRun], None]:
    from raysim.runner import ProgressBar, new_run_dir, resume_config, run_experiment

    def one(run: PlannedRun) -> None:
        t0 = time.perf_counter()
        callbacks: list[Any] = []
        progress_bar = ProgressBar(run.name) if bar else None
        if progress_bar is not None:
            callbacks.append(progress_bar)
        try:
            if states[run.name] == "unfinished":
                config = resume_config(run.run_dir)
                summary = run_experiment(config, run.run_dir, callbacks=callbacks)
                how = "resumed, "
            else:
                run.run_dir.path.parent.mkdir(parents=True, exist_ok=True)
                run_dir = new_run_dir(run.config, str(run.run_dir))
                summary = run_experiment(run.config, run_dir, callbacks=callbacks)
                how = ""
        except RaysimError as exc:
            failures.append((run, user_message(exc)))
            progress.finished(run, f"failed: {user_message(exc)}")
            return
        finally:
            if progress_bar is not None:
                progress_bar.close()
        accuracy = summary.get("final_accuracy")
        shown = f"final accuracy {accuracy:.4f}" if accuracy is not None else "no accuracy"
        seconds = time.perf_counter() - t0
        progress.finished(run, f"{how}{shown}, {seconds / 60:.1f} min", seconds)

    return one
