"""FedProx (Li et al., 2020): local objective + mu/2 ||w - w_global||^2."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.algorithm import NonNegativeFloat
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.weight_math import as_tensors, param_names, squared_distance
from raysim.training import cross_entropy_loss
from raysim.vectorized import BatchLoss


class FedProx(FedAvg):
    name = "fedprox"
    summary = "FedProx: FedAvg with a proximal term mu/2 ||w - w_global||^2"

    @dataclass(frozen=True)
    class Params:
        mu: NonNegativeFloat = 0.001  # FedAF's setting

    def local_loss(self, payload, client, ctx):
        model = ctx.model()
        anchor = as_tensors(payload["weights"], param_names(model), ctx.device)
        mu = self.params.mu

        def loss_fn(model, x, y):
            return cross_entropy_loss(model, x, y) + 0.5 * mu * squared_distance(model, anchor)

        return loss_fn

    def batch_loss(self, payload, clients, ctx):
        return BatchLoss.shared(self.local_loss(payload, clients[0], ctx))  # it reads the payload only
