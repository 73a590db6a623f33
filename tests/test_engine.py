"""The engine: determinism across actor counts, sampling, outputs, bytes, GPU placement."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml


def server_metric(run_dir, metric):
    table = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return [(r["round"], r["value"]) for r in table if r["client"] is None and r["metric"] == metric]


ACTORS = {"resources.in_process": False}


def test_same_numbers_with_one_or_two_actors_or_in_process(run_tiny):
    _, one = run_tiny(**ACTORS, **{"resources.actors": 1})
    _, two = run_tiny(**ACTORS, **{"resources.actors": 2})
    _, here = run_tiny(**{"resources.in_process": True})
    for metric in ("accuracy", "loss", "bytes_up", "bytes_down"):
        assert server_metric(one, metric) == server_metric(two, metric) == server_metric(here, metric), metric
    assert len(server_metric(one, "accuracy")) == 2
    assert yaml.safe_load((here / "actors.yaml").read_text())[0]["device"] == "cpu (in process)"


def test_outputs_and_accounting(run_tiny):
    summary, run_dir = run_tiny(**ACTORS, **{"output.tensorboard": True, "clients.per_round": 3})
    for name in ("config.yaml", "metrics.parquet", "summary.json", "checkpoints/last.pt",
                 "checkpoints/final_model.pt", "actors.yaml"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    table = pq.read_table(run_dir / "metrics.parquet")
    assert table.column_names == ["round", "client", "metric", "value"]
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_accuracy", "best_accuracy", "rounds", "bytes_up", "bytes_down", "wall_time_s"):
        assert key in on_disk and on_disk[key] == summary[key]
    assert summary["rounds"] == 2 and summary["finished"]
    # 3 of 6 clients per round; every participant downloads the same broadcast
    assert [v for _, v in server_metric(run_dir, "participants")] == [3, 3]
    rows = table.to_pylist()
    per_round_clients = {r for r, c, m in ((x["round"], x["client"], x["metric"]) for x in rows)
                         if c is not None and m == "bytes_up"}
    assert per_round_clients == {1, 2}
    # FedAvg uploads what it downloads (the whole model), give or take pickle headers
    up, down = summary["bytes_up"], summary["bytes_down"]
    assert abs(up - down) / down < 0.01
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["clients"]["per_round"] == 3 and resolved["algorithm"]["name"] == "fedavg"


def test_learns_above_chance(run_tiny):
    summary, _ = run_tiny(**{"rounds": 3, "model.width": 16})
    assert summary["final_accuracy"] > 0.4  # 10 classes: chance is 0.1


def test_fractional_gpus_place_four_actors_on_one_gpu(run_tiny):
    _, run_dir = run_tiny(**ACTORS, **{"resources.actors": 4, "resources.cpus_per_actor": 0.5,
                             "resources.gpus_per_actor": 0.25, "rounds": 1})
    actors = yaml.safe_load((run_dir / "actors.yaml").read_text())
    assert len(actors) == 4
    assert all(a["gpu_ids"] == ["0"] for a in actors)          # all four share the one logical GPU
    assert all(a["device"] == "cpu" for a in actors)           # torch sees no CUDA: CPU fallback


def test_asking_for_more_than_the_cluster_fails_clearly(run_tiny):
    from raysim.errors import RaysimError

    with pytest.raises(RaysimError, match="needs 8 GPUs .* has 1"):
        run_tiny(**ACTORS, **{"resources.actors": 1, "resources.gpus_per_actor": 8})
