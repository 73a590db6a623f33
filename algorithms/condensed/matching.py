"""Distribution matching (DM; Zhao & Bilen, 2023) and class-wise logit statistics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raysim import compiled
from raysim.precision import autocast

Augment = Callable[[torch.Tensor, int], torch.Tensor]


def _embed_and_logits(model, x, with_logits: bool):
    with autocast(x.device):  # resources.precision; the means and distances are taken in float32
        features = compiled.function(model.embed)(x)  # resources.compile
        logits = model.classifier(features) if with_logits else None
    return features.float(), (logits.float() if with_logits else None)


@dataclass
class ClassMeans:
    """One matching step's class-wise means, a row per class present at the client (eq. 3 of
    the FedAF paper; logits as in its eq. 5-6). Real rows carry no gradient."""

    real_features: torch.Tensor
    syn_features: torch.Tensor
    real_logits: torch.Tensor | None = None
    syn_logits: torch.Tensor | None = None


def class_means(
    model: torch.nn.Module,
    real: list[torch.Tensor],
    syn: list[torch.Tensor],
    augment: Augment | None = None,
    seed: int = 0,
    logits: bool = False,
    batched: bool = True,
) -> ClassMeans:
    """Mean features (and logits) of each class's real and synthetic images through `model`.

    `real[i]` and `syn[i]` hold the images of the i-th class present at the client. With
    `batched`, all classes go through one forward pass each for real and synthetic images
    (one augmentation draw for the step, shared by both); otherwise a loop over classes (the
    DM reference code's way, kept for the benchmark), with one draw per class.
    """

    def stack(parts):
        return torch.stack(parts) if parts[0] is not None else None

    if batched:
        xr, xs = torch.cat(real), torch.cat(syn)
        if augment is not None:
            xr, xs = augment(xr, seed), augment(xs, seed)
        with torch.no_grad():
            fr, lr = _embed_and_logits(model, xr, logits)
        fs, ls = _embed_and_logits(model, xs, logits)

        def means(values, sets):
            return None if values is None else stack([c.mean(0) for c in values.split([len(x) for x in sets])])

        return ClassMeans(means(fr, real), means(fs, syn), means(lr, real), means(ls, syn))
    rows = []
    for i, (r, s) in enumerate(zip(real, syn)):
        if augment is not None:
            r, s = augment(r, seed + i), augment(s, seed + i)
        with torch.no_grad():
            fr, lr = _embed_and_logits(model, r, logits)
        fs, ls = _embed_and_logits(model, s, logits)
        rows.append([t if t is None else t.mean(0) for t in (fr, fs, lr, ls)])
    return ClassMeans(*(stack(list(column)) for column in zip(*rows)))


def distribution_distance(means: ClassMeans, match_logits: bool = False) -> torch.Tensor:
    """The DM loss: sum_c ||mean h(real_c) - mean h(syn_c)||^2 (FedAF eq. 4), plus the same on
    logits when `match_logits` (FedDM)."""
    loss = ((means.real_features - means.syn_features) ** 2).sum()
    if match_logits:
        loss = loss + ((means.real_logits - means.syn_logits) ** 2).sum()
    return loss


def dm_loss(
    model: torch.nn.Module,
    real: list[torch.Tensor],
    syn: list[torch.Tensor],
    augment: Augment | None = None,
    seed: int = 0,
    match_logits: bool = False,
    batched: bool = True,
) -> torch.Tensor:
    """The DM loss of one step (see `class_means` for the arguments)."""
    return distribution_distance(class_means(model, real, syn, augment, seed, match_logits, batched), match_logits)


def real_batch_indices(available: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """`size` indices into a class's `available` real images: distinct when there are enough,
    drawn with replacement otherwise.

    Every class then contributes `size` images to the real batch, as every class contributes
    `ipc` to the synthetic one. With batch norm in training mode and all classes in one forward
    pass, the batch statistics depend on the class proportions; equal proportions on both sides
    keep a client's rare classes (a handful of images under strong label skew) from shifting the
    real features that the synthetic ones are matched to.
    """
    if available >= size:
        return torch.randperm(available, generator=generator)[:size]
    return torch.randint(available, (size,), generator=generator)


@torch.no_grad()
def class_mean_logits(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, batch_size: int = 1000
) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, C) class-wise mean logits (FedAF eq. 5; zero rows for absent classes) and the (C,) counts."""
    sums = torch.zeros(num_classes, num_classes, device=x.device)
    counts = torch.zeros(num_classes, device=x.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        yb = y[start : start + batch_size]
        sums.index_add_(0, yb, logits.float())
        counts += torch.bincount(yb, minlength=num_classes).float()
    means = sums / counts.clamp_min(1).unsqueeze(1)
    return means, counts


def soft_labels(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / tau) along the last axis (FedAF eq. 11, 13)."""
    return F.softmax(logits / temperature, dim=-1)


def symmetric_kl(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """1/2 (KL(p||q) + KL(q||p)) summed over the last axis, averaged over rows (FedAF eq. 15)."""
    p, q = p.clamp_min(eps), q.clamp_min(eps)
    return 0.5 * ((p * (p.log() - q.log())).sum(-1) + (q * (q.log() - p.log())).sum(-1)).mean()
