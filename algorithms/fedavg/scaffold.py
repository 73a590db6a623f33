"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

Client i corrects every gradient by (c - c_i); after K local steps with lr eta,
  c_i+ = c_i - c + (w_global - w_i) / (K eta)            (eq. 4, option II)
With momentum rho, K is replaced by FedNova's effective step count
a = [K - rho (1 - rho^K) / (1 - rho)] / (1 - rho), since K momentum steps move
the weights about a/K times further than K plain ones (otherwise c_i is
overestimated about 1/(1 - rho) times and training diverges).
and sends (w_i, c_i+ - c_i). The server averages the models (scaled by the
global lr) and moves c by the control changes, both with the same weights
(`weighting`). c_i is per-client state: it stays in the client's actor between
rounds.

Why the weights must be the same: the corrections cancel in the aggregate only
if c is the mean of the c_i under the weights that average the models,
sum_i p_i (c - c_i) = 0. Averaging the models by client size while c is the
plain mean of the c_i leaves every round a drift of the averaged model along
c_plain - c_sized, which the clients' local steps carry without a restoring
force; with clients of very unequal sizes (Dirichlet 0.1) the model diverges.
The paper (Algorithm 1) averages both uniformly: its clients hold equal data,
and its c += (|S|/N) mean_{i in S} delta_c_i keeps c = (1/N) sum_i c_i exactly.

The size-weighted mean over ALL clients, c = sum_i (n_i / n) c_i (n = sum of all
n_i), moves when the participants S change their c_i by exactly
  c += sum_{i in S} (n_i / n) delta_c_i = (n_S / n) * sum_{i in S} (n_i / n_S) delta_c_i,
n_S the participants' samples: the participants' size-weighted mean, scaled by
the share of the data they hold. That is `population`, the default. `samples`
scales the same mean by the share of the clients, |S|/N, in place of n_S / n: it
equals `population` when every client takes part, and otherwise lets c wander
from the size-weighted mean of the c_i (more, the more unequal the sizes). The
server of `population` knows every client's size: the row sums of
ctx.label_counts, sizes only, what FedAvg's n_k / n presumes (McMahan et al.,
Algorithm 1); a deployment's clients would report them once.

