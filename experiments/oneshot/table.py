"""The one-shot tables of this folder's README from run directories (a stand-in until `raysim
reproduce` exists): python experiments/oneshot/table.py RUNS/<setting> [...]

Each argument is a folder of run directories named s<seed>-<method> (as the README's commands write
them). Per method: best, final and last-5 test accuracy, mean +- std over the seeds (population
std), the per-seed values, and the wall time. "best" is over the method's own models: for the
distillation methods (FedDF, DENSE, Co-Boosting, FedHydra) over the distillation epochs (round 2
on), not the model the server holds before distilling (round 1: an untrained network, or for FedDF
the clients' average); for FedAvg one-shot and OT fusion over round 1, their only model.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

METHODS = ["fedavg_oneshot", "ot_fusion", "feddf", "dense", "coboosting", "fedhydra"]
LABELS = {
    "fedavg_oneshot": "FedAvg one-shot",
    "ot_fusion": "OT fusion",
    "feddf": "FedDF",
    "dense": "DENSE",
    "coboosting": "Co-Boosting",
    "fedhydra": "FedHydra",
}
DISTILLATION = {"feddf", "dense", "coboosting", "fedhydra"}


def curve(run_dir: Path) -> list[float]:
    rows = pq.read_table(run_dir / "metrics.parquet", columns=["round", "client", "metric", "value"]).to_pylist()
    points = sorted((r["round"], r["value"]) for r in rows if r["client"] is None and r["metric"] == "accuracy")
    return [v for _, v in points]


def measures(run_dir: Path, method: str) -> dict[str, float]:
    accuracy = curve(run_dir)
    own = accuracy[1:] if method.split("-")[0] in DISTILLATION and len(accuracy) > 1 else accuracy[:1]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "best": max(own),
        "final": accuracy[-1],
        "last5": float(np.mean(accuracy[-5:])),
        "wall_min": summary["wall_time_s"] / 60,
        "summary": summary,
    }


def runs(folder: Path) -> dict[str, dict[int, dict]]:
    found: dict[str, dict[int, dict]] = {}
    for run_dir in sorted(folder.iterdir()):
        match = re.fullmatch(r"s(\d+)-(.+)", run_dir.name)
        if match and (run_dir / "summary.json").is_file():
            found.setdefault(match.group(2), {})[int(match.group(1))] = measures(run_dir, match.group(2))
    return found


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.3f} +- {np.std(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def table(folder: Path) -> str:
    found = runs(folder)
    methods = [m for m in METHODS if m in found] + sorted(m for m in found if m not in METHODS)
    seeds = sorted({s for per in found.values() for s in per})
    lines = [
        f"{folder.name}: seeds {', '.join(map(str, seeds))}",
        "",
        "| method | best | last-5 | final | best per seed | last-5 per seed | wall (min) per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        per = [found[m][s] for s in sorted(found[m])]
        cells = [mean_std([p[k] for p in per]) for k in ("best", "last5", "final")]
        each = [" / ".join(f"{p[k]:.3f}" for p in per) for k in ("best", "last5")]
        wall = " / ".join(f"{p['wall_min']:.1f}" for p in per)
        lines.append(f"| {LABELS.get(m, m)} | {' | '.join(cells)} | {' | '.join(each)} | {wall} |")
    if "fedhydra" in found:
        lines.append("")
        for key in ("best", "last5"):
            first = [
                s
                for s in found["fedhydra"]
                if all(
                    found["fedhydra"][s][key] > found[m][s][key]
                    for m in METHODS
                    if m != "fedhydra" and s in found.get(m, {})
                )
            ]
            lines.append(f"FedHydra first on {key}: {len(first)} of {len(found['fedhydra'])} seeds ({first})")
    return "\n".join(lines)


def teachers(folder: Path) -> str:
    """The clients and the teachers read on the test images (FedHydra's runs), per seed."""
    found = runs(folder).get("fedhydra", {})
    lines = [
        "| seed | best client | average ensemble (AE) | label-weighted (default) label-free; given the label "
        "| eq. 8-11 label-free; given the label |",
        "|---|---|---|---|---|",
    ]
    for seed, m in sorted(found.items()):
        s = m["summary"]
        both = [
            f"{s[k]:.3f}; {s[k + '_given_label']:.3f}"
            for k in ("ensemble_accuracy_stratified_unscaled", "ensemble_accuracy_stratified")
        ]
        lines.append(
            f"| {seed} | {s['best_client_accuracy']:.3f} | {s['ensemble_accuracy']:.3f} | {' | '.join(both)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(table(Path(arg)))
        print()
        print(teachers(Path(arg)))
        print()
