"""The one-shot methods as their authors' code runs them: FedHydra's teacher and distillation loss,
DENSE's BN loss, Co-Boosting's ensemble re-weighting and ODS step, FedDF's transfer set (the
mechanisms; runs of the whole methods are in test_oneshot.py)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from raysim.algorithms.oneshot.augment import augment_images
from raysim.algorithms.oneshot.ensemble import (
    normalise_over_classes,
    normalise_over_clients,
    stratified_logits,
    tempered_over_clients,
)
from raysim.algorithms.oneshot.losses import distillation_loss
from raysim.algorithms.oneshot.transfer import to_shape
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.registry import class_and_params
from tests.conftest import tiny_overrides
from tests.test_oneshot import ONE_SHOT, ROOT, run, server_series


def algorithm(**overrides):
    """The configured algorithm object (no Ray, no data), as the server builds it."""
    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{**ONE_SHOT, **overrides}))
    cls, params = class_and_params(config)
    return cls(params, config)


def fake_ctx(channels: int = 1, size: int = 28) -> SimpleNamespace:
    spec = SimpleNamespace(image_size=size, in_channels=channels)
    return SimpleNamespace(device=torch.device("cpu"), mean=[0.5] * channels, std=[0.25] * channels, spec=spec)


# ------------------------------------------------------------------ FedHydra


def test_literal_eq_8_depends_on_a_clients_logit_offset_and_the_default_teacher_does_not():
    """Adding a constant to one client's logits changes none of its probabilities. Eq. 8 multiplies
    the logits by U_c per class, so the constant moves each class by another amount and the literal
    teacher's prediction changes; the default teacher (no eq. 8, as in the authors' code) moves every
    class by the same amount, so its probabilities stay."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 64, 10, generator=gen)  # (clients, samples, classes)
    u = np.random.default_rng(0).random((3, 10)) * 5 + 0.1
    over_clients = torch.tensor(normalise_over_clients(u), dtype=torch.float32)
    over_classes = torch.tensor(normalise_over_classes(u), dtype=torch.float32)
    shifted = logits.clone()
    shifted[1] += 20.0  # client 1's logit offset
    assert torch.allclose(F.softmax(shifted[1], 1), F.softmax(logits[1], 1), atol=1e-5)
    y = torch.randint(10, (64,), generator=gen)
    literal = [stratified_logits(z, y, over_clients, over_classes).argmax(1) for z in (logits, shifted)]
    assert (literal[0] != literal[1]).sum() > 0  # eq. 8: the offset changes the teacher's answer
    default = [F.softmax(stratified_logits(z, y, over_clients, None), 1) for z in (logits, shifted)]
    assert torch.allclose(default[0], default[1], atol=1e-5)
    # the default: clients weighted per target label by eq. 4-5's normalised u, no eq. 8; the authors'
    # code's reading (the raw u) scales each class y's logits by sum_k u[k, y]
    hydra = algorithm()
    assert hydra.params.aggregation == "label_weighted"
    state = {"u": u, "over_clients": normalise_over_clients(u), "over_classes": normalise_over_classes(u)}
    weights, scale = hydra.teacher_weights(state, "label_weighted", "cpu")
    assert scale is None and torch.allclose(weights, over_clients)
    raw, scale = hydra.teacher_weights(state, "label_weighted_raw", "cpu")
    assert scale is None and torch.allclose(raw, torch.tensor(u, dtype=torch.float32))
    per_class = torch.tensor(u.sum(0), dtype=torch.float32)[y, None]  # s_y of each sample's target
    raw_teacher = stratified_logits(logits, y, raw, None)
    assert torch.allclose(raw_teacher, stratified_logits(logits, y, over_clients, None) * per_class, atol=1e-4)
    assert not torch.allclose(F.softmax(raw_teacher, 1), default[0], atol=1e-2)  # another temperature per class
    assert torch.allclose(hydra.teacher_weights(state, "stratified_eq8", "cpu")[1], over_classes)


