"""The two alternating phases of data-free distillation (DENSE Algorithm 1, FedHydra's HASA):

1. `synthesize`: a generator (re-initialised each time, as the authors' code does) and its input
   noise are trained for `steps` Adam steps on the method's objective, computed from the teacher
   ensemble's and the student's logits on the augmented images (plus the BN-statistics loss of the
   teachers); the batch with the lowest objective is kept, as 8-bit pixels (the authors store PNGs)
   with its target labels.
2. `distill_epoch`: one pass of the student over the whole image pool (random crop + flip per
   image), on the method's distillation loss against the ensemble's logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raysim.algorithms.oneshot.augment import augment_images
from raysim.algorithms.oneshot.generator import Generator, reset_generator
from raysim.algorithms.oneshot.losses import BNStatistics
from raysim.precision import autocast
from raysim.training import TrainStats, even_batches, train

# (model-input images, target labels) -> ensemble logits (B, C)
Ensemble = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (teacher logits, student logits, targets) -> the method's generator objective without the BN term
GeneratorObjective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# (student logits, teacher logits, targets) -> distillation loss
DistillLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class SynthesisResult:
    pixels: np.ndarray  # (B, C, H, W) uint8
    targets: np.ndarray  # (B,) int64
    loss: float  # the kept batch's objective
    bn_loss: float


def synthesize(
    generator: Generator,
    teachers: list[nn.Module],
    ensemble: Ensemble,
    student: nn.Module,
    objective: GeneratorObjective,
    to_input: Callable[[torch.Tensor], torch.Tensor],
    *,
    num_classes: int,
    steps: int,
    batch: int,
    lr: float,
    bn_weight: float,
    seed: int,
    augment: str = "crop_flip",
    grad_clip: float = 0.0,
) -> SynthesisResult:
    """`augment`: what the teachers and the student see of the generator's images (one of
    raysim.algorithms.oneshot.augment.AUGMENTATIONS); `grad_clip` > 0 clips the generator's gradient norm
    (not the noise's) before each step, as Co-Boosting's code does."""
    device = next(generator.parameters()).device
    reset_generator(generator, seed)
    generator.train()
    student.eval()
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, generator.nz, generator=g).to(device).requires_grad_(True)
    targets = torch.randint(num_classes, (batch,), generator=g).to(device)
    optimizer = torch.optim.Adam([*generator.parameters(), z], lr=lr, betas=(0.5, 0.999))
    best = (float("inf"), None, 0.0)
    with BNStatistics(teachers if bn_weight else []) as bn:
        for _ in range(steps):
            with autocast(device):  # resources.precision: the models' forward passes; images and losses in float32
                pixels = generator(z).float()
                x = to_input(augment_images(pixels, augment, g))
                teacher_logits, student_logits = ensemble(x, targets), student(x)
                bn_loss = bn.loss()
            loss = objective(teacher_logits.float(), student_logits.float(), targets) + bn_weight * bn_loss
            if float(loss.detach()) < best[0]:
                best = (float(loss.detach()), pixels.detach(), float(torch.as_tensor(bn_loss).detach()))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(generator.parameters(), grad_clip)
            optimizer.step()
    quantised = (best[1].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return SynthesisResult(quantised, targets.cpu().numpy(), best[0], best[2])


def add_to_pool(
    pool_x: np.ndarray | None, pool_y: np.ndarray | None, result: SynthesisResult, cap: int
) -> tuple[np.ndarray, np.ndarray]:
    """The pool with `result` appended; with cap > 0 only the newest `cap` images stay."""
    x = result.pixels if pool_x is None else np.concatenate([pool_x, result.pixels])
    y = result.targets if pool_y is None else np.concatenate([pool_y, result.targets])
    if cap > 0 and len(y) > cap:
        x, y = x[-cap:], y[-cap:]
    return x, y


def distill_epoch(
    student: nn.Module,
    optimizer: torch.optim.Optimizer,
    pool_x: np.ndarray,
    pool_y: np.ndarray,
    ensemble: Ensemble,
    loss: DistillLoss,
    to_input: Callable[[torch.Tensor], torch.Tensor],
    *,
    batch: int,
    generator: torch.Generator,
    augment: str = "crop_flip",
    perturb: Callable[[torch.Tensor], torch.Tensor] | None = None,
    grad_clip: float = 0.0,
) -> TrainStats:
    """One pass over the pool; `augment` is applied to each image (raysim.algorithms.oneshot.augment),
    `perturb` edits each model-input batch first (Co-Boosting's ODS), `grad_clip` > 0 clips the
    student's gradient norm before each step."""
    device = next(student.parameters()).device
    x = torch.from_numpy(pool_x).to(device).float() / 255.0
    y = torch.from_numpy(pool_y).to(device)

    def prepare(xb: torch.Tensor, seed: int) -> torch.Tensor:
        return to_input(augment_images(xb, augment, torch.Generator().manual_seed(seed)))

    def loss_fn(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if perturb is not None:
            xb = perturb(xb)
        with torch.no_grad():
            teacher_logits = ensemble(xb, yb)
        return loss(model(xb), teacher_logits, yb)

    return train(
        student,
        x,
        y,
        epochs=1,
        batch_size=batch,
        optimizer=optimizer,
        generator=generator,
        loss_fn=loss_fn,
        augment=prepare,
        grad_hook=(lambda model: torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        if grad_clip > 0
        else None,
        split=even_batches,
    )  # no batch of 1 for BN
