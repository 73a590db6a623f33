"""The one-shot family (raysim.algorithms.oneshot): the shared machinery (generator, losses,
client-stage cache) and the six methods on the embedded dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from raysim.algorithms.oneshot.augment import crop_flip
from raysim.algorithms.oneshot.ensemble import (
    max_client_share,
    mean_logits,
    normalise_over_classes,
    normalise_over_clients,
    stratified_logits,
    stratified_predict,
    tempered_over_clients,
    weighted_logits,
)
from raysim.algorithms.oneshot.generator import Generator, reset_generator
from raysim.algorithms.oneshot.losses import (
    BNStatistics,
    adversarial_loss,
    distillation_loss,
    hard_sample_cross_entropy,
)
from raysim.algorithms.oneshot.stratify import (
    MIN_LOSS,
    loss_variation,
    rank_against_predictions,
    stratification_scores,
)
from raysim.algorithms.oneshot.transfer import transfer_source
from raysim.data.home import data_home
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.models import build_model
from raysim.outputs.metrics import is_timing
from raysim.runner import prepare
from raysim.tensors import module_weights
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["fedavg_oneshot", "ot_fusion", "feddf", "dense", "coboosting", "fedhydra"]
# 5 clients with two disjoint classes each (2c/c), the paper's 2-layer CNN, a tiny generator
ONE_SHOT = {
    "algorithm.name": "fedhydra",
    "rounds": 3,
    "clients.num": 5,
    "clients.per_round": 5,
    "partition.kind": "classes",
    "partition.classes_per_client": 2,
    "model.name": "cnn2",
    "local.epochs": 1,
    "local.batch_size": 64,
    "algorithm.ngf": 8,
    "algorithm.nz": 32,
    "algorithm.generator_steps": 3,
    "algorithm.synthesis_batch": 32,
    "algorithm.kd_batch": 32,
    "algorithm.stratify_steps": 10,
    "algorithm.stratify_batch": 8,  # 50 generators (5 clients x 10 classes): most of a FedHydra run
    "resources.in_process": True,
}


def run(tmp_path: Path, name: str, **overrides):
    from raysim.runner import run_experiment

    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{**ONE_SHOT, **overrides}))
    run_dir = tmp_path / name
    return run_experiment(config, run_dir), run_dir


def server_series(run_dir: Path, metric: str) -> list[float]:
    return [
        r["value"]
        for r in pq.read_table(run_dir / "metrics.parquet").to_pylist()
        if r["client"] is None and r["metric"] == metric
    ]


# ------------------------------------------------------------------ shared machinery


def test_generator_makes_images_of_the_datasets_shape_in_0_1_and_resets_deterministically():
    g = Generator(nz=16, ngf=8, image_size=28, channels=1)
    z = torch.randn(4, 16)
    with torch.no_grad():
        x = reset_generator(g, 3)(z)
        assert x.shape == (4, 1, 28, 28) and 0 <= float(x.min()) and float(x.max()) <= 1
        assert torch.equal(reset_generator(g, 3)(z), x) and not torch.equal(reset_generator(g, 4)(z), x)
        assert Generator(16, 8, 32, 3)(z).shape == (4, 3, 32, 32)


def test_crop_flip_without_shift_or_flip_is_the_identity_and_passes_gradients():
    x = torch.rand(3, 1, 8, 8, requires_grad=True)
    same = crop_flip(x, torch.Generator().manual_seed(0), pad=0, flip=False)
    assert torch.allclose(same, x, atol=1e-6)
    shifted = crop_flip(x, torch.Generator().manual_seed(0), pad=2)
    shifted.sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


def test_bn_statistics_loss_is_zero_when_the_batch_matches_the_running_statistics_and_skips_models_without_bn():
    teacher = build_model(
        "cnn2", in_channels=1, num_classes=10, image_size=28, width=8, depth=3, norm="batchnorm", hidden=8
    )
    x = torch.randn(64, 1, 28, 28)
    teacher.train()
    teacher.features[1].momentum = 1.0  # running statistics := this batch's
    teacher.features[5].momentum = 1.0
    teacher(x)
    teacher.eval().requires_grad_(False)
    with BNStatistics([teacher]) as bn:
        teacher(x)
        assert float(bn.loss()) < 1e-3
        teacher(x * 3 + 1)
        assert float(bn.loss()) > 1.0
    without_bn = build_model(
        "cnn3", in_channels=3, num_classes=10, image_size=32, width=8, depth=3, norm="batchnorm", hidden=8
    )
    with BNStatistics([without_bn]) as bn:
        without_bn(torch.randn(2, 3, 32, 32))
        assert float(bn.loss()) == 0.0


def test_adversarial_loss_counts_only_disagreeing_samples_when_masked():
    student = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    teacher = torch.tensor([[4.0, 0.0], [5.0, 0.0]])  # agree on sample 0, disagree on 1
    kl = F.kl_div(F.log_softmax(student, 1), F.softmax(teacher, 1), reduction="none").sum(1)
    assert torch.allclose(adversarial_loss(student, teacher, masked=True), -kl[1] / 2)
    assert torch.allclose(adversarial_loss(student, teacher, masked=False), -kl.mean())
    assert float(distillation_loss(teacher, teacher, 4.0)) == pytest.approx(0.0, abs=1e-6)


def test_hard_sample_cross_entropy_weights_confident_samples_down():
    logits = torch.tensor([[9.0, 0.0], [0.5, 0.0]])
    y = torch.tensor([0, 0])
    ce = F.cross_entropy(logits, y, reduction="none")
    p = F.softmax(logits, 1)[:, 0]
    assert torch.allclose(hard_sample_cross_entropy(logits, y, 1.0), ((1 - p) * ce).mean())
    assert torch.allclose(hard_sample_cross_entropy(logits, y, 0.0), ce.mean())


def test_stratified_aggregation_follows_eq_8_to_11():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 5)  # (clients, samples, classes)
    u = np.random.default_rng(0).random((3, 5)) + 0.1
    r, c = normalise_over_clients(u), normalise_over_classes(u)
    assert np.allclose(r.sum(0), 1) and np.allclose(c.sum(1), 1)
    rt, ct = torch.tensor(r, dtype=torch.float32), torch.tensor(c, dtype=torch.float32)
    y = torch.tensor([0, 4, 2, 2])
    out = stratified_logits(logits, y, rt, ct)
    for i in range(4):  # eq. 11 row by row: sum_k U_r[y_i, k] * (P_k(i, :) (.) U_c(:, k))
        expected = sum(rt[k, y[i]] * logits[k, i] * ct[k] for k in range(3))
        assert torch.allclose(out[i], expected, atol=1e-6)
    scores = stratified_predict(logits, rt, ct)  # label-free: try every class as the target
    for i in range(4):
        for cls in range(5):
            row = stratified_logits(logits[:, i : i + 1], torch.tensor([cls]), rt, ct)
            assert torch.allclose(scores[i, cls], torch.log_softmax(row, 1)[0, cls], atol=1e-5)
    assert torch.allclose(weighted_logits(logits, torch.ones(3)), mean_logits(logits))
    unscaled = stratified_logits(logits, y, rt, None)  # SA without eq. 8: sum_k U_r[y_i, k] * P_k(i, :)
    for i in range(4):
        assert torch.allclose(unscaled[i], sum(rt[k, y[i]] * logits[k, i] for k in range(3)), atol=1e-6)
    assert torch.allclose(stratified_logits(logits, y, rt, torch.ones_like(ct)), unscaled)
    assert torch.allclose(stratified_predict(logits, rt, None), stratified_predict(logits, rt, torch.ones_like(ct)))


def test_loss_variation_is_eq_2():
    assert loss_variation([2.0, 1.0, 0.5]) == pytest.approx((2.0 - 0.5) / 0.5)
    assert loss_variation([1.0, 1.0]) == 0.0


def test_stratification_score_is_never_negative_nor_infinite_for_flat_or_zero_curves():
    """The case that broke: a curve of zeros gave u = -1 (a negative teacher weight), and eq. 2
    unguarded (the authors' code) divides by zero."""
    for curve in ([0.0, 0.0, 0.0], [1e-13, 1e-13], [3.0, 3.0, 3.0], [5.0], []):
        assert loss_variation(curve) == 0.0, curve  # flat (zeros included) or no curve at all
    assert loss_variation([2.0, 0.0]) == pytest.approx(2.0 / MIN_LOSS)  # reaches 0: min clamped
    assert loss_variation([2.0, float("nan"), 1.0, float("inf")]) == pytest.approx(1.0)  # finite points only
    assert loss_variation([float("nan"), float("nan")]) == 0.0
    for curve in ([0.0, 1e-9, 0.0], [1e-7, 2e-7], [1e30, 0.0]):
        u = loss_variation(curve)
        assert u >= 0 and np.isfinite(u), (curve, u)


def test_stratification_of_a_model_sure_of_one_class_gives_zeros_and_equal_weights():
    """A client model that puts all its probability on class 0 whatever its input: its CE curve is
    exactly 0 for class 0 and flat for the others, so every u is 0 (not -1 nor a division by zero),
    and a class with u = 0 for every client is weighted equally over the clients."""

    class Sure(torch.nn.Module):
        def forward(self, x):
            logits = torch.zeros(len(x), 3)
            logits[:, 0] = 1e4
            return logits + 0 * x.mean()  # depends on the images, with zero gradient

    u = stratification_scores(
        [Sure(), Sure()],
        3,
        Generator(nz=8, ngf=4, image_size=28, channels=1),
        lambda x: x,
        steps=3,
        batch=4,
        lr=1e-3,
        seed_of=lambda k, j: 10 * k + j,
    )
    assert np.array_equal(u, np.zeros((2, 3)))
    assert np.array_equal(normalise_over_clients(u), np.full((2, 3), 0.5))
    assert np.array_equal(normalise_over_classes(u), np.full((2, 3), 1 / 3))
    assert np.array_equal(max_client_share(u), np.full(3, 0.5))


def test_teacher_max_client_share_and_tempering_on_a_small_s():
    u = np.array([[3.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 2.0, 0.0]])  # (clients, classes); class 2 all 0
    # by hand: class 0: 3/4, 1/4, 0; class 1: 1/4, 1/4, 2/4; class 2: equal, 1/3 each
    assert np.allclose(max_client_share(u), [0.75, 0.5, 1 / 3])
    assert np.allclose(max_client_share(normalise_over_clients(u)), [0.75, 0.5, 1 / 3])
    assert np.array_equal(tempered_over_clients(u, 1.0), normalise_over_clients(u))  # tau = 1: the paper's rule
    half = tempered_over_clients(u, 2.0)  # sqrt(u), normalised: class 0 sqrt(3) / (sqrt(3) + 1)
    assert np.allclose(half.sum(0), 1) and half[2, 0] == 0  # u = 0 keeps weight 0
    assert np.allclose(max_client_share(half), [3**0.5 / (3**0.5 + 1), 2**0.5 / (2**0.5 + 2), 1 / 3])
    skewed = np.array([[1950.0, 0.2], [0.16, 900.0], [3.0, 0.5], [1.0, 1.0]])  # one client holds each class
    shares = [max_client_share(tempered_over_clients(skewed, t)).max() for t in (1.0, 2.0, 4.0, 16.0, 1e6)]
    assert shares[0] > 0.99 and all(a > b for a, b in zip(shares, shares[1:])), shares  # falls smoothly with tau
    assert shares[-1] == pytest.approx(0.25, abs=1e-4)  # towards equal weights over the clients
    huge = tempered_over_clients(np.array([[1e300, 1.0], [1e-300, 0.0]]), 0.01)  # sharpening does not overflow
    assert np.all(np.isfinite(huge)) and np.allclose(huge.sum(0), 1)


def test_stratification_is_ranked_against_prediction_rate_and_precision():
    labels = torch.tensor([0, 0, 1, 1])
    predictions = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]])  # client 0 always says 0; client 1 once errs
    # cells (0, 0), (0, 1), (1, 0), (1, 1): rates 1, 0, 0.25, 0.75; precisions 0.5, 0, 1, 2/3
    ranks = rank_against_predictions(np.array([[4.0, 1.0], [2.0, 3.0]]), predictions, labels)
    assert ranks == {"prediction_rate": 1.0, "precision": pytest.approx(0.2)}
    ranks = rank_against_predictions(np.array([[2.0, 1.0], [4.0, 3.0]]), predictions, labels)
    assert ranks == {"prediction_rate": pytest.approx(0.2), "precision": 1.0}
    constant = rank_against_predictions(np.ones((2, 2)), predictions, labels)  # no ranking to compare
    assert constant == {"prediction_rate": None, "precision": None}


