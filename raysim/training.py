"""The one training loop (clients' local training, server training on condensed data, DynaFed's
fine-tuning, distillation), and evaluation.

`train` runs epochs of shuffled mini-batches; what differs between its callers is a parameter:
the loss (cross-entropy, with an algorithm's extra terms, or soft labels), the optimiser, an
augmentation applied per batch, a hook on the gradients, and how an epoch is cut into batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raysim import compiled, precision
from raysim.config import LocalConfig
from raysim.precision import autocast

LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
GradHook = Callable[[torch.nn.Module], None]
Augment = Callable[[torch.Tensor, int], torch.Tensor]  # (batch, seed) -> augmented batch, e.g. DSA


def cross_entropy_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def fixed_batches(order: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, ...]:
    """An epoch's shuffled indices in batches of `batch_size`, the last one holding the rest."""
    return order.split(batch_size)


def even_batches(order: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, ...]:
    """An epoch's shuffled indices in ceil(N / batch_size) batches of nearly equal size.

    Condensed sets are small (a few hundred images), so a plain split leaves a last batch of a
    handful of images whose batch-norm statistics are noise, and they go into the running
    statistics used at test time: 780 images at 256 would end each epoch on a batch of 12.
    """
    return order.tensor_split(max(1, math.ceil(len(order) / batch_size)))


@dataclass
class TrainStats:
    steps: int  # optimiser steps taken
    mean_loss: float  # over every step
    last_epoch_loss: float  # over the last epoch's steps


def train(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    loss_fn: LossFn = cross_entropy_loss,
    augment: Augment | None = None,
    grad_hook: GradHook | None = None,
    split: Callable[[torch.Tensor, int], tuple[torch.Tensor, ...]] = fixed_batches,
) -> TrainStats:
    """`epochs` of mini-batch training of `model` on (x, y); y is whatever `loss_fn` takes (labels,
    soft-label logits). Each epoch's order is drawn from `generator`, then, per batch, the seed of
    `augment`. `grad_hook` edits the gradients before each step (SCAFFOLD's correction)."""
    model.train()
    # resources.precision: the loss is computed under autocast, and the model's output comes back in
    # float32 so that what a loss does with it (sums into float buffers, soft labels) stays float32
    # resources.compile: the forward is compiled for the loop (raysim.compiled)
    with _outputs_in_float32(model) if precision.enabled() else nullcontext(), compiled.forward(model):
        return _train_epochs(model, x, y, epochs, batch_size, optimizer, generator, loss_fn, augment, grad_hook, split)


def _train_epochs(model, x, y, epochs, batch_size, optimizer, generator, loss_fn, augment, grad_hook, split):
    steps, total, epoch_total, epoch_steps = 0, 0.0, 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator).to(y.device)
        epoch_total, epoch_steps = 0.0, 0
        for idx in split(order, batch_size):
            xb, yb = x[idx], y[idx]
            if augment is not None:
                xb = augment(xb, int(torch.randint(2**31 - 1, (1,), generator=generator)))
            optimizer.zero_grad(set_to_none=True)
            with autocast(xb.device):
                loss = loss_fn(model, xb, yb).float()
            loss.backward()
            if grad_hook is not None:
                grad_hook(model)
            optimizer.step()
            value = float(loss.detach())
            steps, total = steps + 1, total + value
            epoch_steps, epoch_total = epoch_steps + 1, epoch_total + value
    return TrainStats(steps, total / max(steps, 1), epoch_total / max(epoch_steps, 1))


@contextmanager
def _outputs_in_float32(model: torch.nn.Module) -> Iterator[None]:
    """The model's own output in float32 while the block runs (its layers still compute under autocast)."""
    handle = model.register_forward_hook(
        lambda module, inputs, out: out.float() if torch.is_tensor(out) and out.is_floating_point() else out
    )
    try:
        yield
    finally:
        handle.remove()


def make_optimizer(params, local: LocalConfig) -> torch.optim.Optimizer:
    if local.optimizer == "adam":
        return torch.optim.Adam(params, lr=local.lr, weight_decay=local.weight_decay)
    return torch.optim.SGD(params, lr=local.lr, momentum=local.momentum, weight_decay=local.weight_decay)


