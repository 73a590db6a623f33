"""FedHydra (Bai et al., KDD 2025): one-shot FL with model stratification and stratified aggregation.

After the one-shot client stage (algorithms/_oneshot.py):
- **Model stratification** (MS, Algorithm 2, eq. 1-7), once per client round: for every client k
  and class j a fresh generator is trained for `stratify_steps` steps to make model k alone
  predict j (eq. 1); u_{k,j} = (max - min) / min of its CE curve (eq. 2); U (eq. 3) is normalised
  over clients (U_r, eq. 4-5) and over classes (U_c, eq. 6-7) (raysim.synthesis.stratify and
  .ensemble). summary.json's `stratification` is U_c as one row per client (TensorBoard shows it),
  `stratification_scores` the u it came from, and `stratification_rank_correlation` how u ranks
  against each client's prediction rate and precision per class on the test images
  (raysim.synthesis.stratify.rank_against_predictions).
- **Stratified aggregation** (SA, eq. 8-12): the teacher of a synthetic sample with target y is
  sum_k U_r[k, y] (P_k (.) U_c[k]) (raysim.synthesis.ensemble.stratified_logits).
- **HASA** (Algorithm 3), each distillation epoch: the generator minimises
  CE(P, y) + lambda1 L_BN + lambda2 L_AD (eq. 13-16; L_AD = -KL(P, F_g), on the samples where the
  server model disagrees with P, as in the authors' DENSE-based code); the server model then
  minimises KL(P, F_g) + beta CE(F_g, H[P]) (eq. 17-19) over the pool.
Choices where the paper is silent: the temperature of eq. 17's KL (1, the authors' code default;
eq. 15's adversarial KL stays at 1, as in DENSE's code, which theirs builds on), beta
(1.0: the paper introduces the term; the authors' code default of 0 would switch eq. 18 off), the
stratification generator's steps (20) and batch (256) from the authors' code. `aggregation: mean`
replaces SA by the average ensemble (the paper's AE, Fig. 7); `aggregation: stratified_unscaled` is
an ablation of ours, SA without eq. 8: each client's logits enter unscaled, weighted by U_r[k, y]
alone (eq. 10-11), which separates the two parts of SA. SA's teacher is read on the test
images two ways (summary.json): `ensemble_accuracy_stratified`, label-free
(raysim.synthesis.ensemble.stratified_predict), and `ensemble_accuracy_stratified_given_label`, with
each image's true class as the target y, as the generator and the server model read SA on
synthetic images: how often SA's teacher, told the class, predicts it. The same two readings of SA
without eq. 8 are `ensemble_accuracy_stratified_unscaled` and `..._unscaled_given_label`, whatever
`aggregation` is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms._oneshot import DataFreeDistillation, OneShotParams
from raysim.errors import RaysimError
from raysim.seeding import SERVER, derive_seed
from raysim.synthesis.ensemble import (
    mean_logits,
    normalise_over_classes,
    normalise_over_clients,
    stratified_logits,
    stratified_predict,
)
from raysim.synthesis.losses import adversarial_loss, distillation_loss
from raysim.synthesis.stratify import rank_against_predictions, stratification_scores

AGGREGATIONS = ("stratified", "stratified_unscaled", "mean")


class FedHydra(DataFreeDistillation):
    name = "fedhydra"
    summary = "FedHydra: one-shot, model stratification + stratified aggregation guide synthesis and distillation"
    supports_client_models = True

    @dataclass
    class Params(OneShotParams):
        lambda1: float = 1.0  # BN loss (eq. 16)
        lambda2: float = 1.0  # adversarial loss (eq. 16)
        beta: float = 1.0  # hard-label CE of the server model (eq. 19)
        temperature: float = 1.0  # of the distillation KL (eq. 17)
        # stratified (SA, eq. 8-11) | stratified_unscaled (SA without eq. 8) | mean (AE, Fig. 7)
        aggregation: str = "stratified"

        def validate(self) -> None:
            super().validate()
            if self.aggregation not in AGGREGATIONS:
                raise RaysimError(
                    f"algorithm.aggregation must be one of {', '.join(AGGREGATIONS)}, got '{self.aggregation}'"
                )
            if self.stratify_steps < 2 or self.stratify_batch < 1:
                raise RaysimError(
                    "algorithm.stratify_steps must be >= 2 (eq. 2 needs a loss curve) and algorithm.stratify_batch >= 1"
                )

    def after_client_stage(self, state, round_index, ctx):
        state = super().after_client_stage(state, round_index, ctx)
        p = self.params
        teachers = self.teachers(state, ctx)
        u = stratification_scores(
            teachers,
            ctx.num_classes,
            self.generator(ctx),
            self.to_input(ctx),
            steps=p.stratify_steps,
            batch=p.stratify_batch,
            lr=p.generator_lr,
            seed_of=lambda k, j: derive_seed(self.config.seed, SERVER, round_index, k, j),
            augment=p.augment,
        )
        over_clients, over_classes = normalise_over_clients(u), normalise_over_classes(u)
        r = torch.as_tensor(over_clients, dtype=torch.float32, device=ctx.device)
        c = torch.as_tensor(over_classes, dtype=torch.float32, device=ctx.device)
        readings = {}
        for suffix, scale in (("", c), ("_unscaled", None)):
            readings[f"ensemble_accuracy_stratified{suffix}"] = self.ensemble_accuracy(
                teachers, ctx, lambda logits, _, scale=scale: stratified_predict(logits, r, scale)
            )
            readings[f"ensemble_accuracy_stratified{suffix}_given_label"] = self.ensemble_accuracy(
                teachers, ctx, lambda logits, y, scale=scale: stratified_logits(logits, y, r, scale)
            )
        for name, value in readings.items():
            ctx.log.scalar(name, value)
        ranks = rank_against_predictions(u, self.test_logits(teachers, ctx).argmax(2), ctx.test_y)
        from raysim.plots import matrix_figure

        ctx.log.figure(
            "stratification", matrix_figure(over_classes, "U_c (rows: clients, columns: classes)", "class", "client")
        )
        clients = sorted(state["clients"])
        report = {
            **state["report"],
            **readings,
            "stratification": [[round(float(v), 6) for v in row] for row in over_classes],
            "stratification_scores": [[round(float(v), 6) for v in row] for row in u],  # u (eq. 2), before eq. 4-7
            "stratification_clients": clients,
            "stratification_rank_correlation": ranks,
        }
        return {**state, "u": u, "over_clients": over_clients, "over_classes": over_classes, "report": report}

    def bn_weight(self) -> float:
        return self.params.lambda1  # eq. 16

    def ensemble(self, state, teachers):
        if self.params.aggregation == "mean":
            return lambda x, y: mean_logits(self.stacked_logits(teachers, x))
        device = next(teachers[0].parameters()).device
        r = torch.as_tensor(state["over_clients"], dtype=torch.float32, device=device)
        c = None
        if self.params.aggregation == "stratified":
            c = torch.as_tensor(state["over_classes"], dtype=torch.float32, device=device)
        return lambda x, y: stratified_logits(self.stacked_logits(teachers, x), y, r, c)

    def generator_objective(self, state):
        p = self.params
        return lambda teacher, student, y: (
            F.cross_entropy(teacher, y)  # eq. 13
            + p.lambda2 * adversarial_loss(student, teacher, masked=True)  # at temperature 1, as DENSE's
        )  # eq. 15

    def distillation_loss(self, state):
        p = self.params
        return lambda student, teacher, y: (
            distillation_loss(student, teacher, p.temperature)  # eq. 17
            + p.beta * F.cross_entropy(student, teacher.argmax(1))
        )  # eq. 18
