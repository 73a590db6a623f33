"""Small algorithms that exercise the engine's general features; used by tests/test_engine_features.py
as user code (`algorithm.name: tests.engine_algorithms:Class`), the way a researcher's own file is."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithm import Algorithm, Broadcast
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.seeding import SERVER, torch_generator
from raysim.tensors import load_weights, module_weights
from raysim.training import evaluate, local_train


class OneShotDistill(Algorithm):
    """Round 1: every client trains its own architecture from its initial weights and uploads it.
    Later rounds are server-only: the server distils the clients' ensemble into its own model on
    Gaussian noise (a stand-in for a generator), `distill_steps` steps a round."""

    name = "oneshot-distill-test"
    supports_client_models = True

    @dataclass(frozen=True)
    class Params:
        distill_steps: int = 20
        distill_batch: int = 32

    def server_init(self, model, ctx):
        return {"weights": module_weights(model), "clients": {}}

    def select_clients(self, state, round_index, rng, ctx):
        return list(range(self.config.clients.num)) if round_index == 1 else []

    def broadcast(self, state, round_index, participants):
        return {}  # clients start from their own architecture's initial weights

    def client_update(self, payload, client, ctx):
        model = ctx.model()
        load_weights(model, module_weights(ctx.spec.initial_model(client.arch)))
        local_train(model, client.x, client.y, self.config.local, client.generator)
        return {"weights": module_weights(model), "arch": client.arch.describe()}

    def teachers(self, state, ctx):
        models = []
        for k, saved in sorted(state["clients"].items()):
            model = ctx.model(f"teacher{k}", ctx.spec.client_architecture(k))
            load_weights(model, saved["weights"])
            models.append(model.eval())
        return models

    def server_update(self, state, replies, round_index, ctx):
        state = {**state, "clients": {**state["clients"], **{r.client: r.message for r in replies}}}
        teachers = self.teachers(state, ctx)
        if replies:
            for reply, teacher in zip(replies, teachers):
                ctx.log.client_value(reply.client, "own_accuracy", evaluate(teacher, ctx.test_x, ctx.test_y)[0])
            with torch.no_grad():
                ensemble = torch.stack([F.softmax(t(ctx.test_x), 1) for t in teachers]).mean(0)
            ctx.log.scalar("ensemble_accuracy", float((ensemble.argmax(1) == ctx.test_y).float().mean()), summary=True)
            return state
        student = ctx.model("student")
        load_weights(student, state["weights"])
        student.train()
        optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
        g = torch_generator(self.config.seed, SERVER, round_index)
        shape = (self.params.distill_batch, ctx.spec.in_channels, ctx.spec.image_size, ctx.spec.image_size)
        for _ in range(self.params.distill_steps):
            x = torch.randn(shape, generator=g).to(ctx.device)
            with torch.no_grad():
                target = torch.stack([F.softmax(t(x), 1) for t in teachers]).mean(0)
            loss = F.kl_div(F.log_softmax(student(x), 1), target, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ctx.log.scalar("distill_loss", float(loss.detach()))
        return {**state, "weights": module_weights(student)}


class AddressedFedAvg(FedAvg):
    """FedAvg whose broadcast also addresses each participant a note of its own length (100 bytes per
    client id + 100) and the two lowest participants a shared group part; clients report what they got."""

    name = "addressed-fedavg-test"

    def broadcast(self, state, round_index, participants):
        payload = Broadcast(shared=super().broadcast(state, round_index, participants))
        for k in participants:
            payload.to(k, {"note": np.full(100 * (k + 1), k, np.uint8)})
        return payload.to(participants[:2], {"group": np.zeros(1000, np.uint8)})

    def client_update(self, payload, client, ctx):
        note = payload["note"]
        assert len(note) == 100 * (client.id + 1) and int(note[0]) == client.id, "a note reached the wrong client"
        client.metrics["got_group"] = float("group" in payload)
        return super().client_update(payload, client, ctx)


class ChoosesAStranger(FedAvg):
    name = "stranger-test"

    def select_clients(self, state, round_index, rng, ctx):
        return [0, 99]


class FailsWhenAsked(FedAvg):
    """FedAvg whose server raises in round 1 when `fail` is set: a sweep trial that breaks mid-run."""

    name = "fails-when-asked-test"

    @dataclass(frozen=True)
    class Params(FedAvg.Params):
        fail: bool = False

    def server_update(self, state, replies, round_index, ctx):
        if self.params.fail:
            raise RuntimeError("this trial was asked to fail")
        return super().server_update(state, replies, round_index, ctx)
