"""A reproduced table's figures, one panel per cell, each method's mean over its finished seeds:

- `rounds` (curves.png): test accuracy against the rounds, the band from the lowest to the highest seed;
- `mb` (curves_mb.png): test accuracy against the megabytes moved up and down so far (FedAF's paper
  leads with this picture); a method that moves all its bytes in its first round (a one-shot method)
  is a point, its table figure at its bytes, not a vertical line;
- `compute` (curves_compute.png): test accuracy against the work done so far, clients' and server's:
  multiply-accumulates where every run of the panel counted them (eval.count_macs), else seconds;
- `pareto` (pareto.png): each method's table figure (mean, bar: std over seeds) against the megabytes
  it moved in all, on a log axis, with the front of the methods no other beats on both.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from raysim.outputs.safe_write import atomic_write
from raysim.plots import integer_ticks, mpl, new_figure
from raysim.results import mb_moved, stat

FIGURE_FILES = {"rounds": "curves.png", "mb": "curves_mb.png", "compute": "curves_compute.png", "pareto": "pareto.png"}
PARETO_LABEL = "pareto-label"  # the gid of the Pareto panel's method labels
LABEL_POINTS = 7  # their font size
X_LABELS = {
    "rounds": "round",
    "mb": "MB moved (up + down, cumulative)",
    "macs": "compute (GMACs, clients + server, cumulative)",
    "compute_s": "compute (seconds, clients + server, cumulative)",
    "pareto": "MB moved in all (up + down, log scale)",
}


def method_styles(table) -> dict[str, dict[str, Any]]:
    """Each of the table's methods' colour and line style, the same in every panel and picture: up to
    10 methods tab10's colours with solid lines; beyond, tab20's colours, each ten methods in a line
    style of their own (solid, dashed, dotted, dash-dot), so that no two of the benchmark's methods
    look alike."""
    colormaps = mpl().colormaps
    names = list(table.methods)
    if len(names) <= 10:
        return {name: {"color": colormaps["tab10"](i), "linestyle": "-"} for i, name in enumerate(names)}
    tab20 = colormaps["tab20"]
    styles = ("-", "--", ":", "-.")
    return {
        name: {"color": tab20((2 * i) % 20 + (i // 10) % 2), "linestyle": styles[(i // 10) % len(styles)]}
        for i, name in enumerate(names)
    }


def write_curves(table, measured, cells: list[str], methods: list[str], path: Path, axis: str = "rounds") -> Path:
    columns = min(3, len(cells))
    rows = math.ceil(len(cells) / columns)
    fig = new_figure(figsize=(5 * columns, 3.6 * rows), dpi=100)
    pareto_labels: dict[Any, tuple[list, list]] = {}  # axes: its points and their labels
    for i, cell in enumerate(cells):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.set_ylabel("test accuracy (%)")
        present = [m for m in methods if measured.get((cell, m)) is not None and measured[(cell, m)].records]
        if axis == "pareto":
            pareto_labels[ax] = _pareto_panel(ax, table, measured, cell, present)
        else:
            _curves_panel(ax, table, measured, cell, present, axis)
        ax.set_title(table.cells[cell].label, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7 if len(present) > 8 else 8, ncols=2 if len(present) > 8 else 1)
    fig.suptitle(textwrap.fill(table.title, 55 * columns), fontsize=11)  # wrapped to the figure's width
    _lay_out(fig, pareto_labels)

    atomic_write(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".")))  # never through a link
    return path


def _lay_out(fig, pareto_labels: dict[Any, tuple[list, list]]) -> None:
    """tight_layout, then the Pareto panels' labels placed again where they meet: the layout moves
    and resizes the axes, and the labels' pixels with them (their places are in data units)."""
    fig.tight_layout()
    for _ in range(3):
        meeting = [ax for ax in pareto_labels if _labels_meet(ax)]
        if not meeting:
            return
        for ax in meeting:
            _labels_apart(ax, *pareto_labels[ax])
        fig.tight_layout()


