"""DIR/curves.png of a reproduced table: per cell, each method's test accuracy over the rounds
(the mean over its finished seeds, the band from the lowest to the highest seed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def write_curves(table, measured, cells: list[str], methods: list[str], path: Path) -> Path:
    from raysim.report import read_curves

    columns = min(3, len(cells))
    rows = math.ceil(len(cells) / columns)
    fig = Figure(figsize=(5 * columns, 3.6 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for i, cell in enumerate(cells):
        ax = fig.add_subplot(rows, columns, i + 1)
        for method in methods:
            m = measured.get((cell, method))
            if m is None or not m.run_dirs:
                continue
            series = [read_curves(d)["accuracy"] for d in m.run_dirs]
            rounds = sorted(set().union(*(r.tolist() for r, _ in series)))
            if not rounds:
                continue
            # a seed without an evaluation at some round leaves a gap there, not the whole curve
            values = np.array([[dict(zip(r.tolist(), v)).get(x, np.nan) for x in rounds] for r, v in series]) * 100
            line = ax.plot(rounds, np.nanmean(values, axis=0), label=table.methods[method].label)[0]
            if len(series) > 1:
                low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
                ax.fill_between(rounds, low, high, alpha=0.2, color=line.get_color())
        ax.set_title(table.cells[cell].label, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.suptitle(table.title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