def local_train(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    local: LocalConfig,
    generator: torch.Generator,
    loss_fn: LossFn = cross_entropy_loss,
    grad_hook: GradHook | None = None,
    epochs: int | None = None,
    client_state: dict | None = None,
) -> tuple[int, float]:
    """A client's `local.epochs` of training; returns (optimizer steps taken, mean training loss).

    `loss_fn` adds the algorithm's terms (proximal, contrastive, ...);
    `grad_hook` edits gradients before the step (SCAFFOLD's correction);
    `client_state`: with `local.keep_optimizer`, the optimiser resumes from the state kept there
    and leaves its new state there (on the CPU, so it is checkpointed with the client).
    """
    optimizer = make_optimizer(model.parameters(), local)
    keep = local.keep_optimizer and client_state is not None
    if keep and "optimizer" in client_state:
        optimizer.load_state_dict(client_state["optimizer"])
    stats = train(
        model,
        x,
        y,
        epochs=local.epochs if epochs is None else epochs,
        batch_size=local.batch_size,
        optimizer=optimizer,
        generator=generator,
        loss_fn=loss_fn,
        grad_hook=grad_hook,
    )
    if keep:
        client_state["optimizer"] = to_cpu(optimizer.state_dict())
    return stats.steps, stats.mean_loss


def soft_cross_entropy(logits: torch.Tensor, label_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against softmax(label_logits) (learnable soft labels), averaged over the batch
    *and the classes*, as the DynaFed authors' `kd_loss`: the usual cross-entropy divided by C.
    The reduction fixes the scale of an unrolled step, step_size x gradient: their initial step size
    0.04 is in these units, so summing over classes would make every inner step C times theirs."""
    return -(F.softmax(label_logits, dim=1) * F.log_softmax(logits, dim=1)).mean()


def soft_label_loss(model: torch.nn.Module, x: torch.Tensor, label_logits: torch.Tensor) -> torch.Tensor:
    return soft_cross_entropy(model(x), label_logits)


def train_soft_labels(
    model: torch.nn.Module,
    x: torch.Tensor,
    label_logits: torch.Tensor,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    augment: Augment | None,
    keep_bn_statistics: bool = False,
) -> TrainStats:
    """Adam on (x, soft labels) in even batches (DynaFed's server-side refinement, Algorithm 2).
    keep_bn_statistics: batch norm's running statistics stay those the model came with."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    with batchnorm_statistics_frozen(model) if keep_bn_statistics else nullcontext():
        return train(
            model,
            x,
            label_logits,
            epochs=epochs,
            batch_size=batch_size,
            optimizer=optimizer,
            generator=generator,
            loss_fn=soft_label_loss,
            augment=augment,
            split=even_batches,
        )


def to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(v) for v in tree)
    return tree


@contextmanager
def batchnorm_statistics_frozen(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Train-mode batch norm that normalises with each batch's statistics but leaves the running
    statistics (the ones used at test time) untouched: momentum 0 inside, restored on exit."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield model
    finally:
        for m, momentum in zip(norms, saved):
            m.momentum = momentum


@torch.no_grad()
def _predictions(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, float]:
    """(per-sample correctness, summed cross-entropy) of `model` on (x, y), in eval mode."""
    model.eval()
    correct, loss = [], 0.0
    for start in range(0, len(y), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = model(xb)
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct.append(logits.argmax(1) == yb)
    return torch.cat(correct), loss


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` on (x, y)."""
    correct, loss = _predictions(model, x, y, batch_size)
    return int(correct.sum()) / len(y), loss / len(y)


def evaluate_by_group(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    groups: torch.Tensor,
    num_groups: int,
    batch_size: int = 1000,
) -> tuple[float, float, list[float]]:
    """evaluate() plus the accuracy within each group (e.g. each DomainNet domain's test split),
    from one pass over the data."""
    correct, loss = _predictions(model, x, y, batch_size)
    per_group = [
        float(correct[groups == g].float().mean()) if bool((groups == g).any()) else float("nan")
        for g in range(num_groups)
    ]
    return int(correct.sum()) / len(y), loss / len(y), per_group
