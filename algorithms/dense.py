"""DENSE (Zhang et al., NeurIPS 2022): data-free one-shot FL by ensemble distillation.

After the one-shot client stage (algorithms/_oneshot.py), each distillation epoch:
1. data generation: a fresh generator and its noise z minimise, for uniformly drawn target labels y,
   ce_weight CE(A(x), y) + bn_weight L_BN + adv_weight L_adv, with A the *average* of the client
   models' logits, L_BN the BN-statistics loss over every client model with BN layers, and L_adv
   the (masked) adversarial loss against the server model (raysim.synthesis.losses);
2. model distillation: the server model takes one pass over the image pool on
   T^2 KL(softmax(A/T) || softmax(S/T)).
Defaults are the authors' README command (bn 1, oh 1, adv 1, T 20, generator lr 1e-3, 30 steps,
batch 256); their server lr is 0.005 there, while FedHydra's comparison uses the shared kd_lr 0.01,
which this module inherits so that every method distils with the same optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from algorithms._oneshot import DataFreeDistillation, OneShotParams
from raysim.synthesis.losses import adversarial_loss, distillation_loss


class Dense(DataFreeDistillation):
    name = "dense"
    summary = "DENSE: one-shot, generator trained against the average ensemble, then distillation"

    @dataclass
    class Params(OneShotParams):
        ce_weight: float = 1.0
        bn_weight: float = 1.0
        adv_weight: float = 1.0
        temperature: float = 20.0

    def generator_objective(self, state):
        p = self.params
        return lambda teacher, student, y: (
            p.ce_weight * F.cross_entropy(teacher, y) + p.adv_weight * adversarial_loss(student, teacher, masked=True)
        )

    def distillation_loss(self, state):
        return lambda student, teacher, y: distillation_loss(student, teacher, self.params.temperature)
