"""Runs made by older raysim code are read as what they ran (raysim.run_format): a stored config of
an earlier format takes each added parameter's earlier value, one of today's format its own, and a
summary written before federated selection existed selected its final model."""

from __future__ import annotations

import dataclasses
import json
import shutil

import yaml

from raysim.algorithm import BEFORE, SINCE
from raysim.experiment import config_from_dict, load_config
from raysim.registry import algorithm_class, builtin_names
from raysim.results import read_run
from raysim.resume import resume_config
from raysim.run_format import RUN_FORMAT, config_as_made, made_at


def added_params() -> dict[str, list[dataclasses.Field]]:
    found = {}
    for name in builtin_names():
        fields = [f for f in dataclasses.fields(algorithm_class(name).Params) if BEFORE in f.metadata]
        if fields:
            found[name] = fields
    return found


def test_a_stored_config_reads_as_its_format_ran_and_a_users_config_as_the_default(tmp_path):
    added = added_params()
    assert {"scaffold", "feddm", "fedaf", "feddf"} <= set(added)  # the parameters added with a new default
    for name, fields in added.items():
        # mnist: a dataset every method has its defaults for (FedDF's unlabelled images among them)
        stored = load_config(None, [f"algorithm.name={name}", "dataset.name=mnist"]).to_dict()
        for f in fields:
            assert f.metadata[SINCE] <= RUN_FORMAT and f.default != f.metadata[BEFORE]
            without = {**stored, "algorithm": {k: v for k, v in stored["algorithm"].items() if k != f.name}}
            # a user's config lacking the key: the default; a stored one of an earlier format: what it ran
            assert getattr(config_from_dict(without).algorithm, f.name) == f.default
            assert getattr(config_from_dict(config_as_made(without, 1)).algorithm, f.name) == f.metadata[BEFORE]
            assert getattr(config_from_dict(config_as_made(without, RUN_FORMAT)).algorithm, f.name) == f.default
            # a key the stored config states is what it ran, whatever its format
            other = {**stored, "algorithm": {**stored["algorithm"], f.name: f.metadata[BEFORE]}}
            assert config_as_made(other, 1) == other
    # --resume reads the run's format from its summary.json
    name, f = "scaffold", next(f for f in added["scaffold"] if f.name == "weighting")
    stored = load_config(None, [f"algorithm.name={name}"]).to_dict()
    del stored["algorithm"][f.name]
    for written, ran in ((None, f.metadata[BEFORE]), (RUN_FORMAT, f.default)):
        run_dir = tmp_path / f"format{written}"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(yaml.safe_dump(stored))
        if written is not None:
            (run_dir / "summary.json").write_text(json.dumps({"run_format": written}))
        assert resume_config(run_dir).algorithm.weighting == ran
    assert made_at({"run_format": "2"}) == made_at({"run_format": True}) == made_at(None) == 1


def test_a_summary_without_selection_reads_as_its_final_model(tmp_path, run_tiny):
    summary, shared = run_tiny(rounds=2)
    assert summary["run_format"] == RUN_FORMAT and summary["selection"] == "final"
    run_dir = tmp_path / "run"
    shutil.copytree(shared, run_dir)
    record = json.loads((run_dir / "summary.json").read_text())
    newer = ("run_format", "selection", "selected_round", "selected_accuracy")
    old = {k: v for k, v in record.items() if k not in newer}
    (run_dir / "summary.json").write_text(json.dumps(old))
    read = read_run(run_dir).summary
    assert (read["selection"], read["selected_round"], read["selected_accuracy"]) == (
        "final",
        old["rounds"],
        old["final_accuracy"],
    )
