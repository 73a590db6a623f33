"""Pictures of a partition, like the papers' partition figures, and of a clients x classes matrix.

Uses ``matplotlib.figure.Figure`` with the Agg canvas directly, never pyplot, so it works headless,
keeps no global figure registry and is safe in Ray workers. matplotlib is imported on the first
figure (`new_figure`, `mpl`), not with this module: it takes over a second to import, and a run or
a report that draws nothing never loads it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def mpl() -> ModuleType:
    """matplotlib, with the submodules raysim draws with loaded (colormaps, figure, text, ticker, the
    Agg backend): imported here, on first use, for the reason in the module docstring."""
    # lazy: matplotlib takes over a second to import, and only a figure needs it
    import matplotlib.backends.backend_agg
    import matplotlib.figure
    import matplotlib.text
    import matplotlib.ticker

    return matplotlib


def new_figure(**kwargs: Any) -> Figure:
    """A matplotlib Figure (its keyword arguments) on the Agg canvas."""
    matplotlib = mpl()
    fig = matplotlib.figure.Figure(**kwargs)
    matplotlib.backends.backend_agg.FigureCanvasAgg(fig)
    return fig


def integer_ticks(**kwargs: Any) -> Any:
    """A tick locator at integers (matplotlib's MaxNLocator with integer=True and `kwargs`)."""
    return mpl().ticker.MaxNLocator(integer=True, **kwargs)


# Above this many classes the y axis shows numbers instead of class names.
_MAX_NAMED_CLASSES = 40


def partition_figure(counts: np.ndarray, class_names: list[str] | None = None, title: str | None = None) -> Figure:
    """Bubble chart of a (clients, classes) count matrix.

    x is the client id, y the class, and each bubble's area is proportional to
    how many samples of that class the client holds (empty cells get no
    bubble). The figure grows with the number of clients and classes, within
    limits; the largest bubble's count is given in the x-axis label.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be a (clients, classes) matrix, got shape {counts.shape}")
    k, c = counts.shape
    if class_names is not None and len(class_names) != c:
        raise ValueError(f"{len(class_names)} class names for {c} classes")

    width = float(np.clip(2.0 + 0.3 * k, 6.0, 20.0))
    height = float(np.clip(1.5 + 0.35 * c, 3.5, 14.0))
    fig = new_figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot(1, 1, 1)

    peak = int(counts.max()) if counts.size else 0
    if peak > 0:
        # Largest bubble about 90% of one grid cell across (in points^2).
        cell_w = 72.0 * width * 0.8 / max(k, 1)
        cell_h = 72.0 * height * 0.8 / max(c, 1)
        max_area = (0.9 * min(cell_w, cell_h)) ** 2
        cli, cls = np.nonzero(counts > 0)
        areas = counts[cli, cls] / peak * max_area
        ax.scatter(cli, cls, s=areas, c="tab:blue", alpha=0.65, edgecolors="navy", linewidths=0.5)

    ax.set_xlim(-0.6, k - 0.4)
    ax.set_ylim(-0.6, c - 0.4)
    ax.xaxis.set_major_locator(integer_ticks(nbins=min(k, 25)))
    if class_names is not None and c <= _MAX_NAMED_CLASSES:
        ax.set_yticks(range(c))
        ax.set_yticklabels([str(n) for n in class_names])
    else:
        ax.yaxis.set_major_locator(integer_ticks(nbins=min(max(c, 1), 20)))
    ax.set_xlabel(f"client (largest bubble = {peak} samples)")
    ax.set_ylabel("class")
    ax.grid(True, linestyle=":", linewidth=0.5, alpha=0.5)
    ax.set_axisbelow(True)
    if title is None:
        title = f"Partition: {k} clients, {c} classes, {int(counts.sum())} samples"
    ax.set_title(title)
    fig.tight_layout()
    return fig


def matrix_figure(matrix: np.ndarray, title: str, xlabel: str, ylabel: str) -> Figure:
    """Heat map of a (rows, columns) matrix with its values written in the cells when it is small
    (FedHydra's stratification U_c, like the paper's Figure 5b)."""
    matrix = np.asarray(matrix, dtype=float)
    rows, cols = matrix.shape
    fig = new_figure(
        figsize=(float(np.clip(1.5 + 0.6 * cols, 5, 16)), float(np.clip(1.2 + 0.4 * rows, 3, 16))), dpi=100
    )
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(matrix, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax)
    if rows * cols <= 200:
        for i in range(rows):
            for j in range(cols):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=7, color="white")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def save_partition_plot(
    counts: np.ndarray,
    path: str | Path,
    class_names: list[str] | None = None,
    title: str | None = None,
) -> None:
    """Write :func:`partition_figure` as a PNG to ``path`` (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = partition_figure(counts, class_names=class_names, title=title)
    try:
        fig.savefig(path, format="png")
    finally:
        fig.clear()


# The panels of `curves_figure`: (key in each run's curves, y-axis label).
CURVE_PANELS = (("accuracy", "test accuracy"), ("loss", "test loss"), ("mb_moved", "cumulative MB moved (up + down)"))


def curves_figure(
    experiments: dict[str, list[dict[str, tuple[np.ndarray, np.ndarray]]]], title: str | None = None
) -> Figure:
    """Per-round curves of several experiments side by side: test accuracy, test loss, cumulative MB.

    ``experiments`` maps an experiment's label to its runs (one per seed), each run a mapping
    ``{"accuracy" | "loss" | "mb_moved": (rounds, values)}``. Each panel has one line per experiment,
    the mean over its seeds at each round (over the seeds that have that round), and, with more than
    one seed, a shaded band from the seeds' minimum to their maximum. One legend for all panels.
    """
    n = len(experiments)
    fig = new_figure(figsize=(15.0, 4.3 + 0.25 * ((n + 1) // 2)), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(CURVE_PANELS))
    handles = []
    for i, (label, runs) in enumerate(experiments.items()):
        color, handle = f"C{i % 10}", None
        for ax, (key, _) in zip(axes, CURVE_PANELS):
            by_round: dict[int, list[float]] = {}
            for run in runs:
                rounds, values = run.get(key, ((), ()))
                for r, v in zip(rounds, values):
                    by_round.setdefault(int(r), []).append(float(v))
            if not by_round:
                continue
            rounds = np.array(sorted(by_round))
            stacked = [np.array(by_round[r]) for r in rounds]
            mean = np.array([s.mean() for s in stacked])
            (line,) = ax.plot(
                rounds,
                mean,
                color=color,
                linewidth=1.6,
                marker="o" if len(rounds) <= 20 else None,
                markersize=3.5,
                label=f"{label} ({len(runs)} seed{'s' if len(runs) != 1 else ''})",
            )
            handle = handle or line
            if len(runs) > 1:
                ax.fill_between(
                    rounds, [s.min() for s in stacked], [s.max() for s in stacked], color=color, alpha=0.2, linewidth=0
                )
        if handle is not None:
            handles.append(handle)
    for ax, (_, ylabel) in zip(axes, CURVE_PANELS):
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(integer_ticks())
        ax.grid(True, linestyle=":", linewidth=0.5, alpha=0.6)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 2), frameon=False)
    fig.suptitle(title or "line: mean over seeds, band: min..max over seeds")
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` to ``path``, in the format its suffix names (.png, .pdf, .svg; parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, format=path.suffix.lstrip(".").lower())
    finally:
        fig.clear()
