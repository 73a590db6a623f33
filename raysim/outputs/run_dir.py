"""The run directory: the one place that names its files, and writes and reads them.

    config.yaml                the run's config (written once its actors are up)
    data.json                  what data it runs on (raysim.data.identity), written at its start
    metrics.parquet            one row per (round, client or none, metric)
    summary.json               the run's figures, rewritten after every round
    actors.yaml                where each client actor ran and which clients it hosted
    tensorboard/               the same curves for TensorBoard
    checkpoints/last.pt        the latest checkpointed round's state, read by --resume
    checkpoints/previous.pt    the one before it: the way back from a damaged last.pt
    checkpoints/final_model.pt the global model at the end
    client_state/              per-client state the algorithm keeps between rounds
    .lock                      held by the process running it

Everything here is plain data (a path), so a `RunDir` travels to Ray actors as it is.

A run directory may come from someone else, so nothing planted in it makes raysim write outside it
(raysim.outputs.safe_write): each file is written under a fresh, unpredictable name created exclusively
and renamed onto its own (a link at the final name is replaced, not followed); `.lock` is opened
without following a link; and a run directory that is itself a symbolic link, or whose
checkpoints/, client_state/ (or a client's folder in it) or tensorboard/ is one, is refused in one
line before anything is written (`refuse_links`, when the run's lock is taken).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

from raysim.data.identity import DataIdentity
from raysim.errors import RaysimError
from raysim.outputs.safe_write import atomic_write, refuse_link, write_json, write_text
from raysim.outputs.state_files import checked_checkpoint, encode, load_state, save_state

if TYPE_CHECKING:
    from raysim.data.identity import DataIdentity

CONFIG = "config.yaml"
DATA = "data.json"
METRICS = "metrics.parquet"
SUMMARY = "summary.json"
ACTORS = "actors.yaml"
TENSORBOARD = "tensorboard"
CHECKPOINT = "checkpoints/last.pt"
PREVIOUS_CHECKPOINT = "checkpoints/previous.pt"
FINAL_MODEL = "checkpoints/final_model.pt"
CLIENT_STATE = "client_state"
LOCK = ".lock"
FOLDERS = (TENSORBOARD, "checkpoints", CLIENT_STATE)  # written into by raysim, or by TensorBoard's writer
# A finished run's record: everything its figures (tables, reports, curves) are read from. Without its
# checkpoints and TensorBoard events it cannot be resumed, but `raysim report` and `raysim reproduce`
# read it as a finished run; the experiment reports commit only these files.
RECORD = (CONFIG, DATA, METRICS, SUMMARY)
# The rest of a run directory: what resuming it, TensorBoard and its owner need, not its figures
# (a table's folder keeps them out of version control: raysim.reproduce.table_output).
BEYOND_RECORD = (*(f"{folder}/" for folder in FOLDERS), ACTORS, LOCK)


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    def __str__(self) -> str:  # messages name the folder as the user gave it
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    # ------------------------------------------------------------ file names
    @property
    def config_file(self) -> Path:
        return self.path / CONFIG

    @property
    def data_file(self) -> Path:
        return self.path / DATA

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS

    @property
    def summary_file(self) -> Path:
        return self.path / SUMMARY

    @property
    def actors_file(self) -> Path:
        return self.path / ACTORS

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def checkpoint_file(self) -> Path:
        return self.path / CHECKPOINT

    @property
    def previous_checkpoint_file(self) -> Path:
        return self.path / PREVIOUS_CHECKPOINT

    @property
    def final_model_file(self) -> Path:
        return self.path / FINAL_MODEL

    @property
    def client_state_dir(self) -> Path:
        return self.path / CLIENT_STATE

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK

    # ------------------------------------------------------------ life cycle
    def holds_run(self) -> bool:
        """A run was started here (its config is written)."""
        return self.config_file.is_file()

    def refuse_links(self) -> None:
        """One line if the folder, or a folder raysim (or TensorBoard) writes into, is a symbolic
        link: the files written there would land outside the run directory. (TensorBoard writes a
        new events file named after the time and process; a link in its folder is refused too.)"""
        refuse_link(self.path)
        for name in FOLDERS:
            refuse_link(self.path / name)
        for folder in (self.client_state_dir, self.tensorboard_dir):  # a client's folder; an events file
            if folder.is_dir():
                for entry in folder.iterdir():
                    refuse_link(entry)

    # ------------------------------------------------------------ writers
    def write_config(self, text: str) -> None:
        write_text(self.config_file, text)

    def write_data(self, identity: DataIdentity) -> None:
        write_json(self.data_file, identity.to_dict())

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.summary_file, summary)

    def write_actors(self, actor_info: list[dict[str, Any]], per_client_models: bool) -> None:
        """actors.yaml: where each actor runs and which clients it hosts (with clients.models, their models)."""

        entries = []
        for i, info in enumerate(actor_info):
            entry = {"actor": i, **{key: info[key] for key in ("node_id", "device", "gpu_ids", "clients")}}
            if per_client_models:
                entry["models"] = info["models"]
            entries.append(entry)
        write_text(self.actors_file, yaml.safe_dump(entries, sort_keys=False, default_flow_style=None))

    def write_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """last.pt becomes previous.pt, then the new one becomes last.pt (both renames are atomic; a run
        killed between them has only previous.pt, which read_checkpoint then uses)."""

        encoded = encode(checkpoint)
        atomic_write(self.checkpoint_file, lambda p: torch.save(encoded, p), previous=self.previous_checkpoint_file)

    def write_final_model(self, weights: Any) -> None:

        save_state(self.final_model_file, weights)

    # ------------------------------------------------------------ readers
    def read_checkpoint(self) -> dict[str, Any] | None:
        """The run's latest checkpoint ({round, state, wall_time_s, log_summary}), None if it has none;
        refused in one line (with the way back) if it cannot be read safely."""

        last, previous = self.checkpoint_file, self.previous_checkpoint_file
        if not last.exists():
            if not previous.exists():
                return None
            path, way_out = previous, "start a fresh run"
        elif previous.exists():
            path, way_out = (
                last,
                (
                    f"go back to the checkpoint before it with 'mv {previous} {last}' and resume again "
                    "(the rounds after it are re-run, with the same numbers), or start a fresh run"
                ),
            )
        else:
            path, way_out = last, "start a fresh run (there is no earlier checkpoint to go back to)"
        return checked_checkpoint(load_state(path, way_out), path, way_out)

    def completed_rounds(self) -> int:
        """Rounds the checkpoint holds (reading it checks it: safe to load, not damaged)."""
        checkpoint = self.read_checkpoint()
        return 0 if checkpoint is None else int(checkpoint["round"])

    def read_data(self) -> DataIdentity | None:
        """The data the run was started on (data.json), None for a run that records none."""

        if not os.path.lexists(self.data_file):
            return None
        try:
            data = json.loads(self.data_file.read_text()) if self.data_file.is_file() else None
        except (ValueError, UnicodeDecodeError, OSError):
            data = None
        return DataIdentity.from_dict(data, str(self.data_file))

    def read_summary(self) -> dict[str, Any]:
        """summary.json as written, {} if the run has none yet; a damaged one is refused in one line."""
        if not self.summary_file.is_file():
            return {}
        try:
            summary = json.loads(self.summary_file.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise RaysimError(f"{self.summary_file} is not valid JSON ({exc}): remove that run's folder") from None
        if not isinstance(summary, dict):
            raise RaysimError(f"{self.summary_file} is not the mapping raysim writes: remove that run's folder")
        return checked_summary(summary, self.summary_file, "remove that run's folder, or rerun it")

    def read_summary_and_config(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """summary.json and config.yaml of a finished or running run, each refused in one line if it
        is not what raysim writes (for reports over folders that may come from anywhere)."""

        summary_path, config_path = self.summary_file, self.config_file
        if not summary_path.is_file() or not config_path.is_file():
            raise RaysimError(f"'{self}' is not a finished or running raysim run (no {SUMMARY}/{CONFIG})")
        way_out = "pass the folder of a run raysim wrote (or leave this one out)"
        try:
            summary = json.loads(summary_path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise RaysimError(f"{summary_path} is not valid JSON ({exc}): {way_out}") from None
        try:
            config = yaml.safe_load(config_path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            problem = str(exc).strip().splitlines()[0]
            raise RaysimError(f"{config_path} is not a plain YAML config ({problem}): {way_out}") from None
        for path, value in ((summary_path, summary), (config_path, config)):
            if not isinstance(value, dict):
                raise RaysimError(f"{path} holds a {type(value).__name__}, not the mapping raysim writes: {way_out}")
        if not isinstance(config.get("algorithm"), dict) or not isinstance(config.get("dataset"), dict):
            raise RaysimError(f"{config_path} lacks the algorithm and dataset sections raysim writes: {way_out}")
        missing = [key for key in REPORTED if key not in summary]
        if missing:
            raise RaysimError(f"{summary_path} lacks {', '.join(missing)}, which raysim writes: {way_out}")
        return checked_summary(summary, summary_path, way_out), config

    def read_metrics_rows(self, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """metrics.parquet's rows (refused in one line if missing or unreadable)."""

        if not self.metrics_file.is_file():
            raise RaysimError(f"'{self}' has no {METRICS}: pass the folder of a run that has finished a round")
        try:
            return pq.read_table(self.metrics_file, columns=columns).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise RaysimError(f"cannot read '{self.metrics_file}': {exc}") from None

    def read_actors(self) -> list[dict[str, Any]]:

        return yaml.safe_load(self.actors_file.read_text())


