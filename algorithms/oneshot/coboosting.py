"""Co-Boosting (Dai et al., ICLR 2024): one-shot FL where the synthetic data and the ensemble boost each other.

After the one-shot client stage (algorithms/oneshot/base.py), each distillation epoch:
1. data generation: a fresh generator minimises the hard-sample-weighted cross-entropy
   mean((1 - p_y)^hs CE(E(x), y)) of the *weighted* ensemble E = sum_k w_k f_k / sum_k w_k, minus
   adv_weight times the unmasked student-teacher KL at temperature 3 (x T^2), plus bn_weight L_BN
   (0 by default, as the authors run it);
2. ensemble re-weighting (from the second epoch), over the pool as it was before this epoch's
   images, shuffled into batches of kd_batch: one sign step per batch,
   w <- w - mu wdc^(epoch-1) sign(grad_w CE(E(x), y)), then w - w_start clipped to [-1, 1] and w to
   [0, 1] (w_start: the weights when the epoch's re-weighting began);
3. distillation: each pool batch is moved by one ODS step (x + eta sign(grad_x r . softmax(E(x)/4)),
   r ~ U(-1, 1)) and the server model minimises T^2 KL at T = 4.
As the authors' code runs it (rong-dai/Co-Boosting@b95d715, `co_boosting.sh` and `datafree_kd.py`):
hs 1, mu 0.01, wdc 0.99, T 4, adv 1, bn 0; 128 images a synthesis and pool batches of 128
(`--batch_size 128`, which `synthesis_batch_size` defaults to: `synthesis_batch` and `kd_batch`
here, shared keys, which configs/fedhydra/base.yaml sets to 128 for Co-Boosting alone in its
`per_method:` section); one sign step of the weights per pool batch (so they can reach their
clamps within an epoch); ODS step 8/255 on inputs normalised with std 0.5, which is 4/255 in
pixels (`ods_eta` is in pixels and divided by the data's std here, so the step in pixels is
theirs whatever the normalisation); distillation SGD lr 0.01, momentum 0.9, weight decay
1e-4, cosine schedule over the epochs; gradient norms clipped at 10 for the student and the
generator; no augmentation of the generator's images during synthesis, and on the pooled images
crop + flip for CIFAR datasets and none for the others (their transforms). Their clients also clip
at 10 in local training; here the client stage is shared by all six methods and does not clip.
The learned weights are in summary.json (`ensemble_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithm import NonNegativeFloat, PositiveFloat
from raysim.algorithms.oneshot.augment import augment_images
from raysim.algorithms.oneshot.base import DataFreeDistillation, KDSchedule, OneShotParams
from raysim.algorithms.oneshot.ensemble import weighted_logits
from raysim.algorithms.oneshot.losses import adversarial_loss, distillation_loss, hard_sample_cross_entropy, ods_perturb
from raysim.seeding import SERVER, torch_generator


class CoBoosting(DataFreeDistillation):
    name = "coboosting"
    summary = "Co-Boosting: hard-sample synthesis, learned ensemble weights, ODS-perturbed distillation"

    @dataclass(frozen=True)
    class Params(OneShotParams):
        hard_sample_power: float = 1.0  # hs
        adv_weight: float = 1.0
        bn_weight: float = 0.0
        mu: float = 0.01  # ensemble-weight step
        weight_decay_rate: float = 0.99  # wdc: the step's decay per epoch
        ods_eta: float = 4 / 255  # ODS step, in pixel units (their 8/255 on inputs normalised with std 0.5)
        temperature: PositiveFloat = 4.0
        kd_weight_decay: NonNegativeFloat = 1e-4
        kd_schedule: KDSchedule = "cosine"
        kd_grad_clip: NonNegativeFloat = 10.0
        generator_grad_clip: NonNegativeFloat = 10.0

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

    def authors_augmentation(self, phase, dataset):
        return "crop_flip" if phase == "distill" and "cifar" in dataset else "none"

    def before_distillation(self, state, teachers, ctx, epoch, round_index):
        if epoch <= 1:
            return state
        p = self.params
        old = len(state["pool_y"]) - state.get("pool_added", 0)  # the pool before this epoch's images
        if old <= 0:
            return state
        to_input = self.to_input(ctx)
        mode = self.augmentation("distill")
        g = torch_generator(self.config.seed, SERVER, round_index, "reweight")
        order = torch.randperm(old, generator=g).numpy()
        step = p.mu * p.weight_decay_rate ** (epoch - 1)
        start = torch.as_tensor(state["ensemble_weights"], dtype=torch.float32, device=ctx.device)
        w = start.clone()
        for first in range(0, old, p.kd_batch):
            idx = np.sort(order[first : first + p.kd_batch])
            pixels = torch.from_numpy(state["pool_x"][idx]).to(ctx.device).float() / 255.0
            x = to_input(augment_images(pixels, mode, g))
            y = torch.from_numpy(state["pool_y"][idx]).to(ctx.device)
            with torch.no_grad():
                logits = self.stacked_logits(teachers, x)
            w.requires_grad_(True)
            (grad,) = torch.autograd.grad(F.cross_entropy(weighted_logits(logits, w), y), w)
            moved = (w.detach() - step * grad.sign() - start).clamp(-1.0, 1.0)
            moved = (start + moved).clamp(0.0, 1.0)
            if float(moved.sum()) > 0:  # every weight at 0 would divide by 0 (their code's NaN): keep w
                w = moved
            w = w.detach()
        new = w.cpu().numpy().astype(np.float64)
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
