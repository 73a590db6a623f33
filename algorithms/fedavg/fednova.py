"""FedNova (Wang et al., 2020): normalised averaging that removes the bias of unequal local steps.

Client i reports its normalised update d_i = (w_global - w_i) / a_i, where for SGD
with momentum rho over tau_i steps a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)
(a_i = tau_i without momentum). The server steps
  w = w_global - tau_eff * sum_i p_i d_i,   tau_eff = sum_i p_i a_i,   p_i = n_i / n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.weight_math import param_names
from raysim.tensors import weighted_average


def normalised_steps(tau: int, rho: float) -> float:
    if rho == 0:
        return float(tau)
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


class FedNova(FedAvg):
    name = "fednova"
    summary = "FedNova: normalised averaging by each client's number of local steps"

    @dataclass(frozen=True)
    class Params:
        pass

    def after_training(self, model, payload, client, ctx, steps):
        rho = self.config.local.momentum if self.config.local.optimizer == "sgd" else 0.0
        return {"a": np.float32(normalised_steps(steps, rho))}

    def aggregate(self, state, replies, ctx):
        n = np.array([r.num_samples for r in replies], dtype=np.float64)
        p = n / n.sum()
        a = np.array([float(r.message["a"]) for r in replies])
        tau_eff = float((p * a).sum())
        plain = weighted_average([r.message["weights"] for r in replies], n)  # buffers: plain average
        params = set(param_names(ctx.model()))
        out = {}
        for key, w0 in state["weights"].items():
            if key not in params:  # BatchNorm running statistics: plain weighted average
                out[key] = plain[key]
                continue
            d = np.zeros(w0.shape, dtype=np.float64)
            for p_i, a_i, r in zip(p, a, replies):
                d += p_i * (w0.astype(np.float64) - r.message["weights"][key]) / max(a_i, 1e-12)
            out[key] = (w0 - tau_eff * d).astype(w0.dtype)
        return out