def _curves_panel(ax, table, measured, cell: str, methods: list[str], axis: str) -> None:
    curve = {"mb": "mb_moved", "compute": _compute_curve(measured, cell, methods)}.get(axis)
    styles = method_styles(table)
    for method in methods:
        m = measured[(cell, method)]
        curves = [r.curves() for r in m.records]
        rounds = sorted(set().union(*(c["accuracy"][0].tolist() for c in curves)))
        if not rounds or (curve is not None and any(curve not in c for c in curves)):
            continue
        label, style = table.methods[method].label, styles[method]
        if axis == "mb" and all(_moved_at_once(c["mb_moved"]) for c in curves) and len(rounds) > 1:
            figure = m.stat(table.metric)
            bytes_ = stat([mb_moved(r.summary) for r in m.records]).mean
            spread = [figure.std or 0]
            ax.errorbar([bytes_], [figure.mean], yerr=spread, marker="D", capsize=3, label=label, color=style["color"])
            continue
        # a seed without an evaluation at some round leaves a gap there, not the whole curve
        values = np.array([_at(c["accuracy"], rounds) for c in curves]) * 100
        x = np.array(rounds, dtype=float)
        if curve is not None:
            x = np.nanmean([_at(c[curve], rounds) for c in curves], axis=0) / (1e9 if curve == "macs" else 1)
        mean = np.nanmean(values, axis=0)
        marker = "o" if len(rounds) <= 3 else None  # a method evaluated once or twice is a point or two
        line = ax.plot(x, mean, label=label, marker=marker, **style)[0]
        if len(curves) > 1:
            low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
            ax.fill_between(x, low, high, alpha=0.2, color=line.get_color())
    ax.set_xlabel(X_LABELS["rounds" if curve is None else "mb" if curve == "mb_moved" else curve])
    if axis == "rounds":
        ax.xaxis.set_major_locator(integer_ticks())


def _compute_curve(measured, cell: str, methods: list[str]) -> str:
    """MACs when every run of the panel counted them, else seconds (one unit per panel)."""
    records = [r for m in methods for r in measured[(cell, m)].records]
    return "macs" if records and all("macs" in r.curves() for r in records) else "compute_s"


def _moved_at_once(series: tuple[np.ndarray, np.ndarray]) -> bool:
    """All of a run's bytes moved in its first round (and some moved)."""
    values = series[1]
    return len(values) > 1 and values[-1] > 0 and values[0] == values[-1]


def _pareto_panel(ax, table, measured, cell: str, methods: list[str]) -> tuple[list, list]:
    """The panel; returns its points and labels, for placing the labels again after the layout."""
    points, labels, styles = [], [], method_styles(table)
    for method in methods:
        m = measured[(cell, method)]
        figure, moved = m.stat(table.metric_of(method)), stat([mb_moved(r.summary) for r in m.records])
        if figure.mean is None or moved.mean is None or moved.mean <= 0:
            continue
        colour = styles[method]["color"]
        ax.errorbar([moved.mean], [figure.mean], yerr=[figure.std or 0], fmt="o", capsize=3, color=colour)
        points.append((moved.mean, figure.mean))
        labels.append(table.methods[method].label)
    ax.set_xscale("log")
    _span_a_decade(ax, points)
    _labels_apart(ax, points, labels)
    front = pareto_front(points)
    if front:
        xs, ys = zip(*front)
        ax.step(xs, ys, where="post", color="black", alpha=0.6, label="front: no method moves less for more")
    ax.set_xlabel(X_LABELS["pareto"])
    readings = dict.fromkeys(_reading(table.metric_of(method)) for method in methods)
    ax.set_ylabel(f"{' or '.join(readings) or _reading(table.metric)} test accuracy (%)")
    return points, labels


def _reading(metric: str) -> str:
    """A summary reading as the axis names it: last5_accuracy -> last-5."""
    return metric.replace("_accuracy", "").replace("last5", "last-5")


def _span_a_decade(ax, points: list[tuple[float, float]]) -> None:
    """A panel whose points lie within a factor 10 of bytes shows a decade around them. Otherwise
    the axis spans only their spread (the one-shot methods of a cell can move the same bytes to
    within a few bytes), and a label placed right of the points would lie millions of pixels out."""
    if not points:
        return
    low, high = min(x for x, _ in points), max(x for x, _ in points)
    if high < 10 * low:
        middle = math.sqrt(low * high)
        ax.set_xlim(middle / 4, middle * 4)