# ------------------------------------------------------------------ the methods


@pytest.fixture(scope="module")
def six_methods(tmp_path_factory):
    """Every method on one config (3 rounds: the client round, two distillation epochs), the client
    stage cached by the first run; plus dense without the cache. Shared by the tests below."""
    folder = tmp_path_factory.mktemp("oneshot")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAYSIM_CACHE_DIR", str(folder / "cache"))
        runs = {
            "uncached": run(
                folder, "dense-uncached", **{"algorithm.name": "dense", "algorithm.cache_client_stage": False}
            )
        }
        assert not list((folder / "cache").glob("client_stage/*.pt"))
        for method in ["dense", *[m for m in METHODS if m != "dense"]]:  # dense fills the cache
            extra = {  # the embedded data has no other dataset beside it: the data-free variants
                "feddf": {"algorithm.distill_source": "generator"},
                "ot_fusion": {"algorithm.alignment": "weights"},
            }.get(method, {})
            runs[method] = run(
                folder, method, **{"algorithm.name": method, "output.tensorboard": method == "fedhydra", **extra}
            )
    return runs, folder / "cache"


def test_stratification_finds_each_clients_two_classes_and_is_reported(six_methods):
    summary, run_dir = six_methods[0]["fedhydra"]
    u = np.array(summary["stratification"])
    assert u.shape == (5, 10) and np.allclose(u.sum(1), 1, atol=1e-4)
    scores = np.array(summary["stratification_scores"])  # eq. 6-7 turn u into U_c
    assert np.allclose(scores / scores.sum(1, keepdims=True), u, atol=1e-4)
    for k, row in enumerate(u):  # client k holds classes 2k and 2k + 1
        assert sorted(np.argsort(row)[-2:].tolist()) == [2 * k, 2 * k + 1], (k, row)
    accuracy = summary["client_accuracy"]
    assert sorted(accuracy) == [str(k) for k in range(5)] and summary["best_client_accuracy"] > 0.15
    # On 2c/c a client predicts only its two classes, so its largest u are where it predicts at all
    # and the only classes it can be right on: both rankings agree with u.
    ranks = summary["stratification_rank_correlation"]
    assert ranks["prediction_rate"] > 0.5 and ranks["precision"] > 0.5, ranks
    assert 0 <= summary["ensemble_accuracy"] <= 1 and 0 <= summary["ensemble_accuracy_stratified"] <= 1
    # the teacher's largest client share, beside its label-free accuracy and the average ensemble's
    assert 0 <= summary["teacher_accuracy"] <= 1
    per_class = summary["teacher_max_client_share_per_class"]
    assert len(per_class) == 10 and summary["teacher_max_client_share"] == max(per_class)
    assert summary["teacher_max_client_share"] == pytest.approx(max_client_share(scores).max(), abs=1e-4)
    assert 1 / 5 <= summary["teacher_max_client_share"] <= 1
    assert server_series(run_dir, "teacher_max_client_share") == [summary["teacher_max_client_share"]]
    # Told each image's class, SA weights the one client that holds it (U_r): far above the label-free reading.
    assert summary["ensemble_accuracy_stratified_given_label"] > summary["ensemble_accuracy_stratified"] + 0.2
    own = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["metric"] == "own_accuracy"]
    assert sorted(r["client"] for r in own) == list(range(5))
    assert server_series(run_dir, "participants") == [0, 0, 0]  # clients from the cache, then distillation epochs
    assert server_series(run_dir, "pool_images") == [32, 64]
    assert len(server_series(run_dir, "accuracy")) == 3  # the server model after every epoch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert any("stratification" in tag for tag in events.Tags()["images"])


