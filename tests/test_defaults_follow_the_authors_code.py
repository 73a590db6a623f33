"""Three fidelity items: FedDF's transfer set as its code streams it (or the growing pool), Co-Boosting's
batch of 128 at paper scale, and FedAF's CDC logits through the step's re-sampled model (eq. 6, 17)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.errors import RaysimError
from raysim.experiment import load_config
from tests.conftest import one_client_runtime, tiny_overrides
from tests.test_oneshot import ONE_SHOT, ROOT, run, server_series
from tests.test_oneshot_as_authors_ran import algorithm, fake_ctx, write_parquet_dataset

# ------------------------------------------------------------------ FedDF: what the student sees an epoch


@pytest.fixture
def transfer_set(tmp_path):
    """A 40-image transfer set (CIFAR-10's layout) and the keys that make FedDF read it."""
    images = np.random.default_rng(0).integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    write_parquet_dataset(tmp_path / "cifar10", images, np.arange(40) % 10)
    return {
        "algorithm.name": "feddf",
        "algorithm.distill_dataset": "cifar10",
        "algorithm.distill_root": str(tmp_path / "cifar10"),
        "dataset.verify": False,  # random images stand in for CIFAR-10
    }


def epochs_of(feddf, rounds: int = 3) -> list[tuple[np.ndarray, dict]]:
    """The pool each distillation epoch of one global round gives the student, and the logged scalars."""
    state = {"pool_x": None, "pool_y": None, "transfer_drawn": 0, "rounds_per_global": rounds}
    seen = []
    for round_index in range(2, rounds + 1):
        scalars = feddf.new_images(state, [], None, fake_ctx(), round_index)
        seen.append((state["pool_x"].copy(), scalars))
    return seen


def test_feddf_streams_the_whole_transfer_set_by_default_as_its_code_does(transfer_set):
    feddf = algorithm(**transfer_set)
    assert (feddf.params.transfer_pool, feddf.params.transfer_steps) == ("whole", 10000)
    every = {img.tobytes() for img in feddf.transfer_images(fake_ctx())}
    # one pass an epoch: every epoch is the whole set, in a new order
    feddf = algorithm(**transfer_set, **{"algorithm.transfer_steps": 0})
    (first, s1), (second, s2) = epochs_of(feddf)
    for pool in (first, second):
        assert len(pool) == 40 and {img.tobytes() for img in pool} == every
    assert not np.array_equal(first, second)
    assert (s1["transfer_passes"], s2["transfer_passes"]) == (1.0, 2.0)
    # transfer_steps batches of kd_batch (32) a global round, spread over its epochs: 3 + 3 of 6
    feddf = algorithm(**transfer_set, **{"algorithm.transfer_steps": 6})
    (first, _), (second, s2) = epochs_of(feddf)
    assert len(first) == len(second) == 3 * 32 and s2["transfer_passes"] == 192 / 40
    stream = np.concatenate([first, second])
    for start in range(0, 160, 40):  # each pass of the stream holds every image once
        assert {img.tobytes() for img in stream[start : start + 40]} == every
    # the growing pool: synthesis_batch (32) more an epoch
    feddf = algorithm(**transfer_set, **{"algorithm.transfer_pool": "growing"})
    assert [len(pool) for pool, _ in epochs_of(feddf)] == [32, 64]


def test_feddf_transfer_steps_are_spread_over_the_epochs_and_checked():
    feddf = algorithm(**{"algorithm.name": "feddf", "algorithm.distill_source": "generator"})
    feddf.params = replace(feddf.params, transfer_steps=10000)
    state = {"rounds_per_global": 201}  # the paper-scale round: 200 distillation epochs
    assert {feddf.epoch_steps(state, e) for e in range(1, 201)} == {50}
    feddf.params = replace(feddf.params, transfer_steps=7)
    state = {"rounds_per_global": 4}
    assert [feddf.epoch_steps(state, e) for e in (1, 2, 3)] == [2, 2, 3]
    source = ["algorithm.name=feddf", "algorithm.distill_dataset=mnist", "algorithm.distill_root=/nowhere"]
    base = tiny_overrides(**ONE_SHOT)
    with pytest.raises(RaysimError, match="transfer_steps=1 gives some of the 2 distillation epochs"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + source + ["algorithm.transfer_steps=1"])
    with pytest.raises(RaysimError, match="'algorithm.transfer_pool' must be one of whole, growing, got 'all'"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + source + ["algorithm.transfer_pool=all"])


@pytest.mark.slow  # three whole runs
def test_feddf_transfer_pool_changes_what_the_student_sees_in_a_run(tmp_path, transfer_set, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    runs = {}
    for name, extra in {
        "growing": {"algorithm.transfer_pool": "growing"},
        "pass": {"algorithm.transfer_steps": 0},
        "steps": {"algorithm.transfer_steps": 6},
    }.items():
        summary, run_dir = run(tmp_path, f"feddf-{name}", **transfer_set, **extra)
        runs[name] = (summary, run_dir)
    assert server_series(runs["growing"][1], "pool_images") == [32, 64]
    assert server_series(runs["pass"][1], "pool_images") == [40, 40]
    assert server_series(runs["pass"][1], "transfer_passes") == [1.0, 2.0]
    assert server_series(runs["steps"][1], "pool_images") == [96, 96]
    assert server_series(runs["growing"][1], "transfer_passes") == []
    # a streamed epoch's images are read again from the transfer set, not checkpointed
    from raysim.outputs.state_files import load_state

    def last_state(name):
        return load_state(runs[name][1] / "checkpoints/last.pt", "")["state"]

    assert last_state("pass")["pool_x"] is None and len(last_state("growing")["pool_x"]) == 64
    finals = {name: summary["final_accuracy"] for name, (summary, _) in runs.items()}
    assert len(set(finals.values())) > 1, finals  # the same clients, distilled on other images


def test_the_2_core_fedhydra_configs_keep_feddfs_growing_pool():
    for name in ("fmnist_alpha0.1_cpu", "cifar10_alpha0.1_cpu", "mnist_2cc_cpu", "fmnist_100c_cpu"):
        config = load_config(ROOT / f"configs/fedhydra/{name}.yaml", ["algorithm.name=feddf", "dataset.root=/nowhere"])
        assert config.algorithm.transfer_pool == "growing", name
    paper = load_config(ROOT / "configs/fedhydra/cifar10_alpha0.1.yaml", ["algorithm.name=feddf", "dataset.root=/x"])
    assert (paper.algorithm.transfer_pool, paper.algorithm.transfer_steps) == ("whole", 10000)


# ------------------------------------------------------------------ Co-Boosting's batch at paper scale


def test_paper_scale_coboosting_uses_its_codes_batch_of_128_and_the_others_keep_256():
    from raysim.reproduce import load_table

    for table, cell in (("fedhydra_table1", "cifar10_alpha0.1"), ("fedhydra_table2", "mnist_2cc")):
        t = load_table(table)
        resolved = {m: t.config(cell, m, "paper", 0, "/nonexistent/data").algorithm for m in t.methods}
        assert (resolved["coboosting"].synthesis_batch, resolved["coboosting"].kd_batch) == (128, 128)
        assert (resolved["fedhydra"].synthesis_batch, resolved["fedhydra"].kd_batch) == (256, 256)
        assert (resolved["dense"].synthesis_batch, resolved["dense"].kd_batch) == (256, 256)
        # the 2-core scale keeps its own batches for every method
        if "cpu" in t.cells[cell].config:
            cpu = {m: t.config(cell, m, "cpu", 0, "/nonexistent/data").algorithm for m in ("coboosting", "fedhydra")}
            assert {(a.synthesis_batch, a.kd_batch) for a in cpu.values()} == {(64, 128)}


# ------------------------------------------------------------------ FedAF: the model of u (eq. 6)

TINY_FEDAF = {
    "algorithm.name": "fedaf",
    "algorithm.ipc": 3,
    "algorithm.steps": 2,
    "algorithm.real_batch": 32,
    "algorithm.server_epochs": 1,
    "algorithm.lambda_loc": 10.0,  # CDC large enough to see in two steps
    "model.width": 8,
}


def fedaf_runtime(tmp_path: Path, **extra):
    """A client runtime (no Ray) of a tiny FedAF run, and a round-2 payload whose V covers every class."""
    from raysim.registry import make_algorithm

    config = load_config(ROOT / "configs/quickstart.yaml", tiny_overrides(**{**TINY_FEDAF, **extra}))
    exp, runtime = one_client_runtime(config, tmp_path / "state")
    torch.manual_seed(0)
    server = make_algorithm(config)
    payload = server.broadcast(server.server_init(exp.spec.build(), runtime.ctx), 2, [0])
    c = exp.dataset.num_classes
    payload["logits"] = np.random.default_rng(1).normal(0, 3, (c, c)).astype(np.float32)
    payload["known"] = np.ones(c, bool)
    return runtime, payload


def condensed(tmp_path: Path, name: str, **extra) -> tuple[np.ndarray, dict]:
    runtime, payload = fedaf_runtime(tmp_path / name, **extra)
    out = runtime.run_client(2, 0, payload)
    return out["message"]["images"], out


def test_fedaf_cdc_goes_through_the_resampled_model_by_default_and_the_global_one_on_request(tmp_path):
    runtime, _ = fedaf_runtime(tmp_path / "defaults")
    assert runtime.algorithm.params.cdc_model == "resampled"
    resampled, _ = condensed(tmp_path, "resampled")
    global_, _ = condensed(tmp_path, "global", **{"algorithm.cdc_model": "global"})
    assert not np.allclose(resampled, global_)  # the two readings move the images apart
    # without CDC the model of u does not matter
    off = {"algorithm.lambda_loc": 0.0}
    without = condensed(tmp_path, "off-global", **{**off, "algorithm.cdc_model": "global"})[0]
    np.testing.assert_array_equal(condensed(tmp_path, "off-resampled", **off)[0], without)
    with pytest.raises(RaysimError, match="'algorithm.cdc_model' must be one of resampled, global"):
        load_config(ROOT / "configs/quickstart.yaml", tiny_overrides(**{**TINY_FEDAF, "algorithm.cdc_model": "w"}))


def test_fedaf_resampled_u_is_the_mean_logit_of_the_dm_pass(tmp_path):
    """u through w' (cdc_points: mean) is the classifier of the DM pass's mean feature, which is the
    mean of that pass's logits (the classifier is linear); per_image reads the same logits."""
    from raysim.algorithms.condensed.dsa import DSA
    from raysim.algorithms.condensed.matching import class_means

    runtime, payload = fedaf_runtime(tmp_path)
    algo, ctx = runtime.algorithm, runtime.ctx
    net = algo.matching_model(payload, None, ctx, seed=5)
    gen = torch.Generator().manual_seed(0)
    syn = torch.randn(3, 4, 1, 28, 28, generator=gen, requires_grad=True)
    real = [torch.randn(6, 1, 28, 28, generator=gen) for _ in range(3)]
    means = class_means(net, real, list(syn), DSA(), 5)
    per_image = algo.step_logits(net, syn, 5)
    torch.testing.assert_close(net.classifier(means.syn_features), per_image.mean(1), rtol=1e-4, atol=1e-5)
    # the CDC loss of both points conventions has a gradient on the images through w'
    for points in ("mean", "per_image"):
        algo.params = replace(algo.params, cdc_points=points)
        loss = algo.extra_condensation_loss(payload, means, syn, [0, 1, 2], 5, ctx)
        (grad,) = torch.autograd.grad(loss, syn, retain_graph=True)
        assert float(grad.norm()) > 0
