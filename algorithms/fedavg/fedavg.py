"""FedAvg (McMahan et al., 2017): local SGD, then the size-weighted average of client models.

The other aggregate-then-adapt algorithms subclass this and override one hook each:
`local_loss` (extra loss terms), `grad_hook` (gradient corrections),
`extra_message`/`after_training` (what else a client sends or keeps), and
`aggregate` (how the server combines replies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from raysim.algorithm import Algorithm, ClientData, Context, Reply
from raysim.tensors import load_weights, module_weights, weighted_average
from raysim.training import GradHook, LossFn, cross_entropy_loss, local_train


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "FedAvg: size-weighted average of locally trained models"

    @dataclass(frozen=True)
    class Params:
        pass

    # ------------------------------------------------------------- server
    def server_init(self, model: torch.nn.Module, ctx: Context) -> dict[str, Any]:
        return {"weights": module_weights(model)}

    def broadcast(self, state: dict[str, Any], round_index: int, participants: list[int]) -> dict[str, Any]:
        return {"weights": state["weights"]}

    def server_update(self, state, replies: list[Reply], round_index: int, ctx: Context):
        return {**state, "weights": self.aggregate(state, replies, ctx)}

    def aggregate(self, state, replies: list[Reply], ctx: Context):
        return weighted_average([r.message["weights"] for r in replies], [r.num_samples for r in replies])

    # ------------------------------------------------------------- client
    def client_update(self, payload: dict[str, Any], client: ClientData, ctx: Context) -> dict[str, Any]:
        model = ctx.model()
        self.load_global(model, payload, client)
        steps, loss = local_train(
            model,
            client.x,
            client.y,
            self.config.local,
            client.generator,
            loss_fn=self.local_loss(payload, client, ctx),
            grad_hook=self.grad_hook(payload, client, ctx),
            client_state=client.state,
        )
        client.metrics["train_loss"] = loss
        client.metrics["local_steps"] = steps
        message = {"weights": module_weights(model)}
        message.update(self.after_training(model, payload, client, ctx, steps))
        return message

    def load_global(self, model: torch.nn.Module, payload: dict[str, Any], client: ClientData) -> None:
        load_weights(model, payload["weights"])

    def local_loss(self, payload, client: ClientData, ctx: Context) -> LossFn:
        return cross_entropy_loss

    def grad_hook(self, payload, client: ClientData, ctx: Context) -> GradHook | None:
        return None

    def after_training(self, model, payload, client: ClientData, ctx: Context, steps: int) -> dict[str, Any]:
        """Extra entries of the client's message (and the place to update client.state)."""
        return {}
