"""Tests for raysim.algorithms.oneshot.fusion: OT (permutation) alignment keeps the function, recovers permutations,
fuses with coefficients, and rejects unsupported architectures."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.oneshot.fusion import align_to, layer_activations, ot_fuse
from raysim.errors import RaysimError
from raysim.models import build_model

# (name, build_model kwargs, input shape)
CASES = [
    ("cnn2", {"in_channels": 1, "image_size": 28}, (1, 28, 28)),
    ("cnn3", {"in_channels": 3, "image_size": 32, "width_multiplier": 0.25}, (3, 32, 32)),
    ("lenet", {"in_channels": 1, "image_size": 28}, (1, 28, 28)),
    ("mlp", {"in_channels": 1, "image_size": 28, "hidden": 64}, (1, 28, 28)),
    ("convnet", {"in_channels": 3, "image_size": 32, "width": 16, "norm": "batchnorm"}, (3, 32, 32)),
    ("convnet", {"in_channels": 1, "image_size": 28, "width": 16, "norm": "instancenorm"}, (1, 28, 28)),
    ("convnet", {"in_channels": 3, "image_size": 32, "width": 16, "depth": 2, "norm": "none"}, (3, 32, 32)),
]
IDS = [f"{name}-{kw['norm']}" if "norm" in kw else name for name, kw, _ in CASES]
NORM_TYPES = (nn.BatchNorm2d, nn.GroupNorm)


def make(name: str, kwargs: dict, seed: int) -> nn.Module:
    """A model in eval mode with random (non-trivial) norm affine parameters and BN statistics."""
    torch.manual_seed(seed)
    model = build_model(name, num_classes=10, **kwargs)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, NORM_TYPES):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_()
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(seed + 1)
    return model.eval()


def randomly_permuted(model: nn.Module, seed: int) -> nn.Module:
    """A copy of `model` with every hidden layer's units shuffled (same function)."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    norms: dict[int, list[nn.Module]] = {}
    for m in out.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            layers.append(m)
        elif isinstance(m, NORM_TYPES):
            norms.setdefault(len(layers) - 1, []).append(m)
    with torch.no_grad():
        for i, (layer, nxt) in enumerate(itertools.pairwise(layers)):
            n = layer.weight.shape[0]
            perm = torch.randperm(n, generator=gen)
            for t in [layer.weight, layer.bias] + [
                getattr(m, a, None) for m in norms.get(i, []) for a in ("weight", "bias", "running_mean", "running_var")
            ]:
                if t is not None:
                    t.copy_(t[perm])
            w = nxt.weight
            w.copy_(w.reshape(w.shape[0], n, -1)[:, perm].reshape(w.shape))
    return out


