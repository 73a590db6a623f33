"""eval.selection: the run's model chosen without the test set (federated validation on the clients'
held-out shares), summary.json's selected_round / selected_accuracy, and the bytes it costs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysim.errors import RaysimError
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# candidates: rounds 2 (every 2nd evaluated round) and 3 (the last); 4 of the 6 clients validate
FEDERATED = {"eval.selection": "federated", "eval.select_every": 2, "eval.select_clients": 4, "rounds": 3}
ACTORS = {"resources.in_process": False, "resources.actors": 2}


def config_of(**overrides):
    from raysim.experiment import load_config
    from tests.conftest import tiny_overrides

    return load_config(QUICKSTART, tiny_overrides(**overrides))


def rows(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "metrics.parquet").to_pylist()


def server_metric(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    return [(r["round"], r["value"]) for r in rows(run_dir) if r["client"] is None and r["metric"] == metric]


# ---------------------------------------------------------------------------- fast: no Ray
def test_each_client_trains_on_its_data_less_a_seeded_held_out_share():
    from raysim.runner import prepare

    plain = prepare(config_of())
    federated = prepare(config_of(**{"eval.selection": "federated", "eval.client_holdout": 0.2}))
    assert plain.holdout is None
    for k, (whole, train, held) in enumerate(zip(plain.parts, federated.parts, federated.holdout)):
        assert len(held) == int(np.floor(0.2 * len(whole) + 0.5)) > 0, k
        assert len(train) == len(whole) - len(held)
        assert np.array_equal(np.sort(np.concatenate([train, held])), whole)  # a split, nothing lost
    # what the clients train on is what the server and the algorithms are told of (counts, digest)
    assert federated.counts.sum() == sum(len(p) for p in federated.parts) < plain.counts.sum()
    # seeded by the partition seed and the client: the run's seed alone does not move it
    fixed = {"eval.selection": "federated", "partition.seed": 7}
    one, two = prepare(config_of(**fixed, seed=1)), prepare(config_of(**fixed, seed=2))
    assert all(np.array_equal(a, b) for a, b in zip(one.holdout, two.holdout))


def test_a_client_keeps_at_least_one_example_to_train_on():
    from raysim.partition import hold_out

    train, held = hold_out([np.array([4]), np.array([1, 2]), np.arange(10, 30)], 0.9, seed=0)
    assert [len(t) for t in train] == [1, 1, 2] and [len(h) for h in held] == [0, 1, 18]


def test_the_validating_clients_are_a_seeded_sample_the_same_each_time():
    from raysim.partition import validating_clients

    assert validating_clients(6, 0, seed=3) == list(range(6))
    chosen = validating_clients(100, 5, seed=3)
    assert chosen == validating_clients(100, 5, seed=3) and len(set(chosen)) == 5 and chosen == sorted(chosen)
    assert chosen != validating_clients(100, 5, seed=4)


@pytest.mark.parametrize(
    "override, words",
    [
        ("eval.selection=best", "eval.selection"),
        ("eval.client_holdout=1", "eval.client_holdout"),
        ("eval.client_holdout=0", "eval.client_holdout"),
        ("eval.select_every=0", "eval.select_every"),
        ("eval.select_clients=7", "eval.select_clients"),
        ("eval.select_clients=-1", "eval.select_clients"),
    ],
)
def test_a_bad_value_is_one_line(override, words):
    key, value = override.split("=")
    with pytest.raises(RaysimError, match=words) as caught:
        config_of(**{key: value})
    assert "\n" not in str(caught.value)


def test_a_bad_value_exits_2_through_the_cli(tmp_path, capsys):
    done = cli_in_process(capsys, "run", QUICKSTART, "eval.selection=best", "--out", tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "eval.selection" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_config_stored_before_the_keys_existed_reads_as_final(tmp_path):
    """An old run's config.yaml (no eval.selection and friends) resolves as it did: final selection."""
    from raysim.config import dump_config
    from raysim.resume import resume_config

    config = config_of()
    tree = yaml.safe_load(dump_config(config))
    for key in ("selection", "client_holdout", "select_every", "select_clients"):
        del tree["eval"][key]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    resumed = resume_config(tmp_path)
    assert resumed.eval.selection == "final" and resumed == config


def test_selection_takes_the_highest_validation_accuracy_the_earliest_on_a_tie():
    from raysim.outputs.summary import selected_model

    accuracy = [(1, 0.5), (2, 0.7), (3, 0.6), (4, 0.65)]
    validation = [(2, 0.61), (3, 0.64), (4, 0.64)]

    def pick(selection):
        return selected_model(selection, accuracy, validation)

    assert pick("federated") == (3, 0.6)  # not round 2, the best on the test set
    assert pick("final") == (4, 0.65)


