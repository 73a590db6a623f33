"""`raysim reproduce TABLE`: a paper's table run as ordinary run directories and laid beside the paper.

table_file: the tables as data (configs/tables/*.yaml); runs: planning, skipping, resuming and running
them; results: table.md / table.csv; curves: curves.png; estimate: `--list`'s time estimates.
named: what `raysim run NAME` and `raysim bench cell NAME` accept (a file, a shipped config's name,
or a table's cell TABLE:CELL:METHOD[:SCALE], read by table_file.cell_name alone).
"""

from __future__ import annotations

import sys
from pathlib import Path

from raysim.engine import ray_side
from raysim.errors import RaysimError
from raysim.outputs.safe_write import real_folder
from raysim.reproduce.runs import execute, finished_only, plan_runs
from raysim.reproduce.table_file import SCALES, Table, cell_name, list_tables, load_table
from raysim.reproduce.table_output import check_out, write_outputs

__all__ = [
    "Table",
    "cell_name",
    "check_cell_name",
    "list_tables",
    "load_table",
    "parse_seeds",
    "reproduce",
    "selection",
]


MAX_SEEDS = 1000  # seeds of one table: each is a run of every cell and method


def parse_seeds(text: str | None, default: int) -> list[int]:
    """'3' -> seeds 0, 1, 2; '0,2,5' -> those; '1-3' -> 1, 2, 3; None -> the table's number.
    More than MAX_SEEDS seeds are refused before any list of them is made."""
    if text is None:
        return list(range(default))
    text = text.strip()
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
            count = len(seeds)
        elif "-" in text[1:]:
            low, high = (int(s) for s in text.split("-", 1))
            count = high - low + 1
        else:
            low, high = 0, int(text) - 1
            count = high + 1
    except ValueError:
        raise RaysimError(f"--seeds {text!r}: give a count (3), a list (0,1,2) or a range (0-2)") from None
    if count > MAX_SEEDS:
        raise RaysimError(
            f"--seeds {text!r} asks for {count:,} seeds, each a run of every cell and method: "
            f"give at most {MAX_SEEDS} (the papers use 3 to 5)"
        )
    if "," not in text:
        seeds = list(range(low, high + 1))
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


def check_cell_name(name: str, command: str) -> None:
    """A table's cell named as TABLE:CELL:METHOD[:SCALE] (raysim run, raysim bench cell) at a scale
    the cell has no config for: one line naming its scales in the form `command` takes (the
    :SCALE part; --scale is raysim reproduce's option, not theirs)."""
    parsed = cell_name(name)
    if parsed is None or "," in parsed[1] or "," in parsed[2]:
        return  # not a cell, or one load_named_config refuses itself
    table_name, cell, method, scale = parsed
    table = load_table(table_name)
    cell = selection(table, cell, table.cells, "cell")[0]
    scales = list(table.cells[cell].config)
    if scale not in scales:
        forms = " or ".join(f"'{command} {':'.join(name.split(':')[:3] + [s])}'" for s in scales)
        raise RaysimError(
            f"table {table.name}: cell {cell} has no {scale}-scale config (it has {', '.join(scales)}): "
            f"name the scale as the cell's last part, {forms}"
        )


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
    table_only: bool = False,
) -> tuple[list[Path], list]:
    """Run the selection (skipping finished runs, resuming unfinished ones) and write the table.
    Returns the files written and the runs that failed (with their one-line errors). `table_only`:
    run nothing, write the table from the finished runs (a table part-way, or one whose records
    were received; the data need not be here)."""

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
    check_out(out, table)  # table.md & co. can be written: refused now, not after the runs
    # unset: each run reads its dataset's folder in the data home (RAYSIM_DATA, raysim.data.home)
    runs = plan_runs(
        table, scale, parse_seeds(seeds, table.seeds), available, method_names, out, data_root, resources, table_only
    )
    if table_only:
        finished_only(runs, out)  # before real_folder: it creates --out, and there is nothing to put in it
    elif not out.exists() and not all(run.config.resources.in_process for run in runs):
        ray_side()  # every run is new and some start actors: without Ray, one line before --out is made
    try:  # once every run's config is valid: a refused table leaves no folder behind
        real_folder(out)  # a linked --out is refused before the runs, not when the table is written
    except OSError as exc:
        raise RaysimError(f"cannot create --out '{out}' ({exc.strerror}): choose another folder") from None
    failures = [] if table_only else execute(runs, address, parallel, bars)
    command = command_line(table, scale, seeds, cells, methods, resources)
    return write_outputs(table, scale, runs, out, available, method_names, command), failures


def command_line(
    table: Table, scale: str, seeds: str | None, cells: str | None, methods: str | None, resources: list[str] = ()
) -> str:
    """The command that writes this selection of the table (the folder as DIR: where the runs lie is
    the reader's; the datasets are read from the reader's data home)."""
    parts = ["raysim reproduce", table.name, f"--scale {scale}"]
    parts += [
        f"--{flag} {value}" for flag, value in (("seeds", seeds), ("cells", cells), ("methods", methods)) if value
    ]
    parts += [*resources, "--out DIR"]
    return " ".join(parts)