def test_fedhydra_teacher_is_the_papers_by_default_and_tempered_on_request():
    """The authors' code hands the raw u to its teacher, unbounded and untempered: the paper's rule
    (eq. 4-5) stays the default, and `tempered` (u^(1/tau) over the clients) lowers the largest
    client share of a skewed S, equal to the paper's rule at tau = 1."""
    u = np.array([[1950.0, 0.2, 0.0], [0.16, 900.0, 0.0], [3.0, 0.5, 0.0], [1.0, 1.0, 0.0]])  # class 2: all 0
    paper = algorithm()
    assert (paper.params.stratify_weighting, paper.params.stratify_temperature) == ("paper", 4.0)
    state = {"u": u, "over_clients": normalise_over_clients(u), "over_classes": normalise_over_classes(u)}
    shares = paper.teacher_shares(state, "label_weighted", 4, 3)
    assert np.allclose(shares, [1950 / 1954.16, 900 / 901.7, 0.25])  # one client holds a class; equal where u = 0
    assert np.allclose(paper.teacher_shares(state, "label_weighted_raw", 4, 3), shares)
    assert np.array_equal(paper.teacher_shares(state, "mean", 4, 3), np.full(3, 0.25))
    raw, _ = paper.teacher_weights(state, "label_weighted_raw", "cpu")
    assert torch.equal(raw[:, :2], torch.tensor(u[:, :2], dtype=torch.float32))  # the raw u, as before
    assert torch.equal(raw[:, 2], torch.full((4,), 0.25))  # no class left with a teacher of zeros
    for tau, lower in ((1.0, False), (4.0, True)):
        hydra = algorithm(**{"algorithm.stratify_weighting": "tempered", "algorithm.stratify_temperature": tau})
        tempered = {**state, "teacher_over_clients": tempered_over_clients(u, tau)}
        for aggregation in ("label_weighted", "label_weighted_raw", "stratified_eq8"):
            mine = hydra.teacher_shares(tempered, aggregation, 4, 3)
            assert (mine.max() < shares.max() - 0.2) if lower else np.allclose(mine, shares), (tau, aggregation)
            w, c = hydra.teacher_weights(tempered, aggregation, "cpu")
            w_paper, c_paper = hydra.teacher_weights(tempered, aggregation, "cpu", paper=True)  # the references
            assert torch.allclose(w_paper, paper.teacher_weights(state, aggregation, "cpu")[0])
            assert torch.allclose(w, w_paper) == (not lower) and (c is None) == (c_paper is None)
        raw, _ = hydra.teacher_weights(tempered, "label_weighted_raw", "cpu")  # raw u's scale s_y kept
        assert torch.allclose(raw.sum(0)[:2], torch.tensor(u.sum(0)[:2], dtype=torch.float32))
    with pytest.raises(RaysimError, match="algorithm.stratify_temperature must be > 0, got 0"):
        algorithm(**{"algorithm.stratify_temperature": 0})
    with pytest.raises(RaysimError, match="'algorithm.stratify_weighting' must be one of paper, tempered, got 'soft'"):
        algorithm(**{"algorithm.stratify_weighting": "soft"})


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")  # torch's note on the authors' reduction
def test_fedhydra_distils_on_its_codes_kl_averaged_over_batch_and_classes():
    gen = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(8, 10, generator=gen), torch.randn(8, 10, generator=gen) * 3
    y = torch.randint(10, (8,), generator=gen)
    for t in (1.0, 4.0):  # torch's reductions, as the authors call them
        log_s, p_t = F.log_softmax(student / t, 1), F.softmax(teacher / t, 1)
        mean = F.kl_div(log_s, p_t, reduction="mean") * t * t  # FedHydra's KLCom
        batchmean = F.kl_div(log_s, p_t, reduction="batchmean") * t * t  # DENSE's and Co-Boosting's KLDiv
        assert torch.allclose(distillation_loss(student, teacher, t, "mean"), mean, atol=1e-6)
        assert torch.allclose(distillation_loss(student, teacher, t), batchmean, atol=1e-6)
    hydra = algorithm()
    p = hydra.params
    assert (p.kl_reduction, p.kl_weight, p.beta, p.temperature) == ("mean", 1.0, 1.0, 1.0)
    expected = F.kl_div(F.log_softmax(student, 1), F.softmax(teacher, 1), reduction="mean") + F.cross_entropy(
        student, teacher.argmax(1)
    )
    assert torch.allclose(hydra.distillation_loss({})(student, teacher, y), expected, atol=1e-6)
    dense = algorithm(**{"algorithm.name": "dense"})
    expected = F.kl_div(F.log_softmax(student / 20, 1), F.softmax(teacher / 20, 1), reduction="batchmean") * 400
    assert torch.allclose(dense.distillation_loss({})(student, teacher, y), expected, atol=1e-5)
    # no augmentation of the generator's images in synthesis, crop + flip in distillation (their code)
    assert (hydra.augmentation("synthesis"), hydra.augmentation("distill")) == ("none", "crop_flip")
    assert algorithm(**{"algorithm.augment": False}).augmentation("distill") == "none"


