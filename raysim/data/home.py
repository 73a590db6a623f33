"""The data home: where `raysim data get` puts datasets, and where a run looks for one when
dataset.root is not given (DATA_HOME/<name>, e.g. ~/.local/share/raysim/data/mnist).

`RAYSIM_DATA` sets it; otherwise it is `$XDG_DATA_HOME/raysim/data` (default
`~/.local/share/raysim/data`): datasets are data the user keeps, not a cache that may be emptied.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "RAYSIM_DATA"


def data_home() -> Path:
    home = os.environ.get(DATA_ENV) or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join("~", ".local", "share"), "raysim", "data"
    )
    return Path(home).expanduser()


def dataset_folder(name: str, root: str | os.PathLike | None) -> Path:
    """The folder a dataset is read from: dataset.root when given, else its folder in the data home."""
    if root is not None and str(root).strip():
        return Path(str(root)).expanduser()
    return data_home() / name


def get_hint(name: str) -> str:
    """The clause that says how to get a dataset that is not there."""
    return f"get it with 'raysim data get {name}' (into the data home, {data_home()}; {DATA_ENV} moves it)"