def outputs(model: nn.Module, state: dict, shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    other = copy.deepcopy(model)
    other.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(x), other.eval()(x)


@pytest.mark.parametrize("name,kwargs,shape", CASES, ids=IDS)
def test_align_to_keeps_the_function(name, kwargs, shape):
    model, anchor = make(name, kwargs, 1), make(name, kwargs, 2)
    aligned = align_to(model, anchor)
    assert set(aligned) == set(model.state_dict())
    changed = [k for k, v in aligned.items() if not torch.equal(v, model.state_dict()[k])]
    assert changed, "independent inits should need some permutation"
    a, b = outputs(model, aligned, shape)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,kwargs,shape", CASES, ids=IDS)
def test_random_permutation_is_undone_exactly(name, kwargs, shape):
    anchor = make(name, kwargs, 3)
    permuted = randomly_permuted(anchor, seed=4)
    a, b = outputs(anchor, permuted.state_dict(), shape)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # the helper itself keeps the function
    assert any(not torch.equal(v, anchor.state_dict()[k]) for k, v in permuted.state_dict().items())
    aligned = align_to(permuted, anchor)
    for key, value in anchor.state_dict().items():
        assert torch.equal(aligned[key], value), key
    fused = ot_fuse([anchor, permuted], [1, 1])
    for key, value in anchor.state_dict().items():
        assert fused[key].dtype == value.numpy().dtype
        np.testing.assert_array_equal(fused[key], value.numpy(), err_msg=key)


@pytest.mark.parametrize("name,kwargs,shape", CASES, ids=IDS)
def test_activation_alignment_undoes_a_random_permutation_and_differs_from_the_weights(name, kwargs, shape):
    """Their `acts` variant: neurons matched by their outputs on a batch of inputs. A permuted copy
    computes the same neuron outputs in another order, so the permutation is undone exactly; two
    models of one initialisation trained apart can be matched otherwise than by their weights."""
    anchor = make(name, kwargs, 3)
    permuted = randomly_permuted(anchor, seed=4)
    inputs = torch.randn(16, *shape, generator=torch.Generator().manual_seed(5))
    aligned = align_to(permuted, anchor, inputs)
    for key, value in anchor.state_dict().items():
        assert torch.equal(aligned[key], value), key
    acts = layer_activations(anchor, inputs)
    assert len(acts) >= 1 and all(a.shape[1] % len(inputs) == 0 for a in acts.values())


def test_identical_models_fuse_to_themselves_and_coefficients_weight():
    name, kwargs, shape = CASES[0]  # cnn2: has BN and num_batches_tracked
    a = make(name, kwargs, 5)
    fused = ot_fuse([a, copy.deepcopy(a), copy.deepcopy(a)], [0.2, 0.3, 0.5])
    for key, value in a.state_dict().items():
        np.testing.assert_allclose(fused[key], value.numpy(), rtol=1e-6, atol=1e-7, err_msg=key)

    b = make(name, kwargs, 6)
    fused = ot_fuse([a, b], [3, 1])
    aligned_b = align_to(b, a)
    for key, value in a.state_dict().items():
        if value.is_floating_point():
            expected = 0.75 * value.numpy() + 0.25 * aligned_b[key].numpy()
            np.testing.assert_allclose(fused[key], expected, rtol=1e-5, atol=1e-6, err_msg=key)
        else:  # integer buffers come from the anchor
            np.testing.assert_array_equal(fused[key], value.numpy())
    # shuffling b's units does not change the fusion; the anchor index is honoured
    shuffled = ot_fuse([a, randomly_permuted(b, seed=7)], [3, 1])
    for key in fused:
        np.testing.assert_allclose(shuffled[key], fused[key], rtol=1e-6, atol=1e-7, err_msg=key)
    anchored_b = ot_fuse([a, b], [1, 0], anchor=1)
    for key, value in align_to(a, b).items():
        if value.is_floating_point():
            np.testing.assert_allclose(anchored_b[key], value.numpy(), rtol=1e-6, atol=1e-7, err_msg=key)
    a_out, fused_out = outputs(a, fused, shape)
    assert torch.isfinite(fused_out).all() and a_out.shape == fused_out.shape


@pytest.mark.parametrize("name", ["resnet18", "googlenet"])
def test_branching_models_are_rejected(name):
    kwargs = {"in_channels": 3, "num_classes": 10, "image_size": 32, "width_multiplier": 0.125}
    a, b = build_model(name, **kwargs), build_model(name, **kwargs)
    with pytest.raises(RaysimError, match="residual or branching connections.*fedavg_oneshot"):
        ot_fuse([a, b], [1, 1])
    with pytest.raises(RaysimError, match="plain chains"):
        align_to(a, b)


class _Skip(nn.Module):
    """Dimensions chain up, but a residual connection breaks the permutation argument."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return self.out(h + torch.relu(self.fc2(h)) + x)


def test_hidden_residual_is_caught_by_the_function_check():
    torch.manual_seed(0)
    with pytest.raises(RaysimError, match="_Skip has residual or branching connections"):
        ot_fuse([_Skip(), _Skip()], [1, 1])


def test_mismatched_architectures_are_rejected():
    cnn2 = build_model("cnn2", in_channels=1, num_classes=10, image_size=28)
    lenet = build_model("lenet", in_channels=1, num_classes=10, image_size=28)
    with pytest.raises(RaysimError, match="one architecture"):
        ot_fuse([cnn2, lenet], [1, 1])
    narrow = build_model("convnet", in_channels=3, num_classes=10, image_size=32, width=8)
    wide = build_model("convnet", in_channels=3, num_classes=10, image_size=32, width=16)
    with pytest.raises(RaysimError, match="equal widths"):
        align_to(narrow, wide)


def test_bad_coefficients_and_anchor_are_rejected():
    a = build_model("mlp", in_channels=1, num_classes=10, image_size=28, hidden=8)
    with pytest.raises(RaysimError):
        ot_fuse([a, a], [1])
    with pytest.raises(RaysimError):
        ot_fuse([a, a], [0, 0])
    with pytest.raises(RaysimError):
        ot_fuse([a, a], [1, 1], anchor=2)
