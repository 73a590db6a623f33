"""FedAvg one-shot: the size-weighted average of the clients' converged models (one architecture).

The client stage is the one-shot family's (algorithms/oneshot/base.py): every client trains its model
from the common initial weights (or, with client_init: independent, weights of its own) for
local.epochs and uploads it once; the server averages them
(McMahan et al., 2017, in one round). Distillation rounds leave the average as it is; with
global_rounds T > 1 clients restart from the average each round (FedHydra's Table 5).
"""

from __future__ import annotations

from raysim.algorithms.oneshot.base import OneShot
from raysim.tensors import weighted_average


class FedAvgOneShot(OneShot):
    name = "fedavg_oneshot"
    summary = "FedAvg one-shot: size-weighted average of the clients' converged models"
    supports_client_models = False

    def after_client_stage(self, state, round_index, ctx):
        clients = sorted(state["clients"])
        weights = weighted_average([state["clients"][k] for k in clients], [state["num_samples"][k] for k in clients])
        return {**state, "weights": weights}
