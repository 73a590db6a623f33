"""FedAF: aggregation-free federated learning (Wang et al., CVPR 2024, eq. 3-17).

Round r, client k (holding classes c with data D_{k,c}):
  V_k = [v_{k,c}],  v_{k,c} = mean_{x in D_{k,c}} f_w(x)                      (eq. 5, 7)
  R_k = [r_{k,c}],  r_{k,c} = softmax(v_{k,c} / tau)                           (eq. 11)
  S_k refined (it persists between rounds) by minimising, each step through a
  re-sampled model w' = gamma w + (1 - gamma) w_random                         (eq. 17)
    L_loc = L_DM(S_k, D_k) + lambda_loc sum_c SWD(u_{k,c}, v_c)                (eq. 10, CDC)
  with u_{k,c} = mean_{x in S_{k,c}} f_w'(x), from the DM step's forward pass    (eq. 6)
  and v_c the global mean logits the server broadcast                          (eq. 8, 9)
  then S_k, V_k and R_k go to the server.
Server:
  v_c = mean_k v_{k,c},  r_c = mean_k r_{k,c}   (over the clients holding c)   (eq. 8, 12)
  train w on S = union S_k with L = CE + lambda_glob LGKM                      (eq. 14)
  (S_k, V_k, R_k: each seen client's latest, `server_sets: seen`; the round's, `round`)
  LGKM = 1/2 (KL(R||T) + KL(T||R)),  t_c = softmax(mean_{x in S_c} f_w(x) / tau)  (eq. 13, 15, 16)
Choices where the paper is silent:
  - V computed by the clients in round r is broadcast in round r + 1 (one message each way per
    round), so round 1 condenses without CDC;
  - t_c is computed on the classes present in each server mini-batch;
  - averages over "clients" in eq. 8 and 12 run over the clients that hold class c, among the clients
    whose sets the server trains on (`server_sets`: by default every client seen so far, with its
    latest V_k and R_k; `round`: the round's participants; raysim.algorithms.condensed.condensation);
  - eq. 17 re-samples w "in each step of the local data condensation", and eq. 6 is written with
    that w, so u_{k,c} goes through the step's re-sampled model w' (`cdc_model: resampled`) as the
    DM term sees it: the mean logit of the class in the DM term's own forward pass (batch norm in
    training mode, the step's DSA draw). The classifier being one linear layer on the features
    (raysim.models), that is the classifier of w' applied to the class's mean feature DM matches, so
    it costs no second forward pass (`cdc_points: per_image` runs one, with the same draw).
    `cdc_model: global` takes u as v is taken (eq. 5): through the received global model f_w in
    eval mode on un-augmented images. Neither puts u through v's own model: v_c comes from the
    previous round's global model (V is broadcast a round late, above). CDC is about 0.6% of the
    condensation gradient at the paper's CIFAR weight (below), so the two readings differ little;
  - tau defaults to 2.0 (not stated in the paper);
  - F of eq. 10, the sliced Wasserstein distance between u_{k,c} and v_c, is not specified further.
    Between two single points, POT's SWD_2 (`swd: root_mean`) has a gradient of norm about
    1 / sqrt(C) whatever their distance, so at the paper's lambda_loc (1e-4 on CIFAR) CDC would be
    invisible next to the DM term. The default (`swd: sum_squared`) sums the squared projected gaps
    over the projections, about (L / C) ||u - v||^2: a gradient that grows with the gap.
    `cdc_points: per_image` compares each condensed image's
    logits with v_c instead of their mean. Each round every client logs the norm of the CDC gradient
    on its images over the DM gradient's (`cdc_dm_grad_ratio`); experiments/fedaf/README.md gives the measured shares.
  - The initial images (init=average) are averages of real images with random weights, so no two
    coincide (raysim.algorithms.condensed.synthetic.init_synthetic); the server trains on the condensed images
    with DSA drawn per image, as DM's evaluation does.
Ablations: without CDC lambda_loc = 0, without LGKM lambda_glob = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch

from raysim.algorithm import NonNegativeFloat, PositiveFloat, added_param
from raysim.algorithms.condensed.condensation import CondensedDataAlgorithm, Init, ServerSetsParams, frozen
from raysim.algorithms.condensed.dsa import DSA
from raysim.algorithms.condensed.match_models import resample_model
from raysim.algorithms.condensed.matching import class_mean_logits, soft_labels, symmetric_kl
from raysim.algorithms.condensed.wasserstein import sliced_wasserstein
from raysim.config.parse import Bound
from raysim.tensors import load_weights


class FedAF(CondensedDataAlgorithm):
    extra_loss_name = "cdc"
    name = "fedaf"
    summary = "FedAF: collaborative condensation (CDC) + local-global knowledge matching (LGKM), no aggregation"
    _step_model: torch.nn.Module | None = None  # the re-sampled model of the current condensation step

    @dataclass(frozen=True)
    class Params(ServerSetsParams):
        init: Init = "average"  # class-wise averages of random real images
        gamma: Annotated[float, Bound(ge=0, le=1)] = 0.9  # model re-sampling coefficient (eq. 17)
        lambda_loc: NonNegativeFloat = 1e-4  # CDC weight (eq. 10); 0 = "without CDC"
        lambda_glob: NonNegativeFloat = 1e-2  # LGKM weight (eq. 14); 0 = "without LGKM"
        temperature: PositiveFloat = 2.0  # tau of eq. 11 and 13
        swd_projections: int = 64
        # How F(u_{k,c}, v_c) of eq. 10 reduces the sliced distance (see algorithms/condensed/wasserstein.py):
        # "sum_squared": squared gaps summed over the projections; "root_mean": SWD_2 (POT's convention).
        swd: Literal["sum_squared", "root_mean"] = "sum_squared"
        # The local side of F: "mean" = u_{k,c}, the class's mean logit (eq. 6); "per_image" = the
        # distribution of the class's per-image logits, each compared with v_c.
        cdc_points: Literal["mean", "per_image"] = "mean"
        # The model of u_{k,c} (eq. 6): "resampled" = the step's w' of eq. 17, as the DM term sees it;
        # "global" = the received global model, in eval mode on un-augmented images (as v of eq. 5).
        cdc_model: Literal["resampled", "global"] = added_param("resampled", before="global", since=2)

    # ------------------------------------------------------------- server
    def server_init(self, model, ctx):
        c = ctx.num_classes
        state = super().server_init(model, ctx)
        state.update(
            {"logits": np.zeros((c, c), np.float32), "soft": np.zeros((c, c), np.float32), "known": np.zeros(c, bool)}
        )
        return state

    def broadcast(self, state, round_index, participants):
        return {"weights": state["weights"], "logits": state["logits"], "known": state["known"]}

    knowledge_keys = ("logits", "soft")  # V_k and R_k, kept with S_k (server_sets: seen)

    def aggregate_knowledge(self, state, sets, ctx):
        """eq. 8 and 12: class-wise means of the V_k and R_k sent with the sets the server trains on."""
        c = ctx.num_classes
        sums, soft, holders = np.zeros((c, c)), np.zeros((c, c)), np.zeros(c)
        for s in sets:
            for cls in s["classes"]:
                sums[cls] += s["logits"][cls]
                soft[cls] += s["soft"][cls]
                holders[cls] += 1
        known = holders > 0
        safe = np.maximum(holders, 1)[:, None]
        state.update(
            {"logits": (sums / safe).astype(np.float32), "soft": (soft / safe).astype(np.float32), "known": known}
        )
        return state

    def server_extra_loss(self, state, ctx):
        """lambda_glob * LGKM (eq. 14-16) on the classes of each mini-batch."""
        lam, tau = self.params.lambda_glob, self.params.temperature
        if lam == 0:
            return None
        r = torch.from_numpy(state["soft"]).to(ctx.device)

        def loss(model, xb, yb, logits):
            present = torch.unique(yb)
            sums = torch.zeros(len(present), logits.shape[1], device=logits.device).index_add_(
                0, torch.searchsorted(present, yb), logits
            )
            t = soft_labels(sums / torch.bincount(yb)[present].unsqueeze(1), tau)
            return lam * symmetric_kl(r[present], t)

        return loss

    # ------------------------------------------------------------- client
    def before_condensation(self, payload, client, ctx, classes, real):
        """V_k and R_k on the client's real data under the received global model (eq. 5, 11)."""
        model = ctx.model("global")
        load_weights(model, payload["weights"])
        frozen(model).eval()
        means, _ = class_mean_logits(model, client.x, client.y, ctx.num_classes)
        soft = soft_labels(means, self.params.temperature)
        soft[client.label_counts == 0] = 0
        return {"logits": means.cpu().numpy().astype(np.float32), "soft": soft.cpu().numpy().astype(np.float32)}

    def initial_set(self, client, classes, real, ctx):
        """The set this client refined in its previous round, or a fresh one the first time."""
        if "syn" in client.state and client.state["classes"] == classes:
            return client.state["syn"].to(ctx.device).clone()
        return super().initial_set(client, classes, real, ctx)

    def after_condensation(self, syn, client, classes):
        client.state["syn"] = syn.cpu()
        client.state["classes"] = list(classes)

    def matching_model(self, payload, client, ctx, seed):
        net = frozen(ctx.model("match"))
        net.train()
        self._step_model = resample_model(net, frozen(ctx.model("random")), payload["weights"], self.params.gamma, seed)
        return self._step_model  # the CDC term of the same step reads it (cdc_model: resampled)

    def extra_condensation_loss(self, payload, means, syn, classes, seed, ctx):
        """lambda_loc * sum_c F(u_{k,c}, v_c): the CDC loss (eq. 10), for classes with a global v_c;
        u_{k,c} through the model `cdc_model` says (the module docstring)."""
        p = self.params
        known = [i for i, c in enumerate(classes) if payload["known"][c]]
        if p.lambda_loc == 0 or not known:
            return 0.0
        if p.cdc_model == "global":
            model = ctx.model("global")  # holds w since before_condensation, frozen, in eval mode
            images = syn[known]
            logits = model(images.reshape(-1, *images.shape[2:])).reshape(len(known), images.shape[1], -1)
        elif p.cdc_points == "per_image":
            logits = self.step_logits(self._step_model, syn, seed)[known]
        else:  # the DM pass's mean logit: its classifier is linear, so the classifier of the mean feature
            logits = self._step_model.classifier(means.syn_features[known]).unsqueeze(1)
        v = torch.from_numpy(payload["logits"][[classes[i] for i in known]]).to(logits.device)
        g = torch.Generator().manual_seed(seed)
        squared, over = (True, "sum") if p.swd == "sum_squared" else (False, "mean")
        total = 0.0
        for j in range(len(known)):
            local = logits[j] if p.cdc_points == "per_image" else logits[j].mean(0, keepdim=True)
            total = total + sliced_wasserstein(
                local, v[j : j + 1], p.swd_projections, g, squared=squared, over_projections=over
            )
        return p.lambda_loc * total

    def step_logits(self, net, syn, seed):
        """(classes, ipc, C) logits of the condensed images as the step's DM term sees them: through
        `net` with the step's DSA draw, all classes in one pass (class by class with dm_batched
        false), as raysim.algorithms.condensed.matching.class_means runs them."""
        augment = DSA() if self.params.dsa else None
        if self.params.dm_batched:
            x = syn.reshape(-1, *syn.shape[2:])
            return net(augment(x, seed) if augment else x).reshape(syn.shape[0], syn.shape[1], -1)
        return torch.stack([net(augment(s, seed + i) if augment else s) for i, s in enumerate(syn)])
