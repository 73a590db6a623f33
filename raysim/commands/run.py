"""`raysim run`: a config (a file, a shipped name, a table's cell or a received run's config) into a
new run directory, or a run continued with --resume."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raysim.engine.address import check_address
from raysim.errors import RaysimError
from raysim.outputs.received import check_fresh_out, load_received_config, received_run_dir
from raysim.outputs.run_dir import RunDir
from raysim.outputs.run_lock import release_all
from raysim.reproduce import check_cell_name
from raysim.reproduce.named import load_named_config
from raysim.resume import ResumeLock, read_config
from raysim.runner import discard_unstarted_run, failure_message, new_run_dir, prepare, run_with_progress


def main(args: argparse.Namespace) -> int:

    try:
        return _run(args)
    finally:
        release_all()  # the run directory's lock (the process may go on: tests, notebooks)


def _run(args: argparse.Namespace) -> int:

    check_address(args.address)  # before anything is read or created
    held = None  # a resume's lock, and what the directory held before it (raysim.resume)
    if args.resume:
        if args.config and "=" not in args.config:
            raise RaysimError("give either CONFIG or --resume RUN_DIR, not both")
        overrides = ([args.config] if args.config else []) + args.overrides
        run_dir = RunDir(args.resume)
        config = read_config(run_dir, overrides, args.allow_code)
        held = ResumeLock(run_dir)
        experiment = held.experiment(config, prepare, args.accept_data)
        if experiment is None:  # finished: nothing ran, the directory stays as it was
            return 0
    else:
        if not args.config:
            raise RaysimError("no config given: raysim run CONFIG.yaml [key=value ...] (try configs/quickstart.yaml)")

        check_cell_name(args.config, "raysim run")  # a cell's scale is its name's last part here
        if args.out:
            check_fresh_out(Path(args.out))  # before the data are read: nothing is created in a refused folder
        received = received_run_dir(args.config) if Path(args.config).is_file() else None
        if received is not None:  # a run directory's config: no code, no say in where the run goes
            config = load_received_config(
                Path(args.config), received, args.overrides, args.allow_code, out_given=bool(args.out)
            )
        else:
            config = load_named_config(args.config, args.overrides)

        experiment = prepare(config)  # bad data or partition fails before a run directory appears
        run_dir = new_run_dir(config, args.out)
    try:
        run_with_progress(config, run_dir, args.address, experiment, accept_data=args.accept_data)
    except KeyboardInterrupt:
        print(f"interrupted: finished rounds are kept; continue with 'raysim run --resume {run_dir}'", file=sys.stderr)
        return 130
    except RaysimError:
        if not args.resume:  # refused before its first round (e.g. resources): the same --out works again
            discard_unstarted_run(run_dir)
        else:
            held.leave_as_received()
        raise
    except Exception as exc:  # Ray itself failed (a node or the cluster went away): say how to go on
        message, refused_at_start = failure_message(exc, run_dir)
        if message is None:
            raise
        if refused_at_start and not args.resume:
            discard_unstarted_run(run_dir)
        elif refused_at_start:
            held.leave_as_received()
        raise RaysimError(message) from None
    return 0
