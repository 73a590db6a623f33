"""Every check and policy of a resumed run (`raysim run --resume`, and `raysim reproduce`'s
unfinished runs), in one place:

- config: only `rounds` and `resources.*` may change, stored cluster keys are dropped (said in one
  line), a parameter added since the run was made reads as what it ran (raysim.run_format), and a directory
  that may come from someone else imports no code without --allow-code;
- lock: a resume takes the run directory's lock; refused, it leaves the directory as received (the
  .lock and a data.json it added are removed again);
- rounds: a finished run runs nothing (one line on stdout);
- checkpoint and model: the checkpoint is readable, holds this run's model, and its metrics.parquet
  holds every finished round;
- data: the data at hand are those the run started on (data.json), or, where none is recorded,
  those its checkpoint was trained on (else --accept-data).

raysim.runner (run_experiment) and raysim.reproduce call these; raysim.cli strings them together.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from raysim.algorithm import Algorithm
from raysim.config import Config
from raysim.config.files import read_yaml
from raysim.data.home import dataset_folder
from raysim.data.identity import DataIdentity
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.outputs.metrics import MetricsTable
from raysim.outputs.received import refuse_code
from raysim.outputs.run_dir import RunDir
from raysim.outputs.run_lock import lock_run_dir, unlock_and_remove
from raysim.outputs.state_files import check_model_arrays
from raysim.plugins import user_code_refused
from raysim.registry import algorithm_class
from raysim.run_format import config_as_made, made_at


def read_config(run_dir: RunDir, overrides: list[str], allow_code: bool) -> Config:
    """The config a resume of `run_dir` runs: resume_config, its code refused unless `allow_code`."""
    return resume_config(run_dir, overrides) if allow_code else resume_config_without_code(run_dir, overrides)


# Keys of a stored config that say where (or how) to reach a Ray cluster. A run directory may come
# from someone else: where its run executes is the user's choice (--address, RAY_ADDRESS, or these
# keys on this command line), never the directory's.
CLUSTER_KEYS = ("address",)


def resume_config(run_dir: str | Path | RunDir, overrides: list[str] = ()) -> Config:
    """The run's own config; only `rounds` (to extend a run) and `resources.*` may change.

    The stored config's cluster keys (`CLUSTER_KEYS`: resources.address) are not used: the resumed
    run goes where this command line or RAY_ADDRESS says (else a private local Ray); a stored one
    dropped is said in one line on stderr."""
    run_dir = RunDir(run_dir)
    if not run_dir.holds_run():
        raise RaysimError(
            f"'{run_dir}' is not a run directory (no {run_dir.config_file.name}): "
            "pass the folder a previous 'raysim run' wrote"
        )
    for text in overrides:
        key = text.split("=", 1)[0]
        if key != "rounds" and not key.startswith("resources."):
            raise RaysimError(
                f"'{key}' cannot change on --resume (only rounds and resources.* can): start a new run instead"
            )
    tree = config_as_made(read_yaml(run_dir.config_file), made_at(run_dir.read_summary()))
    given = {text.split("=", 1)[0] for text in overrides}
    dropped = _drop_cluster_keys(tree, given)
    config = load_config(overrides=overrides, base=tree)
    for key, value in dropped:
        print(_not_used_line(run_dir, key, value), file=sys.stderr)
    return config


def _drop_cluster_keys(tree: dict[str, Any], given: set[str]) -> list[tuple[str, Any]]:
    """Remove from `tree` (in place) the stored values of CLUSTER_KEYS that this command line does
    not set itself; returns (dotted key, stored value) of each that named something."""
    resources = tree.get("resources")
    if not isinstance(resources, dict):
        return []
    dropped = []
    for name in CLUSTER_KEYS:
        value = resources.get(name)
        if name in resources:
            tree["resources"] = resources = {k: v for k, v in resources.items() if k != name}
        if value not in (None, "") and f"resources.{name}" not in given:
            dropped.append((f"resources.{name}", value))
    return dropped


def _not_used_line(run_dir: RunDir, key: str, value: Any) -> str:
    """The one line a resume prints for a stored cluster key it did not use: the value as text that
    cannot move the terminal (repr escapes control characters), cut short if long."""
    shown = repr(value)
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    printable = isinstance(value, str) and value.isprintable() and len(value) <= 200
    flag = f"--address {shlex.quote(value)}" if printable and key == "resources.address" else None
    how = f"add {flag} (or set RAY_ADDRESS)" if flag else f"give {key}=... on this command line"
    return (
        f"note: {run_dir.config_file} names {key}={shown}: not used (a resumed run goes where this command "
        f"says: --address, RAY_ADDRESS, else a private local Ray); to run there, {how}"
    )


def resume_config_without_code(run_dir: RunDir, overrides: list[str]) -> Config:
    """The config of a run directory that may come from someone else, refused (one line) where
    resuming it could run code the user has not vouched for with --allow-code: user code it names
    (algorithm, model factories, clients' models), or a working directory inside the run directory
    (raysim.outputs.received: the same rule as a received config given to a fresh run)."""
    why = (
        f"named by '{run_dir.config_file}': a resumed run imports no code unless you vouch for its "
        "directory: add --allow-code if you wrote or trust this run"
    )
    with user_code_refused(why):  # the algorithm class is imported while the config is read
        config = resume_config(run_dir, overrides)
    refuse_code(config, run_dir.path, why, "resume")
    return config


class ResumeLock:
    """The run directory's lock taken for a resume, and what the directory held before it (a
    directory received without a .lock or a data.json gets them back removed when the resume is
    refused or has nothing to run)."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir
        self.had_lock_file = os.path.lexists(run_dir.lock_file)
        self.had_data_file = os.path.lexists(run_dir.data_file)
        lock_run_dir(run_dir)  # a run that is still going on keeps its directory

    def experiment(self, config: Config, prepare: Callable[[Config], Any], accept_data: bool = False):
        """resumable(): the experiment to continue, or None (finished: nothing ran, the directory
        stays as it was); refused, the directory is left as it was received."""
        try:
            experiment = resumable(self.run_dir, config, prepare, accept_data)
        except RaysimError:
            if not self.had_lock_file:  # refused: the directory is left as it was received
                unlock_and_remove(self.run_dir)
            raise
        if experiment is None and not self.had_lock_file:
            unlock_and_remove(self.run_dir)
        return experiment

    def leave_as_received(self) -> None:
        leave_as_received(self.run_dir, self.had_lock_file, self.had_data_file)


