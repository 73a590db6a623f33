"""The `raysim` command: run, tune, partition, report, bench, algorithms, datasets."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from raysim.errors import RaysimError, user_message

EXIT_USER_ERROR = 2


def _cmd_run(args: argparse.Namespace) -> int:
    from raysim.outputs.run_lock import release_all

    try:
        return _run(args)
    finally:
        release_all()  # the run directory's lock (the process may go on: tests, notebooks)


def _run(args: argparse.Namespace) -> int:
    from raysim.outputs.run_dir import RunDir
    from raysim.resume import ResumeLock, read_config
    from raysim.runner import discard_unstarted_run, new_run_dir, prepare, run_with_progress

    _check_address(args.address)  # before anything is read or created
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
        from raysim.outputs.received import received_run_dir
        from raysim.reproduce import check_cell_name
        from raysim.reproduce.named import load_named_config

        check_cell_name(args.config, "raysim run")  # a cell's scale is its name's last part here
        if args.out:
            from raysim.outputs.received import check_fresh_out

            check_fresh_out(Path(args.out))  # before the data are read: nothing is created in a refused folder
        received = received_run_dir(args.config) if Path(args.config).is_file() else None
        if received is not None:  # a run directory's config: no code, no say in where the run goes
            from raysim.outputs.received import load_received_config

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
        from raysim.runner import failure_message

        message, refused_at_start = failure_message(exc, run_dir)
        if message is None:
            raise
        if refused_at_start and not args.resume:
            discard_unstarted_run(run_dir)
        elif refused_at_start:
            held.leave_as_received()
        raise RaysimError(message) from None
    return 0


def _check_address(address: str | None) -> None:
    """--address in a form Ray takes (HOST:PORT, ray://HOST:PORT, auto, local): one line before any
    work, not a traceback from ray.init after the run directory was made."""
    if address:
        from raysim.engine.ray_session import check_address

        check_address(address, "--address")


def _cmd_partition(args: argparse.Namespace) -> int:
    from raysim.config.files import resolve
    from raysim.experiment import load_config
    from raysim.partition import format_counts
    from raysim.runner import prepare

    if args.plot:
        from raysim.report import check_plot_file

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
        from raysim.plots import save_partition_plot

        save_partition_plot(
            exp.counts,
            args.plot,
            exp.dataset.classes,
            title=f"{config.dataset.name}, {config.partition.kind}, {config.clients.num} clients",
        )
        print(f"bubble chart written to {args.plot}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from raysim.report import check_plot_path, plot_report, report

    if args.plot:
        check_plot_path(args.plot)
    text = report(args.runs)
    if args.plot:  # before printing: bad input gives only its error line
        plot_report(args.runs, args.plot)
    print(text)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _cmd_algorithms(args: argparse.Namespace) -> int:
    from raysim.registry import describe_algorithms

    for name, text in describe_algorithms():
        print(f"{name:12s} {text}")
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from raysim.data import describe_datasets
    from raysim.models import describe_models

    print("datasets (dataset.name):")
    for name, text in describe_datasets():
        print(f"  {name:14s} {text}")
    print("models (model.name):")
    for name, text in describe_models():
        print(f"  {name:14s} {text}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from raysim.data.download import mirror_base
    from raysim.data.get import get, status
    from raysim.data.home import DATA_ENV, data_home

    home = Path(args.root).expanduser() if args.root else data_home()
    if args.action == "get":
        if not args.names:
            raise RaysimError("name the datasets to get: raysim data get NAME [NAME ...] (raysim data list shows them)")
        from raysim.data.catalogue import entry

        for name in args.names:
            entry(name)  # every name known before anything is downloaded
        if args.timeout is not None and not args.timeout > 0:
            raise RaysimError(f"--timeout {args.timeout}: give the seconds a dataset's get may take, more than 0")
        mirror = mirror_base(args.mirror)
        timeout = {} if args.timeout is None else {"timeout_s": args.timeout}
        for name in dict.fromkeys(args.names):
            try:
                folder, got = get(name, home, mirror, bar=sys.stderr.isatty(), **timeout)
            except KeyboardInterrupt:
                print(
                    f"interrupted: run 'raysim data get {name}' again to go on from where it stopped", file=sys.stderr
                )
                return 130
            print(f"{name}: {'got' if got else 'already'} in {folder}")
        if args.root and Path(args.root).expanduser().resolve() != data_home().resolve():
            print(f"runs read them with --data-root {args.root} (raysim reproduce) or {DATA_ENV}={args.root}")
        return 0
    if args.names:
        raise RaysimError("raysim data list takes no names: it lists every dataset raysim can get")
    from raysim.reproduce.table_file import datasets_of_tables, list_tables

    used = datasets_of_tables(list_tables())
    print(f"data home: {home} ({DATA_ENV} moves it)")
    print(f"{'dataset':14s} {'here':14s} {'on disk':>9s} {'download':>9s}  tables")
    for s in status(home):
        here = s.present or ("partly got" if s.partial_bytes else "-")
        on_disk = _size(s.disk_bytes) if s.present else (_size(s.partial_bytes) if s.partial_bytes else "-")
        download = _size(s.download_bytes) if s.download_bytes else "?"
        print(f"{s.name:14s} {here:14s} {on_disk:>9s} {download:>9s}  {', '.join(used.get(s.name, [])) or '-'}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _cmd_tune(args: argparse.Namespace) -> int:
    from raysim.sweep import load_sweep
    from raysim.tune_state import user_key
    from raysim.tuning import resume_sweep, run_sweep

    _check_address(args.address)
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
    from raysim.tuning import sweep_started

    user_key()  # the key that will sign the sweep's state: a bad one is refused before anything is written

    # Tune's state appears once the sweep has started: before that (a sweep refused while starting)
    # the same --out can simply be used again.
    if sweep_started(out):
        raise RaysimError(
            f"'{out}' already holds a sweep: continue it with 'raysim tune --resume {out}' or choose another --out"
        )
    from raysim.config.files import resolve

    run_sweep(load_sweep(resolve(args.sweep), args.overrides), out, args.address)
    return 0


def _cmd_configs(args: argparse.Namespace) -> int:
    from raysim.config import dump_config
    from raysim.config.files import list_configs, resolve
    from raysim.experiment import load_config

    if args.config:  # the whole config a run would use: its extends: chain, the overrides and the defaults
        print(dump_config(load_config(resolve(args.config), args.overrides)), end="")
        return 0
    rows = list_configs()
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        print(f"{name:{width}s}  {text}".rstrip())
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from raysim.reproduce import reproduce

    if args.list:
        return _list_tables()
    if not args.table:
        raise RaysimError("no table given: raysim reproduce TABLE --out DIR (list them with 'raysim reproduce --list')")
    if not args.out:
        raise RaysimError("raysim reproduce needs --out DIR: the table's runs, table.md and table.csv go there")
    if args.parallel is not None and args.parallel < 1:
        raise RaysimError(f"--parallel {args.parallel}: give 1 or more runs side by side (or leave it out: auto)")
    _check_address(args.address)
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
    from raysim.reproduce import list_tables
    from raysim.reproduce.estimate import REFERENCE_SECONDS, calibrate, table_minutes

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


def _cmd_bench(args: argparse.Namespace) -> int:
    from raysim import bench

    return bench.main(args.which, args.extra)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

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
    run.set_defaults(func=_cmd_run)

    part = sub.add_parser("partition", help="print (and plot) the per-client class counts of a config")
    part.add_argument("config")
    part.add_argument("overrides", nargs="*")
    part.add_argument("--plot", metavar="FILE.png", help="write a bubble chart of the partition")
    part.set_defaults(func=_cmd_partition)

    rep = sub.add_parser("report", help="side-by-side table of runs (mean +- std over seeds)")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rep.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw accuracy, loss and MB moved per round, one line per experiment "
        "with a band over its seeds (.png, .pdf or .svg)",
    )
    rep.set_defaults(func=_cmd_report)

    sub.add_parser("algorithms", help="list the algorithms").set_defaults(func=_cmd_algorithms)
    sub.add_parser("datasets", help="list the datasets and models").set_defaults(func=_cmd_datasets)
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
    data.set_defaults(func=_cmd_data)
    configs = sub.add_parser(
        "configs", help="list the shipped configs (raysim run NAME runs one from any folder), or print one whole"
    )
    configs.add_argument("config", nargs="?", help="print this config whole: its base's keys and the defaults too")
    configs.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    configs.set_defaults(func=_cmd_configs)

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
    tune.set_defaults(func=_cmd_tune)

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
    repro.set_defaults(func=_cmd_reproduce)

    bench = sub.add_parser("bench", help="benchmarks that print ratios")
    from raysim.bench import BENCHES

    bench.add_argument("which", choices=list(BENCHES))
    bench.add_argument("extra", nargs="*", help="key=value options of the benchmark")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    from raysim.data.home import settle_data_home

    settle_data_home()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow the options (`raysim run CONFIG --out D rounds=3`)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except RaysimError as exc:
        print(f"raysim: error: {user_message(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `raysim configs | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
