"""The clients of one actor (or, with resources.in_process, of the run): their data, their
persistent state and the algorithm's client step. Ray-free: the actor that hosts it on Ray is
raysim.engine.ray_actors.ClientActor, and payloads come through the run's object store
(raysim.engine.store).

With eval.selection=federated each client also keeps a held-out share of its data (never trained on)
and, at the server's candidate rounds, scores the global model on it (`validate`): counts only, in eval
mode, no state changed and no random stream drawn."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from raysim.algorithm import Algorithm, ClientData, Context, ModelSpec
from raysim.config import Config
from raysim.engine.client_state import ClientStateStore
from raysim.engine.devices import configure_torch, peak_memory_mb, pick_device
from raysim.engine.store import object_store
from raysim.macs import counting
from raysim.seeding import CLIENT_TRAIN, derive_seed, torch_generator
from raysim.tensors import load_weights, serialized_nbytes
from raysim.training import evaluate

# resources.vectorize_clients: the most clients trained as one vectorised model. A group's
# activations are held at once (32 clients at batch 64: the activations of a batch of 2048), so
# larger groups would gain little more on a GPU and risk its memory.
CLIENTS_TOGETHER = 32


def to_model_input(images: np.ndarray, mean: np.ndarray, std: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 (N, H, W, C) -> normalised float32 (N, C, H, W) on `device`."""
    x = torch.from_numpy(np.array(images, dtype=np.uint8)).to(device)  # a copy: object-store arrays are read-only
    x = x.permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(np.asarray(mean), dtype=torch.float32, device=device).view(1, -1, 1, 1)
    s = torch.tensor(np.asarray(std), dtype=torch.float32, device=device).view(1, -1, 1, 1)
    return (x - m) / s


