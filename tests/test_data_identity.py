"""The data are part of a run's identity: data read under a name they do not fit are refused, and a
run (resumed, or a table's) continues only on the data it started on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raysim.errors import RaysimError
from tests.conftest import shared_data, tiny_overrides
from tests.test_oneshot_as_authors_ran import write_parquet_dataset

ROOT = Path(__file__).resolve().parents[1]


def test_data_read_under_another_datasets_name_are_refused_in_one_line():
    from raysim.data import load_dataset

    mnist = shared_data("mnist")
    with pytest.raises(RaysimError) as refused:
        load_dataset("fashion_mnist", mnist)  # the probe: MNIST under a fashion_mnist/ folder
    text = str(refused.value)
    assert "not Fashion-MNIST" in text and "mean pixel value 0.131" in text and "look like mnist" in text
    assert "\n" not in text
    with pytest.raises(RaysimError, match=r"not CIFAR-10: 1 channel\(s\), not 3; 28x28 images, not 32x32"):
        load_dataset("cifar10", mnist)
    assert load_dataset("mnist", mnist).train_x.shape == (60_000, 28, 28, 1)
    assert load_dataset("fashion_mnist", mnist, verify=False).num_classes == 10  # altered on purpose: allowed


def test_a_run_continues_only_on_the_data_it_started_on(tmp_path, monkeypatch, capsys):
    from raysim.cli import main
    from raysim.experiment import load_config
    from raysim.outputs.run_dir import RunDir
    from raysim.reproduce.runs import PlannedRun, run_state
    from raysim.runner import run_experiment

    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    data = tmp_path / "mnist"
    labels = np.arange(200) % 10
    write_parquet_dataset(data, rng.integers(0, 256, (200, 28, 28, 1), dtype=np.uint8), labels)
    overrides = tiny_overrides(
        **{"dataset.name": "mnist", "dataset.root": data, "dataset.verify": False},  # random images as MNIST
        **{"clients.num": 2, "clients.per_round": 2, "rounds": 1, "resources.in_process": True},
    )
    config = load_config(ROOT / "configs" / "quickstart.yaml", overrides)
    run_dir = RunDir(tmp_path / "run")
    run_experiment(config, run_dir)
    recorded = json.loads(run_dir.data_file.read_text())
    assert (recorded["name"], recorded["train"], recorded["channels"]) == ("mnist", 200, 1)
    checkpoint = run_dir.checkpoint_file.read_bytes()

    # the same root now holds other images (the probe: a table rerun with the right --data-root)
    write_parquet_dataset(data, rng.integers(0, 256, (200, 28, 28, 1), dtype=np.uint8), labels)
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), "rounds=2"]) == 2
    err = capsys.readouterr().err.strip()
    ran_on = f"ran on mnist, 200/200 images of 28x28x1, 10 classes, digest {recorded['digest'][:12]}"
    assert "\n" not in err and ran_on in err
    assert "but the data at hand" in err and "start a new run" in err
    assert run_dir.checkpoint_file.read_bytes() == checkpoint  # nothing of round 2 on the other data
    with pytest.raises(RaysimError, match="but the data at hand"):  # a table whose run exists: the same refusal
        run_state(PlannedRun("cell", "fedavg", config.seed, config, run_dir))
