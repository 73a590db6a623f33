"""FedHydra's model stratification (Algorithm 2, eq. 1-3): how well each client model knows each class.

For every client k and class j, a freshly initialised generator is trained for `steps` Adam steps
to make client k alone classify its images as j (eq. 1: CE(F(x_hat; theta_k), j), minimised over
theta_G); its input noise stays fixed, as eq. 1 and the authors' code have it (their `interview`
hands z to Adam without requires_grad), unless `learn_z` (z learnt beside the generator); the
loss of every step is recorded and
u_{k,j} = (max - min) / min of that curve (eq. 2). A model that knows class j drives the loss
towards 0, so u is large; one that never saw j stays high and flat.

`loss_variation` guards eq. 2. The paper writes u = (max - min) / min; the authors' code
(Jun-B0518/ICDE2025-FL-SA@a7481f2, `helpers/synthesizers.py`, `interview`) computes exactly that
in Python floats, with no guard: a curve whose minimum is 0 divides by zero (with their default
`--oh 0` every loss is 0, so every u does), and a former guard here, (max - m) / m with
m = max(min, 1e-12), gave u = -1 for a curve of zeros, a negative teacher weight. Here the
numerator keeps the true minimum and only the denominator is clamped, at `MIN_LOSS` = 1e-6 (a
float32 cross-entropy of one sample is 0 or at least about 1.2e-7, the step of 1 + x in float32:
a loss under 1e-6 is a few steps of rounding, not information); points that are not finite (a
diverged generator) are dropped. So u >= 0 and finite always: a flat curve, zeros included, gives
0, and a curve reaching 0 gives (max - min) / 1e-6.
A class whose u is 0 for every client is weighted equally over the clients
(raysim.algorithms.oneshot.ensemble.normalise_over_clients).

`rank_against_predictions` checks that reading on labelled test images: over the K x C cells, the
rank correlation of u with how often client k predicts j (its bias towards j) and with its
precision on j (how often it is right when it says j). A score that measures capability should
follow precision more than the rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch import nn

from raysim.algorithms.oneshot.augment import crop_flip
from raysim.algorithms.oneshot.generator import Generator, reset_generator

MIN_LOSS = 1e-6  # eq. 2's denominator is clamped here (module docstring)


def loss_variation(losses: list[float]) -> float:
    """Eq. 2: (max - min) / min of a loss curve, guarded (module docstring): the finite points only,
    the minimum clamped at MIN_LOSS in the denominator; >= 0 and finite, 0 for a flat curve or one
    with fewer than two finite points."""
    finite = [float(v) for v in losses if math.isfinite(v)]
    if len(finite) < 2:
        return 0.0
    high, low = max(finite), min(finite)
    return (high - low) / max(low, MIN_LOSS)


def stratification_scores(
    teachers: list[nn.Module],
    num_classes: int,
    generator: Generator,
    to_input: Callable[[torch.Tensor], torch.Tensor],
    *,
    steps: int,
    batch: int,
    lr: float,
    seed_of: Callable[[int, int], int],
    augment: bool = True,
    learn_z: bool = False,
) -> np.ndarray:
    """u (K x C): one fresh generator per (client, class); `seed_of(k, j)` seeds its initialisation,
    noise and augmentation."""
    device = next(generator.parameters()).device
    scores = np.zeros((len(teachers), num_classes))
    for k, teacher in enumerate(teachers):
        teacher.eval()
        for j in range(num_classes):
            seed = seed_of(k, j)
            reset_generator(generator, seed)
            generator.train()
            g = torch.Generator().manual_seed(seed)
            z = torch.randn(batch, generator.nz, generator=g).to(device).requires_grad_(learn_z)
            trained = [*generator.parameters(), z] if learn_z else list(generator.parameters())
            optimizer = torch.optim.Adam(trained, lr=lr, betas=(0.5, 0.999))
            target = torch.full((batch,), j, dtype=torch.long, device=device)
            curve = []
            for _ in range(steps):
                pixels = generator(z)
                if augment:
                    pixels = crop_flip(pixels, g)
                loss = F.cross_entropy(teacher(to_input(pixels)), target)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                curve.append(float(loss.detach()))
            scores[k, j] = loss_variation(curve)
    return scores


def rank_against_predictions(u: np.ndarray, predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float | None]:
    """Spearman's rank correlation over the K x C cells of u with each client's prediction rate
    (the share of the images it classifies as j) and its precision on j (0 where it never
    predicts j); `predictions` is (K, N) predicted classes, `labels` (N,). None where a side is
    constant (no ranking)."""
    predictions, labels = predictions.long().cpu(), labels.long().cpu()
    counts = torch.zeros(u.shape, dtype=torch.float64)  # counts[k, j]: images client k calls j
    counts.scatter_add_(1, predictions, torch.ones_like(predictions, dtype=torch.float64))
    correct = torch.zeros_like(counts).scatter_add_(1, predictions, (predictions == labels).double())
    rate = (counts / predictions.shape[1]).numpy()
    precision = (correct / counts.clamp(min=1)).numpy()

    def rho(other: np.ndarray) -> float | None:
        if np.ptp(u) == 0 or np.ptp(other) == 0:
            return None
        return round(float(spearmanr(u.ravel(), other.ravel()).statistic), 4)

    return {"prediction_rate": rho(rate), "precision": rho(precision)}