Why `population` is a new choice and `samples` keeps its reading: a run's
stored config names its `weighting` (`samples` in every record made since the
key was added, experiments/benchmark among them), and the earlier-runs
mechanism (added_param's `before`) reads only a config that lacks the key, so
`samples` read as the exact update would count those records as runs they did
not make. A config without `weighting` was made before the key existed, with
`mixed`: its `before` stays "mixed".

Every round the server logs `control_drift` = ||c - m|| / max(||m||, eps)
(latest value in summary.json), m the mean of all clients' c_i under the
models' weights (n_i / n; 1/N for `uniform`), kept on the server from the
control changes (c_i changes only in the rounds client i takes part in, by the
delta it sends, so the server's m is exact): 0 up to float rounding for
`population` and `uniform`, not for `samples` under partial participation or
`mixed`. A run resumed from a checkpoint made before m was kept logs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from raysim.algorithm import added_param
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.fednova import normalised_steps
from raysim.algorithms.fedavg.weight_math import as_tensors, param_names, zeros_like_params
from raysim.errors import RaysimError
from raysim.tensors import weighted_average
from raysim.vectorized import BatchLoss

# The server's copy of the mean of all clients' c_i under the models' weights (module docstring).
CLIENTS_MEAN = "clients_control_mean"
EPS = 1e-12


class Scaffold(FedAvg):
    name = "scaffold"
    summary = "SCAFFOLD: control variates c, c_i correct client drift (per-client state)"
    per_parameter_state = ("control",)

    @dataclass(frozen=True)
    class Params:
        global_lr: float = 1.0
        # The weights of both means, the models' and the control changes': "population" = each
        # client's number of samples, c kept the size-weighted mean of ALL clients' c_i (the
        # objective FedAvg's size-weighted average minimises); "samples" = the same, with the
        # control step scaled by |S|/N in place of the participants' share of the data (exact
        # only when every client takes part; runs made before "population"); "uniform" = equal
        # (the paper's Algorithm 1); "mixed" = the models by size, the controls equal
        # (NIID-Bench's code; diverges on clients of very unequal sizes, module docstring).
        weighting: Literal["population", "samples", "uniform", "mixed"] = added_param(
            "population", before="mixed", since=2
        )

    def server_init(self, model, ctx):
        zeros = zeros_like_params(model)
        return {
            "weights": super().server_init(model, ctx)["weights"],
            "control": zeros,
            CLIENTS_MEAN: {n: v.copy() for n, v in zeros.items()},
        }

    def broadcast(self, state, round_index, participants):
        return {"weights": state["weights"], "control": state["control"]}

    def grad_hook(self, payload, client, ctx):
        correction = self.correction(payload, client, ctx)

        def hook(model):
            for n, p in model.named_parameters():
                if p.grad is not None:
                    p.grad.add_(correction[n])

        return hook

    def batch_loss(self, payload, clients, ctx):
        return BatchLoss(corrections=[self.correction(payload, client, ctx) for client in clients])

    def correction(self, payload, client, ctx):
        """c - c_i, the correction added to each gradient (tensors on the device)."""
        model = ctx.model()
        names = param_names(model)
        c = as_tensors(payload["control"], names, ctx.device)
        c_i = as_tensors(client.state.get("control") or zeros_like_params(model), names, ctx.device)
        return {n: c[n] - c_i[n] for n in names}

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
        deltas = [r.message["control_delta"] for r in replies]
        weighting = self.params.weighting
        if weighting == "population":
            sizes = self.client_sizes(ctx, required=True)
            control = _moved(state["control"], deltas, *_share(sizes, replies))
        else:
            sized = weighting == "samples"
            mean_delta = weighted_average(deltas, [r.num_samples if sized else 1.0 for r in replies])
            fraction = len(replies) / self.config.clients.num
            control = {n: (state["control"][n] + fraction * mean_delta[n]).astype(np.float32) for n in state["control"]}
        new = {**state, "weights": weights, "control": control}
        mean = state.get(CLIENTS_MEAN)  # absent from checkpoints made before it was kept
        if mean is not None:
            if weighting == "uniform":
                weights_of_all = np.ones(self.config.clients.num)
            else:
                weights_of_all = self.client_sizes(ctx, required=False)
            if weights_of_all is None:  # no sizes (a server_update called without the engine's context)
                del new[CLIENTS_MEAN]
            else:
                new[CLIENTS_MEAN] = _moved(mean, deltas, *_share(weights_of_all, replies))
                if ctx is not None:
                    ctx.log.scalar("control_drift", control_drift(control, new[CLIENTS_MEAN]), summary=True)
        return new

    def client_sizes(self, ctx, required: bool) -> np.ndarray | None:
        """Every client's number of samples (the rows of ctx.label_counts summed)."""
        counts = None if ctx is None else ctx.label_counts
        if counts is None:
            if required:
                raise RaysimError(
                    "SCAFFOLD's weighting 'population' needs every client's size (ctx.label_counts) on the "
                    "server: run it through the engine, or set algorithm.weighting=samples"
                )
            return None
        sizes = np.asarray(counts, dtype=np.int64).sum(axis=1)
        if sizes.shape != (self.config.clients.num,) or sizes.sum() <= 0:
            raise RaysimError(
                f"ctx.label_counts holds {sizes.shape[0]} clients' counts summing to {int(sizes.sum())}: "
                f"SCAFFOLD needs one row per client of the {self.config.clients.num}, not all empty"
            )
        return sizes


def _share(weights_of_all: np.ndarray, replies) -> tuple[list[float], float]:
    """The participants' weights and their share of all clients' weights (sum over S / sum over all)."""
    own = [float(weights_of_all[r.client]) for r in replies]
    return own, float(sum(own) / weights_of_all.sum())


def _moved(control, deltas, coefficients, share):
    """control + share * (the coefficient-weighted mean of the deltas) = control + sum_S (w_i / W) delta_i."""
    if not deltas or share == 0.0:  # no participant, or only empty ones: the mean of the c_i stays
        return control
    mean_delta = weighted_average(deltas, coefficients)
    return {n: (control[n] + share * mean_delta[n]).astype(np.float32) for n in control}


def control_drift(control, mean) -> float:
    """||c - m|| / max(||m||, eps) over all parameters together."""
    gap = sum(float(np.sum((np.asarray(control[n], np.float64) - mean[n]) ** 2)) for n in control)
    size = sum(float(np.sum(np.asarray(mean[n], np.float64) ** 2)) for n in mean)
    return float(np.sqrt(gap) / max(np.sqrt(size), EPS))
