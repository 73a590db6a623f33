"""Trajectory matching (DynaFed, Pi et al. 2023, eq. 3-4 and Algorithm 1).

A functional copy of the model starts at checkpoint w_t and trains for s' unrolled
steps on the synthetic set (learnable images, learnable soft labels, learnable step
size); the loss is the normalised distance of the end point to the target checkpoint,
    d = ||w_hat - w_target||^2 / ||w_t - w_target||^2,
differentiated through every unrolled step. Only the current parameters of the inner
run are held (autograd keeps what the backward pass needs, nothing more): no copy of
the trajectory is made per step.

That backward pass holds the graph of all s' steps, each a gradient taken with its own graph kept,
so memory grows with s' x |batch| x the model's activations. `recompute=True` trades time for it:
the forward pass keeps only each step's weights (and its batch and augmentation draw), and the
backward pass rebuilds one step's graph at a time, from the last step to the first, carrying the
gradient with respect to that step's weights (reverse-mode through the unrolled loop, as gradient
checkpointing does for layers). The memory is one step's instead of s' steps', at the cost of one
more plain forward-and-backward pass per step; the gradients are the same to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.func import functional_call

from raysim.macs import IdenticalWork
from raysim.precision import autocast
from raysim.training import soft_cross_entropy

Augment = Callable[[torch.Tensor, int], torch.Tensor]
Weights = dict[str, np.ndarray]
MIN_STEP_SIZE = 1e-6


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def as_tensors(weights: Weights, names: list[str], device) -> dict[str, torch.Tensor]:
    return {n: torch.as_tensor(np.asarray(weights[n]), dtype=torch.float32, device=device) for n in names}


def inner_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor | None]:
    """Indices of each unrolled step's batch: the shuffled set cut into batches of `batch_size`, a new
    shuffle when they run out (the authors' code). None when a batch is the whole set (their default,
    batch = C x ipc): every step then sees every image, and no indexing copy is made."""
    if batch_size <= 0 or batch_size >= n:
        while True:
            yield None
    while True:
        yield from torch.randperm(n, generator=generator).split(batch_size)


def unrolled_training(
    model: torch.nn.Module,
    start: dict[str, torch.Tensor],
    x: torch.Tensor,
    label_logits: torch.Tensor,
    step_size: torch.Tensor | float,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
    augment: Augment | None = None,
    differentiable: bool = True,
) -> dict[str, torch.Tensor]:
    """s' steps of SGD from `start` on (x, soft labels). differentiable: the end point keeps the graph
    back to x, labels and step size (synthesis); otherwise each step is detached (evaluation, no
    graph held). `batch_size` <= 0 (or >= len(x)): the whole set every step."""
    names = list(start)
    if differentiable:
        params = {n: p.clone().requires_grad_(True) if not p.requires_grad else p for n, p in start.items()}
    else:
        params = _no_grad_copy(start)
    batches = inner_batches(len(x), batch_size, generator)
    for _ in range(steps):
        if not differentiable:
            params = {n: p.requires_grad_(True) for n, p in params.items()}
        xb, yb = _batch(x, label_logits, _draw(batches, augment, generator), augment)
        params = _sgd_step(model, params, names, xb, yb, step_size, create_graph=differentiable)
        if not differentiable:
            params = {n: p.detach() for n, p in params.items()}
    return params


def _sgd_step(model, params, names, xb, yb, step_size, create_graph: bool) -> dict[str, torch.Tensor]:
    with autocast(xb.device):  # resources.precision: the forward pass; the loss and the step in float32
        logits = functional_call(model, params, (xb,))
    loss = soft_cross_entropy(logits.float(), yb)
    grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=create_graph)
    return {n: params[n] - step_size * g for n, g in zip(names, grads)}


Draw = tuple[torch.Tensor | None, int | None]  # a step's batch indices (None: all) and augmentation seed


def _draw(batches: Iterator[torch.Tensor | None], augment: Augment | None, generator: torch.Generator) -> Draw:
    idx = next(batches)
    return idx, (int(torch.randint(2**31 - 1, (1,), generator=generator)) if augment is not None else None)


def _batch(
    x: torch.Tensor, label_logits: torch.Tensor, draw: Draw, augment: Augment | None
) -> tuple[torch.Tensor, torch.Tensor]:
    idx, seed = draw
    xb, yb = (x, label_logits) if idx is None else (x[idx.to(x.device)], label_logits[idx.to(x.device)])
    if augment is not None:
        xb = augment(xb, seed)
    return xb, yb


def matching_gradients_recomputed(
    model: torch.nn.Module,
    start: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    x: torch.Tensor,
    label_logits: torch.Tensor,
    step_size: torch.Tensor,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
    augment: Augment | None = None,
    shift_free: tuple[str, ...] = (),
) -> float:
    """The matching loss of `s'` unrolled steps from `start`, with its gradients accumulated into
    x.grad, label_logits.grad and step_size.grad, holding one step's graph at a time (module
    docstring). Draws from `generator` in the same order as `unrolled_training`."""
    names = list(start)
    batches = inner_batches(len(x), batch_size, generator)
    draws, weights = [], [start]
    with torch.no_grad():
        step_value = step_size.clamp_min(MIN_STEP_SIZE)
    for _ in range(steps):
        draws.append(_draw(batches, augment, generator))
        with torch.no_grad():
            xb, yb = _batch(x, label_logits, draws[-1], augment)
        params = {n: w.detach().requires_grad_(True) for n, w in weights[-1].items()}
        weights.append({n: w.detach() for n, w in _sgd_step(model, params, names, xb, yb, step_value, False).items()})
    end = {n: w.requires_grad_(True) for n, w in weights[-1].items()}
    loss = normalised_distance(end, start, target, shift_free)
    adjoint = torch.autograd.grad(loss, [end[n] for n in names])  # d loss / d w_{i+1}, from the last step down
    leaves = (x, label_logits, step_size)
    for i in reversed(range(steps)):
        params = {n: w.requires_grad_(True) for n, w in weights[i].items()}
        xb, yb = _batch(x, label_logits, draws[i], augment)
        new = _sgd_step(model, params, names, xb, yb, step_size.clamp_min(MIN_STEP_SIZE), create_graph=True)
        inputs = [*leaves, *([params[n] for n in names] if i > 0 else [])]
        grads = torch.autograd.grad([new[n] for n in names], inputs, grad_outputs=adjoint, allow_unused=True)
        for leaf, g in zip(leaves, grads):
            if g is not None:
                leaf.grad = g if leaf.grad is None else leaf.grad + g
        adjoint = grads[len(leaves) :]
        weights[i + 1] = None  # this step's weights are no longer needed
    return float(loss.detach())


def classifier_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The parameters of the final linear layer (every raysim model exposes it as `model.classifier`)."""
    return tuple(f"classifier.{n}" for n, _ in model.classifier.named_parameters())


