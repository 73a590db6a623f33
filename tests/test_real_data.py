"""Runs on the real datasets in ../shared/data (skipped with a reason where it is absent)."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import shared_data

ROOT = Path(__file__).resolve().parents[1]


def test_fedavg_mnist_config_reaches_95_percent(ray_session, tmp_path):
    from raysim.config import load_config
    from raysim.runner import run_experiment

    root = shared_data("mnist")
    config = load_config(ROOT / "configs/fedavg_mnist.yaml", [f"dataset.root={root}", "output.tensorboard=false"])
    summary = run_experiment(config, tmp_path / "run")
    assert summary["rounds"] == 5
    assert summary["final_accuracy"] >= 0.95, summary
