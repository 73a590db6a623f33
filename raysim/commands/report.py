"""`raysim report`: runs side by side (mean +- std over seeds), and a plot of their curves."""

from __future__ import annotations

import argparse

from raysim.report import check_plot_path, plot_report, report


def main(args: argparse.Namespace) -> int:

    if args.plot:
        check_plot_path(args.plot)
    text = report(args.runs)
    if args.plot:  # before printing: bad input gives only its error line
        plot_report(args.runs, args.plot)
    print(text)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0
