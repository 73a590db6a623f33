"""A reproduced table: per cell and method the measured mean +- std beside the paper's figure, the
paper's orderings with the number of seeds on which each holds, the rounds to a target accuracy
where the paper counts them, and the accuracy curves.

Figures are in percent, as the papers give them; std is the sample standard deviation over seeds
(ddof 1, as `raysim report` computes it). An ordering "a > b" holds on a seed when a's figure
(the table's metric) is above b's on that seed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysim.reproduce.runs import PlannedRun, is_finished
from raysim.reproduce.table_file import METRICS, Table

SHORT = {"last5_accuracy": "last-5", "final_accuracy": "final", "best_accuracy": "best"}


@dataclass
class Measured:
    """The finished seeds of one (cell, method)."""

    seeds: list[int]
    summaries: list[dict[str, Any]]
    run_dirs: list[Path]

    def values(self, metric: str) -> list[float]:
        return [100 * s[metric] for s in self.summaries if s.get(metric) is not None]

    def by_seed(self, metric: str) -> dict[int, float]:
        return {seed: 100 * s[metric] for seed, s in zip(self.seeds, self.summaries) if s.get(metric) is not None}


def collect(runs: list[PlannedRun]) -> dict[tuple[str, str], Measured]:
    out: dict[tuple[str, str], Measured] = {}
    for run in runs:
        entry = out.setdefault((run.cell, run.method), Measured([], [], []))
        if is_finished(run):
            summary = run.run_dir.read_summary()
            entry.seeds.append(run.seed)
            entry.summaries.append(summary)
            entry.run_dirs.append(run.run_dir.path)
    return out


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def shown(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.1f}" if std is None else f"{mean:.1f} +- {std:.1f}"


def one_decimal(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ordering_rows(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str] | None = None
) -> list[dict[str, Any]]:
    """The paper's orderings in each cell, between methods that were run (all of the table's if
    `methods` is None)."""
    rows = []
    for cell_name in cells:
        cell = table.cells[cell_name]
        for a, b in table.cell_orderings(cell):
            if methods is not None and (a not in methods or b not in methods):
                continue
            one = measured.get((cell_name, a), Measured([], [], [])).by_seed(table.metric)
            two = measured.get((cell_name, b), Measured([], [], [])).by_seed(table.metric)
            both = sorted(set(one) & set(two))
            rows.append(
                {
                    "cell": cell_name,
                    "ordering": f"{a} > {b}",
                    "paper": f"{cell.paper[a][0]:g} vs {cell.paper[b][0]:g}",
                    "holds_in_paper": cell.paper[a][0] > cell.paper[b][0],
                    "holds": sum(one[s] > two[s] for s in both),
                    "seeds": len(both),
                }
            )
    return rows


def method_rows(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for cell_name in cells:
        cell = table.cells[cell_name]
        for method in methods:
            m = measured.get((cell_name, method), Measured([], [], []))
            paper = cell.paper.get(method)
            row: dict[str, Any] = {
                "cell": cell_name,
                "method": method,
                "seeds": len(m.values(table.metric)),
                "paper_mean": paper[0] if paper else None,
                "paper_std": paper[1] if paper else None,
            }
            for metric in METRICS:
                row[f"{SHORT[metric]}_mean"], row[f"{SHORT[metric]}_std"] = mean_std(m.values(metric))
            row["per_seed"] = " ".join(f"{v:.1f}" for v in m.values(table.metric))
            walls = [s["wall_time_s"] / 60 for s in m.summaries if s.get("wall_time_s") is not None]
            moved = [(s.get("bytes_up", 0) + s.get("bytes_down", 0)) / 1e6 for s in m.summaries]
            row["wall_min"] = float(np.mean(walls)) if walls else None
            row["mb_moved"] = float(np.mean(moved)) if moved else None
            rows.append(row)
    return rows


def rounds_rows(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str]
) -> list[dict[str, Any]]:
    """Rounds to a target accuracy, per cell, method and target: the targets the paper gives figures for
    and those the runs were asked for (eval.targets), measured as `raysim report` shows them."""
    from raysim.report import rounds_to

    rows = []
    for cell_name in cells:
        cell = table.cells[cell_name]
        for method in methods:
            m = measured.get((cell_name, method), Measured([], [], []))
            paper = cell.paper_rounds.get(method, {})
            asked = {t for s in m.summaries for t in s.get("rounds_to_accuracy") or {}}
            for target in sorted(set(paper) | asked, key=float):
                reached = [s["rounds_to_accuracy"].get(target) for s in m.summaries if s.get("rounds_to_accuracy")]
                rows.append(
                    {
                        "cell": cell_name,
                        "method": method,
                        "target": target,
                        "paper_rounds": _paper_rounds(paper, target),
                        "rounds": rounds_to(m.summaries, target),
                        "reached": sum(r is not None for r in reached),
                        "seeds": len(reached),
                    }
                )
    return rows


def _paper_rounds(paper: dict[str, int | None], target: str) -> str:
    """The paper's rounds to `target` as shown: a number, '-' (never reached), '' (no figure)."""
    if target not in paper:
        return ""
    return "-" if paper[target] is None else str(paper[target])


