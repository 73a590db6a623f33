"""The DCFL tables of this folder's README from run directories (a stand-in until `raysim reproduce`
exists): python experiments/dcfl/table.py RUNS

RUNS holds one folder per setting (ck2, dir0.1, dir0.5), each with run directories named
s<seed>-<variant> (as the README's script writes them). Per setting and variant: last-5, final and
best test accuracy as mean +- std over the seeds (population std) with the per-seed last-5 values;
rounds to each of the config's eval.targets (mean over the seeds that reached it, "k/n" when not all
did); the CKA diagnostics (cka_label_spearman averaged over the rounds after pre-training, and its
last value; selection_spread's mean); wall time and megabytes moved.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ORDER = [
    "fedavg",
    "dcfl",
    "fedprox",
    "dcfl_fedprox",
    "cka_alone",
    "dsa_alone",
    "dcfl_mix",
    "dcfl_random_groups",
    "dcfl_complement_high",
    "dcfl_cka_update",
    "dcfl_cka_latest",
]
LABELS = {
    "fedavg": "FedAvg",
    "dcfl": "DCFL on FedAvg (fine-tune)",
    "fedprox": "FedProx",
    "dcfl_fedprox": "DCFL on FedProx",
    "cka_alone": "FedAvg + CKA selection",
    "dsa_alone": "FedAvg + DSA",
    "dcfl_mix": "DCFL, mix instead of fine-tune",
    "dcfl_random_groups": "DCFL, random groups",
    "dcfl_complement_high": "DCFL, most similar group (follow-up)",
    "dcfl_cka_update": "DCFL, cka_on: update",
    "dcfl_cka_latest": "DCFL, cka_on: latest",
}


def server_series(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    rows = pq.read_table(run_dir / "metrics.parquet", columns=["round", "client", "metric", "value"]).to_pylist()
    return sorted((r["round"], r["value"]) for r in rows if r["client"] is None and r["metric"] == metric)


def measures(run_dir: Path) -> dict:
    accuracy = [v for _, v in server_series(run_dir, "accuracy")]
    summary = json.loads((run_dir / "summary.json").read_text())
    config = (run_dir / "config.yaml").read_text()
    pretrain = int(m.group(1)) if (m := re.search(r"pretrain_rounds: (\d+)", config)) else 0
    rho = [v for r, v in server_series(run_dir, "cka_label_spearman") if r > pretrain]
    spread = [v for r, v in server_series(run_dir, "selection_spread") if r > pretrain]
    return {
        "last5": float(np.mean(accuracy[-5:])),
        "final": accuracy[-1],
        "best": max(accuracy),
        "targets": summary.get("rounds_to_accuracy", {}),
        "rounds": summary["rounds"],
        "rho_mean": float(np.mean(rho)) if rho else None,
        "rho_last": rho[-1] if rho else None,
        "spread": float(np.mean(spread)) if spread else None,
        "wall_min": summary["wall_time_s"] / 60,
        "mb": (summary["bytes_up"] + summary["bytes_down"]) / 1e6,
    }


def finished(run_dir: Path) -> bool:
    """A run that has written its last round (a running one already has a summary.json)."""
    path = run_dir / "summary.json"
    return path.is_file() and json.loads(path.read_text()).get("finished", False)


def collect(folder: Path) -> dict[str, dict[int, dict]]:
    found: dict[str, dict[int, dict]] = {}
    for run_dir in sorted(folder.iterdir()):
        match = re.fullmatch(r"s(\d+)-(.+)", run_dir.name)
        if match and finished(run_dir):
            found.setdefault(match.group(2), {})[int(match.group(1))] = measures(run_dir)
    return found


def pm(values: list[float], digits: int = 3) -> str:
    return f"{np.mean(values):.{digits}f} +- {np.std(values):.{digits}f}"


def reach(per_seed: list[dict], target: str) -> str:
    hit = [m["targets"].get(target) for m in per_seed]
    reached = [h for h in hit if h is not None]
    if not reached:
        return f"never (>{per_seed[0]['rounds']})"
    text = f"{np.mean(reached):.1f}"
    return text if len(reached) == len(hit) else f"{text} ({len(reached)}/{len(hit)})"


def table(folder: Path) -> str:
    found = collect(folder)
    variants = [v for v in ORDER if v in found] + sorted(v for v in found if v not in ORDER)
    targets = sorted({t for v in variants for m in found[v].values() for t in m["targets"]}, key=float)
    head = ["variant", "seeds", "last-5", "per seed (last-5)", "final", "best"]
    head += [f"rounds to {t}" for t in targets]
    head += ["CKA-label rho (mean, last)", "selection spread", "min", "MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        seeds = sorted(found[v])
        per = [found[v][s] for s in seeds]
        rho = [m["rho_mean"] for m in per if m["rho_mean"] is not None]
        rho_last = [m["rho_last"] for m in per if m["rho_last"] is not None]
        spread = [m["spread"] for m in per if m["spread"] is not None]
        cells = [
            LABELS.get(v, v),
            ",".join(map(str, seeds)),
            pm([m["last5"] for m in per]),
            ", ".join(f"{m['last5']:.3f}" for m in per),
            pm([m["final"] for m in per]),
            pm([m["best"] for m in per]),
            *[reach(per, t) for t in targets],
            f"{np.mean(rho):.2f}, {np.mean(rho_last):.2f}" if rho else "-",
            f"{np.mean(spread):.2f}" if spread else "-",
            f"{np.mean([m['wall_min'] for m in per]):.1f}",
            f"{np.mean([m['mb'] for m in per]):.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


ROUNDS = (1, 2, 3, 5, 10, 20, 30, 40)


def rho_by_round(folder: Path) -> str:
    """cka_label_spearman at a few rounds, mean over the seeds, for every variant that logs it."""
    lines = ["| variant | " + " | ".join(f"r{r}" for r in ROUNDS) + " |", "|" + "---|" * (len(ROUNDS) + 1)]
    for run_variant in [v for v in ORDER if v != "fedavg" and v != "fedprox"]:
        per_seed = [
            dict(server_series(d, "cka_label_spearman"))
            for d in sorted(folder.glob(f"s*-{run_variant}"))
            if finished(d)
        ]
        if not any(per_seed):
            continue
        cells = []
        for r in ROUNDS:
            values = [s[r] for s in per_seed if r in s]
            cells.append(f"{np.mean(values):.2f}" if values else "-")
        lines.append(f"| {LABELS[run_variant]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for setting in ("ck2", "dir0.1", "dir0.5"):
        if (root / setting).is_dir():
            print(f"\n### FMNIST {setting}\n\n{table(root / setting)}")
            print(f"\ncka_label_spearman by round (mean over seeds):\n\n{rho_by_round(root / setting)}")
