"""The one-shot client-stage cache cannot change a result: its key covers everything that reaches the
client stage (derived from the resolved config, the data and the normalisation), and an entry is
checked against the run's clients before use; anything else is a miss (issue 45, item 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.algorithms.oneshot import client_cache
from raysim.experiment import load_config
from raysim.runner import prepare
from tests.conftest import tiny_overrides
from tests.test_oneshot import ONE_SHOT, run

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = np.array([0.3]), np.array([0.35])
# Whole runs: the client round and one distillation epoch from it, on the quickest model (the rules
# are the cache's, not the architecture's)
DENSE_ON_THE_MLP = {"algorithm.name": "dense", "rounds": 2, "model.name": "mlp"}


def key(*overrides: str, mean=MEAN, std=STD) -> str:
    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**ONE_SHOT) + list(overrides))
    return client_cache.client_stage_key(config, "digest", mean, std)


def test_the_key_follows_every_setting_that_reaches_the_clients_and_nothing_else():
    base = key()
    # what the clients train with, including normalisation and keys no hand-kept list names
    for changed in (
        key("dataset.mean=[0.5]", "dataset.std=[0.5]"),
        key(mean=np.array([0.5])),
        key(std=np.array([0.5])),
        key("local.lr=0.02"),
        key("local.weight_decay=0.001"),
        key("model.width=16"),
        key("seed=1"),
        key("resources.deterministic=false"),
        key("resources.gpus_per_actor=0.5"),
    ):
        assert changed != base
    # the server side, the outputs and where the run goes leave the clients alone
    for same in (
        key("algorithm.name=dense"),
        key("rounds=9"),
        key("eval.targets=[0.5]"),
        key("resources.actors=1"),
        key("resources.in_process=false"),
        key("output.tensorboard=true"),
        key("dataset.root=/elsewhere"),
    ):
        assert same == base


def entry(clients: int = 10, classes: int = 10) -> tuple[client_cache.Expected, dict, dict]:
    shapes = {k: {"w": (classes, 4), "b": (classes,)} for k in range(clients)}
    weights = {k: {"w": np.zeros((classes, 4), np.float32), "b": np.zeros(classes, np.float32)} for k in range(clients)}
    sizes = {k: 100 + k for k in range(clients)}
    return client_cache.Expected(shapes, dict(sizes)), weights, sizes


def test_an_entry_that_is_not_this_runs_clients_is_refused():
    expected, weights, sizes = entry()
    assert expected.accepts(weights, sizes)
    assert not expected.accepts({k: weights[k] for k in range(3)}, {k: sizes[k] for k in range(3)})  # 3 of 10
    bad = {**weights, 4: {"w": np.zeros((10, 5), np.float32), "b": weights[4]["b"]}}
    assert not expected.accepts(bad, sizes)  # a wrongly shaped tensor
    assert not expected.accepts({**weights, 2: {"w": weights[2]["w"]}}, sizes)  # a tensor missing
    assert not expected.accepts(weights, {**sizes, 1: 0})  # a zero sample count
    assert not expected.accepts(weights, {**sizes, 1: 99})  # not this partition's count
    nan = {**weights, 7: {"w": np.full((10, 4), np.nan, np.float32), "b": weights[7]["b"]}}
    assert not expected.accepts(nan, sizes)
    unknown = client_cache.Expected(expected.shapes, None)
    assert unknown.accepts(weights, sizes) and not unknown.accepts(weights, {**sizes, 1: 0})


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_other_normalisation_constants_miss_the_cache_and_give_the_uncached_numbers(tmp_path, monkeypatch):
    """The case issue 45 found: the same run with other dataset.mean/std hit the old entry."""
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    extra = DENSE_ON_THE_MLP
    first, _ = run(tmp_path, "first", **extra)
    moved = {**extra, "dataset.mean": "[0.5]", "dataset.std": "[0.5]"}
    second, _ = run(tmp_path, "second", **moved)
    assert not first["client_stage_cached"] and not second["client_stage_cached"]
    uncached, _ = run(tmp_path, "uncached", **moved, **{"algorithm.cache_client_stage": False})
    assert second["final_accuracy"] == uncached["final_accuracy"]
    assert run(tmp_path, "third", **moved)[0]["client_stage_cached"]


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_a_planted_entry_with_missing_clients_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    first, _ = run(tmp_path, "first", **DENSE_ON_THE_MLP)
    (path,) = (tmp_path / "cache" / "client_stage").glob("*.pt")
    stored = torch.load(path, weights_only=True)
    stored["weights"] = {k: w for k, w in stored["weights"].items() if int(k) < 3}
    stored["num_samples"] = {k: n for k, n in stored["num_samples"].items() if int(k) < 3}
    torch.save(stored, path)
    again, _ = run(tmp_path, "again", **DENSE_ON_THE_MLP)
    assert not again["client_stage_cached"]
    assert again["final_accuracy"] == first["final_accuracy"]


@pytest.mark.parametrize("split", ["test", "validation"])
def test_the_data_digest_sees_the_validation_split(split):
    """eval.split takes images out of the clients' data: the digest (part of the key) changes."""
    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**ONE_SHOT, **{"eval.split": split}))
    digest = prepare(config).data_digest
    plain = prepare(load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**ONE_SHOT))).data_digest
    assert (digest == plain) == (split == "test")