def write_outputs(
    table: Table, scale: str, runs: list[PlannedRun], out: Path, cells: list[str], methods: list[str]
) -> list[Path]:
    """DIR/table.md, DIR/table.csv and DIR/curves.png from the finished runs."""
    from raysim.outputs.files import write_text

    measured = collect(runs)
    rows = method_rows(table, measured, cells, methods)
    orderings = ordering_rows(table, measured, cells, methods)
    rounds = rounds_rows(table, measured, cells, methods)
    write_text(out / "table.md", markdown(table, scale, rows, orderings, rounds))
    write_text(out / "table.csv", as_csv(table, scale, rows, orderings, rounds))
    written = [out / "table.md", out / "table.csv"]
    if any(m.seeds for m in measured.values()):
        from raysim.reproduce.curves import write_curves

        written.append(write_curves(table, measured, cells, methods, out / "curves.png"))
    return written


def markdown(
    table: Table,
    scale: str,
    rows: list[dict[str, Any]],
    orderings: list[dict[str, Any]],
    rounds: list[dict[str, Any]] = (),
) -> str:
    keys = [SHORT[table.metric]] + [SHORT[m] for m in METRICS if m != table.metric]
    lines = [
        f"# {table.title}",
        "",
        f"Table `{table.name}` at {scale} scale ({table.source}). Accuracy in percent: mean +- std over the "
        f"finished seeds (sample std); the paper's figure is at its own scale. Per seed: {keys[0]}.",
        "",
        f"| cell | method | paper | {' | '.join(keys)} | per seed | seeds | wall (min) | MB moved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = " | ".join(shown(r[f"{k}_mean"], r[f"{k}_std"]) for k in keys)
        lines.append(
            f"| {table.cells[r['cell']].label} | {table.methods[r['method']].label} "
            f"| {shown(r['paper_mean'], r['paper_std'])} | {measured} | {r['per_seed'] or '-'} | {r['seeds']} "
            f"| {one_decimal(r['wall_min'])} | {one_decimal(r['mb_moved'])} |"
        )
    if orderings:
        lines += [
            "",
            f"Orderings ({keys[0]}, seed by seed):",
            "",
            "| cell | ordering | paper | holds in the paper | holds here |",
            "|---|---|---|---|---|",
        ]
        for o in orderings:
            lines.append(
                f"| {table.cells[o['cell']].label} | {o['ordering']} | {o['paper']} "
                f"| {'yes' if o['holds_in_paper'] else 'no'} | {o['holds']} of {o['seeds']} seeds |"
            )
    if rounds:
        lines += [
            "",
            "Rounds to a target test accuracy (the first round reaching it, mean +- std over seeds; `>R`: a seed",
            "did not reach it in its R rounds, with (k/n) the seeds that did; the paper's `-`: never reached):",
            "",
            "| cell | method | target | paper | measured |",
            "|---|---|---|---|---|",
        ]
        for r in rounds:
            lines.append(
                f"| {table.cells[r['cell']].label} | {table.methods[r['method']].label} | {r['target']} "
                f"| {r['paper_rounds']} | {r['rounds']} |"
            )
    return "\n".join(lines) + "\n"


def as_csv(
    table: Table,
    scale: str,
    rows: list[dict[str, Any]],
    orderings: list[dict[str, Any]],
    rounds: list[dict[str, Any]] = (),
) -> str:
    buffer = io.StringIO()
    fields = ["table", "scale", "kind", "cell", "method", *[k for k in rows[0] if k not in ("cell", "method")]]
    fields += ["ordering", "holds_in_paper", "holds", "target", "paper_rounds", "rounds", "reached"]
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({"table": table.name, "scale": scale, "kind": "method", **_rounded(r)})
    for o in orderings:
        writer.writerow(
            {"table": table.name, "scale": scale, "kind": "ordering", **{k: v for k, v in o.items() if k != "paper"}}
        )
    for r in rounds:
        writer.writerow({"table": table.name, "scale": scale, "kind": "rounds", **r})
    return buffer.getvalue()


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