# ------------------------------------------------------------------ DENSE


class _PlainListEnsemble(nn.Module):
    """The authors' Ensemble_A: the client models kept in a plain Python list."""

    def __init__(self, models):
        super().__init__()
        self.models = models


def test_dense_runs_without_the_bn_loss_as_its_code_did():
    models = [nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)) for _ in range(3)]
    # their hook registration walks the ensemble's modules: a plain list registers none of them
    assert not [m for m in _PlainListEnsemble(models).modules() if isinstance(m, nn.BatchNorm2d)]
    registered = nn.ModuleList(models)
    assert len([m for m in registered.modules() if isinstance(m, nn.BatchNorm2d)]) == 3
    dense = algorithm(**{"algorithm.name": "dense"})
    assert dense.params.bn_weight == 0.0 and dense.bn_weight() == 0.0 and dense.params.kd_lr == 0.005
    assert algorithm(**{"algorithm.name": "dense", "algorithm.bn_weight": 1.0}).bn_weight() == 1.0
    # crop + flip while the generator trains; on pooled MNIST-like images a flip alone, on CIFAR crop + flip
    assert dense.authors_augmentation("synthesis", "mnist") == "crop_flip"
    assert dense.authors_augmentation("distill", "fashion_mnist") == "flip"
    assert dense.authors_augmentation("distill", "cifar10") == "crop_flip"
    x = torch.rand(6, 1, 4, 4)
    flipped = augment_images(x, "flip", torch.Generator().manual_seed(0))
    assert all(torch.equal(f, i) or torch.equal(f, i.flip(2)) for f, i in zip(flipped, x))


# ------------------------------------------------------------------ Co-Boosting


class _Oracle(nn.Module):
    """Reads the class from the image's mean pixel (class c: every pixel c / 10) and answers it, or
    the next class (`wrong`)."""

    def __init__(self, wrong: bool):
        super().__init__()
        self.wrong = wrong
        self.dummy = nn.Parameter(torch.zeros(()))  # so that the model has a device

    def forward(self, x):
        cls = (x.flatten(1).mean(1) * 0.25 + 0.5) * 10  # back from fake_ctx's normalisation to pixels
        cls = (cls.round().long() + int(self.wrong)) % 10
        return F.one_hot(cls, 10).float() * 10.0


