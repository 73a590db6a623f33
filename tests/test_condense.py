"""Condensation building blocks: DSA, DM loss, SWD, model re-sampling, uint8 transport."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raysim.algorithms.condensed.dsa import DSA, FAMILIES
from raysim.algorithms.condensed.match_models import perturb_model, resample_model
from raysim.algorithms.condensed.matching import (
    class_mean_logits,
    dm_loss,
    real_batch_indices,
    soft_labels,
    symmetric_kl,
)
from raysim.algorithms.condensed.synthetic import dequantize, init_synthetic, quantize
from raysim.algorithms.condensed.wasserstein import sliced_wasserstein
from raysim.models import build_model
from raysim.tensors import module_weights
from raysim.training import even_batches


def small_convnet(norm="batchnorm"):
    torch.manual_seed(0)
    return build_model("convnet", in_channels=3, num_classes=4, image_size=16, width=8, depth=2, norm=norm)


@pytest.mark.parametrize("family", FAMILIES)
def test_dsa_is_siamese_and_differentiable(family):
    dsa = DSA(families=(family,))
    a = torch.randn(5, 3, 16, 16, requires_grad=True)
    b = torch.randn(3, 3, 16, 16)
    joint = dsa(torch.cat([a, b]), seed=7)
    # the same seed gives the same transform to every image, in one batch or two
    torch.testing.assert_close(joint[:5], dsa(a, seed=7))
    torch.testing.assert_close(joint[5:], dsa(b, seed=7))
    joint[:5].sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()


def test_dsa_draws_differ_between_seeds():
    dsa = DSA()
    x = torch.randn(4, 3, 16, 16)
    outputs = {round(float(dsa(x, seed=s).sum()), 3) for s in range(12)}
    assert len(outputs) > 3


def test_batched_dm_loss_equals_the_per_class_loop_without_augmentation():
    model = small_convnet(norm="instancenorm").train()
    real = [torch.randn(6, 3, 16, 16) for _ in range(3)]
    syn = torch.randn(3, 2, 3, 16, 16, requires_grad=True)
    batched = dm_loss(model, real, list(syn), batched=True, match_logits=True)
    looped = dm_loss(model, real, list(syn), batched=False, match_logits=True)
    torch.testing.assert_close(batched, looped, rtol=1e-4, atol=1e-5)
    batched.backward()
    assert syn.grad.abs().sum() > 0


def test_dm_loss_is_zero_when_sets_coincide():
    model = small_convnet(norm="instancenorm").eval()
    real = [torch.randn(4, 3, 16, 16) for _ in range(2)]
    with torch.no_grad():
        assert float(dm_loss(model, real, [r.clone() for r in real])) < 1e-8


def test_sliced_wasserstein():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=g)
    assert float(sliced_wasserstein(x, x.clone(), generator=torch.Generator().manual_seed(1))) < 1e-5
    shifted = sliced_wasserstein(x, x + 3.0, num_projections=256, generator=torch.Generator().manual_seed(1))
    # a shift by 3 in each of 8 coordinates has length 3*sqrt(8); projected on random unit directions
    # its RMS is |shift| / sqrt(d) = 3
    assert abs(float(shifted) - 3.0) < 0.6
    y = torch.randn(30, 8, generator=g, requires_grad=True)
    sliced_wasserstein(x, y).backward()
    assert y.grad.abs().sum() > 0
    one = torch.zeros(1, 4)
    other = torch.tensor([[2.0, 0, 0, 0]])
    single = sliced_wasserstein(one, other, num_projections=4096, generator=torch.Generator().manual_seed(2))
    assert abs(float(single) - 2.0 / math.sqrt(4)) < 0.1


def test_model_resampling_interpolates_between_global_and_random():
    model, scratch = small_convnet(), small_convnet()
    torch.manual_seed(5)
    global_weights = module_weights(
        build_model("convnet", in_channels=3, num_classes=4, image_size=16, width=8, depth=2)
    )
    resample_model(model, scratch, global_weights, gamma=1.0, seed=3)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(p.numpy(), global_weights[name])
    a = module_weights(resample_model(model, scratch, global_weights, gamma=0.0, seed=3))
    b = module_weights(resample_model(model, scratch, global_weights, gamma=0.0, seed=3))
    c = module_weights(resample_model(model, scratch, global_weights, gamma=0.0, seed=4))
    name = "classifier.weight"
    np.testing.assert_array_equal(a[name], b[name])  # deterministic in the seed
    assert not np.array_equal(a[name], c[name])
    assert not np.array_equal(a[name], global_weights[name])
    half = module_weights(resample_model(model, scratch, global_weights, gamma=0.5, seed=3))
    np.testing.assert_allclose(half[name], 0.5 * global_weights[name] + 0.5 * a[name], rtol=1e-5, atol=1e-6)


def test_feddm_perturbation_lies_at_distance_rho():
    model = small_convnet()
    base = module_weights(model)
    perturb_model(model, base, rho=5.0, generator=torch.Generator().manual_seed(0))
    moved = module_weights(model)
    names = [n for n, _ in model.named_parameters()]
    distance = math.sqrt(sum(float(((moved[n] - base[n]) ** 2).sum()) for n in names))
    assert abs(distance - 5.0) < 1e-3


def test_uint8_round_trip_and_initialisation():
    mean, std = np.array([0.5, 0.4, 0.3], np.float32), np.array([0.2, 0.25, 0.3], np.float32)
    x = (torch.rand(4, 3, 8, 8) - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    q = quantize(x, mean, std)
    assert q.dtype == np.uint8 and q.shape == (4, 3, 8, 8)
    back = dequantize(q, mean, std, torch.device("cpu"))
    assert float((back - x).abs().max()) <= 0.5 / 255 / std.min() + 1e-5
    real = torch.randn(30, 3, 8, 8)
    g = torch.Generator().manual_seed(0)
    for mode in ("real", "average", "noise"):
        assert init_synthetic(real, 5, g, mode).shape == (5, 3, 8, 8)
    assert init_synthetic(real[:2], 5, g, "real").shape == (5, 3, 8, 8)  # fewer real images than IPC


def test_class_mean_logits_and_soft_labels():
    model = small_convnet().eval()
    x, y = torch.randn(10, 3, 16, 16), torch.tensor([0, 0, 1, 1, 1, 3, 3, 3, 3, 0])
    means, counts = class_mean_logits(model, x, y, 4, batch_size=3)
    with torch.no_grad():
        torch.testing.assert_close(means[1], model(x[y == 1]).mean(0))
    assert means[2].abs().sum() == 0 and counts.tolist() == [3, 3, 0, 4]
    p = soft_labels(means, 2.0)
    torch.testing.assert_close(p.sum(1), torch.ones(4))
    assert float(symmetric_kl(p, p)) < 1e-6 and float(symmetric_kl(p, soft_labels(means, 0.5))) > 0


def test_real_batches_have_the_same_size_for_rare_and_common_classes():
    g = torch.Generator().manual_seed(0)
    common = real_batch_indices(500, 32, g)
    assert len(common) == 32 and len(set(common.tolist())) == 32  # distinct when there are enough
    rare = real_batch_indices(3, 32, g)
    assert len(rare) == 32 and set(rare.tolist()) <= {0, 1, 2}  # with replacement otherwise


def test_even_batches_cover_an_epoch_without_a_tiny_last_batch():
    order = torch.randperm(780)
    parts = even_batches(order, 256)
    assert [len(p) for p in parts] == [195, 195, 195, 195]
    assert torch.equal(torch.cat(parts), order)
    assert [len(p) for p in even_batches(torch.arange(100), 256)] == [100]


@pytest.mark.parametrize("family", FAMILIES)
def test_per_image_dsa_gives_each_image_its_own_transform(family):
    """For training on condensed data (the DSA authors' seed=-1): one family per call, parameters per image."""
    x = torch.rand(64, 3, 16, 16, requires_grad=True)
    out = DSA((family,), per_image=True)(x, seed=5)
    assert out.shape == x.shape
    changes = (out - x).detach().flatten(1)
    distinct = {tuple(torch.round(c * 1e4).tolist()) for c in changes}
    assert len(distinct) > 2  # many different transforms in one batch (a siamese call gives one)
    out.sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0
    again = DSA((family,), per_image=True)(x.detach(), seed=5)
    assert torch.equal(again, out.detach())  # reproducible from the seed


def test_per_image_crop_translates_by_whole_pixels_with_zero_fill():
    x = torch.arange(64.0).view(1, 1, 8, 8).repeat(16, 1, 1, 1) + 1
    out = DSA(("crop",), per_image=True)(x, seed=0)
    for image in out[:, 0]:
        values = image[image > 0]
        assert set(values.tolist()) <= set(range(1, 65))  # pixels moved, never blended
        rows, cols = (image > 0).nonzero(as_tuple=True)
        assert len(values) == (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)  # a shifted block


@pytest.mark.parametrize("n", [2, 3, 5, 10, 11, 40])
def test_initial_class_averages_are_distinct(n):
    """FedAF/FedDM init=average: a class with at least 2 images never starts with two equal images
    (equal ones receive equal gradients and stay equal for the whole run)."""
    real = torch.randn(n, 3, 8, 8)
    syn = init_synthetic(real, 20, torch.Generator().manual_seed(0), "average", average_of=10)
    flat = syn.flatten(1)
    gaps = torch.cdist(flat, flat) + torch.eye(20) * 1e9
    assert float(gaps.min()) > 1e-3
    # still averages of the class: inside the span of its images and near their mean in expectation
    many = init_synthetic(real, 2000, torch.Generator().manual_seed(1), "average", average_of=10)
    assert float((many.mean(0) - real.mean(0)).abs().max()) < 0.1


def test_sliced_wasserstein_conventions_for_single_points():
    """root_mean (SWD_2) of two points is about ||x - y|| / sqrt(d); sum_squared about (L / d) ||x - y||^2,
    whose gradient grows with the gap instead of staying at about 1 / sqrt(d)."""
    d, L = 10, 4096
    x, y = torch.zeros(1, d), torch.full((1, d), 0.5)  # ||x - y||^2 = 2.5
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    root = sliced_wasserstein(x, y, L, g())
    summed = sliced_wasserstein(x, y, L, g(), squared=True, over_projections="sum")
    assert float(root) == pytest.approx(math.sqrt(2.5 / d), rel=0.05)
    assert float(summed) == pytest.approx(L / d * 2.5, rel=0.05)
    near, far = (torch.full((1, d), s, requires_grad=True) for s in (0.1, 1.0))
    for point in (near, far):
        sliced_wasserstein(point, x, L, g(), squared=True, over_projections="sum").backward()
    assert float(far.grad.norm()) == pytest.approx(10 * float(near.grad.norm()), rel=1e-3)
