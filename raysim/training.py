"""Local training and evaluation loops shared by the algorithms."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from raysim.config import LocalConfig

LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
GradHook = Callable[[torch.nn.Module], None]


def cross_entropy_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def batches(x: torch.Tensor, y: torch.Tensor, batch_size: int,
            generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of shuffled mini-batches (the order drawn from the client's own generator)."""
    order = torch.randperm(len(y), generator=generator).to(y.device)
    for start in range(0, len(y), batch_size):
        idx = order[start:start + batch_size]
        yield x[idx], y[idx]


def make_optimizer(params, local: LocalConfig) -> torch.optim.Optimizer:
    if local.optimizer == "adam":
        return torch.optim.Adam(params, lr=local.lr, weight_decay=local.weight_decay)
    return torch.optim.SGD(params, lr=local.lr, momentum=local.momentum, weight_decay=local.weight_decay)


def local_train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, local: LocalConfig,
                generator: torch.Generator, loss_fn: LossFn = cross_entropy_loss,
                grad_hook: GradHook | None = None, epochs: int | None = None,
                client_state: dict | None = None) -> tuple[int, float]:
    """`epochs` of mini-batch training; returns (optimizer steps taken, mean training loss).

    `loss_fn` adds the algorithm's terms (proximal, contrastive, ...);
    `grad_hook` edits gradients before the step (SCAFFOLD's correction);
    `client_state`: with `local.keep_optimizer`, the optimiser resumes from the state kept there
    and leaves its new state there (on the CPU, so it is checkpointed with the client).
    """
    model.train()
    optimizer = make_optimizer(model.parameters(), local)
    keep = local.keep_optimizer and client_state is not None
    if keep and "optimizer" in client_state:
        optimizer.load_state_dict(client_state["optimizer"])
    steps, total = 0, 0.0
    for _ in range(local.epochs if epochs is None else epochs):
        for xb, yb in batches(x, y, local.batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, xb, yb)
            loss.backward()
            if grad_hook is not None:
                grad_hook(model)
            optimizer.step()
            steps += 1
            total += float(loss.detach())
    if keep:
        client_state["optimizer"] = _to_cpu(optimizer.state_dict())
    return steps, total / max(steps, 1)


def _to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_cpu(v) for v in tree)
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
def _predictions(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int) -> tuple[torch.Tensor, float]:
    """(per-sample correctness, summed cross-entropy) of `model` on (x, y), in eval mode."""
    model.eval()
    correct, loss = [], 0.0
    for start in range(0, len(y), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        logits = model(xb)
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct.append(logits.argmax(1) == yb)
    return torch.cat(correct), loss


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` on (x, y)."""
    correct, loss = _predictions(model, x, y, batch_size)
    return int(correct.sum()) / len(y), loss / len(y)


def evaluate_by_group(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor,
                      num_groups: int, batch_size: int = 1000) -> tuple[float, float, list[float]]:
    """evaluate() plus the accuracy within each group (e.g. each DomainNet domain's test split),
    from one pass over the data."""
    correct, loss = _predictions(model, x, y, batch_size)
    per_group = [float(correct[groups == g].float().mean()) if bool((groups == g).any()) else float("nan")
                 for g in range(num_groups)]
    return int(correct.sum()) / len(y), loss / len(y), per_group
