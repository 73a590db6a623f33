"""A reproduced table's files: per cell and method the measured mean +- std beside the paper's
figure (table.md, table.csv), the paper's orderings with the number of seeds on which each holds,
the rounds to a target accuracy where the paper counts them, the table's extra readings, and the
accuracy curves (curves.png; curves_mb.png against the megabytes moved).

Every number comes from raysim.results (the runs read through RunDir; mean and sample std over the
seeds, as `raysim report` gives them). Figures are in percent, as the papers give them. An ordering
"a > b" holds on a seed when a's figure (the table's metric) is above b's on that seed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.errors import RaysimError
from raysim.outputs.run_dir import BEYOND_RECORD
from raysim.outputs.safe_write import write_text
from raysim.reproduce import paper_orderings
from raysim.reproduce.curves import FIGURE_FILES, write_curves
from raysim.reproduce.runs import PlannedRun, is_finished
from raysim.reproduce.table_file import METRICS, Table, load_table
from raysim.results import RunRecord, Stat, cost_to, mb_moved, read_run, rounds_to, stat

# Each reading's key in table.csv and the rows (`best`: the best test accuracy over the rounds;
# `selected`: the test accuracy of the model eval.selection chose without the test set) ...
SHORT = {
    "last5_accuracy": "last-5",
    "final_accuracy": "final",
    "best_accuracy": "best",
    "selected_accuracy": "selected",
}
# ... and its heading in table.md, where the reader is told which figure looked at the test set.
LABEL = {**SHORT, "best_accuracy": "best (test-selected)"}


@dataclass
class Measured:
    """The finished seeds of one (cell, method), each run as read by raysim.results."""

    seeds: list[int] = field(default_factory=list)
    records: list[RunRecord] = field(default_factory=list)

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return [r.summary for r in self.records]

    def values(self, key: str, scale: float = 100.0) -> list[float]:
        """The seeds' summary.json numbers under `key`, times `scale` (accuracies in percent)."""
        return [v * scale for r in self.records if (v := r.value(key)) is not None]

    def by_seed(self, metric: str) -> dict[int, float]:
        return {seed: 100 * v for seed, r in zip(self.seeds, self.records) if (v := r.value(metric)) is not None}

    def stat(self, key: str, scale: float = 100.0) -> Stat:
        return stat(self.values(key, scale))

    def diverged(self) -> str:
        """The seeds whose model diverged (raysim.results: test loss not finite), with the round, or ''."""
        rounds = [(seed, r.diverged_at()) for seed, r in zip(self.seeds, self.records)]
        return "; ".join(f"seed {seed} at round {at}" for seed, at in rounds if at is not None)


def collect(runs: list[PlannedRun]) -> dict[tuple[str, str], Measured]:
    out: dict[tuple[str, str], Measured] = {}
    for run in runs:
        entry = out.setdefault((run.cell, run.method), Measured())
        if is_finished(run):
            entry.seeds.append(run.seed)
            entry.records.append(read_run(run.run_dir.path))
    return out


def shown(mean: float | None, std: float | None, digits: int = 1) -> str:
    """A figure as the table shows it (a percent: one decimal), in raysim.results' form."""
    return Stat(mean, std, 0).shown(digits=digits)


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
            one = measured.get((cell_name, a), Measured()).by_seed(table.metric)
            two = measured.get((cell_name, b), Measured()).by_seed(table.metric)
            both = sorted(set(one) & set(two))
            rows.append(
                {
                    "cell": cell_name,
                    "ordering": f"{a} > {b}",
                    "paper": f"{cell.paper[a][0]:g} vs {cell.paper[b][0]:g}" if a in cell.paper else "",
                    "holds_in_paper": cell.paper[a][0] > cell.paper[b][0] if a in cell.paper else None,
                    "holds": sum(one[s] > two[s] for s in both),
                    "seeds": len(both),
                }
            )
    return rows


CACHED_MARK = "*"  # beside a wall time that leaves out a client stage read from the cache