# summary.json's figures that reports fold into numbers, each checked where present: a file edited
# (or not raysim's) is refused in one line rather than shown (an accuracy of 5.0 as 500%) or crashing.
_ACCURACIES = ("final_accuracy", "best_accuracy", "last5_accuracy")
_COUNTS = ("rounds", "rounds_planned")
_AMOUNTS = ("bytes_up", "bytes_down", "wall_time_s")
# What a report reads from every summary: a summary.json without one is refused in one line.
REPORTED = ("final_accuracy", "best_accuracy", "rounds", "bytes_up", "bytes_down", "wall_time_s")


def checked_summary(summary: dict[str, Any], path: Path, way_out: str) -> dict[str, Any]:
    """`summary` if its figures are what raysim writes (finished a bool, rounds a count, accuracies in
    [0, 1] or null, bytes and seconds not negative, rounds to a target a count or null)."""

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value

    def refuse(key: str, what: str) -> None:
        raise RaysimError(f"{path} has {key} {summary[key]!r}, not {what}: {way_out}")

    if "finished" in summary and not isinstance(summary["finished"], bool):
        refuse("finished", "true or false")
    for key in _COUNTS:
        if key in summary and not (
            isinstance(summary[key], int) and not isinstance(summary[key], bool) and summary[key] >= 0
        ):
            refuse(key, "a count of rounds")
    for key in _ACCURACIES:
        if key in summary and summary[key] is not None and not (number(summary[key]) and 0 <= summary[key] <= 1):
            refuse(key, "an accuracy in [0, 1] or null")
    for key in _AMOUNTS:
        if key in summary and not (number(summary[key]) and summary[key] >= 0):
            refuse(key, "a number of at least 0")
    reached = summary.get("rounds_to_accuracy")
    if reached is not None and not (
        isinstance(reached, dict)
        and all(r is None or (isinstance(r, int) and not isinstance(r, bool) and r >= 1) for r in reached.values())
    ):
        refuse("rounds_to_accuracy", "a mapping of target accuracies to rounds or null")
    return summary
