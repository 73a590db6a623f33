"""The deterministic CUDA routes of raysim.resample compute what F.grid_sample and adaptive pooling
compute. On a CPU machine the routes are forced on (the CUDA check itself is `raysim bench
determinism`, run on a GPU)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import raysim.resample as resample
from raysim.algorithms.condensed.dsa import DSA
from raysim.algorithms.oneshot.augment import crop_flip
from raysim.bench.determinism import compare
from raysim.config import ResourcesConfig
from raysim.engine.devices import configure_torch
from raysim.errors import RaysimError
from raysim.models import build_model


def random_grid(n: int, h: int, w: int, align_corners: bool) -> torch.Tensor:
    """Rotation, anisotropic scale and translation, reaching past the image's border."""
    g = torch.Generator().manual_seed(n * h + w)
    angle = (torch.rand(n, generator=g) - 0.5) * 1.2
    scale = 0.7 + 0.8 * torch.rand(n, 2, generator=g)
    shift = (torch.rand(n, 2, generator=g) - 0.5) * 0.6
    theta = torch.stack(
        [
            torch.stack([angle.cos() * scale[:, 0], -angle.sin(), shift[:, 0]], 1),
            torch.stack([angle.sin(), angle.cos() * scale[:, 1], shift[:, 1]], 1),
        ],
        1,
    ).double()
    return F.affine_grid(theta, [n, 1, h, w], align_corners=align_corners)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_gathered_grid_sample_equals_grid_sample_and_its_gradient(mode, align_corners):
    x = torch.randn(5, 3, 12, 10, dtype=torch.float64, requires_grad=True)
    grid = random_grid(5, 12, 10, align_corners)
    expected = F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=align_corners)
    got = resample.gathered_grid_sample(x, grid, mode, align_corners)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    upstream = torch.randn_like(expected)
    (want,) = torch.autograd.grad(expected, x, upstream)
    (have,) = torch.autograd.grad(got, x, upstream)
    torch.testing.assert_close(have, want, rtol=0, atol=1e-12)
    assert want.abs().sum() > 0


def test_gathered_grid_sample_refuses_other_modes():
    with pytest.raises(ValueError, match="bilinear"):
        resample.gathered_grid_sample(torch.zeros(1, 1, 4, 4), torch.zeros(1, 4, 4, 2), "bicubic")


def test_augmentations_and_pooling_give_the_same_results_on_the_deterministic_route(monkeypatch):
    """Every DSA family (siamese and per image), the generator's crop-and-flip and ResNet-18's
    pooling, forward and backward, with and without the route the CUDA actors take."""
    x0 = torch.rand(6, 3, 16, 16)
    resnet = build_model("resnet18", in_channels=3, num_classes=10, image_size=16, width_multiplier=0.125).eval()
    cases = {f"dsa-{f}": lambda x, f=f: DSA(families=(f,))(x, 3) for f in ("scale", "rotate", "crop", "flip")}
    cases.update({f"dsa-each-{f}": lambda x, f=f: DSA((f,), per_image=True)(x, 5) for f in ("scale", "rotate", "crop")})
    cases["crop_flip"] = lambda x: crop_flip(x, torch.Generator().manual_seed(1))
    cases["resnet18"] = resnet

    def run(fn):
        x = x0.clone().requires_grad_(True)
        y = fn(x)
        (g,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), x)
        return y.detach(), g

    default = {name: run(fn) for name, fn in cases.items()}
    monkeypatch.setattr(resample, "deterministic_route", lambda x: True)
    for name, fn in cases.items():
        y, g = run(fn)
        torch.testing.assert_close(y, default[name][0], rtol=1e-5, atol=1e-5, msg=name)
        torch.testing.assert_close(g, default[name][1], rtol=1e-5, atol=1e-5, msg=name)


def test_cpu_actors_leave_deterministic_algorithms_off_so_cpu_numbers_are_unchanged():
    threads = torch.get_num_threads()
    try:
        configure_torch(1, torch.device("cpu"), ResourcesConfig(deterministic=True))
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.set_num_threads(threads)
    assert not resample.deterministic_route(torch.zeros(1))


def test_cuda_actors_turn_on_deterministic_mode_and_follow_the_tf32_setting(monkeypatch):
    """What configure_torch sets for a CUDA actor (no GPU needed: it only sets flags)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    threads, saved = torch.get_num_threads(), (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic)
    try:
        configure_torch(1, torch.device("cuda"), ResourcesConfig(deterministic=True, tf32=False))
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.allow_tf32
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        torch.use_deterministic_algorithms(False)
        configure_torch(1, torch.device("cuda"), ResourcesConfig(deterministic=False, tf32=True))
        assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.allow_tf32
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = saved
        torch.set_num_threads(threads)


def test_the_client_stage_cache_key_follows_tf32_on_a_gpu_only():
    from raysim.algorithms.oneshot.client_cache import client_stage_key
    from raysim.config.files import ROOT
    from raysim.experiment import load_config

    def key(*overrides):
        config = load_config(ROOT / "quickstart.yaml", list(overrides))
        return client_stage_key(config, "digest", [0.3, 0.3, 0.3], [0.25, 0.25, 0.25])

    assert key("resources.tf32=false") == key()
    gpu = "resources.gpus_per_actor=0.5"
    assert key(gpu, "resources.tf32=false") != key(gpu) != key()


def test_bench_determinism_compares_metrics_value_by_value():
    one = {(1, None, "accuracy"): 0.5, (1, 0, "loss"): 1.0}
    assert compare(one, dict(one)) == {"values": 2, "differing": 0, "largest_difference": 0.0, "first_differing": None}
    two = {(1, None, "accuracy"): 0.5, (1, 0, "loss"): 1.25}
    outcome = compare(one, two)
    assert outcome["differing"] == 1 and outcome["largest_difference"] == 0.25
    assert outcome["first_differing"] == str((1, 0, "loss"))


def test_bench_determinism_names_an_unknown_algorithm():
    from raysim.bench import main

    with pytest.raises(RaysimError, match="unknown algorithms \\['fedsgd'\\]"):
        main("determinism", ["algorithms=fedavg,fedsgd"])
    with pytest.raises(RaysimError, match="GPU share per actor >= 0"):
        main("determinism", ["gpus=half"])