def method_rows(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for cell_name in cells:
        cell = table.cells[cell_name]
        for method in methods:
            m = measured.get((cell_name, method), Measured())
            paper = cell.paper.get(method)
            row: dict[str, Any] = {
                "cell": cell_name,
                "method": method,
                "seeds": m.stat(table.metric).n,
                "paper_mean": paper[0] if paper else None,
                "paper_std": paper[1] if paper else None,
            }
            for metric in METRICS:
                value = m.stat(metric)
                row[f"{SHORT[metric]}_mean"], row[f"{SHORT[metric]}_std"] = value.mean, value.std
            row["per_seed"] = " ".join(f"{v:.1f}" for v in m.values(table.metric))
            row["wall_min"] = m.stat("wall_time_s", 1 / 60).mean
            # runs whose one-shot client stage came from the cache: their minutes do not include it
            row["wall_cached_runs"] = sum(bool(s.get("client_stage_cached")) for s in m.summaries)
            row["mb_moved"] = stat([mb_moved(s) for s in m.summaries]).mean
            row["diverged"] = m.diverged()
            for key, extra in table.extra.items():
                value = m.stat(key, extra.scale)
                row[f"{key}_mean"], row[f"{key}_std"] = value.mean, value.std
            rows.append(row)
    return rows


def rounds_rows(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str]
) -> list[dict[str, Any]]:
    """Rounds to a target accuracy, per cell, method and target: the targets the paper gives figures for
    and those the runs were asked for (eval.targets), measured as `raysim report` shows them."""
    rows = []
    for cell_name in cells:
        cell = table.cells[cell_name]
        for method in methods:
            m = measured.get((cell_name, method), Measured())
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


# what a leaderboard shows of a run's spending: (key, heading, curve or summary.json key, scale)
SPENT = (
    ("client_s", "clients (s)", "compute_s_clients", 1.0),
    ("server_s", "server (s)", "compute_s_server", 1.0),
    ("client_gmacs", "clients (GMACs)", "macs_clients", 1e-9),
    ("server_gmacs", "server (GMACs)", "macs_server", 1e-9),
)
# summary.json readings a leaderboard shows: (key, heading, summary key, scale, digits)
READINGS = (
    ("mb_up", "MB up", "bytes_up", 1e-6, 1),
    ("mb_down", "MB down", "bytes_down", 1e-6, 1),
    ("client_peak_mb", "peak MB, a client actor", "peak_memory_mb.clients", 1.0, 0),
    ("server_peak_mb", "peak MB, server", "peak_memory_mb.server", 1.0, 0),
)


def leaderboard_rows(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str]
) -> list[dict[str, Any]]:
    """Per cell, the methods with finished seeds ranked by the table's metric (mean over seeds), each
    with what it spent (mean over seeds): megabytes in all and to each eval.targets accuracy, the
    clients' and the server's compute in seconds and, where counted, MACs, and the peak memory."""
    rows = []
    for cell_name in cells:
        ranked = []
        for method in methods:
            m = measured.get((cell_name, method), Measured())
            figure = m.stat(table.metric_of(method))
            if figure.mean is None:
                continue
            row: dict[str, Any] = {"cell": cell_name, "method": method, "seeds": figure.n}
            row["reading"] = SHORT[table.metric_of(method)]
            row["mean"], row["std"] = figure.mean, figure.std
            for metric in METRICS:
                row[SHORT[metric]] = m.stat(metric).mean
            row["mb"] = stat([mb_moved(s) for s in m.summaries]).mean  # as method_rows reads it
            for key, _, curve, scale in SPENT:
                spent = stat([r.total(curve) for r in m.records])
                row[key] = None if spent.mean is None else spent.mean * scale
            for key, _, summary_key, scale, _ in READINGS:
                row[key] = m.stat(summary_key, scale).mean
            targets = sorted({t for s in m.summaries for t in s.get("rounds_to_accuracy") or {}}, key=float)
            row["mb_to"] = {t: cost_to(m.records, t) for t in targets}
            row["diverged"] = m.diverged()
            ranked.append(row)
        ranked.sort(key=lambda r: -r["mean"])
        rows += [{**r, "rank": i + 1} for i, r in enumerate(ranked)]
    return rows


