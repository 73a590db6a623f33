"""`raysim reproduce TABLE`: a paper's table run as ordinary run directories and laid beside the paper.

table_file: the tables as data (configs/tables/*.yaml); runs: planning, skipping, resuming and running
them; results: table.md / table.csv; curves: curves.png; estimate: `--list`'s time estimates.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from raysim.errors import RaysimError
from raysim.reproduce.table_file import SCALES, Table, list_tables, load_table

__all__ = ["Table", "list_tables", "load_table", "parse_seeds", "reproduce", "selection"]


def parse_seeds(text: str | None, default: int) -> list[int]:
    """'3' -> seeds 0, 1, 2; '0,2,5' -> those; '1-3' -> 1, 2, 3; None -> the table's number."""
    if text is None:
        return list(range(default))
    text = text.strip()
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        elif "-" in text[1:]:
            low, high = text.split("-", 1)
            seeds = list(range(int(low), int(high) + 1))
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise RaysimError(f"--seeds {text!r}: give a count (3), a list (0,1,2) or a range (0-2)") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise RaysimError(f"--seeds {text!r}: give at least one seed, each once and not negative")
    return seeds


def selection(table: Table, chosen: str | None, known: dict, what: str) -> list[str]:
    """--cells / --methods: a comma-separated subset, in the table's order; None: all of them."""
    if chosen is None:
        return list(known)
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise RaysimError(
            f"table {table.name} has no {what} {', '.join(unknown) or repr(chosen)}: choose from {', '.join(known)}"
        )
    return [n for n in known if n in names]


def reproduce(
    name: str,
    out: str | Path,
    scale: str = "cpu",
    seeds: str | None = None,
    cells: str | None = None,
    methods: str | None = None,
    data_root: str | None = None,
    address: str | None = None,
    parallel: int | None = None,
    bars: bool = True,
    resources: list[str] = (),
) -> tuple[list[Path], list]:
    """Run the selection (skipping finished runs, resuming unfinished ones) and write the table.
    Returns the files written and the runs that failed (with their one-line errors)."""
    from raysim.reproduce.runs import execute, plan_runs
    from raysim.reproduce.table_output import write_outputs

    if scale not in SCALES:
        raise RaysimError(f"--scale {scale!r}: choose {' or '.join(SCALES)}")
    table = load_table(name)
    cell_names = selection(table, cells, table.cells, "cell")
    available = [c for c in cell_names if scale in table.cells[c].config]
    if not available:
        raise RaysimError(f"table {table.name} has no cell at {scale} scale among {', '.join(cell_names)}")
    if cells is not None and len(available) < len(cell_names):
        left = ", ".join(c for c in cell_names if c not in available)
        print(f"note: {left} has no {scale}-scale config: left out", file=sys.stderr)
    method_names = selection(table, methods, table.methods, "method")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RaysimError(f"--out '{out}' is a file: give a new or existing folder for the table's runs")
    data_root = data_root or os.environ.get("RAYSIM_DATA")
    runs = plan_runs(table, scale, parse_seeds(seeds, table.seeds), available, method_names, out, data_root, resources)
    try:  # once every run's config is valid: a refused table leaves no folder behind
        from raysim.outputs.files import real_folder

        real_folder(out)  # a linked --out is refused before the runs, not when the table is written
    except OSError as exc:
        raise RaysimError(f"cannot create --out '{out}' ({exc.strerror}): choose another folder") from None
    failures = execute(runs, address, parallel, bars)
    command = command_line(table, scale, seeds, cells, methods, resources)
    return write_outputs(table, scale, runs, out, available, method_names, command), failures


def command_line(
    table: Table, scale: str, seeds: str | None, cells: str | None, methods: str | None, resources: list[str] = ()
) -> str:
    """The command that writes this selection of the table (the folders as DIR and DATA: where the
    runs and the datasets lie is the reader's)."""
    parts = ["raysim reproduce", table.name, f"--scale {scale}"]
    parts += [
        f"--{flag} {value}" for flag, value in (("seeds", seeds), ("cells", cells), ("methods", methods)) if value
    ]
    parts += [*resources, "--out DIR", "--data-root DATA"]
    return " ".join(parts)
