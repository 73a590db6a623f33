"""Co-Boosting (Dai et al., ICLR 2024): one-shot FL where the synthetic data and the ensemble boost each other.

After the one-shot client stage (algorithms/_oneshot.py), each distillation epoch:
1. data generation: a fresh generator minimises the hard-sample-weighted cross-entropy
   mean((1 - p_y)^hs CE(E(x), y)) of the *weighted* ensemble E = sum_k w_k f_k / sum_k w_k, minus
   adv_weight times the unmasked student-teacher KL at temperature 3 (x T^2), plus bn_weight L_BN
   (0 by default, as the authors run it);
2. ensemble re-weighting (from the second epoch): over the whole pool,
   w <- w - mu wdc^(epoch-1) sign(grad_w CE(E(x), y)), then w - w_init clipped to [-1, 1] and w to [0, 1];
3. distillation: each pool batch is moved by one ODS step (x + eta sign(grad_x r . softmax(E(x)/4)),
   r ~ U(-1, 1)) and the server model minimises T^2 KL at T = 4.
Defaults: the authors' script (hs 1, mu 0.01, wdc 0.99, ODS 8/255 of the pixel range, T 4, adv 1,
bn 0). Their distillation also uses weight decay 1e-4 and a cosine schedule; here every method
shares one distillation optimiser (kd_*), so that the comparison changes one thing at a time.
The learned weights are in summary.json (`ensemble_weights`). ODS's eta is in pixel units, so it
is divided by the data's standard deviation to act on normalised inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from algorithms._oneshot import DataFreeDistillation, OneShotParams
from raysim.synthesis.ensemble import weighted_logits
from raysim.synthesis.losses import adversarial_loss, distillation_loss, hard_sample_cross_entropy, ods_perturb


class CoBoosting(DataFreeDistillation):
    name = "coboosting"
    summary = "Co-Boosting: hard-sample synthesis, learned ensemble weights, ODS-perturbed distillation"

    @dataclass
    class Params(OneShotParams):
        hard_sample_power: float = 1.0  # hs
        adv_weight: float = 1.0
        bn_weight: float = 0.0
        mu: float = 0.01  # ensemble-weight step
        weight_decay_rate: float = 0.99  # wdc: the step's decay per epoch
        ods_eta: float = 8 / 255  # ODS step, in pixel units
        temperature: float = 4.0

    def after_client_stage(self, state, round_index, ctx):
        state = super().after_client_stage(state, round_index, ctx)
        k = len(state["clients"])
        return {**state, "ensemble_weights": np.full(k, 1.0 / k), "initial_weights": np.full(k, 1.0 / k)}

    def ensemble(self, state, teachers):
        device = next(teachers[0].parameters()).device
        w = torch.as_tensor(state["ensemble_weights"], dtype=torch.float32, device=device)
        return lambda x, y: weighted_logits(self.stacked_logits(teachers, x), w)

    def generator_objective(self, state):
        p = self.params
        return lambda teacher, student, y: (
            hard_sample_cross_entropy(teacher, y, p.hard_sample_power)
            + p.adv_weight * adversarial_loss(student, teacher, masked=False, temperature=3.0)
        )

    def distillation_loss(self, state):
        return lambda student, teacher, y: distillation_loss(student, teacher, self.params.temperature)

    def before_distillation(self, state, teachers, ctx, epoch):
        if epoch <= 1:
            return state
        p = self.params
        to_input = self.to_input(ctx)
        w = torch.as_tensor(state["ensemble_weights"], dtype=torch.float32, device=ctx.device).requires_grad_(True)
        x_all = torch.from_numpy(state["pool_x"]).to(ctx.device)
        y_all = torch.from_numpy(state["pool_y"]).to(ctx.device)
        for start in range(0, len(y_all), p.kd_batch):
            x = to_input(x_all[start : start + p.kd_batch].float() / 255.0)
            with torch.no_grad():
                logits = self.stacked_logits(teachers, x)
            loss = F.cross_entropy(weighted_logits(logits, w), y_all[start : start + p.kd_batch], reduction="sum")
            loss.backward()
        step = p.mu * p.weight_decay_rate ** (epoch - 1)
        initial = state["initial_weights"]
        new = state["ensemble_weights"] - step * np.sign(w.grad.cpu().numpy())
        new = np.clip(initial + np.clip(new - initial, -1.0, 1.0), 0.0, 1.0)
        if new.sum() <= 0:  # every weight clipped to 0: keep the previous ones
            new = state["ensemble_weights"]
        state = {**state, "ensemble_weights": new}
        state["report"] = {**state["report"], "ensemble_weights": [round(float(v), 6) for v in new]}
        return state

    def perturbation(self, state, teachers, ctx, generator):
        if self.params.ods_eta <= 0:
            return None
        ensemble = self.ensemble(state, teachers)
        std = torch.as_tensor(ctx.std, dtype=torch.float32, device=ctx.device).view(1, -1, 1, 1)
        eta = self.params.ods_eta / std
        return lambda x: ods_perturb(x, lambda v: ensemble(v, None), eta, generator, self.params.temperature)
