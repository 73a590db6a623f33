"""`raysim bench cell NAME`: what a whole cell (a table's cell or any config) will cost on this machine,
which phase of it dominates, and how much memory its processes need - from two short runs.

An algorithm declares the config keys that count its repeated work (local epochs, condensation
steps, synthesis iterations, server epochs ...) and the phase each multiplies (the clients' step or
the server's update) here, beside the bench, not on the Algorithm: its class is decorated with
`@bench_work(keys={"algorithm.steps": "clients", ...})`, optionally with `minimum=` (a key's smallest
valid value, where above 1) and `overrides=` (settings that make each bench run do its own work,
such as a cache turned off). A built-in family and a researcher's own class (`algorithm.name:
module:Class`) declare theirs the same way (`from raysim.bench.cell import bench_work`); each part is
inherited from the nearest base class that declares it, and a class no one declared for counts
`local.epochs` in the clients' step. The bench runs the cell twice as it is - same data,
partition, models, actors, rounds, evaluation - but with every work key at a fraction f of its value
and then at 2f (at least 1; never above the full value), each run a real run through Ray in a
temporary folder. Per phase (from metrics.parquet: broadcast, clients, server update, evaluation;
the rest of the command's wall time is start-up and outputs) the two runs give a line, time = a +
b * work, which is read at the full work. What no key scales (evaluation, start-up, a one-shot
method's distillation over its pool, local training at 1 epoch) is measured at its full size in
both runs. Rounds are never cut: algorithms whose rounds differ (pre-training, the round a
trajectory is complete, a one-shot method's client round) run each kind.

The projection assumes a phase's time is linear in its work keys; where a phase has several keys
with different ratios of full to bench value, their mean ratio is used (printed). Memory: the peak of
a client actor's process and of the server's (summary.json's peak_memory_mb; CPU: resident set;
CUDA: tensors on the GPU), from the larger run - the work keys repeat work, they do not grow it.

Share of the hardware: both runs count multiply-accumulates (eval.count_macs, raysim.macs: the seconds
then include its hook, a few microseconds a layer call) - the clients' (each client's `macs`, summed),
the server update's (`macs_server`: server training on condensed sets, a one-shot method's synthesis
and distillation, DynaFed's trajectory synthesis) and the evaluation's (`macs_eval`: a forward pass
over the test split; not the federated validation, which the clients' actors run). A client step that
condenses (FedDM, FedAF, DCFL) is one phase: its training and its condensation are counted together.
A phase's rate is its MACs over its seconds in the larger run, beside the peak raysim.bench.peak
measures afterwards in this process, on the phase's device and thread count and in its dtype
(resources.precision; evaluation is float32): the server's phases against one process with the
server's threads (resources.server_threads, else every core it may use); the clients' phase, whose
actors run at once and whose seconds are the phase's wall time, against the whole machine the actors
hold - the peak of one actor's threads (cpus_per_actor) times the number of actors on CPUs, times the
number of GPUs they share on CUDA (one runtime with resources.in_process, which runs the clients in
turn). Both rates are the machine's at the time: the load average beside them says whether other
processes shared it. Not measured where the models are compiled (resources.compile, refused beside
eval.count_macs); without a share of the peak where the runs were on another machine (`address`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import yaml

from raysim.bench.peak import BIG_SIZE, SMALL_SHAPE, measure_peak
from raysim.config import dump_config
from raysim.engine.devices import pick_device
from raysim.errors import RaysimError
from raysim.outputs.metrics import PHASE_MACS, PHASE_SECONDS, phase_macs
from raysim.outputs.run_dir import RunDir
from raysim.precision import PRECISIONS
from raysim.registry import algorithm_class
from raysim.report import flatten
from raysim.reproduce import check_cell_name
from raysim.reproduce.named import load_named_config
from raysim.runner import prepare, run_experiment

DEFAULTS = {
    "config": "",  # a config file, a shipped config's name, or TABLE:CELL:METHOD[:SCALE] (the first bare argument)
    "fraction": "0.1",  # f: the first run's share of each work key (the second runs 2f)
    "address": "",  # a Ray cluster to run on (default: a private local Ray, as `raysim run`)
    "out": "",  # also write the measurements and the projection as JSON to this file
}
TAKES_CONFIG = True  # `raysim bench cell NAME key=value ...`: a config and its overrides

LABELS = {
    "broadcast": "broadcast",
    "clients": "clients (their steps, in parallel)",
    "server": "server update",
    "eval": "evaluation",
    "rest": "start-up and outputs",
}


@dataclass(frozen=True)
class BenchWork:
    """What `raysim bench cell` scales and sets for one algorithm class (see the module's docstring)."""

    keys: dict[str, str] = field(default_factory=lambda: {"local.epochs": "clients"})  # config key -> phase
    minimum: dict[str, int] = field(default_factory=dict)  # a work key's smallest valid value, where above 1
    overrides: dict[str, Any] = field(default_factory=dict)  # settings that make each bench run do its own work


# algorithm class -> the parts of BenchWork it declared itself (filled as the algorithms' modules load)
_DECLARED: dict[type, dict[str, dict]] = {}


def bench_work(
    *,
    keys: dict[str, str] | None = None,
    minimum: dict[str, int] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Callable[[type], type]:
    """Class decorator: the algorithm's work keys (each with the phase it multiplies: "clients" or
    "server"), their minimum values and the bench runs' overrides; a part not given is inherited."""
    for key, phase in (keys or {}).items():
        if phase not in ("clients", "server"):
            raise ValueError(f"bench_work: work key {key!r} multiplies phase {phase!r}: use 'clients' or 'server'")
    given = {"keys": keys, "minimum": minimum, "overrides": overrides}

    def declare(cls: type) -> type:
        _DECLARED[cls] = {part: dict(value) for part, value in given.items() if value is not None}
        return cls

    return declare


def work_of(cls: type) -> BenchWork:
    """The class's BenchWork: each part from the nearest class in its MRO that declared it."""
    found: dict[str, Any] = {}
    for part in ("keys", "minimum", "overrides"):
        for base in cls.__mro__:
            if part in _DECLARED.get(base, {}):
                found[part] = dict(_DECLARED[base][part])
                break
    return BenchWork(**found)


@dataclass
class WorkKey:
    key: str  # dotted config key
    phase: str  # "clients" or "server"
    full: int
    first: int  # its value in the first bench run
    second: int  # ... and in the second

    @property
    def ratio(self) -> float | None:
        """(full - first) / (second - first): how many times the runs' difference the full work adds;
        None when the key did not change between the runs (it ran at its full value in both)."""
        return None if self.second == self.first else (self.full - self.first) / (self.second - self.first)


def work_keys(config, fraction: float) -> list[WorkKey]:
    """The algorithm's work keys that this config sets above 0, with the two bench values."""

    values = flatten(yaml.safe_load(dump_config(config)))
    work = work_of(algorithm_class(config.algorithm.name))
    keys = []
    for key, phase in work.keys.items():
        full = values.get(key)
        if not isinstance(full, int) or isinstance(full, bool) or full < 1:
            continue
        first = min(full, max(work.minimum.get(key, 1), round(full * fraction)))
        keys.append(WorkKey(key, phase, full, first, min(full, 2 * first)))
    return keys


def phase_ratio(keys: list[WorkKey], phase: str) -> tuple[float | None, bool]:
    """The phase's mean ratio over its keys that changed, and whether those ratios differ by > 10%."""
    ratios = [k.ratio for k in keys if k.phase == phase and k.ratio is not None]
    if not ratios:
        return None, False
    mean = sum(ratios) / len(ratios)
    return mean, max(ratios) > 1.1 * min(ratios)


RUN_FOLDER_PREFIX = "raysim-bench-cell-"


def remove_dead_runs_folders(under: Path | None = None) -> None:
    """Remove the temporary run folders of bench cells whose process is gone. A cell killed with its
    process group (`timeout`, Ctrl-C in a shell) loses Ray's raylet, and the driver then exits from
    inside Ray without unwinding, so its folder - a whole run's outputs - outlives it. The folder's
    name carries its process id; a folder whose process still runs (another bench cell) is kept."""
    for folder in Path(under or tempfile.gettempdir()).glob(f"{RUN_FOLDER_PREFIX}*-*"):
        pid = folder.name[len(RUN_FOLDER_PREFIX) :].split("-", 1)[0]
        if folder.is_dir() and not folder.is_symlink() and pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def timed_run(config, address: str | None) -> dict[str, float]:
    """One real run in a temporary folder: each phase's seconds summed over the rounds, the command's
    wall time, and the peak memory."""

    with tempfile.TemporaryDirectory(prefix=f"{RUN_FOLDER_PREFIX}{os.getpid()}-") as folder:
        run_dir = RunDir(Path(folder) / "run")
        started = time.perf_counter()
        summary = run_experiment(config, run_dir, address, experiment=prepare(config))
        wall = time.perf_counter() - started
        all_rows = run_dir.read_metrics_rows()
        actors = run_dir.read_actors()
    rows = [r for r in all_rows if r["client"] is None]
    seconds = {phase: sum(r["value"] for r in rows if r["metric"] == metric) for phase, metric in PHASE_SECONDS.items()}
    rounds = sum(r["value"] for r in rows if r["metric"] == "round_time_s")
    seconds["rest"] = max(0.0, wall - rounds)
    peaks = summary.get("peak_memory_mb") or {}
    return {
        **seconds,
        "wall": wall,
        "peak_clients_mb": peaks.get("clients"),
        "peak_server_mb": peaks.get("server"),
        **counted_macs(all_rows),
        "gmacs_per_s": summary.get("gmacs_per_s", {}),  # the run's own reading (raysim.outputs.summary)
        "actors": len(actors),
        "actor_gpus": len({gpu for actor in actors for gpu in actor.get("gpu_ids") or []}),
    }


def counted_macs(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """raysim.outputs.metrics.phase_macs of metrics.parquet's rows, as `macs_PHASE`."""
    found = phase_macs([(r["round"], r["client"], r["metric"], r["value"]) for r in rows])
    return {f"macs_{phase}": macs for phase, macs in found.items()}


def project(keys: list[WorkKey], first: dict[str, float], second: dict[str, float]) -> dict[str, float]:
    """Each phase at the full work: a + b * work through the two runs, read at the full values; a phase no
    key changed is the mean of the two (it ran at its full size in both)."""
    out = {}
    for phase in (*PHASE_SECONDS, "rest"):
        ratio = phase_ratio(keys, phase)[0] if phase in ("clients", "server") else None
        if ratio is None:
            out[phase] = (first[phase] + second[phase]) / 2
        else:  # a slope below 0 is noise on a phase the keys barely touch: no growth
            out[phase] = second[phase] + max(0.0, second[phase] - first[phase]) * (ratio - 1)
    return out


def cell(opts: dict) -> None:

    if not opts["config"]:
        raise RaysimError(
            "bench cell needs a config: raysim bench cell NAME [key=value ...] (NAME: a config file, a shipped "
            "config such as fedaf/cifar10_cpu, or TABLE:CELL:METHOD[:SCALE])"
        )
    try:
        fraction = float(opts["fraction"])
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 0.5:
        raise RaysimError(f"bench cell: fraction={opts['fraction']} must be a number in (0, 0.5]")
    check_cell_name(opts["config"], "raysim bench cell")  # a cell's scale is its name's last part here
    remove_dead_runs_folders()
    config = load_named_config(opts["config"], opts["overrides"])
    keys = work_keys(config, fraction)
    fixed = [f"{k}={v}" for k, v in work_of(algorithm_class(config.algorithm.name)).overrides.items()]
    if not config.resources.compile:  # count the phases' MACs (refused beside compiled models)
        fixed.append("eval.count_macs=true")
    runs = []
    for which in ("first", "second"):
        values = [f"{k.key}={getattr(k, which)}" for k in keys]
        runs.append(load_named_config(opts["config"], [*opts["overrides"], *values, *fixed]))
    where = "in process" if config.resources.in_process else f"actors {config.resources.actors or 'auto'}"
    print(
        f"bench cell {opts['config']}: {config.algorithm.name}, {config.rounds} rounds, "
        f"{config.clients.num} clients, {where}; two runs at "
        f"{fraction:g} and {2 * fraction:g} of the work",
        flush=True,
    )
    for k in keys:
        print(f"  {k.key} ({LABELS[k.phase].split(' (')[0]}): {k.first}, then {k.second}, of {k.full}", flush=True)
    address = opts["address"] or None
    measured = []
    for i, run_config in enumerate(runs, 1):
        started = time.perf_counter()
        measured.append(timed_run(run_config, address))
        print(f"  run {i}: {time.perf_counter() - started:.1f} s", flush=True)
    projected = project(keys, *measured)
    print(report(config, keys, measured, projected))
    rates, peaks = [], {}
    if config.resources.compile:
        print("GMAC/s not measured: resources.compile is on, and MACs are counted only of models run uncompiled")
    else:
        peaks = {} if address else phase_peaks(config, measured[1])
        rates = rate_rows(measured[1], peaks)
        print(rates_report(rates, peaks, fraction, address))
    if opts["out"]:
        Path(opts["out"]).write_text(
            json.dumps(
                {
                    "config": opts["config"],
                    "overrides": opts["overrides"],
                    "fraction": fraction,
                    "work_keys": [k.__dict__ for k in keys],
                    "runs": measured,
                    "projected_s": projected,
                    "projected_wall_s": sum(projected.values()),
                    "rates": rates,
                    "peaks": {phase: {**asdict(peak), "processes": n} for phase, (peak, n) in peaks.items() if peak},
                },
                indent=1,
            )
        )


def report(config, keys: list[WorkKey], measured: list[dict[str, float]], projected: dict[str, float]) -> str:
    total = sum(projected.values())
    lines = [
        "",
        f"{'phase':38s} {'run 1 (s)':>10s} {'run 2 (s)':>10s} {'projected (s)':>14s} {'share':>6s}  per unit of work",
    ]
    for phase, seconds in projected.items():
        changed = [k for k in keys if k.phase == phase and k.ratio is not None]
        unit = ""
        if len(changed) == 1:
            k = changed[0]
            per = max(0.0, measured[1][phase] - measured[0][phase]) / (k.second - k.first)
            unit = f"{per:.3g} s per {k.key} (whole run)"
        elif len(changed) > 1:
            ratio, differ = phase_ratio(keys, phase)
            unit = f"{len(changed)} keys, ratio {ratio:.1f}" + (" (their ratios differ: approximate)" if differ else "")
        lines.append(
            f"{LABELS[phase]:38s} {measured[0][phase]:10.1f} {measured[1][phase]:10.1f} {seconds:14.1f} "
            f"{100 * seconds / total:5.0f}%  {unit}".rstrip()
        )
    dominant = max(projected, key=projected.get)
    lines.append(
        f"projected wall time: {total / 60:.1f} min for the {config.rounds} rounds "
        f"(the two runs took {measured[0]['wall'] / 60:.1f} and {measured[1]['wall'] / 60:.1f} min); "
        f"dominated by {LABELS[dominant]} ({100 * projected[dominant] / total:.0f}%)"
    )
    peaks = measured[1]
    if config.resources.in_process and peaks["peak_clients_mb"]:  # clients and server: this one process
        lines.append(f"peak memory: the run's process {peaks['peak_clients_mb']:.0f} MiB")
    elif peaks["peak_clients_mb"] or peaks["peak_server_mb"]:
        shown = [
            f"{who} {peaks[key]:.0f} MiB"
            for who, key in (("a client actor", "peak_clients_mb"), ("the server", "peak_server_mb"))
            if peaks[key]
        ]
        lines.append("peak memory: " + ", ".join(shown))
    return "\n".join(lines)


def phase_peaks(config, run: dict[str, Any]) -> dict[str, tuple[Any, int]]:
    """Per counted phase: the peak (raysim.bench.peak.Peak; None where its CUDA device is not visible
    here) of one of the processes that run it, on its device, with its threads, in its dtype, and how
    many such processes run it at once (see the module's docstring)."""

    r = config.resources
    hot = PRECISIONS[r.precision] or torch.float32  # training's dtype; evaluation stays in float32
    client_device, server_device = pick_device(r.gpus_per_actor), pick_device(r.server_gpus)
    server_threads = r.server_threads or len(os.sched_getaffinity(0))  # as the server actor sets them
    at_once = run["actors"] if client_device.type == "cpu" else max(1, run["actor_gpus"])
    wanted = {
        "clients": (client_device, max(1, int(r.cpus_per_actor)), hot, at_once),
        "server": (server_device, max(1, int(server_threads)), hot, 1),
        "eval": (server_device, max(1, int(server_threads)), torch.float32, 1),
    }
    measured: dict[tuple, Any] = {}  # one measurement per (device, threads, dtype)
    for device, threads, dtype, _ in wanted.values():
        if (device, threads, dtype) not in measured:
            measured[device, threads, dtype] = measure_peak(device, threads, dtype)
    return {phase: (measured[device, threads, dtype], n) for phase, (device, threads, dtype, n) in wanted.items()}


def rate_rows(run: dict[str, Any], peaks: dict[str, tuple[Any, int]]) -> list[dict[str, Any]]:
    """Per counted phase of `run`: its MACs, seconds, GMAC/s (the run's summary.json reading) and,
    where its peak was measured, the peak's and the small product's rate for the processes that run
    it, and its share (%) of the peak."""
    rows = []
    for phase in PHASE_MACS:
        macs, seconds = run[f"macs_{phase}"] or 0.0, run[phase]
        # the run states no rate for a phase that ran without counting any MACs (FedAvg's server): 0
        rate = run["gmacs_per_s"].get(phase, 0.0 if seconds > 0 else None)
        peak, at_once = peaks.get(phase) or (None, 1)
        row = {"phase": phase, "gmacs": macs / 1e9, "seconds": seconds, "gmacs_per_s": rate}
        if peak is not None:
            row["peak_gmacs_per_s"] = peak.big_gmacs * at_once
            row["small_gmacs_per_s"] = peak.small_gmacs * at_once
            row["share_of_peak_pct"] = None if rate is None else 100 * rate / row["peak_gmacs_per_s"]
        rows.append(row)
    return rows


def rates_report(
    rows: list[dict[str, Any]], peaks: dict[str, tuple[Any, int]], fraction: float, address: str | None
) -> str:
    """The table of the phases' rates and their shares of the peak, and what the peaks were."""

    def number(value: float | None, digits: int = 1, suffix: str = "") -> str:
        return "-" if value is None else f"{value:.{digits}f}{suffix}"

    lines = [
        "",
        f"{'phase (run 2, at ' + format(2 * fraction, 'g') + ' of the work)':38s} {'MACs (G)':>10s} {'seconds':>9s} "
        f"{'GMAC/s':>8s} {'peak GMAC/s':>12s} {'share':>7s} {'small-matmul GMAC/s':>20s}",
    ]
    for row in rows:
        lines.append(
            f"{LABELS[row['phase']]:38s} {row['gmacs']:10.2f} {row['seconds']:9.1f} "
            f"{number(row['gmacs_per_s'], 2):>8s} {number(row.get('peak_gmacs_per_s')):>12s} "
            f"{number(row.get('share_of_peak_pct'), 1, '%'):>7s} "
            f"{number(row.get('small_gmacs_per_s')):>20s}"
        )
    if address:
        lines.append(f"no share of the peak: the runs were on the Ray cluster at {address}, not on this machine")
    else:
        lines += peak_lines(peaks)
    return "\n".join(lines)


def peak_lines(peaks: dict[str, tuple[Any, int]]) -> list[str]:
    """What the peaks were: the products, each phase's processes, device, threads and dtype, and the
    machine's load while they were measured."""

    sizes = ", ".join(f"{n}x{n} on {kind}" for kind, n in BIG_SIZE.items())
    b, k, n = SMALL_SHAPE
    lines = [f"peak: the fastest timed square product ({sizes}); small-matmul: {b}x{k} @ {k}x{n}"]
    by_peak: dict[tuple, list[str]] = {}  # phases measured against the same peak share a line
    for phase, (peak, at_once) in peaks.items():
        by_peak.setdefault((peak, at_once), []).append(LABELS[phase].split(" (")[0])
    for (peak, at_once), phases in by_peak.items():
        if peak is None:
            lines.append(f"  {', '.join(phases)}: not measured (its CUDA device is not visible here)")
            continue
        many = f"{at_once} {'actors' if peak.device == 'cpu' else 'GPUs'} x " if at_once > 1 else ""
        threads = f"{peak.threads} thread{'s' if peak.threads > 1 else ''}"
        lines.append(
            f"  {', '.join(phases)}: {many}{threads} on {peak.device} in {peak.dtype}: "
            f"{peak.big_gmacs:.1f} GMAC/s{' each' if many else ''} (small-matmul {peak.small_gmacs:.1f})"
        )
    if hasattr(os, "getloadavg"):  # the last minute's, the runs' own processes included
        load, cores = os.getloadavg()[0], os.cpu_count()
        lines.append(f"  load average {load:.1f} on {cores} cores (above {cores}: processes waited for a core)")
    return lines
