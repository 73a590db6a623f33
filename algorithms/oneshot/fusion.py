"""Optimal-transport model fusion (Singh and Jaggi, NeurIPS 2020), weight-based ("wts") or
activation-based ("acts").

Models of one architecture are fused by first aligning every model's hidden neurons to an
anchor model, layer by layer in forward order, and then averaging the aligned weights.

Layers are the ``nn.Conv2d``/``nn.Linear`` modules in registration order, treated as a chain
l = 1..L. For a model A (weights W_l, biases b_l) and the anchor B (W'_l, b'_l):

1. Input alignment: the incoming dimension of W_l is permuted by the previous layer's
   permutation pi_{l-1}. A Linear after a conv and a flatten sees channel-major features
   (index = channel * (H*W) + position), so whole blocks of H*W columns move together:
   W^_l[:, (c, p)] = W_l[:, (pi_{l-1}(c), p)].
2. Ground cost between anchor neuron j and model neuron i. From the weights (bias appended as
   one coordinate): C_ji = || [W'_l[j], b'_l[j]] - [W^_l[i], b_l[i]] ||^2. From the activations
   (`inputs` given, their code's `--geom-ensemble-type acts`): C_ji = || a'_l[j] - a_l[i] ||^2,
   a_l[i] the layer's output for neuron i (before its norm and non-linearity, their
   `--prelu-acts`) over the input images (and, for a conv, every position). A neuron's output does
   not depend on how the earlier layers are ordered, so the activations of the unaligned model
   serve every layer.
3. Transport: with uniform marginals (1/n on both sides) the exact OT linear programme has a
   permutation matrix among its optimal vertices (Birkhoff-von Neumann), so the plan is
   T = P / n with pi_l = argmin_pi sum_j C_{j, pi(j)}, solved by
   ``scipy.optimize.linear_sum_assignment``. Neuron j of the aligned model is neuron pi_l(j):
   W~_l = W^_l[pi_l], b~_l = b_l[pi_l], and the same for the parameters and running statistics
   of a BatchNorm/InstanceNorm/GroupNorm registered right after the layer.
   The last layer (the classifier) keeps its output order: classes are already aligned.
4. Averaging: theta_fused = sum_k alpha_k theta~_k with alpha_k = c_k / sum_k c_k.

Choices where the paper is silent or that differ from its experiments: the anchor is an
argument (the caller picks, e.g. the largest client); marginals are uniform (equal widths, so
the plan is a permutation and no "soft" barycentre is needed); biases are part of the cost
(the paper's networks had none); norm-layer running statistics are permuted with their layer
and averaged like weights (an approximation, as for FedAvg); integer buffers
(``num_batches_tracked``) are the anchor's. Only plain chains are supported: residual or
branching models (resnet18, googlenet) raise RaysimError, detected by a dimension walk and by
checking that the permuted model computes the same outputs as the original.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from raysim.errors import RaysimError

_LAYERS = (nn.Conv2d, nn.Linear)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.GroupNorm)
_NORM_KEYS = ("weight", "bias", "running_mean", "running_var")
Chain = list[tuple[str, nn.Module, list[str]]]  # (layer name, layer, names of its norm layers)


def _unsupported(model: nn.Module, detail: str) -> RaysimError:
    return RaysimError(
        "ot_fusion aligns plain chains of conv/linear layers (cnn2, cnn3, lenet, mlp, convnet); "
        f"{type(model).__name__} has residual or branching connections ({detail}): "
        "use fedavg_oneshot or a distillation method"
    )


def _key(name: str, attr: str) -> str:
    return f"{name}.{attr}" if name else attr


def _dims(layer: nn.Module) -> tuple[int, int]:
    """(in, out) units of a conv or linear layer."""
    conv = isinstance(layer, nn.Conv2d)
    return (layer.in_channels, layer.out_channels) if conv else (layer.in_features, layer.out_features)


def _chain(model: nn.Module) -> Chain:
    """The model's conv/linear layers with their norm layers; raises on anything not a chain."""
    chain: Chain = []
    for name, m in model.named_modules():
        if isinstance(m, _LAYERS):
            if isinstance(m, nn.Conv2d) and m.groups != 1:
                raise _unsupported(model, f"grouped convolution {name!r}")
            if chain:
                prev, (n_in, _) = chain[-1][1], _dims(m)
                p_out = _dims(prev)[1]
                block = isinstance(prev, nn.Conv2d) and isinstance(m, nn.Linear) and n_in % p_out == 0
                if n_in != p_out and not block:
                    raise _unsupported(model, f"{name!r} takes {n_in} inputs after a layer with {p_out} outputs")
            chain.append((name, m, []))
        elif isinstance(m, _NORMS):
            size = m.num_channels if isinstance(m, nn.GroupNorm) else m.num_features
            if (
                not chain
                or size != _dims(chain[-1][1])[1]
                or (isinstance(m, nn.GroupNorm) and m.num_groups not in (1, size))
            ):
                raise _unsupported(model, f"norm layer {name!r} does not normalise the previous layer per channel")
            chain[-1][2].append(name)
        elif any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False)):
            raise _unsupported(model, f"{type(m).__name__} {name!r} is not a conv, linear or norm layer")
    if not chain:
        raise _unsupported(model, "no conv or linear layers")
    return chain


def _check_same_architecture(model: nn.Module, anchor: nn.Module) -> None:
    a, b = model.state_dict(), anchor.state_dict()
    diff = sorted(set(a) ^ set(b)) or [k for k in a if a[k].shape != b[k].shape]
    if diff:
        raise RaysimError(
            f"ot_fusion needs models of one architecture with equal widths, but {diff[0]!r} "
            "differs between them: build every client model from the same model config"
        )