def _squared_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], shift_free: tuple[str, ...]) -> torch.Tensor:
    total = 0.0
    for n in b:
        gap = a[n] - b[n]
        if n in shift_free:  # one row per class: drop the part every row shares
            gap = gap - gap.mean(0, keepdim=True)
        total = total + (gap**2).sum()
    return total


def normalised_distance(
    end: dict[str, torch.Tensor],
    start: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    shift_free: tuple[str, ...] = (),
) -> torch.Tensor:
    """||w_hat - w_target||^2 / ||w_t - w_target||^2 (eq. 3), optionally blind to a shift of all class rows.

    Adding one vector to every row of the classifier (weight and bias) changes no softmax output, and
    no SGD step on a cross-entropy loss moves it: the rows of that gradient, sum_c (p_c - q_c) h, add
    up to zero. Adam-trained clients do move it (per-parameter scaling breaks the symmetry), and on
    CIFAR-10 with 80 Adam clients it is most of a segment's displacement, which no synthetic set can
    then reproduce. `shift_free` names the parameters whose class rows are centred before measuring."""
    return _squared_gap(end, target, shift_free) / _squared_gap(start, target, shift_free).clamp_min(1e-12)


def segment(
    trajectory: list[Weights],
    horizon: int,
    target_average: int,
    generator: torch.Generator,
    names: list[str],
    device,
    target_average_max: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A start w_t (t uniform over the starts with s checkpoints after them) and its target: the mean of
    k checkpoints drawn with replacement from w_{t+1..t+s}. The paper averages 2 checkpoints sampled
    between w_t and w_{t+s}; the authors' code draws k uniformly from [target_average, target_average_max]
    (2..3). The target so sits about (s + 1) / 2 checkpoints ahead of w_t, and differs between draws."""
    t = int(torch.randint(0, len(trajectory) - horizon, (1,), generator=generator))
    high = target_average if target_average_max is None else max(target_average, target_average_max)
    k = int(torch.randint(target_average, high + 1, (1,), generator=generator))
    picks = t + 1 + torch.randint(horizon, (k,), generator=generator)
    start = as_tensors(trajectory[t], names, device)
    ends = [as_tensors(trajectory[int(i)], names, device) for i in picks]
    target = {n: torch.stack([e[n] for e in ends]).mean(0) for n in names}
    return start, target


def synthesize(
    model: torch.nn.Module,
    trajectory: list[Weights],
    images: torch.Tensor,
    label_logits: torch.Tensor,
    *,
    iterations: int,
    inner_steps: int,
    horizon: int,
    target_average: int,
    batch_size: int,
    image_lr: float,
    label_lr: float,
    step_size: float,
    step_size_lr: float,
    generator: torch.Generator,
    augment: Augment | None = None,
    shift_free: tuple[str, ...] = (),
    target_average_max: int | None = None,
    recompute: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, float, list[float]]:
    """DynaFed's DataSyn (Algorithm 1): optimise images and soft labels so that s' steps on them
    from w_t land near w_{t+s}. Returns the images, label logits, final step size and the losses.
    recompute: hold one unrolled step's graph at a time (module docstring)."""
    if len(trajectory) <= horizon:
        raise ValueError(f"trajectory of {len(trajectory)} checkpoints is too short for horizon s={horizon}")
    model.train()
    for p in model.parameters():
        p.requires_grad_(False)
    names = trainable_names(model)
    x = images.clone().requires_grad_(True)
    y = label_logits.clone().requires_grad_(True)
    # The step size itself is the Adam parameter (as in the authors' code), so step_size_lr is in
    # step-size units; the clamp only keeps it positive.
    step = torch.tensor(float(step_size), device=x.device, requires_grad=True)
    optimizer = torch.optim.Adam(
        [{"params": [x], "lr": image_lr}, {"params": [y], "lr": label_lr}, {"params": [step], "lr": step_size_lr}]
    )
    losses = []
    # MACs (eval.count_macs): the outer gradient is a second-order backward through the unrolled steps,
    # which only the dispatcher counts whole; every iteration repeats the same work (raysim.macs).
    iteration = IdenticalWork()
    for _ in range(iterations):
        with iteration.piece():
            start, target = segment(trajectory, horizon, target_average, generator, names, x.device, target_average_max)
            optimizer.zero_grad(set_to_none=True)
            if recompute:
                loss = matching_gradients_recomputed(
                    model, start, target, x, y, step, inner_steps, batch_size, generator, augment, shift_free
                )
            else:
                end = unrolled_training(
                    model, start, x, y, step.clamp_min(MIN_STEP_SIZE), inner_steps, batch_size, generator, augment
                )
                loss = normalised_distance(end, start, target, shift_free)
                loss.backward()
                loss = float(loss.detach())
            optimizer.step()
        losses.append(loss)
    return x.detach(), y.detach(), max(float(step.detach()), MIN_STEP_SIZE), losses


@torch.no_grad()
def _no_grad_copy(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: w.detach().clone() for n, w in weights.items()}


def distance_after_training(
    model: torch.nn.Module,
    trajectory: list[Weights],
    x: torch.Tensor,
    label_logits: torch.Tensor,
    *,
    inner_steps: int,
    horizon: int,
    target_average: int,
    batch_size: int,
    step_size: float,
    segments: int,
    generator: torch.Generator,
    augment: Augment | None = None,
    shift_free: tuple[str, ...] = (),
    target_average_max: int | None = None,
) -> float:
    """Mean normalised distance reached from w_t after s' steps on (x, labels) over random segments
    (DynaFed's Figure 6 left). Plain SGD, no graph kept."""
    model.train()
    names = trainable_names(model)
    total = 0.0
    for _ in range(segments):
        start, target = segment(trajectory, horizon, target_average, generator, names, x.device, target_average_max)
        end = unrolled_training(
            model, start, x, label_logits, step_size, inner_steps, batch_size, generator, augment, differentiable=False
        )
        total += float(normalised_distance(end, start, target, shift_free))
    return total / segments