def leave_as_received(run_dir: RunDir, had_lock_file: bool, had_data_file: bool) -> None:
    """A refused resume removes what it added to the directory: its .lock, and the data.json written
    at its start for a run that recorded none."""
    if not had_data_file:
        run_dir.data_file.unlink(missing_ok=True)
    if not had_lock_file:
        unlock_and_remove(run_dir)


def resumable(run_dir: RunDir, config: Config, prepare: Callable[[Config], Any], accept_data: bool = False):
    """The experiment a resume continues, after every check that needs no Ray (the checkpoint is
    readable and holds this run's model, the data at hand are those it ran on); None when the run
    has finished all its rounds (said on stdout). `prepare`: raysim.runner.prepare (the runner
    imports this module: given, not imported, so that the layers stay one above the other)."""
    checkpoint = run_dir.read_checkpoint()  # an unreadable checkpoint is refused here, before Ray starts
    done = 0 if checkpoint is None else int(checkpoint["round"])
    if done >= config.rounds:
        if done > config.rounds:
            print(
                f"'{run_dir}' has {done} rounds done, more than the {config.rounds} asked: nothing to run "
                f"(add rounds with 'raysim run --resume {run_dir} rounds={done + 10}')"
            )
        else:
            print(
                f"'{run_dir}' has finished all {config.rounds} rounds: nothing to run "
                f"(add rounds with 'raysim run --resume {run_dir} rounds={config.rounds + 10}')"
            )
        return None
    experiment = prepare(config)
    check_data(run_dir, experiment.data, config.dataset.root)
    if checkpoint is not None:
        check_checkpoint_model(run_dir, checkpoint, experiment)
    check_unrecorded_data(run_dir, experiment.data, accept_data)
    return experiment


