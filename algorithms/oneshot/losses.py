"""Losses of data-free distillation (DENSE, Co-Boosting, FedHydra).

- BN-statistics loss (DeepInversion; FedHydra eq. 14): for every teacher with BN layers, over its
  BN layers, ||mu_batch - mu_running||_2 + ||var_batch - var_running||_2 (L2 norms, not squared, as
  the authors' hooks), averaged over those teachers. Teachers without BN (the 3-layer CNN) add 0.
- adversarial loss (DENSE; FedHydra eq. 15): minus the KL divergence between teacher and student,
  DENSE's form restricted to samples where they disagree (`masked`), Co-Boosting's on all samples
  at temperature 3.
- distillation loss (FedHydra eq. 17, DENSE, FedDF): T^2 KL(softmax(t/T) || softmax(s/T)), averaged
  over the batch (`batchmean`: DENSE's, Co-Boosting's and FedDF's code) or over the batch and the
  classes (`mean`: FedHydra's code, KLCom with reduction='mean', 1/C of `batchmean`).
- hard-sample-weighted cross-entropy (Co-Boosting): mean((1 - p_y)^hs CE(t, y)), p_y the teacher's
  (detached) probability of the target.
- ODS (output-diversified sampling, Co-Boosting's distillation): x + eta sign(grad_x r . softmax(t(x)/T)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class BNStatistics:
    """Hooks on every BN layer of the teachers; `loss()` after a forward pass of the teachers gives
    the BN-statistics loss of that batch. Use as a context manager (the hooks are removed on exit)."""

    def __init__(self, teachers: list[nn.Module]):
        self.per_teacher: list[list[torch.Tensor]] = []
        self.handles = []
        for teacher in teachers:
            terms: list[torch.Tensor] = []
            layers = [m for m in teacher.modules() if isinstance(m, nn.BatchNorm2d)]
            for layer in layers:
                self.handles.append(layer.register_forward_hook(self._hook(terms)))
            if layers:
                self.per_teacher.append(terms)

    @staticmethod
    def _hook(terms: list[torch.Tensor]):
        def hook(module: nn.BatchNorm2d, inputs, _output):
            x = inputs[0]
            mean = x.mean(dim=(0, 2, 3))
            var = x.permute(1, 0, 2, 3).reshape(x.shape[1], -1).var(dim=1, unbiased=False)
            terms.append(torch.norm(module.running_mean - mean, 2) + torch.norm(module.running_var - var, 2))

        return hook

    def loss(self) -> torch.Tensor:
        """The loss of the teachers' latest forward pass (and forget it)."""
        if not self.per_teacher:
            return torch.zeros(())
        total = sum(sum(terms) for terms in self.per_teacher) / len(self.per_teacher)
        for terms in self.per_teacher:
            terms.clear()
        return total

    def __enter__(self) -> BNStatistics:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def kl_per_sample(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(t/T) || softmax(s/T)) of each sample (no T^2 factor)."""
    return F.kl_div(
        F.log_softmax(student_logits / temperature, 1), F.softmax(teacher_logits / temperature, 1), reduction="none"
    ).sum(1)


KL_REDUCTIONS = ("batchmean", "mean")


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float, reduction: str = "batchmean"
) -> torch.Tensor:
    """T^2 KL(teacher || student); `reduction` as torch's kl_div: `batchmean` sums over the classes
    and averages over the batch, `mean` averages over both."""
    kl = kl_per_sample(student_logits, teacher_logits, temperature).mean() * temperature**2
    if reduction == "mean":
        return kl / student_logits.shape[1]
    if reduction != "batchmean":
        raise ValueError(f"unknown KL reduction {reduction!r}: choose one of {', '.join(KL_REDUCTIONS)}")
    return kl


def adversarial_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, masked: bool = True, temperature: float = 1.0
) -> torch.Tensor:
    """Minus the student-teacher divergence: the generator seeks samples the student has not learnt.
    `masked` (DENSE, FedHydra): only samples whose predicted classes differ count."""
    kl = kl_per_sample(student_logits, teacher_logits, temperature)
    if masked:
        kl = kl * (student_logits.argmax(1) != teacher_logits.argmax(1)).float()
    return -kl.mean() * (1.0 if masked else temperature**2)


def hard_sample_cross_entropy(teacher_logits: torch.Tensor, targets: torch.Tensor, power: float) -> torch.Tensor:
    p_target = F.softmax(teacher_logits, 1).gather(1, targets[:, None]).squeeze(1).detach()
    return ((1.0 - p_target) ** power * F.cross_entropy(teacher_logits, targets, reduction="none")).mean()


def ods_perturb(
    x: torch.Tensor,
    teacher: Callable[[torch.Tensor], torch.Tensor],
    epsilon: float | torch.Tensor,
    generator: torch.Generator,
    temperature: float = 4.0,
) -> torch.Tensor:
    """One ODS step on the (model-input) batch x: a random direction r ~ U(-1, 1) in the output
    simplex, pulled back to the input by the gradient's sign (`epsilon` may be per channel)."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        probs = F.softmax(teacher(x) / temperature, 1)
        r = (torch.rand(probs.shape, generator=generator) * 2 - 1).to(probs.device)
        (grad,) = torch.autograd.grad((probs * r).sum(), x)
    return (x + epsilon * grad.sign()).detach()
