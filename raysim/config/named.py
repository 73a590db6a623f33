"""A config by the name a user gives it: a YAML file, a shipped config's name, or a table's cell
(TABLE:CELL:METHOD[:SCALE]) - what `raysim run` and `raysim bench cell` accept.

Kept apart from raysim.config.load because a table's cell needs raysim.reproduce, which itself
loads configs: this module imports both, and nothing imports it back but the commands.
"""

from __future__ import annotations

from pathlib import Path

from raysim.config.files import resolve
from raysim.config.load import load_config
from raysim.config.schema import Config
from raysim.errors import RaysimError
from raysim.reproduce import load_table, selection
from raysim.reproduce.table_file import TABLES_DIR


def load_named_config(name: str, overrides: list[str] = ()) -> Config:
    """A config file, a shipped config's name, or a table's cell: TABLE:CELL:METHOD[:SCALE] (the
    run `raysim reproduce` makes for that cell and method, seed 0, data in the data home)."""
    parts = name.split(":")
    if len(parts) in (3, 4) and not Path(name).exists():
        table = load_table(parts[0])
        if "," in parts[1] or "," in parts[2]:
            raise RaysimError(f"'{name}': raysim run takes one cell and one method (raysim reproduce runs several)")
        cell = selection(table, parts[1], table.cells, "cell")[0]
        method = selection(table, parts[2], table.methods, "method")[0]
        scale = parts[3] if len(parts) == 4 else "cpu"
        tree = table.config_tree(cell, method, scale, 0, None)
        return load_config(None, overrides, base=tree)
    path = resolve(name)
    if path.parent == TABLES_DIR.resolve():
        raise RaysimError(
            f"'{name}' is a paper's table, not a config: run it with 'raysim reproduce {path.stem} --out DIR', "
            f"or one of its cells with 'raysim run {path.stem}:CELL:METHOD'"
        )
    return load_config(path, overrides)
