"""Trajectory matching (DynaFed, Pi et al. 2023, eq. 3-4 and Algorithm 1).

A functional copy of the model starts at checkpoint w_t and trains for s' unrolled
steps on the synthetic set (learnable images, learnable soft labels, learnable step
size); the loss is the normalised distance of the end point to the target checkpoint,
    d = ||w_hat - w_target||^2 / ||w_t - w_target||^2,
differentiated through every unrolled step. Only the current parameters of the inner
run are held (autograd keeps what the backward pass needs, nothing more): no copy of
the trajectory is made per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.func import functional_call

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
        xb, yb = _batch(x, label_logits, next(batches), augment, generator)
        loss = soft_cross_entropy(functional_call(model, params, (xb,)), yb)
        grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=differentiable)
        params = {n: params[n] - step_size * g for n, g in zip(names, grads)}
        if not differentiable:
            params = {n: p.detach() for n, p in params.items()}
    return params


def _batch(
    x: torch.Tensor,
    label_logits: torch.Tensor,
    idx: torch.Tensor | None,
    augment: Augment | None,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    xb, yb = (x, label_logits) if idx is None else (x[idx.to(x.device)], label_logits[idx.to(x.device)])
    if augment is not None:
        xb = augment(xb, int(torch.randint(2**31 - 1, (1,), generator=generator)))
    return xb, yb


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
) -> tuple[torch.Tensor, torch.Tensor, float, list[float]]:
    """DynaFed's DataSyn (Algorithm 1): optimise images and soft labels so that s' steps on them
    from w_t land near w_{t+s}. Returns the images, label logits, final step size and the losses."""
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
    for _ in range(iterations):
        start, target = segment(trajectory, horizon, target_average, generator, names, x.device, target_average_max)
        end = unrolled_training(
            model, start, x, y, step.clamp_min(MIN_STEP_SIZE), inner_steps, batch_size, generator, augment
        )
        loss = normalised_distance(end, start, target, shift_free)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
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
