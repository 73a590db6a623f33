"""The data home: where `raysim data get` puts datasets, and where a run looks for one when
dataset.root is not given (DATA_HOME/<name>, e.g. ~/.local/share/raysim/data/mnist).

`RAYSIM_DATA` sets it; otherwise it is `$XDG_DATA_HOME/raysim/data` (default
`~/.local/share/raysim/data`): datasets are data the user keeps, not a cache that may be emptied.
A relative RAYSIM_DATA is taken from the folder the command started in (`settle_data_home`).
"""

from __future__ import annotations

import os
from pathlib import Path

from raysim.errors import RaysimError

DATA_ENV = "RAYSIM_DATA"


def data_home() -> Path:
    home = os.environ.get(DATA_ENV) or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join("~", ".local", "share"), "raysim", "data"
    )
    return Path(home).expanduser().absolute()


def settle_data_home() -> None:
    """RAYSIM_DATA made absolute in this process's environment, so that what this process starts
    (Ray's workers, Tune trials that change folder) reads the same data home."""
    if os.environ.get(DATA_ENV):
        os.environ[DATA_ENV] = str(data_home())


def dataset_folder(name: str, root: str | os.PathLike | None) -> Path:
    """The folder a dataset is read from: dataset.root when given, else its folder in the data home."""
    if root is not None and str(root).strip():
        return Path(str(root)).expanduser()
    return data_home() / name


def check_extra_dataset(name: str, folder: str | os.PathLike, keys: str) -> None:
    """One line when a dataset a run reads besides its own (a transfer set) is not at `folder`;
    `keys` names the config keys that choose it ("algorithm.distill_dataset/distill_root")."""
    dataset_key, root_key = keys.split("/")
    if name != "embedded" and not Path(folder).expanduser().exists():  # the embedded sample has no folder
        raise RaysimError(
            f"the unlabelled images ({name}) are not at {folder}: {get_hint(name)}, or set algorithm.{root_key} "
            f"to their folder or {dataset_key} to another dataset"
        )


def get_hint(name: str) -> str:
    """The clause that says how to get a dataset that is not there."""
    return f"get it with 'raysim data get {name}' (into the data home, {data_home()}; {DATA_ENV} moves it)"
