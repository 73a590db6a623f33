"""FedAvg (McMahan et al., 2017): local SGD, then the size-weighted average of client models.

The other aggregate-then-adapt algorithms subclass this and override one hook each:
`local_loss` (extra loss terms), `grad_hook` (gradient corrections),
`extra_message`/`after_training` (what else a client sends or keeps), and
`aggregate` (how the server combines replies).

With `resources.vectorize_clients` an actor's clients of a round train together
(`client_update_batch`, raysim.vectorized): `load_global` and `after_training` run per client as
they are, and `batch_loss` gives `local_loss` and `grad_hook` in the form one vectorised step
runs. A subclass that changes `local_loss`, `grad_hook` or `client_update` without the batch
form is refused that key when its config is read (`vectorized_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from raysim.algorithm import Algorithm, ClientData, Context, Reply
from raysim.tensors import load_weights, module_weights, weighted_average
from raysim.training import GradHook, LossFn, cross_entropy_loss, local_train
from raysim.vectorized import BatchLoss, ClientRun, train_together


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
        return self.client_message(model, payload, client, ctx, steps, loss)

    def client_message(self, model, payload, client: ClientData, ctx: Context, steps: int, loss: float):
        """The message of a client whose trained weights `model` holds (its metrics set, after_training run)."""
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

    # ------------------------------------------------------------- clients trained together
    def client_update_batch(self, payload: dict[str, Any], clients: list[ClientData], ctx: Context) -> list[dict]:
        """client_update of several clients (one architecture, one payload) trained together as one
        vectorised model (resources.vectorize_clients): each client's message, metrics and state as
        client_update gives them, to float rounding."""
        model = ctx.model()
        runs = []
        for client in clients:
            self.load_global(model, payload, client)
            start = {name: value.detach().clone() for name, value in model.state_dict().items()}
            runs.append(ClientRun(client.x, client.y, client.generator, start))
        trained = train_together(model, runs, self.config.local, self.batch_loss(payload, clients, ctx))
        messages = []
        for client, result in zip(clients, trained):
            model.load_state_dict(result.state)
            messages.append(self.client_message(model, payload, client, ctx, result.steps, result.mean_loss))
        return messages

    def batch_loss(self, payload, clients: list[ClientData], ctx: Context) -> BatchLoss:
        """local_loss and grad_hook of `clients`, in the form one vectorised step runs."""
        return BatchLoss()

    @classmethod
    def vectorized_refusal(cls) -> str | None:
        """Why this class's clients cannot train vectorised (None: they can): a hook of the client
        step overridden in a subclass below the batch form that would have to run it."""
        for hook, batch_form in (
            ("client_update", "client_update_batch"),
            ("local_loss", "batch_loss"),
            ("grad_hook", "batch_loss"),
        ):
            owner, batch_owner = _defined_in(cls, hook), _defined_in(cls, batch_form)
            if not issubclass(batch_owner, owner):
                return f"changes {hook} in {owner.__name__} without {batch_form}, its vectorised form"
        return None


def _defined_in(cls: type, attribute: str) -> type:
    """The class of cls's MRO whose body defines `attribute`."""
    return next(c for c in cls.__mro__ if attribute in vars(c))
