"""The results layer: what turns run directories into numbers, for `raysim report` and `raysim
reproduce` alike.

One reading of a run (`read_run`: summary.json and config.yaml through `RunDir`, each refused in one
line when it is not what raysim writes, an older run's summary as made (raysim.run_format);
`read_curves`: the server's curves from metrics.parquet), one statistic over seeds (`stat`: the mean
and the sample standard deviation, ddof 1, with the number of values), one reading of "rounds to a
target accuracy" (`rounds_to`), and one of "the model diverged" (`RunRecord.diverged_at`). The two
commands differ only in how they lay the numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raysim.outputs.run_dir import RunDir
from raysim.run_format import summary_as_made


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (ddof 1) of n values; std is None for fewer than two."""

    mean: float | None
    std: float | None
    n: int

    def shown(self, digits: int = 4, scale: float = 1.0) -> str:
        """'m +- s' (one value: 'm'; none: '-'), each multiplied by `scale` (100: percent)."""
        if self.mean is None:
            return "-"
        if self.std is None:
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} +- {self.std * scale:.{digits}f}"


def stat(values: list[float | None]) -> Stat:
    """The seeds' values folded into a Stat (None and NaN values left out)."""
    kept = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not kept:
        return Stat(None, None, 0)
    std = float(np.std(kept, ddof=1)) if len(kept) > 1 else None
    return Stat(float(np.mean(kept)), std, len(kept))


@dataclass
class RunRecord:
    """A run as read from its directory: summary.json and config.yaml (curves on demand)."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    _curves: dict[str, tuple[np.ndarray, np.ndarray]] | None = field(default=None, repr=False)

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    def value(self, key: str) -> float | None:
        """A number of summary.json by its (dotted) key, e.g. `best_accuracy`,
        `peak_memory_mb.clients`; None where the run has none (or holds no number there)."""
        value: Any = self.summary
        for part in key.split("."):
            if not isinstance(value, dict):
                return None
            value = value.get(part)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)

    def curves(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if self._curves is None:
            self._curves = read_curves(self.path)
        return self._curves

    def diverged_at(self) -> int | None:
        """The first round whose server test loss is not finite (the global model's weights overflowed;
        its accuracy from then on is a constant guess), or None; read from metrics.parquet. A run
        that collapses to chance with a finite loss is not counted: its accuracy curve shows that.
        None for a run without metrics (none finished a round)."""
        if self._curves is None and not RunDir(self.path).metrics_file.is_file():
            return None
        return first_nonfinite_round(self.curves()["loss"])

    def total(self, curve: str) -> float | None:
        """A cumulative curve's value at the end of the run (None where the run has no such curve)."""
        series = self.curves().get(curve)
        return float(series[1][-1]) if series is not None and len(series[1]) else None


def first_nonfinite_round(loss: tuple[np.ndarray, np.ndarray]) -> int | None:
    """The first of a (rounds, test loss) series' rounds whose loss is not finite, or None."""
    bad = np.flatnonzero(~np.isfinite(loss[1]))
    return int(loss[0][bad[0]]) if len(bad) else None


def read_run(path: str | Path) -> RunRecord:
    summary, config = RunDir(path).read_summary_and_config()
    return RunRecord(Path(path), summary_as_made(summary), config)


