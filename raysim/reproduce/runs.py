"""Running a table: one ordinary run directory per (cell, method, seed), finished ones skipped,
unfinished ones resumed, side by side when the Ray cluster has room for more than one."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raysim.config import NEUTRAL_KEYS, Config, parse_override
from raysim.data.home import dataset_folder, get_hint
from raysim.engine import ray_side
from raysim.errors import RaysimError, first_line, user_message
from raysim.experiment import apply_overrides, config_from_dict
from raysim.outputs.received import named_code
from raysim.outputs.run_dir import RunDir
from raysim.outputs.run_lock import unlock_run_dir
from raysim.outputs.safe_write import real_folder
from raysim.plugins import user_code_refused
from raysim.registry import algorithm_class
from raysim.report import flatten
from raysim.reproduce.table_file import Table
from raysim.results import RunRecord
from raysim.resume import check_data
from raysim.run_format import config_as_made, made_at
from raysim.runner import ProgressBar, failure_message, new_run_dir, read_data, run_experiment


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
    resources: list[str] = (),
    table_only: bool = False,
) -> list[PlannedRun]:
    """Every run of the selection, its config built and validated now (before anything runs).
    `resources` are `resources.key=value` overrides: how the runs use the machine at hand (the
    table decides everything else, so they are the only keys that may change). `table_only`: the
    runs are read, not run, so neither their data nor their inputs (a transfer set) need be here."""

    parsed = []
    for text in resources:
        key_path, value = parse_override(text)
        if key_path[0] != "resources" or len(key_path) < 2:
            raise RaysimError(
                f"'{text}': only resources.* can be set for a table's runs (the table decides the rest; "
                "run one cell with other settings by 'raysim run TABLE:CELL:METHOD key=value')"
            )
        parsed.append((key_path, value))
    runs = []
    for cell in cells:
        for method in methods:
            for seed in seeds:
                tree = apply_overrides(table.config_tree(cell, method, scale, seed, data_root), parsed)
                dataset = tree.get("dataset") or {}
                name = dataset.get("name", "embedded")
                if not table_only and name != "embedded" and not dataset_folder(name, dataset.get("root")).is_dir():
                    raise RaysimError(
                        f"table {table.name}, cell {cell} reads {name} and there is no "
                        f"{dataset_folder(name, dataset.get('root'))}: {get_hint(name)}, or give --data-root DIR, "
                        f"the folder holding {name}/"
                    )
                try:
                    config = config_from_dict(tree)
                    if not table_only:
                        algorithm_class(config.algorithm.name).check_inputs(config)  # a transfer set, say
                except RaysimError as exc:
                    raise RaysimError(f"table {table.name}, cell {cell}, method {method}: {exc}") from None
                runs.append(PlannedRun(cell, method, seed, config, RunDir(out / cell / method / f"s{seed}")))
    return runs


def run_state(run: PlannedRun, data_here: bool = True) -> str:
    """'finished', 'unfinished' (started: resumed from its checkpoint, or extended to more rounds)
    or 'new'. A run directory holding another config than the table's is refused in one line (its
    figures would be mixed in), and, with `data_here`, one made on other data than the data at hand."""
    if not run.run_dir.holds_run():
        return "new"
    try:
        stored = yaml.safe_load(run.run_dir.config_file.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RaysimError(
            f"{run.run_dir.config_file} is not a config raysim wrote ({type(exc).__name__}): "
            "remove that run's folder, or give another --out"
        ) from None
    if not isinstance(stored, dict):
        raise RaysimError(
            f"{run.run_dir.config_file} is not a config raysim wrote: remove that run's folder, or give another --out"
        )

    # Both read through today's schema, the stored one as made (raysim.run_format): a parameter added
    # since the run was made takes the value that run ran, so it makes the run another config only
    # where the table asks for another; a stored config the schema no longer reads is another config.
    # A table's folder may come from someone else: the code its runs name is imported only where the
    # table itself names it (raysim.plugins).
    wanted_tree = run.config.to_dict()
    why = "named by a run in the table's folder, not by the table: this folder may hold another experiment's runs"
    try:
        with user_code_refused(why, vouched=[name for _, name in named_code(run.config)]):
            stored = config_from_dict(config_as_made(stored, made_at(run.run_dir.read_summary()))).to_dict()
    except RaysimError as exc:
        raise RaysimError(
            f"'{run.run_dir}' holds a run of a config this raysim cannot read ({exc}): remove that folder, "
            "or give another --out"
        ) from None
    stored, wanted = flatten(stored), flatten(wanted_tree)
    differing = sorted(k for k in set(stored) | set(wanted) if k not in NEUTRAL_KEYS and stored.get(k) != wanted.get(k))
    shorter = differing == ["rounds"] and isinstance(stored["rounds"], int) and stored["rounds"] < wanted["rounds"]
    if differing and not shorter:
        shown = ", ".join(f"{k}: {stored.get(k)!r} there, {wanted.get(k)!r} here" for k in differing[:3])
        raise RaysimError(
            f"'{run.run_dir}' holds a run of another config than the table's ({shown}"
            f"{', ...' if len(differing) > 3 else ''}): remove that folder, or give another --out"
        )
    if data_here and run.run_dir.read_data() is not None:  # the data at hand are those it ran on (or one line)
        check_data(run.run_dir, read_data(run.config)[1], run.config.dataset.root)
    return "finished" if is_finished(run) else "unfinished"


def is_finished(run: PlannedRun) -> bool:
    """Finished all the rounds the table asks for (a run extended to more rounds is not)."""
    summary = run.run_dir.read_summary()  # its figures checked (RunDir.read_summary)
    return summary.get("finished") is True and summary.get("rounds", 0) >= run.config.rounds


def slots(runs: list[PlannedRun]) -> int:
    """How many runs fit on the Ray cluster at once (each with its config's actors and GPU shares)."""
    if any(run.config.resources.actors is None or run.config.resources.in_process for run in runs):
        return 1  # auto takes what is there; in-process runs in this process
    total = ray_side().cluster_totals()
    fits = []
    for run in runs:
        res = run.config.resources
        cpus = res.actors * res.cpus_per_actor
        gpus = res.actors * res.gpus_per_actor + res.server_gpus
        fit = int(total.get("CPU", 0) // cpus) if cpus else len(runs)
        if gpus:
            fit = min(fit, int(total.get("GPU", 0) // gpus))
        fits.append(fit)
    return max(1, min(fits or [1]))


class TableProgress:
    """One line per run over the whole table: which run, how it ended, time spent and left."""

    def __init__(self, total: int, parallel: int, stream=None):
        # stderr as it is now (not as it was at import: a caller may have replaced it since)
        self.total, self.parallel, self.stream = total, parallel, stream or sys.stderr
        self.done, self.started = 0, time.perf_counter()
        self.run_seconds: list[float] = []
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        with self.lock:
            print(text, file=self.stream, flush=True)

    def finished(self, run: PlannedRun, what: str, seconds: float | None = None, resumed: bool = False) -> None:
        """The time left is estimated from the runs run whole: a resumed run ran only its last rounds,
        and a failed one has no time."""
        with self.lock:
            self.done += 1
            if seconds is not None and not resumed:
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


def finished_only(runs: list[PlannedRun], out: Path) -> None:
    """--table-only: every run directory present must be the table's (run_state refuses another
    config), the runs of a cell must have run on the same data (their data records: the data need
    not be here), and at least one must have finished; says how many the table is written from."""
    finished = [run for run in runs if run_state(run, data_here=False) == "finished"]
    if not finished:
        raise RaysimError(
            f"--table-only: no run of the selection has finished in '{out}': leave --table-only out to run them, "
            "or give the --out that holds them"
        )
    data: dict[str, dict[str, Path]] = {}  # cell -> the data its runs ran on -> a run that ran on it
    for run in finished:
        identity = run.run_dir.read_data()
        if identity is not None:
            data.setdefault(run.cell, {}).setdefault(identity.describe(), run.run_dir.path)
    for cell, seen in data.items():
        if len(seen) > 1:
            shown = "; ".join(f"{where}: {what}" for what, where in list(seen.items())[:2])
            raise RaysimError(
                f"--table-only: the runs of cell {cell} ran on different data ({shown}): remove the runs "
                "made on the wrong data, or give another --out"
            )
    print(f"--table-only: the table from {len(finished)} of {len(runs)} runs (finished); nothing run", file=sys.stderr)


def execute(
    runs: list[PlannedRun], address: str | None, parallel: int | None, bars: bool = True
) -> list[tuple[PlannedRun, str]]:
    """Run what is not finished; returns the runs that failed, each with its one-line error (the
    others go on: a table is never lost to one run)."""
    states = {run.name: run_state(run) for run in runs}
    todo = [run for run in runs if states[run.name] != "finished"]
    skipped = len(runs) - len(todo)
    if skipped:
        print(f"{skipped} of {len(runs)} runs finished already: skipped", file=sys.stderr)
    if not todo:
        return []
    failures: list[tuple[PlannedRun, str]] = []
    in_process = all(run.config.resources.in_process for run in todo)  # no Ray then: none started
    actors = None if in_process else ray_side()
    # the runs' client actors kept from one run to the next (raysim.engine.actor_pool)
    with (
        nullcontext() if actors is None else actors.ray_session(todo[0].config.resources, address),
        nullcontext() if actors is None else actors.reusing_actors(),
    ):
        fit = slots(todo)
        width = min(parallel or fit, fit)
        if parallel and parallel > fit:
            print(
                f"--parallel {parallel}: {fit} run(s) fit side by side on this cluster: running {fit}", file=sys.stderr
            )
        progress = TableProgress(len(todo), width)
        if width > 1:
            progress.line(f"{len(todo)} runs, {width} side by side")
        one = _runner(states, progress, failures, bars and width == 1)
        if width == 1:
            for run in todo:
                one(run)
        else:
            _side_by_side(one, todo, width)
    return failures


def _side_by_side(one: Callable[[PlannedRun], None], todo: list[PlannedRun], width: int) -> None:
    """`width` runs at a time in threads (each drives its own actors; the driver only waits). On
    Ctrl-C the queued runs are dropped at once; the running ones stop when Ray shuts down."""
    pool = ThreadPoolExecutor(max_workers=width)
    futures = [pool.submit(one, run) for run in todo]
    try:
        for future in futures:
            future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _runner(states: dict[str, str], progress: TableProgress, failures: list, bar: bool) -> Callable[[PlannedRun], None]:

    def one(run: PlannedRun) -> None:
        t0 = time.perf_counter()
        callbacks: list[Any] = []
        progress_bar = ProgressBar(run.name, run.run_dir.path) if bar else None
        if progress_bar is not None:
            callbacks.append(progress_bar)
        try:
            # OUT/cell/method/ are real folders: a link planted in a received --out cannot take the
            # run's writes elsewhere (the run directory itself is checked when its lock is taken)
            real_folder(run.run_dir.path.parent, below=run.run_dir.path.parents[2])
            if states[run.name] == "unfinished":
                # the table's config: the stored one but for settings that change no number (this
                # command's resources, where the data lie) and, for a run extended, its rounds
                summary = run_experiment(run.config, run.run_dir, callbacks=callbacks)
                how = "resumed, "
            else:
                summary = run_experiment(run.config, new_run_dir(run.config, str(run.run_dir)), callbacks=callbacks)
                how = ""
        except Exception as exc:  # one run's failure is reported in one line; the table goes on
            if isinstance(exc, RaysimError):
                message = user_message(exc)
            else:
                message = failure_message(exc, run.run_dir)[0] or f"{type(exc).__name__}: {first_line(exc)}"
            failures.append((run, message))
            progress.finished(run, f"failed: {message}")
            return
        finally:
            if progress_bar is not None:
                progress_bar.close()
            unlock_run_dir(run.run_dir)
        accuracy = summary.get("final_accuracy")
        shown = f"final accuracy {accuracy:.4f}" if accuracy is not None else "no accuracy"
        try:
            diverged = RunRecord(run.run_dir.path, summary, {}).diverged_at()
        except RaysimError:  # its metrics unreadable: the table, which reads them too, will say so
            diverged = None
        if diverged is not None:
            shown += f" (diverged at round {diverged}: test loss not finite)"
        seconds = time.perf_counter() - t0
        progress.finished(run, f"{how}{shown}, {seconds / 60:.1f} min", seconds, resumed=bool(how))

    return one