def test_coboosting_takes_a_sign_step_per_pool_batch_until_the_weights_reach_their_clamps():
    cb = algorithm(**{"algorithm.name": "coboosting", "algorithm.mu": 0.4, "algorithm.weight_decay_rate": 1.0})
    assert cb.params.kd_batch == 32
    labels = np.arange(96) % 10
    pool_x = np.repeat((labels * 255 / 10).round().astype(np.uint8)[:, None, None, None], 28, 2).repeat(28, 3)
    teachers = [_Oracle(wrong=False), _Oracle(wrong=True)]
    state = {
        "pool_x": pool_x,
        "pool_y": labels.astype(np.int64),
        "pool_added": 32,  # this epoch's images: left out, as the authors re-weight before adding them
        "ensemble_weights": np.array([0.5, 0.5]),
        "report": {},
    }
    new = cb.before_distillation(state, teachers, fake_ctx(), epoch=2, round_index=3)
    # two batches of the older 64 images: 0.5 -> 0.9 -> 1.0 (clamped) and 0.5 -> 0.1 -> 0.0 (clamped)
    assert new["ensemble_weights"].tolist() == pytest.approx([1.0, 0.0])
    one_batch = cb.before_distillation({**state, "pool_added": 64}, teachers, fake_ctx(), epoch=2, round_index=3)
    assert one_batch["ensemble_weights"].tolist() == pytest.approx([0.9, 0.1])
    assert cb.before_distillation(state, teachers, fake_ctx(), epoch=1, round_index=2) is state  # not in epoch 0


def test_coboosting_runs_as_its_code_ods_step_clipping_schedule_and_augmentation():
    cb = algorithm(**{"algorithm.name": "coboosting"})
    p = cb.params
    assert (p.kd_grad_clip, p.generator_grad_clip, p.kd_weight_decay, p.kd_schedule) == (10.0, 10.0, 1e-4, "cosine")
    assert cb.authors_augmentation("synthesis", "cifar10") == "none"
    assert (cb.authors_augmentation("distill", "mnist"), cb.authors_augmentation("distill", "cifar10")) == (
        "none",
        "crop_flip",
    )
    # ODS moves every pixel by 4/255 (their 8/255 on inputs normalised with std 0.5), whatever our std
    ctx = fake_ctx()
    state = {"ensemble_weights": np.array([0.5, 0.5])}
    teachers = [nn.Sequential(nn.Flatten(), nn.Linear(784, 10)) for _ in range(2)]
    x = torch.rand(4, 1, 28, 28)
    moved = cb.perturbation(state, teachers, ctx, torch.Generator().manual_seed(0))(x)
    step = ((moved - x) * 0.25).abs()  # back to pixel units
    assert torch.allclose(step[step > 0], torch.full_like(step[step > 0], 4 / 255)) and (step > 0).float().mean() > 0.9
    # the student's learning rate follows torch's CosineAnnealingLR over the round's epochs
    assert cb.kd_learning_rate({"rounds_per_global": 3}, 1) == pytest.approx(0.01)
    assert cb.kd_learning_rate({"rounds_per_global": 3}, 2) == pytest.approx(0.005)
    assert cb.kd_learning_rate({"rounds_per_global": 201}, 101) == pytest.approx(
        0.01 * 0.5 * (1 + math.cos(math.pi / 2))
    )


# ------------------------------------------------------------------ FedDF