def check_checkpoint_model(run_dir: RunDir, checkpoint: dict, experiment: Any) -> None:
    """The checkpoint's global weights are this run's model's (names, shapes, numbers), where the
    run's algorithm keeps them in state['weights'] (every algorithm that keeps Algorithm.global_weights),
    and so are the algorithm's per-parameter state entries (Algorithm.per_parameter_state)."""
    cls = algorithm_class(experiment.config.algorithm.name)
    with torch.random.fork_rng(devices=[]):  # the shapes only: the driver's random stream is left as it was
        model = experiment.spec.build("cpu")
    parameters = {name: tuple(value.shape) for name, value in model.named_parameters()}
    expected = {key: parameters for key in cls.per_parameter_state}
    if cls.global_weights is Algorithm.global_weights:  # else its own code keeps the global model elsewhere
        expected["weights"] = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    last = run_dir.checkpoint_file
    for key, shapes in expected.items():
        check_model_arrays(
            checkpoint,
            key,
            shapes,
            last if last.exists() else run_dir.previous_checkpoint_file,  # the one read_checkpoint read
            "it comes from another run or was edited: put back this run's own checkpoint, or start a fresh run",
        )


def check_resumable(run_dir: RunDir) -> None:
    """A run directory with a checkpoint continues only if its metrics.parquet holds every finished
    round (the summary is computed from it): otherwise one error naming the file."""
    checkpoint = run_dir.read_checkpoint()
    if checkpoint is not None:
        MetricsTable(run_dir.metrics_file, resume_through_round=checkpoint["round"])


def check_data(run_dir: RunDir, identity: DataIdentity, root: str | None) -> None:
    """A run continues only on the data it started on: one line naming both if they differ."""
    _refuse_other_data(run_dir, run_dir.read_data(), identity, root)


def _refuse_other_data(run_dir: RunDir, recorded: DataIdentity | None, identity: DataIdentity, root) -> None:
    if recorded is not None and recorded.digest != identity.digest:
        where = "the embedded sample" if identity.name == "embedded" else dataset_folder(identity.name, root)
        raise RaysimError(
            f"'{run_dir}' ran on {recorded.describe()}, but the data at hand ({where}) are "
            f"{identity.describe()}: give the folder of the data it ran on, or start a new run"
        )


def check_unrecorded_data(run_dir: RunDir, identity: DataIdentity, accept_data: bool) -> None:
    """A run with a checkpoint but no data.json (removed, or made by an older raysim) goes on only on
    the dataset its checkpoint says it trained on, or with --accept-data: its data identity is never
    recorded anew over a config whose dataset was changed."""
    if accept_data or run_dir.read_data() is not None:
        return
    checkpoint = run_dir.read_checkpoint()
    if checkpoint is None:
        return
    trained_on = checkpoint.get("dataset")
    if trained_on == identity.name:
        return
    said = (
        f"its checkpoint was trained on '{trained_on}'"
        if isinstance(trained_on, str)
        else ("its checkpoint does not say what data it was trained on")
    )
    raise RaysimError(
        f"'{run_dir}' records no data ({run_dir.data_file.name} is missing) and {said}, but its config now reads "
        f"'{identity.name}': put back its {run_dir.data_file.name}, or add --accept-data if {identity.describe()} "
        "are the data it ran on"
    )


def record_data(run_dir: RunDir, identity: DataIdentity, root: str | None, accept_data: bool = False) -> None:
    """data.json at the run's start; a resumed run is checked against it first. A run that records
    none (made before raysim recorded its data, or its data.json removed) goes on only on the dataset
    its checkpoint was trained on, or with --accept-data (check_unrecorded_data): said in one line,
    then recorded."""
    recorded = run_dir.read_data()
    if recorded is not None:
        _refuse_other_data(run_dir, recorded, identity, root)
        return
    check_unrecorded_data(run_dir, identity, accept_data)
    if run_dir.checkpoint_file.exists() or run_dir.previous_checkpoint_file.exists():
        print(
            f"note: '{run_dir}' records no data (no data.json): the data at hand, "
            f"{identity.describe()}, are recorded now and cannot be checked against what it ran on",
            file=sys.stderr,
        )
    run_dir.write_data(identity)
