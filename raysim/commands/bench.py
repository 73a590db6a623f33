"""`raysim bench NAME`: benchmarks that print ratios."""

from __future__ import annotations

import argparse

from raysim import bench


def main(args: argparse.Namespace) -> int:

    return bench.main(args.which, args.extra)
