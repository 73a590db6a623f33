"""`raysim data get NAME` and `raysim data list`: datasets into the data home."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raysim.data.catalogue import entry
from raysim.data.download import mirror_base
from raysim.data.get import get, status
from raysim.data.home import DATA_ENV, data_home
from raysim.errors import RaysimError
from raysim.reproduce.table_file import datasets_of_tables, list_tables


def main(args: argparse.Namespace) -> int:

    home = Path(args.root).expanduser() if args.root else data_home()
    if args.action == "get":
        if not args.names:
            raise RaysimError("name the datasets to get: raysim data get NAME [NAME ...] (raysim data list shows them)")

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
