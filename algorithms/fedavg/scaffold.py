"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

Client i corrects every gradient by (c - c_i); after K local steps with lr eta,
  c_i+ = c_i - c + (w_global - w_i) / (K eta)            (eq. 4, option II)
With momentum rho, K is replaced by FedNova's effective step count
a = [K - rho (1 - rho^K) / (1 - rho)] / (1 - rho), since K momentum steps move
the weights about a/K times further than K plain ones (otherwise c_i is
overestimated about 1/(1 - rho) times and training diverges).
and sends (w_i, c_i+ - c_i). The server averages the models (scaled by the
global lr) and moves c by |S|/N times the mean control change, both means with
the same weights (`weighting`). c_i is per-client state: it stays in the
client's actor between rounds.

Why the weights must be the same: the corrections cancel in the aggregate only
if c is the mean of the c_i under the weights that average the models,
sum_i p_i (c - c_i) = 0. Averaging the models by client size while c is the
plain mean of the c_i leaves every round a drift of the averaged model along
c_plain - c_sized, which the clients' local steps carry without a restoring
force; with clients of very unequal sizes (Dirichlet 0.1) the model diverges.
The paper (Algorithm 1) averages both uniformly: its clients hold equal data.
With `samples` and a sample of the clients a round, the participants' sizes
stand in for all clients' (as FedAvg's n_k / sum over S of n_j does): c is the
size-weighted mean of the c_i exactly when every client takes part, and close
to it otherwise; the server needs no client's size but its participants'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from raysim.algorithm import added_param
from raysim.algorithms.fedavg._params import as_tensors, param_names, zeros_like_params
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.fednova import normalised_steps
from raysim.tensors import weighted_average


class Scaffold(FedAvg):
    name = "scaffold"
    summary = "SCAFFOLD: control variates c, c_i correct client drift (per-client state)"
    per_parameter_state = ("control",)

    @dataclass
    class Params:
        global_lr: float = 1.0
        # The weights of both means, the models' and the control changes': "samples" = each
        # participant's number of samples (the objective FedAvg's size-weighted average minimises);
        # "uniform" = equal (the paper's Algorithm 1); "mixed" = the models by size, the controls
        # equal (NIID-Bench's code; diverges on clients of very unequal sizes, module docstring).
        weighting: Literal["samples", "uniform", "mixed"] = added_param("samples", before="mixed")

    def server_init(self, model, ctx):
        return {"weights": super().server_init(model, ctx)["weights"], "control": zeros_like_params(model)}

    def broadcast(self, state, round_index, participants):
        return {"weights": state["weights"], "control": state["control"]}

    def grad_hook(self, payload, client, ctx):
        model = ctx.model()
        names = param_names(model)
        c = as_tensors(payload["control"], names, ctx.device)
        c_i = as_tensors(client.state.get("control") or zeros_like_params(model), names, ctx.device)
        correction = {n: c[n] - c_i[n] for n in names}

        def hook(model):
            for n, p in model.named_parameters():
                if p.grad is not None:
                    p.grad.add_(correction[n])

        return hook

    def after_training(self, model, payload, client, ctx, steps):
        c = payload["control"]
        c_i = client.state.get("control") or zeros_like_params(model)
        new_weights = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
        rho = self.config.local.momentum if self.config.local.optimizer == "sgd" else 0.0
        scale = 1.0 / (max(normalised_steps(steps, rho), 1e-12) * self.config.local.lr)
        c_new = {n: (c_i[n] - c[n] + (payload["weights"][n] - new_weights[n]) * scale).astype(np.float32) for n in c}
        client.state["control"] = c_new
        return {"control_delta": {n: c_new[n] - c_i[n] for n in c}}

    def aggregate(self, state, replies, ctx):
        if self.params.weighting == "uniform":
            return weighted_average([r.message["weights"] for r in replies], [1.0] * len(replies))
        return super().aggregate(state, replies, ctx)

    def server_update(self, state, replies, round_index, ctx):
        averaged = self.aggregate(state, replies, ctx)
        g = self.params.global_lr
        weights = {
            k: (state["weights"][k] + g * (averaged[k] - state["weights"][k])).astype(averaged[k].dtype)
            if np.issubdtype(averaged[k].dtype, np.floating)
            else averaged[k]
            for k in averaged
        }
        sized = self.params.weighting == "samples"
        mean_delta = weighted_average(
            [r.message["control_delta"] for r in replies], [r.num_samples if sized else 1.0 for r in replies]
        )
        fraction = len(replies) / self.config.clients.num
        control = {n: (state["control"][n] + fraction * mean_delta[n]).astype(np.float32) for n in state["control"]}
        return {"weights": weights, "control": control}
