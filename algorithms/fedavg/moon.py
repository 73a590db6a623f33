"""MOON (Li, He, Song, 2021): model-contrastive local loss.

  l_con = -log( e^{sim(z, z_glob)/T} / (e^{sim(z, z_glob)/T} + e^{sim(z, z_prev)/T}) )   (eq. 3)
  loss  = CE + mu * l_con                                                               (eq. 4)
z is the model's embedding (everything before the classifier; the paper adds a
projection head, which these models do not have). z_prev comes from the
client's previous local model, kept as per-client state; before a client's
first round the global model stands in for it (as in the authors' code).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raysim.algorithm import NonNegativeFloat, PositiveFloat
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.weight_math import as_tensors
from raysim.tensors import load_weights, module_weights
from raysim.vectorized import BatchLoss, call_method


class Moon(FedAvg):
    name = "moon"
    summary = "MOON: model-contrastive loss against the global and previous local model"

    @dataclass(frozen=True)
    class Params:
        mu: NonNegativeFloat = 1.0  # FedAF's setting
        temperature: PositiveFloat = 0.5  # 0 divides the similarities by zero: the run learns nothing

    def local_loss(self, payload, client, ctx):
        global_model, previous_model = self._global_model(payload, ctx), ctx.model("moon_previous")
        load_weights(previous_model, client.state.get("previous", payload["weights"]))
        previous_model.eval()

        def loss_fn(model, x, y):
            return self._contrastive_loss(model, x, y, lambda: (global_model.embed(x), previous_model.embed(x)))

        return loss_fn

    def batch_loss(self, payload, clients, ctx):
        global_model, previous_model = self._global_model(payload, ctx), ctx.model("moon_previous").eval()

        def loss_fn(model, x, y, extra):
            return self._contrastive_loss(
                model, x, y, lambda: (global_model.embed(x), call_method(previous_model, "embed", extra["previous"], x))
            )

        previous = [client.state.get("previous", payload["weights"]) for client in clients]
        return BatchLoss(loss_fn, extras=[{"previous": as_tensors(w, list(w), ctx.device)} for w in previous])

    def _global_model(self, payload, ctx):
        """The global model, in eval mode (the positive pair's embedding)."""
        global_model = ctx.model("moon_global")
        load_weights(global_model, payload["weights"])
        return global_model.eval()

    def _contrastive_loss(self, model, x, y, references):
        """CE + mu l_con (eq. 3-4); `references()` gives the global and the previous model's embeddings of x."""
        z = model.embed(x)
        with torch.no_grad():
            z_glob, z_prev = references()
        mu, t = self.params.mu, self.params.temperature
        positive = F.cosine_similarity(z, z_glob, dim=-1) / t
        negative = F.cosine_similarity(z, z_prev, dim=-1) / t
        logits = torch.stack([positive, negative], dim=1)
        contrastive = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long, device=x.device))
        return F.cross_entropy(model.classifier(z), y) + mu * contrastive

    def after_training(self, model, payload, client, ctx, steps):
        client.state["previous"] = module_weights(model)
        return {}
