"""`raysim partition`: a config's per-client class counts (and a bubble chart of them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raysim.config.files import resolve
from raysim.experiment import load_config
from raysim.partition import format_counts
from raysim.plots import save_partition_plot
from raysim.report import check_plot_file
from raysim.runner import prepare


def main(args: argparse.Namespace) -> int:

    if args.plot:
        check_plot_file(Path(args.plot))
    config = load_config(resolve(args.config), args.overrides)
    exp = prepare(config)
    print(
        f"{config.dataset.name}: {len(exp.dataset.train_y)} training samples, {config.clients.num} clients, "
        f"partition {config.partition.kind}"
        + (
            f" alpha={config.partition.alpha}"
            if "dirichlet" in config.partition.kind or config.partition.kind == "quantity"
            else ""
        )
    )
    print(format_counts(exp.counts, exp.dataset.classes))
    if args.plot:
        save_partition_plot(
            exp.counts,
            args.plot,
            exp.dataset.classes,
            title=f"{config.dataset.name}, {config.partition.kind}, {config.clients.num} clients",
        )
        print(f"bubble chart written to {args.plot}")
    return 0