# ---------------------------------------------------------------------------- slow: runs
def test_with_federated_selection_each_client_trains_on_fewer_examples(run_tiny):
    _, plain = run_tiny(rounds=3)
    _, federated = run_tiny(**FEDERATED)  # every client holds out, 4 of them validate

    def steps(run_dir):
        return {(r["round"], r["client"]): r["value"] for r in rows(run_dir) if r["metric"] == "local_steps"}

    fewer, before = steps(federated), steps(plain)
    assert fewer.keys() == before.keys()
    assert all(fewer[key] <= before[key] for key in before) and sum(fewer.values()) < sum(before.values())


@pytest.mark.slow
def test_the_same_selection_and_bytes_in_process_and_with_two_actors(run_tiny):
    here_summary, here = run_tiny(**FEDERATED)
    actors_summary, actors = run_tiny(**FEDERATED, **ACTORS)
    for key in ("selection", "selected_round", "selected_accuracy", "final_accuracy", "bytes_up", "bytes_down"):
        assert here_summary[key] == actors_summary[key], key
    for metric in ("validation_accuracy", "validation_loss", "bytes_validation_down", "bytes_validation_up"):
        assert server_metric(here, metric) == server_metric(actors, metric), metric
    assert here_summary["selection"] == "federated"


def test_selected_accuracy_is_the_test_accuracy_where_validation_peaks(run_tiny):
    summary, run_dir = run_tiny(**FEDERATED)
    validation = server_metric(run_dir, "validation_accuracy")
    assert [r for r, _ in validation] == [2, 3]  # the candidates: every 2nd evaluated round, and the last
    top = max(v for _, v in validation)
    chosen = min(r for r, v in validation if v == top)
    assert summary["selected_round"] == chosen
    assert summary["selected_accuracy"] == dict(server_metric(run_dir, "accuracy"))[chosen]
    assert json.loads((run_dir / "summary.json").read_text())["selected_accuracy"] == summary["selected_accuracy"]
    from raysim.report import report

    table = report([str(run_dir)])
    assert "best acc (test-selected)" in table and "selected acc" in table
    assert f"{summary['selected_accuracy']:.4f}" in table


def test_validation_bytes_are_the_weights_to_each_validating_client_at_each_candidate(run_tiny):
    from raysim.outputs.run_dir import RunDir
    from raysim.registry import make_algorithm
    from raysim.tensors import serialized_nbytes

    summary, run_dir = run_tiny(**FEDERATED)
    state = RunDir(run_dir).read_checkpoint()["state"]  # the global weights' size is the same every round
    weights = serialized_nbytes(make_algorithm(config_of(**FEDERATED)).global_weights(state))
    down = server_metric(run_dir, "bytes_validation_down")
    assert sum(v for _, v in down) == 4 * weights * 2  # 4 validating clients, 2 candidates
    up = sum(v for _, v in server_metric(run_dir, "bytes_validation_up"))
    assert 0 < up < 4 * 2 * 200  # a few counts per client
    # counted in the round's bytes: the clients' own bytes plus the validation's
    client_down = sum(r["value"] for r in rows(run_dir) if r["client"] is not None and r["metric"] == "bytes_down")
    assert summary["bytes_down"] == client_down + sum(v for _, v in down)


def test_final_selection_leaves_every_number_unchanged(run_tiny):
    """eval.selection=final (the default): the federated keys move nothing, bytes included, and no
    validation is logged; the selected model is the last."""
    summary, plain = run_tiny(rounds=3)
    keyed_summary, keyed = run_tiny(
        rounds=3, **{"eval.selection": "final", "eval.client_holdout": 0.3, "eval.select_clients": 2}
    )

    def numbers(run_dir):
        return sorted(
            (r["round"], -1 if r["client"] is None else r["client"], r["metric"], r["value"])
            for r in rows(run_dir)
            if not r["metric"].startswith("time") and r["metric"] != "round_time_s"
        )

    assert numbers(plain) == numbers(keyed)
    assert not [r for r in rows(plain) if "validation" in r["metric"]]
    assert summary["selection"] == "final" and summary["selected_round"] == 3
    assert summary["selected_accuracy"] == summary["final_accuracy"] == keyed_summary["selected_accuracy"]


def test_a_resumed_run_selects_as_an_uninterrupted_one(ray_session, tmp_path):
    from raysim.resume import resume_config
    from raysim.runner import run_experiment

    whole = run_experiment(config_of(**FEDERATED, **{"resources.in_process": True}), tmp_path / "whole")
    run_experiment(config_of(**{**FEDERATED, "rounds": 2, "resources.in_process": True}), tmp_path / "parts")
    resumed = run_experiment(resume_config(tmp_path / "parts", ["rounds=3"]), tmp_path / "parts")
    for key in ("selected_round", "selected_accuracy", "bytes_up", "bytes_down"):
        assert resumed[key] == whole[key], key
    assert server_metric(tmp_path / "parts", "validation_accuracy") == server_metric(
        tmp_path / "whole", "validation_accuracy"
    )