def test_best_accuracy_is_over_the_methods_own_models(six_methods):
    """A distiller's best is over its distillation epochs, not the client round's model (FedDF's is
    the clients' average, FedAvg one-shot's result); a method that only combines has round 1."""
    for method in METHODS:
        summary, run_dir = six_methods[0][method]
        accuracy = server_series(run_dir, "accuracy")
        first = 1 if method in ("fedavg_oneshot", "ot_fusion") else 2  # the first round of its own models
        own = accuracy[first - 1 :]
        assert summary["best_accuracy"] == max(own), method
        assert summary["best_round"] == first + own.index(max(own)), method


def test_every_method_runs_from_one_config_and_the_cached_client_stage_changes_no_number(six_methods):
    runs, cache = six_methods
    assert len(list(cache.glob("client_stage/*.pt"))) == 1
    (uncached, _), (first, first_dir) = runs["uncached"], runs["dense"]
    assert not first["client_stage_cached"] and server_series(first_dir, "bytes_up")[0] > 0
    for method in METHODS[:-1]:
        if method == "dense":
            continue
        summary, run_dir = runs[method]
        assert summary["client_stage_cached"], method
        assert server_series(run_dir, "participants")[0] == 0  # no client ran: the models came from the cache
        # ... and the bytes are the stage's as if it had run
        for key in ("bytes_up", "bytes_down"):
            assert server_series(run_dir, key)[0] == server_series(first_dir, key)[0] > 0, (method, key)
    for key in ("final_accuracy", "best_accuracy", "client_accuracy", "ensemble_accuracy", "bytes_up", "bytes_down"):
        assert uncached[key] == first[key], key
    # the client models are the same for every method
    assert len({json.dumps(s["client_accuracy"]) for s, _ in runs.values()}) == 1
    # FedAvg one-shot's and OT fusion's models combine the clients': no longer the initial model
    for method in ("fedavg_oneshot", "ot_fusion"):
        assert runs[method][0]["final_accuracy"] != first["final_accuracy"]
    assert runs["ot_fusion"][0]["ot_anchor"] in range(5)
    # weight-based OT on clients of one initialisation keeps every neuron where it is: FedAvg one-shot
    assert set(runs["ot_fusion"][0]["ot_identity_layers"].values()) == {2}  # cnn2's two hidden layers
    assert runs["ot_fusion"][0]["final_accuracy"] == runs["fedavg_oneshot"][0]["final_accuracy"]
    assert len(runs["coboosting"][0]["ensemble_weights"]) == 5
    # DENSE's BN loss is off, as its code ran; FedHydra's is on (lambda1 = 1; cnn2 has BN layers)
    assert set(server_series(runs["dense"][1], "bn_loss")) == {0.0}
    assert all(v > 0 for v in server_series(runs["fedhydra"][1], "bn_loss"))
    # Co-Boosting's student follows its cosine schedule over the round's two epochs
    assert server_series(runs["coboosting"][1], "kd_lr") == pytest.approx([0.01, 0.005])


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_fedhydra_without_its_additions_is_dense(six_methods, tmp_path, monkeypatch):
    """FedHydra is DENSE's loop plus SA, the hard-label term (eq. 18), its own KD temperature and
    reduction, its code's augmentation, learning rate and BN weight; its adversarial term (eq. 15) is
    DENSE's at temperature 1. With each of those set to DENSE's it must reproduce DENSE's run
    exactly, image for image."""
    runs, cache = six_methods
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(cache))
    _, dense_dir = runs["dense"]
    _, as_dense = run(
        tmp_path,
        "fedhydra-as-dense",
        **{
            "algorithm.aggregation": "mean",
            "algorithm.beta": 0.0,
            "algorithm.temperature": 20.0,
            "algorithm.kl_reduction": "batchmean",
            "algorithm.synthesis_augment": "crop_flip",
            "algorithm.distill_augment": "flip",  # DENSE's on a dataset that is not CIFAR
            "algorithm.kd_lr": 0.005,
            "algorithm.lambda1": 0.0,  # DENSE's BN loss, as its code ran
        },
    )
    for metric in ("generator_loss", "distill_loss", "accuracy"):
        assert server_series(as_dense, metric) == server_series(dense_dir, metric), metric
    assert server_series(runs["fedhydra"][1], "distill_loss") != server_series(dense_dir, "distill_loss")


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_the_literal_eq_8_is_an_ablation_of_the_teacher_only(six_methods, tmp_path, monkeypatch):
    """`aggregation: stratified_eq8` changes the teacher (each client's logits scaled per class by U_c),
    nothing before it: the same clients and u, so the same test-set readings of both teachers; and
    each run reads its own teacher both ways."""
    runs, cache = six_methods
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(cache))
    default_summary, default_dir = runs["fedhydra"]
    summary, run_dir = run(tmp_path, "fedhydra-eq8", **{"algorithm.aggregation": "stratified_eq8"})
    readings = [k for k in default_summary if k.startswith("ensemble_accuracy_stratified")]
    assert len(readings) == 4 and all(0 <= default_summary[k] <= 1 for k in readings)
    assert {k: summary[k] for k in readings} == {k: default_summary[k] for k in readings}
    assert summary["stratification_scores"] == default_summary["stratification_scores"]
    assert server_series(run_dir, "distill_loss") != server_series(default_dir, "distill_loss")
    for key in ("", "_given_label"):
        assert summary[f"teacher_accuracy{key}"] == summary[f"ensemble_accuracy_stratified{key}"]
    for key in ("", "_given_label"):  # the default, label_weighted, is eq. 10-11 without eq. 8
        assert (
            default_summary[f"teacher_accuracy{key}"] == default_summary[f"ensemble_accuracy_stratified_unscaled{key}"]
        )
    # the names before 2026-11-26 keep their meaning, so old run directories resume to the same numbers
    old = load_config(
        ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{**ONE_SHOT, "algorithm.aggregation": "stratified"})
    )
    assert old.algorithm.aggregation == "stratified_eq8"


