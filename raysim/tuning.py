"""`raysim tune`: a sweep as Ray Tune trials, each trial a whole simulation.

Each trial reserves its client actors up front in its own placement group (an empty
head bundle for the trial's driver, whose server actor needs no CPU, and one bundle
per client actor), so concurrent trials can never starve each other's actors
(nested actors outside the trial's placement group can hang). The trial reports
per-round accuracy to Tune, which drives the optional ASHA scheduler.

Layout of the sweep directory DIR:
  sweep.yaml, base.yaml   the sweep as run (what `--resume DIR` reads back)
  runs/<trial_id>/        each trial's run directory, the usual outputs
  tune/                   Ray Tune's experiment state
  tune_state.sig          its signature under the user's key (raysim.tune_state): what --resume checks
  trials.parquet          one row per trial: its parameters, metrics, run directory
  best.yaml               the best trial's config, runnable with `raysim run`
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import yaml
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.basic_variant import BasicVariantGenerator

from raysim.config import ResourcesConfig, dump_config
from raysim.engine import actor_pool
from raysim.engine.ray_session import ray_session
from raysim.errors import RaysimError, user_message
from raysim.outputs.callbacks import Callback, RoundResult
from raysim.outputs.run_dir import RunDir
from raysim.outputs.safe_write import atomic_write, real_folder, refuse_link, write_text
from raysim.runner import run_experiment
from raysim.sweep import Sweep, load_sweep
from raysim.text_table import text_table
from raysim.tune_state import KeepSigned, verify

TUNE_DIR, RUNS_DIR = "tune", "runs"


def trial_bundles(resources: ResourcesConfig) -> list[dict[str, float]]:
    """Placement-group bundles for one trial: empty head, then one bundle per client actor.

    With resources.in_process the trial's own process trains every client, so the head bundle
    holds one actor's CPUs (and GPU) and there are no actor bundles.
    """
    actor = {"CPU": resources.cpus_per_actor}
    if resources.gpus_per_actor:
        actor["GPU"] = resources.gpus_per_actor
    if resources.in_process:
        return [actor]
    head = {"GPU": resources.server_gpus} if resources.server_gpus else {}
    return [head] + [dict(actor) for _ in range(resources.actors)]


def _param_space(sweep: Sweep) -> dict[str, Any]:

    forms = {
        "grid": tune.grid_search,
        "choice": tune.choice,
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
    }
    return {key: forms[form](values) for key, spec in sweep.space.items() for form, values in spec.items()}


def _trial(params: dict[str, Any], sweep: Sweep, sweep_dir: Path) -> None:
    """One simulation; continues its own run directory when Tune restarts it after an interruption."""

    config = sweep.trial_config(params)
    if config.resources.server_threads is None:
        # Trials share nodes: the server gets its trial's share of cores, not every core.
        threads = max(1, math.floor(config.resources.actors * config.resources.cpus_per_actor))
        config = dataclasses.replace(config, resources=dataclasses.replace(config.resources, server_threads=threads))

    run_dir = RunDir(sweep_dir / RUNS_DIR / tune.get_context().get_trial_id())
    real_folder(run_dir.path, below=sweep_dir)  # runs/ and the trial's folder: no planted link (RunDir.refuse_links)
    run_experiment(config, run_dir, callbacks=[TuneReport(run_dir)])


class TuneReport(Callback):
    """Each round's accuracy (the latest evaluation's), and the best so far, to Tune."""

    def __init__(self, run_dir: RunDir):
        earlier = run_dir.read_summary()  # resumed: earlier rounds count towards the best
        self.best = earlier.get("best_accuracy") or -math.inf
        self.last = earlier.get("final_accuracy")

    def on_round_end(self, result: RoundResult) -> None:

        if "accuracy" in result.values:
            self.last = result.values["accuracy"]
            self.best = max(self.best, self.last)
        last = self.last if self.last is not None else 0.0
        tune.report(
            {"round": result.round, "accuracy": last, "final_accuracy": last, "best_accuracy": max(self.best, 0.0)}
        )


def _write_sweep(sweep: Sweep, sweep_dir: Path) -> None:
    """The sweep with its base config inlined, so `--resume` needs nothing but DIR."""
    write_text(sweep_dir / "base.yaml", yaml.safe_dump(sweep.base_tree, sort_keys=False))
    source = dict(sweep.source)
    source.update({"base": "base.yaml", "overrides": {}})
    write_text(sweep_dir / "sweep.yaml", yaml.safe_dump(source, sort_keys=False))


def _tuner(sweep: Sweep, sweep_dir: Path, restore: bool):

    def trainable(params):
        _trial(params, sweep, sweep_dir)

    def bundles(params):
        try:
            resources = sweep.trial_config(params).resources
        except RaysimError:  # raised again inside the trial, which Tune then records as failed
            resources = sweep.trial_config(sweep.example_params()).resources
        return tune.PlacementGroupFactory(trial_bundles(resources))

    resources = tune.with_resources(trainable, bundles)
    if restore:
        return tune.Tuner.restore(
            str(sweep_dir / TUNE_DIR), trainable=resources, resume_unfinished=True, resume_errored=True
        )
    scheduler = None
    if sweep.scheduler is not None:
        rounds = sweep.trial_config(sweep.example_params()).rounds
        # max_t one past the last round: ASHA never cuts a trial short of its final model and summary.
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            metric="accuracy",
            mode="max",
            max_t=rounds + 1,
            grace_period=sweep.scheduler.grace_period,
            reduction_factor=sweep.scheduler.reduction_factor,
        )
    return tune.Tuner(
        resources,
        param_space=_param_space(sweep),
        tune_config=tune.TuneConfig(
            # The generator enforces the concurrency (Tune ignores max_concurrent_trials with it, and warns).
            num_samples=sweep.samples,
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(random_state=sweep.seed, max_concurrent=sweep.concurrency),
        ),
        run_config=tune.RunConfig(name=TUNE_DIR, storage_path=str(sweep_dir), verbose=0),
    )


def plan_trial_actors(sweep: Sweep) -> None:
    """resources.actors=auto in a sweep: the cluster's CPUs shared by `concurrency` trials."""

    res = sweep.trial_config(sweep.example_params()).resources
    if res.actors is not None:
        return
    cpus = ray.cluster_resources().get("CPU", 0.0)
    actors = max(1, math.floor(cpus / sweep.concurrency / res.cpus_per_actor + 1e-9))
    sweep.base_tree.setdefault("resources", {})["actors"] = actors
    print(
        f"resources.actors=auto: {actors} client actor(s) per trial ({cpus:g} CPUs shared by "
        f"{sweep.concurrency} concurrent trials at {res.cpus_per_actor:g} CPU per actor)"
    )