class ClientRuntime:
    """The clients of one actor: their data, their persistent state, the algorithm's client step."""

    def __init__(
        self,
        config: Config,
        algorithm: type[Algorithm],
        spec: ModelSpec,
        train_x: np.ndarray,
        train_y: np.ndarray,
        client_indices: dict[int, np.ndarray],
        mean: np.ndarray,
        std: np.ndarray,
        state_dir: str | None,
        gpus: float = 0.0,
        validation_indices: dict[int, np.ndarray] | None = None,
    ):
        self.config = config
        self.device = pick_device(gpus)
        self.threads = configure_torch(config.resources.cpus_per_actor, self.device, config.resources)
        self.algorithm = algorithm(config.algorithm.params, config)
        self.ctx = Context(config, spec, self.device, config.model, mean, std)
        self.data: dict[int, tuple[torch.Tensor, torch.Tensor, np.ndarray]] = {}
        for client, idx in client_indices.items():
            y = np.asarray(train_y[idx], dtype=np.int64)
            counts = np.bincount(y, minlength=spec.num_classes).astype(np.int64)
            self.data[client] = (
                to_model_input(train_x[idx], mean, std, self.device),
                torch.from_numpy(y).to(self.device),
                counts,
            )
        # eval.selection=federated: each client's held-out share, (images, labels) on the device
        self.validation: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            client: (
                to_model_input(train_x[idx], mean, std, self.device),
                torch.from_numpy(np.asarray(train_y[idx], dtype=np.int64)).to(self.device),
            )
            for client, idx in (validation_indices or {}).items()
        }
        self.states = ClientStateStore(state_dir)
        self.store = object_store(config.resources.in_process)
        # Tells this process from the one Ray starts after a crash: the server counts restarts by it.
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def info(self) -> dict[str, Any]:
        """Where these clients live, for the run directory's actors.yaml (on Ray, the actor adds its
        node and GPU ids)."""
        where = " (in process)" if self.config.resources.in_process else ""
        return {
            "node_id": None,
            "pid": os.getpid(),
            "device": f"{self.device}{where}",
            "gpu_ids": [],
            "clients": sorted(self.data),
            "models": {k: self.ctx.spec.client_architecture(k).describe() for k in sorted(self.data)},
            "threads": torch.get_num_threads(),
        }

    def run_client(
        self, round_index: int, client: int, payload: dict[str, Any], *parts: dict[str, Any]
    ) -> dict[str, Any]:
        """Client `client`'s step of round `round_index` on the shared payload merged with the parts
        addressed to it."""
        start = time.perf_counter()
        data = self._client_data(round_index, client)
        with counting(self.config.eval.count_macs) as macs:
            message = self.algorithm.client_update(_merged(payload, parts), data, self.ctx)
        reply = self._reply(data, message, None if macs is None else macs.total)
        reply["seconds"] = time.perf_counter() - start
        return reply

    def _client_data(self, round_index: int, client: int) -> ClientData:
        """Client `client` as its step sees it in round `round_index`; seeds torch's global generator
        with the client's seed and makes ctx.model() build the client's architecture."""
        # for modules that draw from torch's global generator (dropout, init)
        torch.manual_seed(derive_seed(self.config.seed, CLIENT_TRAIN, round_index, client))
        x, y, counts = self.data[client]
        arch = self.ctx.spec.client_architecture(client)
        self.ctx.arch = arch  # ctx.model() builds this client's own architecture
        return ClientData(
            id=client,
            round=round_index,
            x=x,
            y=y,
            label_counts=counts,
            arch=arch,
            state=self.states.load(client, round_index),
            generator=torch_generator(self.config.seed, CLIENT_TRAIN, round_index, client),
        )

    def _reply(self, data: ClientData, message: dict[str, Any], macs: int | None) -> dict[str, Any]:
        """A client's result for the server, its state saved; the caller sets "seconds"."""
        self.states.save(data.id, data.round, data.state)
        bytes_up = self.algorithm.upload_bytes(message)
        return {
            "client": data.id,
            "num_samples": data.num_samples,
            "message": message,
            "metrics": dict(data.metrics),
            "bytes_up": serialized_nbytes(message) if bytes_up is None else bytes_up,
            "seconds": 0.0,
            "macs": macs,
            "peak_memory_mb": peak_memory_mb(self.device),
            "incarnation": self.incarnation,
        }

    def run_together(
        self, round_index: int, clients: list[int], payload: dict[str, Any], *parts: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """resources.vectorize_clients: the steps of `clients` (one architecture, the same parts
        addressed to each) trained together as one vectorised model (the algorithm's
        client_update_batch); each reply as run_client's, with macs None (the key refuses
        eval.count_macs)."""
        start = time.perf_counter()
        # each client's seed goes to torch's global generator in turn, as in run_client; the
        # vectorised step draws nothing from it (vmap refuses random operations)
        data = [self._client_data(round_index, client) for client in clients]
        messages = self.algorithm.client_update_batch(_merged(payload, parts), data, self.ctx)
        replies = [self._reply(d, message, None) for d, message in zip(data, messages)]
        # The clients took their steps together, so no client's own time exists: each is given an
        # even share of the group's.
        seconds = (time.perf_counter() - start) / len(clients)
        for reply in replies:
            reply["seconds"] = seconds
        return replies

    def validate(self, weights: dict[str, np.ndarray], clients: list[int]) -> dict[str, Any]:
        """Federated validation: the global model (the server's architecture, `weights`) scored on
        each of `clients`' held-out share. Returns each client's reply - correct predictions,
        examples, summed cross-entropy - and this process's incarnation. Eval mode and no_grad: no
        client state, batch-norm statistic or random stream changes."""
        with torch.random.fork_rng(devices=[]):  # building the model (once) initialises weights: no draw kept
            model = self.ctx.model("validation", self.config.model)
        load_weights(model, weights)
        batch = self.config.eval.batch_size
        replies = []
        for client in clients:
            x, y = self.validation[client]
            correct, loss_sum = 0, 0.0
            if len(y):
                accuracy, loss = evaluate(model, x, y, batch)
                correct, loss_sum = round(accuracy * len(y)), loss * len(y)
            replies.append({"client": client, "correct": correct, "count": len(y), "loss_sum": float(loss_sum)})
        return {"replies": replies, "incarnation": self.incarnation}

    def run_clients(
        self, round_index: int, clients: list[int], payload: dict[str, Any], parts: dict[int, list], chunk_bytes: int
    ) -> Iterator[list[dict[str, Any]]]:
        """Several clients' steps, in turn or (resources.vectorize_clients) together in groups;
        their results are yielded in chunks of at least `chunk_bytes` of messages (the last may be
        smaller). `parts`: the object references of the parts addressed to each client."""
        if self.config.resources.vectorize_clients:
            results = self._results_together(round_index, clients, payload, parts)
        else:
            results = (self.run_client(round_index, client, payload, *self._parts(parts, client)) for client in clients)
        chunk, size = [], 0
        for result in results:
            chunk.append(result)
            size += result["bytes_up"]
            if size >= chunk_bytes:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def _parts(self, parts: dict[int, list], client: int) -> list[dict[str, Any]]:
        return self.store.get(parts[client]) if client in parts else []

    def _results_together(
        self, round_index: int, clients: list[int], payload: dict[str, Any], parts: dict[int, list]
    ) -> Iterator[dict[str, Any]]:
        """The results of `clients` trained in groups that share an architecture and the parts
        addressed to them, at most CLIENTS_TOGETHER a group; a group's results are streamed as soon
        as it has trained."""
        groups: dict[tuple, list[int]] = {}
        for client in clients:
            key = (self.ctx.spec.client_architecture(client), tuple(parts.get(client, ())))
            groups.setdefault(key, []).append(client)
        for members in groups.values():
            for i in range(0, len(members), CLIENTS_TOGETHER):
                group = members[i : i + CLIENTS_TOGETHER]
                yield from self.run_together(round_index, group, payload, *self._parts(parts, group[0]))


def _merged(payload: dict[str, Any], parts: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, Any]:
    """The shared payload with the parts addressed to a client laid over it."""
    for part in parts:
        payload = {**payload, **part}
    return payload