def _leaderboard_markdown(table: Table, rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for cell_name in dict.fromkeys(r["cell"] for r in rows):
        mine = [r for r in rows if r["cell"] == cell_name]
        targets = list(dict.fromkeys(t for r in mine for t in r["mb_to"]))
        key = SHORT[table.metric]
        mixed = any(r["reading"] != key for r in mine)
        headings = ["ranked by (%)" if mixed else f"{key} (%)", LABEL["best_accuracy"], "final"]
        headings += ["MB up / down", "MB in all"]
        headings += [f"MB to {float(t) * 100:g}%" for t in targets]
        headings += [h for _, h, _, _ in SPENT] + [h for _, h, _, _, _ in READINGS[2:]]
        readings = ", ".join(f"{r['reading']}: {table.methods[r['method']].label}" for r in mine if r["reading"] != key)
        ranked_by = f"{key}; {readings}" if mixed else key
        lines += [
            "",
            f"Leaderboard, {table.cells[cell_name].label} (ranked by {ranked_by}; spending: mean over seeds):",
            "",
        ]
        lines += [f"| # | method | {' | '.join(headings)} | seeds |", "|---|---|" + "---|" * (len(headings) + 1)]
        for r in mine:
            figure = shown(r["mean"], r["std"]) + (f" ({r['reading']})" if mixed else "")
            cells = [figure, _number(r["best"]), _number(r["final"])]
            cells += [f"{_number(r['mb_up'])} / {_number(r['mb_down'])}", _number(r["mb"])]
            cells += [_spent(r["mb_to"].get(t, "-")) for t in targets]
            cells += [_number(r[k]) for k, _, _, _ in SPENT]
            cells += [_number(r[k], digits=d) for k, _, _, _, d in READINGS[2:]]
            lines.append(f"| {r['rank']} | {table.methods[r['method']].label} | {' | '.join(cells)} | {r['seeds']} |")
        lines += _diverged_note(table, mine)
    return lines


def paper_orderings_markdown(
    table: Table, measured: dict[tuple[str, str], Measured], cells: list[str], methods: list[str]
) -> str:
    """The table's `paper_orderings` sections (raysim.reproduce.paper_orderings), each method read by
    the reading it is ranked by (Table.metric_of)."""
    if not table.paper_orderings:
        return ""
    means = {}
    for cell in cells:
        for method in methods:
            value = measured.get((cell, method), Measured()).stat(table.metric_of(method)).mean
            if value is not None:
                means[(cell, method)] = value
    labels = {name: m.label for name, m in table.methods.items()}
    cell_labels = {name: c.label for name, c in table.cells.items()}
    reading = SHORT[table.metric] + (
        " (a method's own reading where it has one)" if any(m.metric for m in table.methods.values()) else ""
    )
    papers = {
        name: paper_orderings.paper_figures(o, load_table(o.table).cells[o.cell].paper)
        for name, o in table.paper_orderings.items()
    }
    lines = paper_orderings.markdown(table.paper_orderings, papers, means, labels, cell_labels, reading)
    return "\n".join(lines) + "\n" if lines else ""


def _diverged_note(table: Table, rows: list[dict[str, Any]]) -> list[str]:
    """A line naming the runs whose model diverged, where any did: their accuracy from that round on
    is a constant guess, which a mean over seeds would otherwise hide."""
    runs = [
        f"{table.cells[r['cell']].label} / {table.methods[r['method']].label}: {r['diverged']}"
        for r in rows
        if r.get("diverged")
    ]
    if not runs:
        return []
    return ["", f"Diverged (the test loss not finite from that round on): {', '.join(runs)}."]


def _number(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def _spent(value: Stat | str) -> str:
    return value if isinstance(value, str) else value.shown(digits=1)


TABLE_FILES = ("table.md", "table.csv")
GITIGNORE = ".gitignore"  # a table's folder committed keeps each run's record only (raysim.outputs.run_dir)


def check_out(out: Path, table: Table) -> None:
    """Before any run: the files the table is written to (table.md, table.csv, its figures) can be
    written in --out, so that hours of runs never end in an error at the last step."""

    for name in (*TABLE_FILES, GITIGNORE, *(FIGURE_FILES[axis] for axis in table.figures)):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            raise RaysimError(
                f"--out '{out}' holds a folder named {name}, where the table writes its {name}: "
                "move or remove that folder, or choose another --out"
            )


def write_outputs(
    table: Table,
    scale: str,
    runs: list[PlannedRun],
    out: Path,
    cells: list[str],
    methods: list[str],
    command: str = "",
) -> list[Path]:
    """DIR/table.md, DIR/table.csv and the table's figures (curves.png, curves_mb.png) from the
    finished runs; `command` (the one that writes them) heads table.md. DIR/.gitignore leaves each
    run's record to version control (what the command reads to write the table again without
    running), not its checkpoints and events."""

    measured = collect(runs)
    rows = method_rows(table, measured, cells, methods)
    orderings = ordering_rows(table, measured, cells, methods)
    rounds = rounds_rows(table, measured, cells, methods)
    board = leaderboard_rows(table, measured, cells, methods) if table.leaderboard else []
    text = markdown(table, scale, rows, orderings, rounds, command, board)
    text += paper_orderings_markdown(table, measured, cells, methods)
    write_text(out / TABLE_FILES[0], text)
    write_text(out / TABLE_FILES[1], as_csv(table, scale, rows, orderings, rounds, board))
    header = "# Written by raysim reproduce: each run keeps its record here, not what resumes it.\n"
    write_text(out / GITIGNORE, header + "".join(f"{name}\n" for name in BEYOND_RECORD))
    written = [out / name for name in TABLE_FILES]
    if any(m.seeds for m in measured.values()):
        for axis in table.figures:
            written.append(write_curves(table, measured, cells, methods, out / FIGURE_FILES[axis], axis))
    return written


def markdown(
    table: Table,
    scale: str,
    rows: list[dict[str, Any]],
    orderings: list[dict[str, Any]],
    rounds: list[dict[str, Any]] = (),
    command: str = "",
    board: list[dict[str, Any]] = (),
) -> str:
    metrics = [table.metric] + [m for m in METRICS if m != table.metric]
    keys = [SHORT[m] for m in metrics]
    labels = [LABEL[m] for m in metrics]
    lines = [f"# {table.title}", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    if board:
        lines += _leaderboard_markdown(table, board)[1:] + ["", "All figures:", ""]
    lines += [
        f"Table `{table.name}` at {scale} scale ({table.source}). Accuracy in percent: mean +- std over the "
        f"finished seeds (sample std, n = seeds); the paper's figure is at its own scale. Per seed: {labels[0]}.",
        "",
        f"| cell | method | paper | {' | '.join(labels)} | per seed | seeds | wall (min) | MB moved |",
        "|---|---|---|" + "---|" * len(labels) + "---|---|---|---|",
    ]
    for r in rows:
        measured = " | ".join(shown(r[f"{k}_mean"], r[f"{k}_std"]) for k in keys)
        lines.append(
            f"| {table.cells[r['cell']].label} | {table.methods[r['method']].label} "
            f"| {shown(r['paper_mean'], r['paper_std'])} | {measured} | {r['per_seed'] or '-'} | {r['seeds']} "
            f"| {one_decimal(r['wall_min'])}{CACHED_MARK if r.get('wall_cached_runs') else ''} "
            f"| {one_decimal(r['mb_moved'])} |"
        )
    lines += _diverged_note(table, rows)
    if any(r.get("wall_cached_runs") for r in rows):
        lines += [
            "",
            f"Minutes marked {CACHED_MARK} leave out a client stage read from the cache (trained by another "
            "method's run of the seed).",
        ]
    if table.extra:
        readings = [extra.label + (" (%)" if extra.unit == "percent" else "") for extra in table.extra.values()]
        lines += ["", "Readings (summary.json, mean +- std over the seeds):", ""]
        lines += [f"| cell | method | {' | '.join(readings)} |", "|---|---|" + "---|" * len(readings)]
        for r in rows:
            values = [shown(r[f"{k}_mean"], r[f"{k}_std"], extra.digits) for k, extra in table.extra.items()]
            lines.append(
                f"| {table.cells[r['cell']].label} | {table.methods[r['method']].label} | {' | '.join(values)} |"
            )
    if orderings:
        lines += [
            "",
            f"Orderings ({labels[0]}, seed by seed):",
            "",
            "| cell | ordering | paper | holds in the paper | holds here |",
            "|---|---|---|---|---|",
        ]
        for o in orderings:
            lines.append(
                f"| {table.cells[o['cell']].label} | {o['ordering']} | {o['paper']} "
                f"| {_yes_no(o['holds_in_paper'])} | {o['holds']} of {o['seeds']} seeds |"
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
    board: list[dict[str, Any]] = (),
) -> str:
    buffer = io.StringIO()
    fields = ["table", "scale", "kind", "cell", "method", *[k for k in rows[0] if k not in ("cell", "method")]]
    fields += ["ordering", "holds_in_paper", "holds", "target", "paper_rounds", "rounds", "reached"]
    fields += ["rank", "mean", "std", *SHORT.values(), "mb", *(k for k, _, _, _ in SPENT), *(k for k, *_ in READINGS)]
    fields += ["mb_to"]
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
    for r in board:  # mb_to as target=MB pairs (">X (k/n)" where a seed never reached the target)
        mb_to = " ".join(f"{t}={_spent(v)}" for t, v in r["mb_to"].items())
        writer.writerow({"table": table.name, "scale": scale, "kind": "leaderboard", **_rounded(r), "mb_to": mb_to})
    return buffer.getvalue()


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
