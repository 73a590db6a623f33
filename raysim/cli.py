"""The `raysim` command: its arguments, and the dispatch to its subcommands (raysim.commands)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from raysim.bench import benches
from raysim.data.home import settle_data_home
from raysim.engine import ray_missing
from raysim.errors import RaysimError, user_message

EXIT_USER_ERROR = 2


def command(target: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand's function (`module:function` in raysim.commands). The module is imported only
    when its command runs, so that `raysim --version` or `raysim configs` do not load PyTorch (seconds)
    or Ray."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(f"raysim.commands.{module}"), function)


def _version() -> str:
    try:
        return version("raysim")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raysim", description="Federated-learning simulator on Ray")
    parser.add_argument("--version", action="version", version=f"raysim {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment (or continue one with --resume)")
    run.add_argument("config", nargs="?", help="experiment YAML (e.g. configs/quickstart.yaml)")
    run.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. rounds=10 partition.alpha=0.1")
    run.add_argument("--out", help="run directory (default: output.dir/ALGO-DATASET-sSEED-TIME)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    run.add_argument(
        "--address",
        help="Ray cluster address (default: RAY_ADDRESS, else a local Ray; with --resume, never the "
        "resources.address the run's stored config names)",
    )
    run.add_argument(
        "--allow-code",
        action="store_true",
        help="import the user code (package.module:name) that a run directory's config names (with --resume, "
        "or a CONFIG inside a run's folder); without it a received run directory cannot run code",
    )
    run.add_argument(
        "--accept-data",
        action="store_true",
        help="with --resume of a run whose data.json is missing: go on with the config's data even where "
        "its checkpoint was trained on another dataset (its data.json is then written anew)",
    )
    run.set_defaults(command="run:main")

    part = sub.add_parser("partition", help="print (and plot) the per-client class counts of a config")
    part.add_argument("config")
    part.add_argument("overrides", nargs="*")
    part.add_argument("--plot", metavar="FILE.png", help="write a bubble chart of the partition")
    part.set_defaults(command="partition:main")

    rep = sub.add_parser("report", help="side-by-side table of runs (mean +- std over seeds)")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rep.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw accuracy, loss and MB moved per round, one line per experiment "
        "with a band over its seeds (.png, .pdf or .svg)",
    )
    rep.set_defaults(command="report:main")

    sub.add_parser("algorithms", help="list the algorithms").set_defaults(command="listing:algorithms")
    sub.add_parser("datasets", help="list the datasets and models").set_defaults(command="listing:datasets")
    data = sub.add_parser("data", help="get datasets into the data home (raysim data get NAME), or list them")
    data.add_argument("action", choices=["get", "list"])
    data.add_argument("names", nargs="*", help="datasets to get (raysim data list shows them)")
    data.add_argument("--root", help="the folder to put them in (default: the data home; raysim data list shows it)")
    data.add_argument(
        "--mirror",
        help="base URL serving the archives as URL/<dataset>/<file> (default: RAYSIM_DATA_MIRROR, else "
        "the official locations); the checksums are raysim's whatever serves them",
    )
    data.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="the most one dataset's get may take, however slowly its server sends (default 4 hours); "
        "what came is kept for the next get",
    )
    data.set_defaults(command="data:main")
    configs = sub.add_parser(
        "configs", help="list the shipped configs (raysim run NAME runs one from any folder), or print one whole"
    )
    configs.add_argument("config", nargs="?", help="print this config whole: its base's keys and the defaults too")
    configs.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    configs.set_defaults(command="listing:configs")

    tune = sub.add_parser("tune", help="a Ray Tune sweep over config keys (see configs/sweeps/)")
    tune.add_argument("sweep", nargs="?", help="sweep YAML (e.g. configs/sweeps/cpu.yaml)")
    tune.add_argument("overrides", nargs="*", help="key.sub=value overrides of the base config")
    tune.add_argument("--out", help="sweep directory: trials, trials.parquet, best.yaml")
    tune.add_argument("--resume", metavar="DIR", help="continue the interrupted sweep in DIR")
    tune.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    tune.add_argument(
        "--allow-code",
        action="store_true",
        help="with --resume: restore Tune state that does not carry your signature (it is pickled: "
        "restoring runs what it holds); only for a sweep you made",
    )
    tune.set_defaults(command="tune:main")

    repro = sub.add_parser("reproduce", help="run a paper's table and lay it beside the paper's figures")
    repro.add_argument("table", nargs="?", help="a shipped table (raysim reproduce --list) or a table file")
    repro.add_argument(
        "overrides", nargs="*", help="resources.key=value: how the runs use this machine (the table sets the rest)"
    )
    repro.add_argument(
        "--list", action="store_true", help="list the tables, their cells and methods, and time estimates"
    )
    repro.add_argument("--out", help="the table's folder: CELL/METHOD/sSEED run directories, table.md, table.csv")
    repro.add_argument("--scale", default="cpu", choices=["cpu", "paper"], help="2-core configs or the paper's")
    repro.add_argument("--seeds", help="how many seeds (3), or which (0,1,2 or 0-2); default: the table's")
    repro.add_argument("--cells", help="comma-separated cells (default: all at this scale)")
    repro.add_argument("--methods", help="comma-separated methods (default: all)")
    repro.add_argument(
        "--data-root",
        help="folder holding the datasets' folders (mnist/, cifar10/...); default: the data home, where "
        "'raysim data get' puts them (raysim data list shows it)",
    )
    repro.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    repro.add_argument("--parallel", type=int, help="runs side by side (default: as many as the cluster holds)")
    repro.add_argument(
        "--table-only",
        action="store_true",
        help="run nothing: write the table from the runs of the selection already finished in --out",
    )
    repro.set_defaults(command="reproduce:main")

    bench = sub.add_parser("bench", help="benchmarks that print ratios")
    bench.add_argument("which", choices=list(benches()))
    bench.add_argument("extra", nargs="*", help="key=value options of the benchmark")
    bench.set_defaults(command="bench:main")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    settle_data_home()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow the options (`raysim run CONFIG --out D rounds=3`)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        try:
            return command(args.command)(args)
        except ModuleNotFoundError as exc:  # a command whose module imports Ray (`raysim tune`), without Ray
            raise ray_missing(exc) from None
    except RaysimError as exc:
        print(f"raysim: error: {user_message(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `raysim configs | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
