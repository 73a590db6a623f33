"""Distribution matching (DM; Zhao & Bilen, 2023) and class-wise logit statistics."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

Augment = Callable[[torch.Tensor, int], torch.Tensor]


def _embed_and_logits(model, x, with_logits: bool):
    features = model.embed(x)
    return features, (model.classifier(features) if with_logits else None)


def dm_loss(model: torch.nn.Module, real: list[torch.Tensor], syn: list[torch.Tensor],
            augment: Augment | None = None, seed: int = 0, match_logits: bool = False,
            batched: bool = True) -> torch.Tensor:
    """sum_c ||mean h(real_c) - mean h(syn_c)||^2 (+ the same on logits when match_logits).

    `real[i]` and `syn[i]` hold the images of the i-th class present at the client.
    Real features carry no gradient. With `batched`, all classes go through one
    forward pass each for real and synthetic images (one augmentation draw for
    the step, shared by both); otherwise a loop over classes (the DM reference
    code's way, kept for the benchmark), with one draw per class.
    """
    if batched:
        xr, xs = torch.cat(real), torch.cat(syn)
        if augment is not None:
            xr, xs = augment(xr, seed), augment(xs, seed)
        with torch.no_grad():
            fr, lr = _embed_and_logits(model, xr, match_logits)
        fs, ls = _embed_and_logits(model, xs, match_logits)
        real_means = [c.mean(0) for c in fr.split([len(r) for r in real])]
        syn_means = [c.mean(0) for c in fs.split([len(s) for s in syn])]
        loss = sum(((a - b) ** 2).sum() for a, b in zip(real_means, syn_means))
        if match_logits:
            real_logit = [c.mean(0) for c in lr.split([len(r) for r in real])]
            syn_logit = [c.mean(0) for c in ls.split([len(s) for s in syn])]
            loss = loss + sum(((a - b) ** 2).sum() for a, b in zip(real_logit, syn_logit))
        return loss
    loss = 0.0
    for i, (r, s) in enumerate(zip(real, syn)):
        if augment is not None:
            r, s = augment(r, seed + i), augment(s, seed + i)
        with torch.no_grad():
            fr, lr = _embed_and_logits(model, r, match_logits)
        fs, ls = _embed_and_logits(model, s, match_logits)
        loss = loss + ((fr.mean(0) - fs.mean(0)) ** 2).sum()
        if match_logits:
            loss = loss + ((lr.mean(0) - ls.mean(0)) ** 2).sum()
    return loss


@torch.no_grad()
def class_mean_logits(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                      batch_size: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, C) class-wise mean logits (FedAF eq. 5; zero rows for absent classes) and the (C,) counts."""
    sums = torch.zeros(num_classes, num_classes, device=x.device)
    counts = torch.zeros(num_classes, device=x.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start:start + batch_size])
        yb = y[start:start + batch_size]
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