def test_fedhydra_gives_the_same_numbers_on_one_and_two_actors(ray_session, tmp_path):
    """Two client actors against one client runtime in process, as on one actor (tests/conftest.py: run_tiny)."""
    rows = {}
    for actors in (1, 2):
        _, run_dir = run(
            tmp_path,
            f"actors{actors}",
            **{
                "resources.in_process": actors == 1,
                "resources.actors": actors,
                "algorithm.cache_client_stage": False,
                "rounds": 2,
                "local.epochs": 1,
                "algorithm.stratify_steps": 2,  # eq. 2's least
            },
        )
        rows[actors] = [
            (r["round"], r["client"], r["metric"], r["value"])
            for r in pq.read_table(run_dir / "metrics.parquet").to_pylist()
            if not is_timing(r["metric"])
        ]
    assert rows[1] == rows[2]


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_heterogeneous_clients_and_several_global_rounds(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    summary, run_dir = run(
        tmp_path, "hetero", **{"clients.models": "[cnn2, lenet, mlp]", "model.name": "lenet", "algorithm.name": "dense"}
    )
    assert summary["client_models"] == {"cnn2": [0, 3], "lenet": [1, 4], "mlp(hidden=128)": [2]}
    assert len(summary["client_accuracy"]) == 5
    # T = 2: rounds 1 and 3 are client rounds; in the second, clients with the server's architecture restart
    # from the distilled model (they receive it), the others from their own previous model
    summary, run_dir = run(
        tmp_path, "two-rounds", **{"rounds": 4, "algorithm.global_rounds": 2, "algorithm.name": "dense"}
    )
    assert server_series(run_dir, "participants") == [5, 0, 5, 0]
    down = server_series(run_dir, "bytes_down")
    assert down[0] < 1000 < down[2]


def test_one_shot_configuration_errors_are_one_clear_line():
    base = tiny_overrides(**ONE_SHOT)
    with pytest.raises(RaysimError, match=r"rounds=3 must be a multiple of algorithm.global_rounds=2"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.global_rounds=2"])
    feddf = base + ["algorithm.name=feddf"]
    with pytest.raises(
        RaysimError,
        match="feddf has no default set of unlabelled images for dataset embedded: set algorithm.distill_dataset",
    ):
        load_config(ROOT / "configs" / "quickstart.yaml", feddf)
    # the transfer set's folder: beside dataset.root, else in the data home
    config = load_config(ROOT / "configs" / "quickstart.yaml", feddf + ["algorithm.distill_dataset=mnist"])
    assert transfer_source(config, "mnist", "", "k/k") == ("mnist", str(data_home() / "mnist"))
    with pytest.raises(RaysimError, match=r"not at .*mnist: get it with 'raysim data get mnist'"):
        prepare(config)  # before Ray starts, not after the client stage
    with pytest.raises(
        RaysimError, match="aggregation must be one of label_weighted, label_weighted_raw, stratified_eq8, mean"
    ):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.aggregation=median"])
    for key, value, allowed in (
        ("kl_reduction", "sum", "batchmean, mean"),
        ("synthesis_augment", "rotate", "crop_flip, flip, none, auto"),
        ("kd_optimizer", "lbfgs", "sgd, adam"),
        ("kd_schedule", "step", "constant, cosine"),
    ):
        with pytest.raises(RaysimError, match=f"'algorithm.{key}' must be one of {allowed}, got '{value}'"):
            load_config(ROOT / "configs" / "quickstart.yaml", base + [f"algorithm.{key}={value}"])
    with pytest.raises(RaysimError, match="algorithm.kd_grad_clip must be >= 0, got -1"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.kd_grad_clip=-1"])
    for method in ("dense", "coboosting", "feddf", "fedhydra"):
        extra = ["algorithm.distill_source=generator"] if method == "feddf" else []
        with pytest.raises(RaysimError, match="algorithm.temperature must be > 0, got -1"):
            load_config(
                ROOT / "configs" / "quickstart.yaml",
                base + [f"algorithm.name={method}", "algorithm.temperature=-1", *extra],
            )

    config = load_config(
        ROOT / "configs" / "quickstart.yaml", base + ["algorithm.name=fedavg_oneshot", "clients.models=[cnn2, lenet]"]
    )
    with pytest.raises(RaysimError, match="needs every client to have the server's model"):
        prepare(config)


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
@pytest.mark.parametrize("method", ["coboosting", "fedhydra"])
def test_a_resumed_run_continues_to_the_same_numbers(six_methods, tmp_path, monkeypatch, method):
    """The pool, the distillation optimiser, the ensemble weights and the stratification are
    checkpointed: extending a finished run by an epoch equals running them at once. (Co-Boosting's
    cosine schedule spans the epochs planned when the run starts, so extending a run would anneal
    differently: it is compared on a constant rate here.)"""
    from raysim.resume import resume_config
    from raysim.runner import run_experiment

    runs, cache = six_methods
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(cache))
    extra = {"algorithm.kd_schedule": "constant"} if method == "coboosting" else {}
    _, part = run(
        tmp_path, "part", **{"algorithm.name": method, "rounds": 2, "output.tensorboard": method == "fedhydra", **extra}
    )
    run_experiment(resume_config(part, ["rounds=3"]), part)
    _, whole = run(tmp_path, "whole", **{"algorithm.name": method, **extra}) if extra else runs[method]

    def values(run_dir):
        return [
            (r["round"], r["client"], r["metric"], r["value"])
            for r in pq.read_table(run_dir / "metrics.parquet").to_pylist()
            if not is_timing(r["metric"])
        ]

    assert values(part) == values(whole)


def test_ot_fusion_refuses_a_residual_network_before_ray_starts():

    config = load_config(
        ROOT / "configs" / "quickstart.yaml",
        tiny_overrides(**ONE_SHOT)
        + [
            "algorithm.name=ot_fusion",
            "algorithm.alignment=weights",
            "model.name=resnet18",
            "model.width_multiplier=0.125",
        ],
    )
    with pytest.raises(RaysimError, match="ot_fusion aligns plain chains"):
        prepare(config)
    with pytest.raises(RaysimError, match="algorithm.anchor=7 is not a client id"):
        load_config(
            ROOT / "configs" / "quickstart.yaml",
            tiny_overrides(**ONE_SHOT)
            + ["algorithm.name=ot_fusion", "algorithm.alignment=weights", "algorithm.anchor=7"],
        )


def test_independent_client_inits_are_each_clients_own_and_keyed_apart_in_the_cache(monkeypatch):
    """`client_init: independent` (the OT paper's setting): each client starts from weights of its
    own, a function of (seed, client id) only, so the same in any run and whichever actor (and after
    whichever other clients) builds them, for any architecture; its client stage is keyed apart from
    the shared one, whose key is the one it had before client_init existed."""
    from raysim.algorithms.oneshot import client_cache
    from raysim.registry import make_algorithm

    def setting(*extra):
        config = load_config(
            ROOT / "configs" / "quickstart.yaml",
            tiny_overrides(**ONE_SHOT) + ["algorithm.name=ot_fusion", "algorithm.alignment=weights", *extra],
        )
        return config, prepare(config)

    def inits(config, spec, order):
        algorithm = make_algorithm(config)  # a fresh instance, as on another actor
        return {k: algorithm.initial_weights(k, spec.client_architecture(k), spec) for k in order}

    def same(a, b):
        return all(np.array_equal(a[name], b[name]) for name in a)

    shared, experiment = setting()
    independent, _ = setting("algorithm.client_init=independent")
    spec = experiment.spec
    assert shared.algorithm.client_init == "shared"
    first = inits(shared, spec, range(5))
    assert all(same(first[k], module_weights(spec.initial_model())) for k in range(5))
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    own = inits(independent, spec, range(5))
    assert torch.equal(torch.rand(3), before)  # the caller's random stream is untouched
    assert not any(same(own[j], own[k]) for j in range(5) for k in range(j))
    assert not any(same(own[k], first[k]) for k in range(5))
    again = inits(independent, spec, [4, 2, 0, 3, 1])  # another order, another instance: the same
    assert all(same(own[k], again[k]) for k in range(5))
    # heterogeneous clients (clients.models): 0 and 3 have cnn2, 1 and 4 lenet
    hetero = ["clients.models=[cnn2, lenet, mlp]", "model.name=lenet", "algorithm.name=dense"]
    for extra, equal in (([], True), (["algorithm.client_init=independent"], False)):
        config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**ONE_SHOT) + hetero + extra)
        h = inits(config, prepare(config).spec, range(5))
        assert same(h[0], h[3]) is equal and same(h[1], h[4]) is equal
        assert set(h[0]) != set(h[1])  # each client its own architecture's tensors

    # the cache key: independent is keyed apart (an entry's shapes cannot tell the two apart)
    def key(config):
        return client_cache.client_stage_key(config, experiment.data_digest, experiment.mean, experiment.std)

    shared_key = key(shared)
    assert shared_key != key(independent)
    monkeypatch.setattr(client_cache, "CLIENT_STAGE_PARAMS", {})  # the key before client_init existed:
    assert key(shared) == shared_key  # shared keeps it, so the entries written before are still found
    with pytest.raises(RaysimError, match="'algorithm.client_init' must be one of shared, independent, got 'own'"):
        setting("algorithm.client_init=own")


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_weight_based_ot_permutes_neurons_of_independently_initialised_clients(tmp_path, monkeypatch):
    """With one shared initialisation weight-based OT keeps every neuron (FedAvg one-shot, the six
    methods' test); with `client_init: independent` it permutes them, and so differs from FedAvg
    one-shot on the same (cached) clients."""
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    fast = {"rounds": 1, "local.epochs": 1, "algorithm.client_init": "independent"}
    summary, _ = run(tmp_path, "ot", **{"algorithm.name": "ot_fusion", "algorithm.alignment": "weights", **fast})
    assert not summary["client_stage_cached"]
    identity = summary["ot_identity_layers"]
    assert set(identity) == {str(k) for k in range(5)} and identity[str(summary["ot_anchor"])] == 2  # cnn2: 2
    assert any(v < 2 for k, v in identity.items() if k != str(summary["ot_anchor"])), identity
    assert len(list((tmp_path / "cache").glob("client_stage/*.pt"))) == 1
    fedavg, _ = run(tmp_path, "fedavg", **{"algorithm.name": "fedavg_oneshot", **fast})
    assert fedavg["client_stage_cached"] and fedavg["client_accuracy"] == summary["client_accuracy"]
    assert fedavg["final_accuracy"] != summary["final_accuracy"]


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_an_unreadable_cache_entry_is_a_miss_and_is_rewritten(six_methods, tmp_path, monkeypatch):
    runs, cache = six_methods
    broken = tmp_path / "cache"
    (broken / "client_stage").mkdir(parents=True)
    for entry in cache.glob("client_stage/*.pt"):
        (broken / "client_stage" / entry.name).write_bytes(entry.read_bytes()[:100])  # truncated
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(broken))
    summary, run_dir = run(tmp_path, "dense-again", **{"algorithm.name": "dense"})
    assert not summary["client_stage_cached"] and server_series(run_dir, "participants")[0] == 5
    assert summary["final_accuracy"] == runs["dense"][0]["final_accuracy"]
    assert run(tmp_path, "dense-third", **{"algorithm.name": "dense"})[0]["client_stage_cached"]