def check_sweep_fits(sweep: Sweep) -> None:
    """One line, before any trial starts, when a single trial asks for more than the cluster has."""

    total = ray.cluster_resources()
    need: dict[str, float] = {}
    for bundle in trial_bundles(sweep.trial_config(sweep.example_params()).resources):
        for kind, amount in bundle.items():
            need[kind] = need.get(kind, 0.0) + amount
    for kind, amount in need.items():
        if amount > total.get(kind, 0.0) + 1e-9:
            raise RaysimError(
                f"one trial needs {amount:g} {kind}s (its client actors) but the Ray cluster has "
                f"{total.get(kind, 0.0):g}: lower resources.actors or the per-actor share in the base"
            )


def trials_table(sweep: Sweep, sweep_dir: Path, results) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        if result.config is None:
            continue
        params = {key: result.config[key] for key in sweep.space}
        trial_id = (result.metrics or {}).get("trial_id")
        if trial_id is None:  # failed before its first report: find its run directory by name
            names = Path(result.path).name if result.path else ""
            trial_id = next((d.name for d in (sweep_dir / RUNS_DIR).glob("*") if d.name in names), "")
        run_dir = RunDir(sweep_dir / RUNS_DIR / trial_id)
        summary = run_dir.read_summary()
        rows.append(
            {
                "trial_id": trial_id,
                **params,
                "best_accuracy": summary.get("best_accuracy"),
                "final_accuracy": summary.get("final_accuracy"),
                "last5_accuracy": summary.get("last5_accuracy"),
                "rounds": summary.get("rounds", 0),
                "wall_time_s": summary.get("wall_time_s"),
                "status": "error"
                if result.error
                else ("finished" if summary.get("rounds", 0) >= summary.get("rounds_planned", 1) else "stopped"),
                "error": error_line(result.error) if result.error else None,
                "run_dir": str(run_dir),
            }
        )
    rows.sort(key=lambda r: -(r[sweep.metric] if r[sweep.metric] is not None else -1.0))
    return rows


