"""The one rule for a directory that reaches raysim from elsewhere (issue 77).

A run, table or sweep folder may come from someone else. Whatever way it reaches raysim - as the
config of `raysim run`, as `--resume`, as `--out` - it must not run code, make raysim write outside
it or over files it did not write, nor decide where or on what the run goes:

- a config read from inside a run directory (`received_run_dir`: a folder holding a run's record,
  config.yaml with summary.json, metrics.parquet, checkpoints/ or data.json beside it) is received:
  it imports no user code (`package.module:name`) and is not run from inside that folder unless
  `--allow-code` (`refuse_code`), and its `output.dir` and cluster keys are not obeyed
  (`drop_received_keys`, said in one line);
- a fresh run's `--out` is new or holds nothing a run writes (`check_fresh_out`): a folder with a
  checkpoint, summary, metrics, actors.yaml or client state and no run record is refused in one line,
  before anything is created in it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.config import client_architectures
from raysim.config.files import read_yaml
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.outputs.run_dir import ACTORS, CLIENT_STATE, CONFIG, DATA, METRICS, SUMMARY, TENSORBOARD, RunDir
from raysim.plugins import user_code_refused

if TYPE_CHECKING:
    from raysim.config import Config

# Beside a config.yaml, any of these makes its folder a run's record (the config is received).
RECORD_MARKS = (SUMMARY, METRICS, "checkpoints", DATA)
# What a fresh run writes over (or, for checkpoints, adopts): an --out holding one is refused.
WRITTEN_BY_A_RUN = (SUMMARY, METRICS, ACTORS, "checkpoints", CLIENT_STATE, TENSORBOARD)
# Keys of a received config that say where its runs go: the user's command line decides that.
RECEIVED_KEYS = (("output", "dir"), ("resources", "address"))


def received_run_dir(config_path: str | Path) -> RunDir | None:
    """The run directory `config_path` lies in, if its folder holds a run's record; else None."""
    folder = Path(config_path).parent
    if (folder / CONFIG).is_file() and any(os.path.lexists(folder / mark) for mark in RECORD_MARKS):
        return RunDir(folder)
    return None


def check_fresh_out(path: Path) -> None:
    """A fresh run's folder is new, or holds nothing a run writes: one line otherwise, naming
    --resume and a new --out. Called before the folder (or its .lock) is created."""
    if not path.is_dir():
        return
    if (path / CONFIG).exists():
        raise RaysimError(
            f"'{path}' already holds a run: continue it with 'raysim run --resume {path}' or choose another --out"
        )
    found = [name for name in WRITTEN_BY_A_RUN if os.path.lexists(path / name)]
    if found:
        raise RaysimError(
            f"--out '{path}' holds {', '.join(found)} but no run record ({CONFIG}): a run would write over "
            f"or adopt them; give a new or empty --out (a run of yours is continued with 'raysim run --resume')"
        )


def code_refusal(where: Path) -> str:
    return (
        f"named by '{where}': a received config imports no code unless you vouch for it: "
        "add --allow-code if you wrote or trust this run"
    )


def named_code(config: Config) -> list[tuple[str, str]]:
    """(key, `package.module:name`) for each piece of user code `config` names: its algorithm class,
    its model factory and its clients' model factories."""
    names = [("algorithm.name", config.algorithm.name), ("model.name", config.model.name)]
    names += [("clients.models", m.name) for m in client_architectures(config)]
    return [(key, name) for key, name in names if ":" in name]


def refuse_code(config: Config, folder: Path, why: str, action: str) -> None:
    """One line if `config` names user code (its algorithm class is already refused while the config
    is read, under raysim.plugins.user_code_refused; its model factories are imported later), or if
    the working directory lies inside `folder` (Ray puts it on its workers' import path)."""

    if code := named_code(config):
        key, name = code[0]
        raise RaysimError(f"{key}='{name}' is user code, {why}")
    here, inside = Path.cwd().resolve(), folder.resolve()
    if here == inside or inside in here.parents:
        raise RaysimError(
            f"{action} '{folder}' from outside it (e.g. cd {inside.parent} && ...): the working directory is on "
            "the import path (Ray's workers' too), so files shipped in a run directory could run; or add "
            "--allow-code if you wrote or trust this run"
        )


def drop_received_keys(tree: dict[str, Any], overrides: list[str], where: Path, out_given: bool) -> None:
    """Remove from `tree` (in place) output.dir and the cluster keys a received config names, unless
    this command line sets them; one note line naming those dropped that would have mattered."""
    given = {text.split("=", 1)[0] for text in overrides}
    dropped = []
    for section, key in RECEIVED_KEYS:
        values = tree.get(section)
        if not isinstance(values, dict) or key not in values or f"{section}.{key}" in given:
            continue
        value = values[key]
        tree[section] = {k: v for k, v in values.items() if k != key}
        if value in (None, "") or (section == "output" and (out_given or value == "runs")):
            continue
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        dropped.append(f"{section}.{key}={shown}")
    if dropped:
        print(
            f"note: {where} is a received run's config: {', '.join(dropped)} not used (where a run goes is "
            "this command's choice: --out, --address; give them as key=value to use them)",
            file=sys.stderr,
        )


def load_received_config(path: Path, run_dir: RunDir, overrides: list[str], allow_code: bool, out_given: bool):
    """The config of `raysim run CONFIG` where CONFIG lies in a run directory: its code refused unless
    `allow_code`, its output.dir and cluster keys dropped."""

    tree = read_yaml(path)
    drop_received_keys(tree, list(overrides), path, out_given)
    if allow_code:
        return load_config(None, overrides, base=tree)
    why = code_refusal(path)
    with user_code_refused(why):
        config = load_config(None, overrides, base=tree)
    refuse_code(config, run_dir.path, why, "run the config of")
    return config
