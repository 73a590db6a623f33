"""FedBN (Li et al., 2021): BatchNorm layers stay local; everything else is averaged.

Clients never receive BN layers from the server: each keeps its own (per-client
state) from its first round on. To report one global model on the shared test
split, clients also upload their BN layers (a few KB, counted in bytes_up) and
the server evaluates with their average; this average is never sent back.
Without BN layers in the model, FedBN is FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass

from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.algorithms.fedavg.weight_math import batchnorm_keys
from raysim.tensors import load_weights, module_weights


class FedBN(FedAvg):
    name = "fedbn"
    summary = "FedBN: BatchNorm layers stay local, the rest is averaged"

    @dataclass(frozen=True)
    class Params:
        pass

    def load_global(self, model, payload, client):
        load_weights(model, payload["weights"])
        if "bn" in client.state:
            load_weights(model, client.state["bn"], strict=False)

    def after_training(self, model, payload, client, ctx, steps):
        keys = batchnorm_keys(model)
        client.state["bn"] = {k: v for k, v in module_weights(model).items() if k in keys}
        return {}
