"""FedDyn (Acar et al., 2021): dynamic regularisation.

Client k minimises  L_k(w) - <g_k, w> + alpha/2 ||w - w_global||^2, then
  g_k <- g_k - alpha (w_k - w_global)                       (per-client state)
Server: h <- h - alpha/m sum_{k in S} (w_k - w_global);  w <- mean_{k in S} w_k - h / alpha
(m = all clients; the mean over participants is unweighted, as in the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithm import PositiveFloat
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.weight_math import as_tensors, param_names, squared_distance, zeros_like_params
from raysim.tensors import weighted_average
from raysim.training import cross_entropy_loss
from raysim.vectorized import BatchLoss


class FedDyn(FedAvg):
    name = "feddyn"
    summary = "FedDyn: dynamic regulariser with per-client gradient state"
    per_parameter_state = ("h",)

    @dataclass(frozen=True)
    class Params:
        alpha: PositiveFloat = 0.01  # FedAF's setting

    def server_init(self, model, ctx):
        return {"weights": super().server_init(model, ctx)["weights"], "h": zeros_like_params(model)}

    def local_loss(self, payload, client, ctx):
        anchor, g = self._anchor(payload, ctx), self._gradient_state(client, ctx)
        return lambda model, x, y: self._dynamic_loss(model, x, y, g, anchor)

    def batch_loss(self, payload, clients, ctx):
        anchor = self._anchor(payload, ctx)
        return BatchLoss(
            lambda model, x, y, extra: self._dynamic_loss(model, x, y, extra["g"], anchor),
            extras=[{"g": self._gradient_state(client, ctx)} for client in clients],
        )

    def _anchor(self, payload, ctx):
        """The global weights, as tensors on the device."""
        return as_tensors(payload["weights"], param_names(ctx.model()), ctx.device)

    def _gradient_state(self, client, ctx):
        """The client's g_k, as tensors on the device (zeros before its first round)."""
        model = ctx.model()
        return as_tensors(client.state.get("grad") or zeros_like_params(model), param_names(model), ctx.device)

    def _dynamic_loss(self, model, x, y, g, anchor):
        """L_k(w) - <g_k, w> + alpha/2 ||w - w_global||^2."""
        linear = sum((p * g[n]).sum() for n, p in model.named_parameters())
        return cross_entropy_loss(model, x, y) - linear + 0.5 * self.params.alpha * squared_distance(model, anchor)

    def after_training(self, model, payload, client, ctx, steps):
        g = client.state.get("grad") or zeros_like_params(model)
        with torch.no_grad():
            client.state["grad"] = {
                n: (g[n] - self.params.alpha * (p.detach().cpu().numpy() - payload["weights"][n])).astype(np.float32)
                for n, p in model.named_parameters()
            }
        return {}

    def server_update(self, state, replies, round_index, ctx):
        alpha, m = self.params.alpha, self.config.clients.num
        mean = weighted_average([r.message["weights"] for r in replies], [1.0] * len(replies))
        h = {}
        for n, h_n in state["h"].items():
            drift = sum(r.message["weights"][n].astype(np.float64) - state["weights"][n] for r in replies)
            h[n] = (h_n - alpha / m * drift).astype(np.float32)
        weights = dict(mean)
        for n in h:
            weights[n] = (mean[n] - h[n] / alpha).astype(np.float32)
        return {"weights": weights, "h": h}