def _probe_input(model: nn.Module, first: nn.Module) -> torch.Tensor:
    """A random input the model accepts (image sizes are tried for conv-first models)."""
    gen = torch.Generator().manual_seed(0)
    if isinstance(first, nn.Linear):
        return torch.randn(2, first.in_features, generator=gen)
    for size in (28, 32, 64, 224, 16, 96, 128, 8):
        x = torch.randn(2, first.in_channels, size, size, generator=gen)
        try:
            with torch.no_grad():
                model(x)
            return x
        except RuntimeError:
            continue
    raise _unsupported(model, "no square input size from 8 to 224 px runs it")


def _check_function(model: nn.Module, state: dict[str, torch.Tensor], first: nn.Module) -> None:
    """Raise unless the permuted weights compute the same outputs as the original ones."""
    original, permuted = copy.deepcopy(model).eval(), copy.deepcopy(model).eval()
    permuted.load_state_dict(state)
    x = _probe_input(original, first)
    with torch.no_grad():
        same = torch.allclose(original(x), permuted(x), atol=1e-4, rtol=1e-4)
    if not same:
        raise _unsupported(model, "permuting its neurons changed its outputs")


def _rows(state: dict[str, torch.Tensor], name: str, weight: torch.Tensor) -> torch.Tensor:
    """Each output neuron's incoming weights (float64), with its bias appended when there is one."""
    rows, bias = weight.reshape(weight.shape[0], -1).double(), state.get(_key(name, "bias"))
    return rows if bias is None else torch.cat([rows, bias.double().reshape(-1, 1)], 1)


def layer_activations(model: nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """{chain layer name: (neurons, samples x positions) float64}: each conv/linear layer's outputs
    on `inputs`, in eval mode."""
    chain, found, handles = _chain(model), {}, []
    for name, layer, _ in chain[:-1]:  # the classifier's outputs are never permuted

        def hook(_module, _inputs, output, name=name):
            out = output.detach().double()
            found[name] = out.transpose(0, 1).reshape(out.shape[1], -1)

        handles.append(layer.register_forward_hook(hook))
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(inputs)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return found


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T).clamp_min(0.0)


def align_to(model: nn.Module, anchor: nn.Module, inputs: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``model``'s state dict with its hidden neurons permuted to best match ``anchor``'s, by their
    weights, or with ``inputs`` by their activations on them."""
    _check_same_architecture(model, anchor)
    chain = _chain(model)
    acts = (layer_activations(model, inputs), layer_activations(anchor, inputs)) if inputs is not None else None
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref = {k: v.detach() for k, v in anchor.state_dict().items()}
    perm: torch.Tensor | None = None  # the previous layer's permutation
    for idx, (name, _, norms) in enumerate(chain):
        wkey = _key(name, "weight")
        w = state[wkey]
        if perm is not None:  # step 1: align the incoming dimension (blocks of H*W after a flatten)
            w = w.reshape(w.shape[0], len(perm), -1)[:, perm].reshape(w.shape)
            state[wkey] = w
        if idx == len(chain) - 1:
            break  # the classifier's outputs are the classes: never permuted
        if acts is None:  # step 2: squared distances of the weights ...
            cost = _squared_distances(_rows(ref, name, ref[wkey]), _rows(state, name, w))
        else:  # ... or of the activations
            cost = _squared_distances(acts[1][name], acts[0][name])
        # step 3: anchor j <- model perm[j] (solved on the host; the permutation goes back to the weights' device)
        perm = torch.as_tensor(linear_sum_assignment(cost.detach().cpu().numpy())[1], device=w.device)
        keys = [wkey, _key(name, "bias")] + [_key(n, k) for n in norms for k in _NORM_KEYS]
        for key in keys:
            if key in state:
                state[key] = state[key][perm]
    _check_function(model, state, chain[0][1])
    return state


def ot_fuse(
    models: list[nn.Module], coefficients: list[float], anchor: int = 0, inputs: torch.Tensor | None = None
) -> dict[str, np.ndarray]:
    """Align every model's neurons, layer by layer, to the anchor model (by weights, or with
    `inputs` by activations), then return the
    coefficient-weighted average of the aligned state dicts (coefficients are normalised to sum 1),
    as {state_dict key: numpy array} (same keys and dtypes as model.state_dict(), BN running
    statistics and num_batches_tracked included; integer buffers are taken from the anchor)."""
    if not models or len(coefficients) != len(models):
        raise RaysimError(
            f"ot_fuse needs one coefficient per model, got {len(coefficients)} coefficients "
            f"for {len(models)} models: pass matching, non-empty lists"
        )
    alpha = np.asarray(coefficients, dtype=np.float64)
    if not np.all(np.isfinite(alpha)) or np.any(alpha < 0) or alpha.sum() <= 0:
        raise RaysimError(
            f"ot_fuse coefficients must be finite, non-negative and not all zero, "
            f"got {list(coefficients)}: pass e.g. the clients' sample counts"
        )
    if not 0 <= anchor < len(models):
        raise RaysimError(f"ot_fuse anchor {anchor} is not a model index: pass 0..{len(models) - 1}")
    alpha = alpha / alpha.sum()
    ref = models[anchor]
    _chain(ref)  # reject unsupported architectures even when nothing needs aligning
    states = [ref.state_dict() if i == anchor else align_to(m, ref, inputs) for i, m in enumerate(models)]
    fused: dict[str, np.ndarray] = {}
    for key, value in ref.state_dict().items():
        base = value.detach().cpu().numpy()
        if not value.is_floating_point():
            fused[key] = base.copy()
            continue
        total = sum(a * s[key].detach().cpu().double().numpy() for a, s in zip(alpha, states))
        fused[key] = np.ascontiguousarray(total, dtype=base.dtype)
    return fused
