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

from raysim.algorithm import ClientData, Context, ModelSpec
from raysim.config import Config
from raysim.engine.client_state import ClientStateStore
from raysim.engine.devices import configure_torch, peak_memory_mb, pick_device
from raysim.engine.store import object_store
from raysim.macs import counting
from raysim.registry import make_algorithm
from raysim.seeding import CLIENT_TRAIN, derive_seed, torch_generator
from raysim.tensors import load_weights, serialized_nbytes
from raysim.training import evaluate


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
        self.algorithm = make_algorithm(config)
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
        seed = derive_seed(self.config.seed, CLIENT_TRAIN, round_index, client)
        torch.manual_seed(seed)  # modules that draw from torch's global generator (dropout, init)
        for part in parts:
            payload = {**payload, **part}
        x, y, counts = self.data[client]
        arch = self.ctx.spec.client_architecture(client)
        self.ctx.arch = arch  # ctx.model() builds this client's own architecture
        data = ClientData(
            id=client,
            round=round_index,
            x=x,
            y=y,
            label_counts=counts,
            arch=arch,
            state=self.states.load(client, round_index),
            generator=torch_generator(self.config.seed, CLIENT_TRAIN, round_index, client),
        )
        with counting(self.config.eval.count_macs) as macs:
            message = self.algorithm.client_update(payload, data, self.ctx)
        self.states.save(client, round_index, data.state)
        bytes_up = self.algorithm.upload_bytes(message)
        return {
            "client": client,
            "num_samples": data.num_samples,
            "message": message,
            "metrics": dict(data.metrics),
            "bytes_up": serialized_nbytes(message) if bytes_up is None else bytes_up,
            "seconds": time.perf_counter() - start,
            "macs": None if macs is None else macs.total,
            "peak_memory_mb": peak_memory_mb(self.device),
            "incarnation": self.incarnation,
        }

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
        """Several clients' steps in turn; their results are yielded in chunks of at least
        `chunk_bytes` of messages (the last may be smaller). `parts`: the object references of the
        parts addressed to each client."""
        chunk, size = [], 0
        for client in clients:
            mine = self.store.get(parts[client]) if client in parts else []
            result = self.run_client(round_index, client, payload, *mine)
            chunk.append(result)
            size += result["bytes_up"]
            if size >= chunk_bytes:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk
