"""eval.split: validation holds a share of every class of the training split out of the partition and
evaluates on it, the same images for every seed; the test split is then not used."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raysim.data.arrays import with_validation_split
from raysim.data.embedded import embedded_source
from raysim.errors import RaysimError
from raysim.experiment import load_config
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def test_the_validation_split_holds_out_a_share_of_every_class_of_the_training_split():
    ds = embedded_source(None).build()
    out = with_validation_split(ds, 0.1, np.random.default_rng(0))
    train_counts = np.bincount(ds.train_y, minlength=10)
    held = np.bincount(out.test_y, minlength=10)
    assert np.array_equal(held, np.round(0.1 * train_counts).astype(int))
    assert np.array_equal(held + np.bincount(out.train_y, minlength=10), train_counts)
    # the held-out images are training images, none of them left for the clients
    pool = {x.tobytes() for x in ds.train_x}
    assert all(x.tobytes() in pool for x in out.test_x[:50])
    kept = {x.tobytes() for x in out.train_x}
    assert not any(x.tobytes() in kept for x in out.test_x[:50])


def test_runs_of_any_seed_are_validated_on_the_same_images_and_the_clients_never_hold_them():
    from raysim.runner import prepare

    held = []
    for seed in (0, 1):
        config = load_config(QUICKSTART, tiny_overrides(**{"eval.split": "validation", "seed": seed}))
        exp = prepare(config)
        held.append(exp.dataset.test_x)
        assert sum(len(p) for p in exp.parts) == len(exp.dataset.train_y)
        assert len(exp.dataset.test_y) + len(exp.dataset.train_y) == len(embedded_source(None).build().train_y)
    assert np.array_equal(held[0], held[1])


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_a_run_on_the_validation_split_says_so(tmp_path):
    from raysim.runner import one_line_summary, run_experiment

    config = load_config(QUICKSTART, tiny_overrides(**{"eval.split": "validation", "resources.in_process": True}))
    summary = run_experiment(config, tmp_path / "run")
    assert summary["evaluated_on"] == "validation"
    assert "final validation accuracy" in one_line_summary(summary, tmp_path / "run")
    assert summary["best_accuracy"] > 0.2  # learns (chance 0.1)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.split=train", "eval.split must be test or validation, got 'train'"),
        ("eval.validation_fraction=0", r"eval.validation_fraction must be in \(0, 1\), got 0"),
        ("eval.validation_fraction=1.5", r"eval.validation_fraction must be in \(0, 1\), got 1.5"),
    ],
)
def test_bad_validation_settings_are_one_clear_line(override, message):
    with pytest.raises(RaysimError, match=message):
        load_config(QUICKSTART, tiny_overrides() + [override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("seed=4294967296", r"seed must be in \[0, 2\^32\), got 4294967296"),
        ("seed=-1", r"seed must be in \[0, 2\^32\), got -1"),
        ("partition.seed=-3", r"partition.seed must be in \[0, 2\^32\), got -3"),
        ("eval.batch_size=0", "eval.batch_size must be >= 1, got 0"),
        ("partition.max_tries=0", "partition.max_tries must be >= 1, got 0"),
        ("resources.object_store_mb=0", r"resources.object_store_mb must be >= 75 \(Ray's smallest object store\)"),
    ],
)
def test_seeds_and_sizes_that_would_fail_later_or_repeat_another_seed_are_refused_up_front(override, message):
    """Issue 45, items 8, 10 (object store) and 11: refused when the config is read, not in round 1."""
    with pytest.raises(RaysimError, match=message):
        load_config(QUICKSTART, tiny_overrides() + [override])
