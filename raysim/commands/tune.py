"""`raysim tune`: a Ray Tune sweep, or one continued with --resume."""

from __future__ import annotations

import argparse
from pathlib import Path

from raysim.config.files import resolve
from raysim.engine.address import check_address
from raysim.errors import RaysimError
from raysim.sweep import load_sweep
from raysim.tune_state import user_key
from raysim.tuning import resume_sweep, run_sweep, sweep_started


def main(args: argparse.Namespace) -> int:

    check_address(args.address)
    if args.resume:
        if args.sweep:
            raise RaysimError("give either SWEEP.yaml or --resume DIR, not both")
        user_key()  # the key that signs the sweep's state: a bad one is refused before Ray starts
        resume_sweep(Path(args.resume), args.address, allow_code=args.allow_code)
        return 0
    if not args.sweep:
        raise RaysimError("no sweep given: raysim tune SWEEP.yaml --out DIR (try configs/sweeps/cpu.yaml)")
    if not args.out:
        raise RaysimError("raysim tune needs --out DIR: the sweep's trials, table and best.yaml go there")
    out = Path(args.out)

    user_key()  # the key that will sign the sweep's state: a bad one is refused before anything is written

    # Tune's state appears once the sweep has started: before that (a sweep refused while starting)
    # the same --out can simply be used again.
    if sweep_started(out):
        raise RaysimError(
            f"'{out}' already holds a sweep: continue it with 'raysim tune --resume {out}' or choose another --out"
        )

    run_sweep(load_sweep(resolve(args.sweep), args.overrides), out, args.address)
    return 0
