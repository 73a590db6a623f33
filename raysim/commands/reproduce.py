"""`raysim reproduce`: a paper's table run and laid beside the paper's figures; --list the tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raysim.engine.address import check_address
from raysim.errors import RaysimError
from raysim.reproduce import list_tables, reproduce
from raysim.reproduce.estimate import REFERENCE_SECONDS, calibrate, table_minutes


def main(args: argparse.Namespace) -> int:

    if args.list:
        return _list_tables()
    if not args.table:
        raise RaysimError("no table given: raysim reproduce TABLE --out DIR (list them with 'raysim reproduce --list')")
    if not args.out:
        raise RaysimError("raysim reproduce needs --out DIR: the table's runs, table.md and table.csv go there")
    if args.parallel is not None and args.parallel < 1:
        raise RaysimError(f"--parallel {args.parallel}: give 1 or more runs side by side (or leave it out: auto)")
    check_address(args.address)
    try:
        written, failures = reproduce(
            args.table,
            args.out,
            scale=args.scale,
            seeds=args.seeds,
            cells=args.cells,
            methods=args.methods,
            data_root=args.data_root,
            address=args.address,
            parallel=args.parallel,
            resources=args.overrides,
            table_only=args.table_only,
        )
    except KeyboardInterrupt:
        print("interrupted: finished runs are kept; the same command continues the table", file=sys.stderr)
        return 130
    print((Path(args.out) / "table.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    for run, error in failures:
        print(f"raysim: error: {run.name}: {error}", file=sys.stderr)
    return 1 if failures else 0


def _list_tables() -> int:

    speed = min(calibrate() for _ in range(3)) / REFERENCE_SECONDS  # the least, as the reference's
    for table in list_tables():
        print(f"{table.name}: {table.title}")
        print(f"  cells:   {', '.join(table.cells)}")
        print(f"  methods: {', '.join(table.methods)}")
        for scale in ("cpu", "paper"):
            cells = [c for c in table.cells.values() if scale in c.config]
            if not cells:
                continue
            minutes, missing = table_minutes(table, scale, table.seeds, speed)
            where = "this machine" if scale == "cpu" else "the GPU it was measured on"
            if minutes is None:
                guess = "no time recorded"
            else:
                guess = f"{'at least' if missing else 'about'} {_duration(minutes)} on {where}"
            gaps = f" ({missing} cell x method without a recorded time)" if missing and minutes is not None else ""
            print(
                f"  {scale:5s}    {len(cells)} cells x {len(table.methods)} methods x {table.seeds} seeds: "
                f"{guess}{gaps}"
            )
    return 0


def _duration(minutes: float) -> str:
    if minutes < 1:
        return "under a minute"
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