def write_parquet_dataset(folder: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """A train/test pair in the Hugging Face layout raysim reads (PNG bytes in an `image` column)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        blobs = []
        for i, image in enumerate(images):
            buf = io.BytesIO()
            Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(buf, format="PNG")
            blobs.append({"bytes": buf.getvalue(), "path": f"{i}.png"})
        table = pa.table({"image": blobs, "label": pa.array(labels.tolist(), pa.int64())})
        pq.write_table(table, folder / f"{split}.parquet")


def test_transfer_images_are_resized_and_converted_to_the_runs_channels():
    rgb = np.zeros((2, 32, 32, 3), dtype=np.uint8)
    rgb[0, ..., 0], rgb[1] = 255, 100  # pure red; grey 100
    grey = to_shape(rgb, 28, 1)
    assert grey.shape == (2, 1, 28, 28) and grey.dtype == np.uint8
    assert int(grey[0, 0, 14, 14]) == round(0.299 * 255) and int(grey[1, 0, 14, 14]) == 100
    back = to_shape(grey.transpose(0, 2, 3, 1), 32, 3)
    assert back.shape == (2, 3, 32, 32) and (back[1] == 100).all()


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_feddf_distils_on_another_datasets_images_from_the_clients_average(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    transfer = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    write_parquet_dataset(tmp_path / "cifar10", transfer, np.arange(40) % 10)
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    source = {
        "algorithm.name": "feddf",
        "algorithm.distill_dataset": "cifar10",
        "algorithm.distill_root": str(tmp_path / "cifar10"),
        # the pool this test reads (the whole-set stream: test_defaults_follow_the_authors_code)
        "algorithm.transfer_pool": "growing",
        "dataset.verify": False,  # random images stand in for CIFAR-10
    }
    feddf = algorithm(**source)
    p = feddf.params
    assert (p.distill_source, p.student_init, p.kd_optimizer, p.kd_lr, p.kd_grad_clip) == (
        "dataset",
        "auto",
        "adam",
        1e-3,
        5.0,
    )
    state = {"pool_x": None, "pool_y": None, "transfer_drawn": 0}
    ctx = fake_ctx()
    for _ in range(2):
        feddf.new_images(state, [], None, ctx, 2)
    expected = to_shape(transfer, 28, 1)  # the run's embedded images are 28 x 28 grey
    assert state["pool_x"].shape == (64, 1, 28, 28) and state["transfer_drawn"] == 64
    drawn = {img.tobytes() for img in state["pool_x"]}
    assert drawn <= {img.tobytes() for img in expected} and len(drawn) == 40  # 64 draws: all 40 once, then again
    # the server model starts from the clients' average: with no distillation epoch it is FedAvg one-shot
    summary, _ = run(tmp_path, "feddf-average", rounds=1, **source)
    fedavg, _ = run(tmp_path, "fedavg-oneshot", rounds=1, **{"algorithm.name": "fedavg_oneshot"})
    assert fedavg["client_stage_cached"] and summary["final_accuracy"] == fedavg["final_accuracy"]
    summary, run_dir = run(tmp_path, "feddf-transfer", **source)
    assert server_series(run_dir, "pool_images") == [32, 64]
    # a missing transfer set is one line before the clients train
    from raysim.errors import RaysimError

    missing = r"the unlabelled images \(cifar10\) are not at .*nothing: get it with 'raysim data get cifar10'"
    with pytest.raises(RaysimError, match=missing):
        run(tmp_path, "feddf-missing", **{**source, "algorithm.distill_root": str(tmp_path / "nothing")})


# ------------------------------------------------------------------ OT fusion


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_ot_fusion_aligns_by_activations_on_unlabelled_images_by_default(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    write_parquet_dataset(tmp_path / "mnist", rng.integers(0, 256, (30, 28, 28, 1), dtype=np.uint8), np.arange(30) % 10)
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    source = {
        "algorithm.name": "ot_fusion",
        "algorithm.activation_root": str(tmp_path / "mnist"),
        "dataset.verify": False,  # random images stand in for MNIST
    }
    ot = algorithm(**source, **{"algorithm.activation_dataset": "mnist"})
    assert (ot.params.alignment, ot.params.activation_samples) == ("activations", 200)
    inputs = ot.activation_inputs(fake_ctx())
    assert inputs.shape == (30, 1, 28, 28)  # every image there is (fewer than 200)
    summary, _ = run(tmp_path, "ot-acts", rounds=1, **source, **{"algorithm.activation_dataset": "mnist"})
    assert sorted(summary["ot_identity_layers"]) == [str(k) for k in range(5)]
    assert all(0 <= v <= 2 for v in summary["ot_identity_layers"].values())
    with pytest.raises(Exception, match="ot_fusion has no default set of unlabelled images for dataset embedded"):
        algorithm(**{"algorithm.name": "ot_fusion"})
