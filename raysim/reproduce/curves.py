"""A reproduced table's figures: per cell, each method's test accuracy (the mean over its finished
seeds, the band from the lowest to the highest seed) against the rounds (curves.png) or against the
megabytes moved up and down so far (curves_mb.png: the mean over the seeds at each round; FedAF's
paper leads with this picture)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

FIGURE_FILES = {"rounds": "curves.png", "mb": "curves_mb.png"}
X_LABELS = {"rounds": "round", "mb": "MB moved (up + down, cumulative)"}


def write_curves(table, measured, cells: list[str], methods: list[str], path: Path, axis: str = "rounds") -> Path:
    columns = min(3, len(cells))
    rows = math.ceil(len(cells) / columns)
    fig = Figure(figsize=(5 * columns, 3.6 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for i, cell in enumerate(cells):
        ax = fig.add_subplot(rows, columns, i + 1)
        for method in methods:
            m = measured.get((cell, method))
            if m is None or not m.records:
                continue
            curves = [r.curves() for r in m.records]
            rounds = sorted(set().union(*(c["accuracy"][0].tolist() for c in curves)))
            if not rounds:
                continue
            # a seed without an evaluation at some round leaves a gap there, not the whole curve
            values = np.array([_at(c["accuracy"], rounds) for c in curves]) * 100
            x = (
                np.array(rounds, dtype=float)
                if axis == "rounds"
                else np.nanmean([_at(c["mb_moved"], rounds) for c in curves], axis=0)
            )
            mean = np.nanmean(values, axis=0)
            marker = "o" if len(rounds) <= 3 else None  # a one-shot method is a point or two, not a curve
            line = ax.plot(x, mean, label=table.methods[method].label, marker=marker)[0]
            if len(curves) > 1:
                low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
                ax.fill_between(x, low, high, alpha=0.2, color=line.get_color())
        ax.set_title(table.cells[cell].label, fontsize=10)
        ax.set_xlabel(X_LABELS[axis])
        if axis == "rounds":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(table.title, 55 * columns), fontsize=11)  # wrapped to the figure's width
    fig.tight_layout()
    from raysim.outputs.files import atomic_write

    atomic_write(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".")))  # never through a link
    return path


def _at(series: tuple[np.ndarray, np.ndarray], rounds: list[int]) -> list[float]:
    """A (rounds, values) series at the given rounds (NaN where it has none)."""
    by_round = dict(zip(series[0].tolist(), series[1].tolist()))
    return [by_round.get(r, np.nan) for r in rounds]