def read_curves(run_dir: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A run's curves from metrics.parquet, each (rounds, values):
    "accuracy" and "loss": the server's, at its evaluated rounds;
    "mb_moved": cumulative megabytes up + down after each round;
    "compute_s": cumulative seconds of work after each round, the clients' (their steps, summed
    over the participants: the time one machine would spend) plus the server's update;
    "macs": cumulative multiply-accumulates of the same work, where the run counted them
    (eval.count_macs; raysim.macs), else absent."""
    rows = RunDir(run_dir).read_metrics_rows(["round", "client", "metric", "value"])

    def series(metrics: tuple[str, ...], clients: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The server's values of `metrics` per round (the clients' summed, with `clients`)."""
        by_round: dict[int, float] = {}
        for r in rows:
            if r["metric"] in metrics and (r["client"] is not None) == clients:
                by_round[r["round"]] = by_round.get(r["round"], 0.0) + r["value"]
        rounds = np.array(sorted(by_round), dtype=np.int64)
        return rounds, np.array([by_round[r] for r in rounds], dtype=float)

    curves = {"accuracy": series(("accuracy",)), "loss": series(("loss",))}
    rounds, moved = series(("bytes_up", "bytes_down"))
    curves["mb_moved"] = (rounds, np.cumsum(moved) / 1e6)
    for name, server, client in (("compute_s", "time_server_update_s", "time_s"), ("macs", "macs_server", "macs")):
        parts = {"server": dict(zip(*series((server,)))), "clients": dict(zip(*series((client,), clients=True)))}
        if not any(parts.values()):
            continue
        rounds = np.array(sorted(set(parts["server"]) | set(parts["clients"])), dtype=np.int64)
        for part, by_round in parts.items():  # e.g. "macs_clients": the clients' share alone
            curves[f"{name}_{part}"] = (rounds, np.cumsum([by_round.get(r, 0.0) for r in rounds]))
        curves[name] = (rounds, curves[f"{name}_server"][1] + curves[f"{name}_clients"][1])
    return curves


def at_round(series: tuple[np.ndarray, np.ndarray], round_index: int) -> float | None:
    """A cumulative series' value by the end of `round_index` (0 before its first round; None: empty)."""
    rounds, values = series
    if not len(rounds):
        return None
    before = values[rounds <= round_index]
    return float(before[-1]) if len(before) else 0.0


def cost_to(records: list[RunRecord], target: str, curve: str = "mb_moved") -> Stat | str:
    """What the seeds spent (a cumulative curve: MB moved, compute seconds, MACs) by the first round
    reaching `target` (summary.json's rounds_to_accuracy): their Stat, or, when a seed never reached
    it, `>X` with X the least any such seed spent in all (and `(k/n)` the seeds that reached it);
    `-`: no run asked for this target or has this curve."""
    asked = [r for r in records if target in (r.summary.get("rounds_to_accuracy") or {}) and curve in r.curves()]
    if not asked:
        return "-"
    spent, never = [], []
    for r in asked:
        reached = r.summary["rounds_to_accuracy"][target]
        series = r.curves()[curve]
        if reached is None:
            never.append(float(series[1][-1]) if len(series[1]) else 0.0)
        else:
            spent.append(at_round(series, reached))
    if never:
        return f">{min(never):,.1f}" + (f" ({len(spent)}/{len(asked)})" if spent else "")
    return stat(spent)


def mb_moved(summary: dict[str, Any]) -> float | None:
    """Megabytes up and down over the whole run."""
    up, down = summary.get("bytes_up"), summary.get("bytes_down")
    if up is None and down is None:
        return None
    return ((up or 0) + (down or 0)) / 1e6


def rounds_to(summaries: list[dict[str, Any]], target: str) -> str:
    """A `rounds@target` cell: the mean (+- std) over seeds of the first round reaching `target`.
    When a seed never reached it there is no mean: `>R` says it took more than the R rounds it ran
    (the fewest such R), with how many seeds did reach it when some did (`>50 (2/3)`).
    `-`: no run here asked for this target (eval.targets)."""
    asked = [s for s in summaries if target in (s.get("rounds_to_accuracy") or {})]
    reached = [s["rounds_to_accuracy"][target] for s in asked if s["rounds_to_accuracy"][target] is not None]
    if not asked:
        return "-"
    if len(reached) < len(asked):
        never = min(s["rounds"] for s in asked if s["rounds_to_accuracy"][target] is None)
        return f">{never}" + (f" ({len(reached)}/{len(asked)})" if reached else "")
    return stat(reached).shown(digits=1) if len(reached) > 1 else str(reached[0])
