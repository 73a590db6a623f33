"""A config by the name a user gives it: a YAML file, a shipped config's name, or a table's cell
(TABLE:CELL:METHOD[:SCALE]) - what `raysim run` and `raysim bench cell` accept.

Apart from raysim.reproduce's package module so that naming a table (raysim reproduce --list) does
not load the algorithms: this module loads configs through raysim.experiment.
"""

from __future__ import annotations

from raysim.config.files import resolve
from raysim.config.schema import Config
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.reproduce import selection
from raysim.reproduce.table_file import TABLES_DIR, cell_name, load_table


def load_named_config(name: str, overrides: list[str] = ()) -> Config:
    """A config file, a shipped config's name, or a table's cell: TABLE:CELL:METHOD[:SCALE] (the
    run `raysim reproduce` makes for that cell and method, seed 0, data in the data home)."""
    parsed = cell_name(name)
    if parsed is not None:
        table_name, cell, method, scale = parsed
        table = load_table(table_name)
        if "," in cell or "," in method:
            raise RaysimError(f"'{name}': raysim run takes one cell and one method (raysim reproduce runs several)")
        cell = selection(table, cell, table.cells, "cell")[0]
        method = selection(table, method, table.methods, "method")[0]
        tree = table.config_tree(cell, method, scale, 0, None)
        return load_config(None, overrides, base=tree)
    path = resolve(name)
    if path.parent == TABLES_DIR.resolve():
        raise RaysimError(
            f"'{name}' is a paper's table, not a config: run it with 'raysim reproduce {path.stem} --out DIR', "
            f"or one of its cells with 'raysim run {path.stem}:CELL:METHOD'"
        )
    return load_config(path, overrides)