def _labels_apart(ax, points: list[tuple[float, float]], labels: list[str]) -> None:
    """Each point's label to its right; the labels of points at about the same bytes (within 1.5x:
    the methods that move what FedAvg moves, and those a little beyond) in one column right of the
    group, spread apart vertically so that none covers another, each joined to its point by a thin
    line where it had to move. Groups whose labels still meet or nearly (a long label reaching the
    next group's) become one, their labels in one column right of both, so that no line to a point
    crosses another label. Call with the axis scales set: the check is in the figure's pixels.
    Labels it placed before are taken away first."""
    for text in _labels_of(ax):
        text.remove()
    low, high = ax.get_ylim()
    # a twentieth of the axis, or a label's height (with air) where the panel is short for that
    letters = LABEL_POINTS * ax.figure.dpi / 72 * 1.4 * (high - low) / max(ax.bbox.height, 1.0)
    gap = max((high - low) * 0.05, letters)
    groups: list[list[int]] = []
    for i in sorted(range(len(points)), key=lambda i: points[i]):
        if groups and points[i][0] <= points[groups[-1][0]][0] * 1.5:
            groups[-1].append(i)
        else:
            groups.append([i])
    groups = [sorted(group, key=lambda i: points[i][1]) for group in groups]
    while True:
        texts = [
            [_label(ax, points[i], labels[i], _column(group, points), y, gap) for i, y in _spread(group, points, gap)]
            for group in groups
        ]
        boxes = [[_words_box(text) for text in group] for group in texts]
        meet = next(
            (
                (a, b)
                for a in range(len(boxes))
                for b in range(a + 1, len(boxes))
                if any(p.overlaps(q) for p in boxes[a] for q in boxes[b])
            ),
            None,
        )
        if meet is None:
            return
        for text in (t for group in texts for t in group):
            text.remove()
        a, b = meet
        groups[a] = sorted(groups[a] + groups.pop(b), key=lambda i: points[i][1])


def _labels_of(ax) -> list:
    return [text for text in ax.texts if text.get_gid() == PARETO_LABEL]


def _labels_meet(ax) -> bool:
    boxes = [_words_box(text) for text in _labels_of(ax)]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[:i])


def _column(group: list[int], points) -> float:
    """Where a group's labels start: a little right of its rightmost point."""
    return max(points[i][0] for i in group) * 1.12


def _spread(group: list[int], points, gap: float) -> list[tuple[int, float]]:
    """(point, label height) for a group's points by height: at least `gap` apart, centred on them."""
    placed: list[float] = []
    for i in group:
        placed.append(max(points[i][1], placed[-1] + gap) if placed else points[i][1])
    shift = (sum(placed) - sum(points[i][1] for i in group)) / len(group)
    return [(i, y - shift) for i, y in zip(group, placed)]


def _label(ax, point: tuple[float, float], label: str, column: float, y: float, gap: float):
    x, at = point
    moved = abs(y - at) > gap / 4 or column > x * 1.2
    return ax.annotate(
        label,
        point,
        xytext=(column, y),
        textcoords="data",
        fontsize=LABEL_POINTS,
        va="center",
        gid=PARETO_LABEL,
        arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "grey"} if moved else None,
    )


def _words_box(text):
    """The pixels of an annotation's words, without the line to its point, and half a letter's
    width either side: two labels closer than that read as one ("FedProx SCAFFOLD")."""
    text.get_window_extent()  # places the annotation for the figure's renderer
    letter = text.get_fontsize() * text.figure.dpi / 72 / 2
    return mpl().text.Text.get_window_extent(text).padded(letter / 2, 0)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (cost, accuracy) points no other point beats on both (less or equal cost and higher
    accuracy, or less cost and equal accuracy), by increasing cost."""
    front, best = [], -math.inf
    for cost, accuracy in sorted(points, key=lambda p: (p[0], -p[1])):
        if accuracy > best:
            front.append((cost, accuracy))
            best = accuracy
    return front


def _at(series: tuple[np.ndarray, np.ndarray], rounds: list[int]) -> list[float]:
    """A (rounds, values) series at the given rounds (NaN where it has none)."""
    by_round = dict(zip(series[0].tolist(), series[1].tolist()))
    return [by_round.get(r, np.nan) for r in rounds]
