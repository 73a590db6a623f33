"""Each paper's ordering beside a table's own: for a table with no paper figures of its own (the
benchmark), the methods a paper compares, ranked by that paper's figures in one of its cells, and the
same methods ranked by this table's measurement on its nearest cell, pair by pair.

A table file names the comparisons under `paper_orderings`:

    paper_orderings:
      fedaf_cifar10:                 # a name for the section
        table: fedaf_table1          # a shipped paper table: the figures are read from there (one place)
        cell: cifar10_alpha0.1       # that table's cell
        beside: cifar10_dir0.1       # this table's nearest cell
        methods: {dcfl: dcfl}        # optional: the paper table's method -> this table's (default: same name)
        causes: {"feddyn > fedaf": "..."}   # optional: the cause found where a pair differs

Every pair of methods that both the paper's cell and the measurement rank is listed with the paper's
order, and whether the measurement agrees (its mean over seeds of each method's ranking reading; equal
means are a tie).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raysim.errors import need


@dataclass
class PaperOrdering:
    """One paper cell set beside one of this table's cells."""

    table: str
    cell: str
    beside: str
    methods: dict[str, str] = field(default_factory=dict)  # the paper table's method -> this table's
    causes: dict[str, str] = field(default_factory=dict)  # "a > b" (this table's names) -> the cause found
    label: str = ""
    name: str = field(default="", init=False)


def check(ordering: PaperOrdering, cells: set[str], methods: set[str], paper_cells: set[str]) -> None:
    """One-line errors for an entry that names what does not exist (`paper_cells`: its table's cells)."""
    need(ordering.beside in cells, f"paper_orderings {ordering.name}: 'beside' names no cell of this table")
    need(
        ordering.cell in paper_cells,
        f"paper_orderings {ordering.name}: table {ordering.table} has no cell {ordering.cell}",
    )
    unknown = sorted(set(ordering.methods.values()) - methods)
    need(not unknown, f"paper_orderings {ordering.name}: methods maps to unknown method(s) {', '.join(unknown)}")


def paper_figures(ordering: PaperOrdering, figures: dict[str, tuple[float, float | None]]) -> dict[str, float]:
    """The paper's figure (mean, %) of each method it gives in its cell (`figures`: that cell's
    `paper`), by this table's method names."""
    return {ordering.methods.get(m, m): mean for m, (mean, _) in figures.items()}


def comparison_rows(
    ordering: PaperOrdering, paper: dict[str, float], measured: dict[str, float]
) -> list[dict[str, Any]]:
    """Per pair of methods ranked by both, in the paper's order (a above b in the paper): the paper's
    figures (`paper`: method -> %), the measured ones (`measured`: method -> mean %), whether the
    measurement agrees, the cause."""
    common = sorted((m for m in paper if m in measured), key=lambda m: -paper[m])
    rows = []
    for i, a in enumerate(common):
        for b in common[i + 1 :]:
            if paper[a] == paper[b]:
                continue
            pair = f"{a} > {b}"
            rows.append(
                {
                    "section": ordering.name,
                    "ordering": pair,
                    "paper": f"{paper[a]:g} vs {paper[b]:g}",
                    "measured": f"{measured[a]:.1f} vs {measured[b]:.1f}",
                    "agrees": None if measured[a] == measured[b] else measured[a] > measured[b],
                    "cause": ordering.causes.get(pair, ordering.causes.get(f"{b} > {a}", "")),
                }
            )
    return rows


def _agrees(value: bool | None) -> str:
    return "tie" if value is None else ("yes" if value else "no")


def ranking(figures: dict[str, float], methods: list[str], labels: dict[str, str]) -> str:
    """'A > B > C' over `methods`, by `figures` (highest first)."""
    ranked = sorted(methods, key=lambda m: -figures[m])
    return " > ".join(f"{labels.get(m, m)} ({figures[m]:.1f})" for m in ranked)


def markdown(
    orderings: dict[str, PaperOrdering],
    papers: dict[str, dict[str, float]],
    measured: dict[tuple[str, str], float],
    labels: dict[str, str],
    cell_labels: dict[str, str],
    reading: str,
) -> list[str]:
    """The sections of table.md: per paper cell, both orderings and the pairs (`measured`: (cell,
    method) -> the mean over seeds of the method's ranking reading, in %; `papers`: section -> the
    paper's figures by this table's method names)."""
    if not orderings:
        return []
    lines = ["", "## Each paper's ordering beside the benchmark's", ""]
    lines.append(
        f"The paper's figures are its own (its scale, its setting); the measurement is this table's {reading} on "
        "its nearest cell. A pair agrees when the method the paper puts above is above here too (means over seeds)."
    )
    for name, o in orderings.items():
        mine = {m: v for (cell, m), v in measured.items() if cell == o.beside}
        paper = papers[name]
        common = [m for m in paper if m in mine]
        rows = comparison_rows(o, paper, mine)
        title = o.label or f"{o.table}, {o.cell}"
        lines += ["", f"### {title} beside {cell_labels.get(o.beside, o.beside)}", ""]
        if len(common) < 2:
            lines.append("Fewer than two of the paper's methods are measured on this cell yet.")
            continue
        agree = sum(r["agrees"] is True for r in rows)
        lines += [
            f"- The paper: {ranking(paper, common, labels)}",
            f"- Measured: {ranking(mine, common, labels)}",
            f"- {agree} of {len(rows)} pairs agree.",
            "",
            "| pair (the paper's order) | paper | measured | agrees | cause found |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            a, b = r["ordering"].split(" > ")
            lines.append(
                f"| {labels.get(a, a)} > {labels.get(b, b)} | {r['paper']} | {r['measured']} "
                f"| {_agrees(r['agrees'])} | {r['cause'] or '-'} |"
            )
    return lines
