"""FedDisco (Ye et al., 2023): aggregation weights from dataset size and label discrepancy.

  d_k = || D_k - U ||_2   (client k's label distribution vs the uniform one)
  p_k ∝ ReLU(n_k / n - a d_k + b)                                        (eq. 5)
As in the authors' code, the discrepancies are first normalised to sum to 1
over the round's participants (so a and b keep their meaning whatever the
number of clients); without it a = 0.5 zeroes every strongly skewed client.
Clients send their label counts with the model (float32, counted in bytes_up).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.tensors import weighted_average


class FedDisco(FedAvg):
    name = "feddisco"
    summary = "FedDisco: aggregation weights from size and label-distribution discrepancy"

    @dataclass(frozen=True)
    class Params:
        a: float = 0.5
        b: float = 0.1

    def after_training(self, model, payload, client, ctx, steps):
        return {"label_counts": client.label_counts.astype(np.float32)}

    def coefficients(self, replies) -> np.ndarray:
        n = np.array([r.num_samples for r in replies], dtype=np.float64)
        counts = np.stack([r.message["label_counts"].astype(np.float64) for r in replies])
        dist = counts / counts.sum(axis=1, keepdims=True)
        discrepancy = np.linalg.norm(dist - 1.0 / counts.shape[1], axis=1)
        if discrepancy.sum() > 0:
            discrepancy = discrepancy / discrepancy.sum()
        p = np.maximum(n / n.sum() - self.params.a * discrepancy + self.params.b, 0.0)
        return p if p.sum() > 0 else n

    def aggregate(self, state, replies, ctx):
        return weighted_average([r.message["weights"] for r in replies], self.coefficients(replies))