def error_line(error: BaseException) -> str:
    """What a failed trial raised, in one line (a RaysimError's message; else the exception's last line)."""
    text = user_message(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if len(lines) > 1 else (lines[0] if lines else type(error).__name__)


def format_table(rows: list[dict[str, Any]], sweep: Sweep) -> str:
    measures = ["best_accuracy", "final_accuracy"] + (["last5_accuracy"] if sweep.metric == "last5_accuracy" else [])
    columns = ["trial_id", *sweep.space, *measures, "rounds", "status"]

    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    return text_table(columns, [[cell(r[c]) for c in columns] for r in rows])


def write_results(rows: list[dict[str, Any]], sweep: Sweep, sweep_dir: Path) -> Path | None:

    table = pa.Table.from_pylist(rows)
    atomic_write(sweep_dir / "trials.parquet", lambda tmp: pq.write_table(table, tmp))
    best = next((r for r in rows if r[sweep.metric] is not None), None)
    if best is None:
        return None
    config = sweep.trial_config({key: best[key] for key in sweep.space})
    path = sweep_dir / "best.yaml"
    write_text(
        path,
        f"# best trial {best['trial_id']} of {sweep_dir} by {sweep.metric} = "
        f"{best[sweep.metric]:.4f}\n" + dump_config(config),
    )
    return path


def run_sweep(sweep: Sweep, sweep_dir: Path, address: str | None = None, restore: bool = False) -> list[dict]:

    sweep_dir = sweep_dir.resolve()
    real_folder(sweep_dir)
    for name in (TUNE_DIR, RUNS_DIR):  # Tune's state and the trials' run directories land in these
        refuse_link(sweep_dir / name)
    if not restore:
        _write_sweep(sweep, sweep_dir)
    base_resources = sweep.trial_config(sweep.example_params()).resources
    if restore and base_resources.address:
        # a received sweep does not choose the cluster: --address, RAY_ADDRESS, else a local Ray
        print(
            f"note: {sweep_dir / 'sweep.yaml'}'s base names resources.address={base_resources.address!r}: not used "
            "(a resumed sweep goes where this command says: --address, RAY_ADDRESS, else a private local Ray)",
            file=sys.stderr,
        )
        base_resources = dataclasses.replace(base_resources, address=None)
    with ray_session(base_resources, address):
        actor_pool.clear()  # actors kept from earlier runs of this driver would hold the trials' CPUs
        plan_trial_actors(sweep)
        check_sweep_fits(sweep)
        with KeepSigned(sweep_dir, TUNE_DIR):  # so that only this user's --resume restores it
            results = _tuner(sweep, sweep_dir, restore).fit()
    rows = trials_table(sweep, sweep_dir, results)
    print(format_table(rows, sweep))
    for row in rows:
        if row["error"]:
            print(f"trial {row['trial_id']} failed: {row['error']}")
    best = write_results(rows, sweep, sweep_dir)
    print(
        f"{len(rows)} trials -> {sweep_dir / 'trials.parquet'}"
        + (f"; best config -> {best} (run it with: raysim run {best})" if best else "")
    )
    # Tune returns only the trials it created; an interrupted grid has fewer, or unfinished ones.
    expected = sweep.grid_size() * sweep.samples
    unfinished = sweep.scheduler is None and any(r["status"] == "stopped" for r in rows)
    if len(rows) < expected or unfinished:
        print(f"interrupted: finished rounds are kept; continue with 'raysim tune --resume {sweep_dir}'")
    return rows


def sweep_started(sweep_dir: Path) -> bool:
    """Tune has written the state a resume restores (before that, the sweep can simply start again)."""
    return (sweep_dir / TUNE_DIR / "tuner.pkl").is_file()


def resume_sweep(sweep_dir: Path, address: str | None = None, allow_code: bool = False) -> list[dict]:
    """Continue the sweep in `sweep_dir`; its Tune state must carry this user's signature (see
    raysim.tune_state) unless `allow_code`, checked before anything in it is unpickled or imported."""
    if (sweep_dir / "sweep.yaml").exists() and not sweep_started(sweep_dir):
        raise RaysimError(
            f"the sweep in '{sweep_dir}' never started (no {TUNE_DIR}/): start it again with "
            f"'raysim tune {sweep_dir / 'sweep.yaml'} --out {sweep_dir}'"
        )
    if not (sweep_dir / "sweep.yaml").exists():
        raise RaysimError(
            f"'{sweep_dir}' is not a sweep directory (no sweep.yaml and tune/): "
            "give the --out DIR of an earlier `raysim tune`"
        )
    if not allow_code:
        target = address or os.environ.get("RAY_ADDRESS") or ""
        if target.startswith("ray://"):
            raise RaysimError(
                f"over Ray Client ({target}) Tune restores the sweep's state on the head node, where raysim "
                "cannot check its signature: resume it on the head node (ray job submit), or add "
                "--allow-code if you made this sweep"
            )
        verify(sweep_dir, TUNE_DIR)
    return run_sweep(load_sweep(sweep_dir / "sweep.yaml"), sweep_dir, address, restore=True)
