"""The server actor: owns the global state and runs one round at a time.

One round (paper-agnostic):
  participants = algorithm.select_clients(state, rng(seed, round))   ([] = a server-only round)
  payload = algorithm.broadcast(state, participants)   -> each part put once in the object store
  replies = client actors' client_update               -> streamed back in chunks as they finish
  state   = algorithm.server_update(state, replies sorted by client id)
  evaluate the global weights on the test split; hand the round's results to the output callbacks
  (metrics.parquet, TensorBoard, checkpoint, summary.json: raysim.outputs.callbacks).

Model selection without the test set (eval.selection): summary.json (raysim.outputs.summary)
names the last evaluated round (`final`), or (`federated`) the candidate round - every
eval.select_every-th evaluated round and the last - whose global weights score the highest pooled
accuracy on the validating clients' held-out shares. At a candidate round, after the test
evaluation, the weights are put once in the object store, each actor hosting validating clients
scores them on each client's share and replies with counts; the round logs validation_accuracy and
validation_loss, and the bytes (the weights to each validating client, each reply) in
bytes_down/bytes_up and, to take them out, in bytes_validation_down/bytes_validation_up.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raysim.algorithm import Algorithm, Context, ModelSpec, Reply, ServerLog
from raysim.config import Config
from raysim.engine.client_runtime import to_model_input
from raysim.engine.delivery import Delivery
from raysim.engine.devices import configure_torch, peak_memory_mb, pick_device
from raysim.engine.store import object_store
from raysim.errors import RaysimError
from raysim.macs import counting
from raysim.outputs.callbacks import (
    Callback,
    CheckpointFile,
    MetricsFile,
    RoundResult,
    RunStart,
    SummaryFile,
    TensorBoardFile,
)
from raysim.outputs.run_dir import RunDir
from raysim.outputs.summary import run_summary
from raysim.partition import validating_clients
from raysim.plots import partition_figure
from raysim.seeding import CLIENT_SAMPLING, numpy_rng
from raysim.tensors import load_weights, serialized_nbytes
from raysim.training import evaluate, evaluate_by_group

RESULT_CHUNK_BYTES = 32 * 2**20  # an actor streams its clients' results in chunks of at least this many bytes


@dataclass
class ServerInputs:
    """What the server knows of the experiment: the model's shape, the split it evaluates on, the
    normalisation, and (for the algorithms and the outputs) the clients' label counts and a digest
    of their data. The clients' training data stays with the client actors."""

    algorithm: type[Algorithm]  # the config's algorithm class (resolved once, by raysim.runner.prepare)
    spec: ModelSpec
    test_x: np.ndarray
    test_y: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    partition_counts: np.ndarray | None = None  # (clients, classes)
    class_names: list[str] | None = None
    test_domain: np.ndarray | None = None  # domain-skew data: each test image's domain
    domains: list[str] | None = None
    data_digest: str | None = None


class ServerRuntime:
    """The global state and the round loop. `actors` host the clients; `client_actor` maps each
    client to the index of its actor."""

    def __init__(
        self, config: Config, inputs: ServerInputs, run_dir: RunDir, actors: list, client_actor: dict[int, int]
    ):
        self.config = config
        self.run_dir = run_dir
        self.device = pick_device(config.resources.server_gpus)
        # Fixed by the config and the node, never by the number of actors (see resources.server_threads).
        threads = config.resources.server_threads or len(os.sched_getaffinity(0))
        self.threads = configure_torch(threads, self.device, config.resources)
        spec = inputs.spec
        self.ctx = Context(
            config,
            spec,
            self.device,
            config.model,
            inputs.mean,
            inputs.std,
            log=ServerLog(),
            data_digest=inputs.data_digest,
            label_counts=inputs.partition_counts,
        )
        self.algorithm = inputs.algorithm(config.algorithm.params, config)
        self.actors = actors
        self.client_actor = client_actor
        self.store = object_store(config.resources.in_process)
        self.incarnations: dict[int, str] = {}  # actor index -> the process its last result came from
        federated = config.eval.selection == "federated"
        self.validators = (
            validating_clients(config.clients.num, config.eval.select_clients, config.seed) if federated else []
        )
        self.test_x = to_model_input(inputs.test_x, inputs.mean, inputs.std, self.device)
        self.test_y = torch.from_numpy(np.asarray(inputs.test_y, dtype=np.int64)).to(self.device)
        self.ctx.test_x, self.ctx.test_y = self.test_x, self.test_y
        # Domain-skew data (DomainNet): the papers report the mean of the per-domain test accuracies.
        has_domains = inputs.domains is not None and inputs.test_domain is not None
        self.domains = list(inputs.domains) if has_domains else []
        self.test_domain = (
            torch.from_numpy(np.asarray(inputs.test_domain, dtype=np.int64)).to(self.device) if self.domains else None
        )

        checkpoint = run_dir.read_checkpoint()
        if checkpoint is not None:
            self.state, self.completed = checkpoint["state"], checkpoint["round"]
            self.previous_wall = checkpoint["wall_time_s"]
            self.ctx.log.summary.update(checkpoint.get("log_summary", {}))
        else:
            self.state = self.algorithm.server_init(spec.initial_model(), self.ctx)
            self.completed, self.previous_wall = 0, 0.0
        self.started = time.perf_counter()
        self.clients_peak_mb = 0.0
        self.callbacks = self._output_callbacks(inputs.partition_counts, inputs.class_names)
        for callback in self.callbacks:
            callback.on_run_start(RunStart(self.completed, config.rounds))

    def _output_callbacks(self, partition_counts, class_names) -> list[Callback]:
        config = self.config
        metrics = MetricsFile(self.run_dir.metrics_file, self.completed)
        self.metrics = metrics.table  # the run's history, read by summary()
        callbacks: list[Callback] = [metrics]
        if config.output.tensorboard:

            def partition_picture():
                return partition_figure(partition_counts, class_names)

            callbacks.append(
                TensorBoardFile(
                    self.run_dir.tensorboard_dir,
                    self.completed,
                    partition_picture if partition_counts is not None else None,
                )
            )
        callbacks.append(
            CheckpointFile(
                self.run_dir,
                config.output.checkpoint_every,
                config.rounds,
                self.checkpoint_data,
                lambda: self.algorithm.global_weights(self.state),
            )
        )
        callbacks.append(SummaryFile(self.run_dir, self.summary))
        return callbacks

    # ------------------------------------------------------------------ round
    def participants(self, round_index: int) -> list[int]:
        rng = numpy_rng(self.config.seed, CLIENT_SAMPLING, round_index)
        chosen = list(self.algorithm.select_clients(self.state, round_index, rng, self.ctx))
        num = self.config.clients.num
        bad = [k for k in chosen if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < num]
        if bad or len(set(chosen)) != len(chosen):
            why = f"client ids outside 0..{num - 1}: {bad[:5]}" if bad else "a client twice"
            raise RaysimError(
                f"round {round_index}: {type(self.algorithm).__name__}.select_clients returned {why}: "
                "return distinct ids of existing clients ([] for a server-only round)"
            )
        return sorted(int(k) for k in chosen)

    def run_round(self, round_index: int) -> RoundResult:
        if round_index != self.completed + 1:
            raise ValueError(f"round {round_index} requested after round {self.completed}")
        t0 = time.perf_counter()
        config = self.config
        sampled = self.participants(round_index)
        results: dict[int, dict[str, Any]] = {}
        fetch = 0.0  # time spent moving finished replies out of the object store (the upload)
        restarts = 0
        bytes_down: dict[int, int] = {}
        t1 = t0
        if sampled:
            delivery = Delivery(
                self.algorithm.broadcast(self.state, round_index, sampled), sampled, round_index, self.store
            )
            bytes_down = delivery.bytes_down
            t1 = time.perf_counter()
            fetch, restarts = self._run_clients(round_index, sampled, delivery, results)
            del delivery
        t2 = time.perf_counter()

        peaks = [results[k]["peak_memory_mb"] for k in sampled if results[k]["peak_memory_mb"] is not None]
        self.clients_peak_mb = max([self.clients_peak_mb, *peaks])
        replies = [Reply(k, results[k]["num_samples"], results[k]["message"]) for k in sampled]
        with counting(config.eval.count_macs) as server_macs:
            self.state = self.algorithm.server_update(self.state, replies, round_index, self.ctx)
        t3 = time.perf_counter()

        values: dict[str, float] = {}
        evaluated = round_index % config.eval.every == 0 or round_index == config.rounds
        if evaluated:
            with counting(config.eval.count_macs) as eval_macs:  # a forward pass over the test split
                values.update(self.evaluate())
            if eval_macs is not None:
                values["macs_eval"] = eval_macs.total
        validation: dict[str, float] = {}
        if evaluated and self.is_candidate(round_index):
            validation, validation_restarts = self.validate()
            restarts += validation_restarts
        t4 = time.perf_counter()

        log = self.ctx.log.drain()
        values.update(log.scalars)
        values.update(
            {
                "bytes_up": sum(results[k]["bytes_up"] for k in sampled)
                + sum(u for u, _ in log.replayed.values())
                + validation.get("bytes_validation_up", 0),
                "bytes_down": sum(bytes_down.values())
                + sum(d for _, d in log.replayed.values())
                + validation.get("bytes_validation_down", 0),
                "participants": len(sampled),
                "actor_restarts": restarts,
                "time_broadcast_s": t1 - t0,
                "time_clients_s": t2 - t1,
                "time_fetch_s": fetch,
                "time_server_update_s": t3 - t2,
                "time_eval_s": t4 - t3,
            }
        )
        values.update(validation)
        if server_macs is not None:
            values["macs_server"] = server_macs.total
        client_values: list[tuple[int, str, float]] = []
        for k in sampled:
            client_values += [
                (k, "bytes_up", results[k]["bytes_up"]),
                (k, "bytes_down", bytes_down[k]),
                (k, "time_s", results[k]["seconds"]),
            ]
            if results[k].get("macs") is not None:
                client_values.append((k, "macs", results[k]["macs"]))
            client_values += [(k, name, value) for name, value in results[k]["metrics"].items()]
        for k, (up, down) in log.replayed.items():  # steps the algorithm replayed instead of running
            client_values += [(k, "bytes_up", up), (k, "bytes_down", down)]
        client_values += log.client_values
        self.completed = round_index
        values["round_time_s"] = time.perf_counter() - t0
        result = RoundResult(round_index, values, client_values, log.images, log.figures)
        for callback in self.callbacks:
            callback.on_round_end(result)
        return result.without_pictures()

    def _run_clients(
        self, round_index: int, sampled: list[int], delivery: Delivery, results: dict[int, dict[str, Any]]
    ) -> tuple[float, int]:
        """One task per actor runs its participants in turn and streams their results back in chunks
        (RESULT_CHUNK_BYTES); returns the time spent fetching them and how many client actors were
        found restarted (a result from another process than the actor's previous one). A task per
        client would pay Ray's per-task round trip (the reply put in the object store, the next
        task's arguments resolved: about 3.6 ms a client on 2 cores, measured) between clients;
        chunks pay it once per chunk and still bound the results an actor holds. A retried task
        (actor restart) replays the same chunks: every client's step is deterministic."""
        by_actor: dict[int, list[int]] = {}
        for k in sampled:
            by_actor.setdefault(self.client_actor[k], []).append(k)
        calls = [
            (self.actors[a], clients, {k: delivery.parts[k] for k in clients if delivery.parts[k]})
            for a, clients in by_actor.items()
        ]
        fetch, restarts = 0.0, 0

        def take(chunk_ref) -> None:
            nonlocal fetch, restarts
            t = time.perf_counter()
            for result in self.store.get(chunk_ref):
                results[result["client"]] = result
                actor, incarnation = self.client_actor[result["client"]], result.pop("incarnation")
                restarts += self.incarnations.setdefault(actor, incarnation) != incarnation
                self.incarnations[actor] = incarnation
            fetch += time.perf_counter() - t

        if self.config.resources.in_process:  # the clients ran when called: their chunks are ready
            for actor, clients, parts in calls:
                for chunk_ref in actor.run_clients.remote(
                    round_index, clients, delivery.shared, parts, RESULT_CHUNK_BYTES
                ):
                    take(chunk_ref)
            return fetch, restarts
        live = [
            actor.run_clients.options(num_returns="streaming").remote(
                round_index, clients, delivery.shared, parts, RESULT_CHUNK_BYTES
            )
            for actor, clients, parts in calls
        ]
        while live:  # consume chunks as they finish, whichever actor they come from
            ready, _ = self.store.wait(live, num_returns=1)
            for stream in ready:
                try:
                    take(next(stream))
                except StopIteration:
                    live.remove(stream)
        return fetch, restarts

    def is_candidate(self, round_index: int) -> bool:
        """eval.selection=federated: an evaluated round whose model federated validation scores: every
        eval.select_every-th evaluated round (in round numbers, a multiple of every * select_every)
        and the last round."""
        e = self.config.eval
        if e.selection != "federated":
            return False
        return round_index % (e.every * e.select_every) == 0 or round_index == self.config.rounds

    def validate(self) -> tuple[dict[str, float], int]:
        """Federated validation of the global weights (put once in the object store) on the validating
        clients' held-out shares, one task per actor hosting some: the pooled accuracy and mean loss,
        the bytes each way, and how many of those actors were found restarted (a task lost with its
        actor is retried by Ray: validation changes no state, so a retry gives the same counts)."""
        weights = self.algorithm.global_weights(self.state)
        ref, size = self.store.put(weights), serialized_nbytes(weights)
        by_actor: dict[int, list[int]] = {}
        for k in self.validators:
            by_actor.setdefault(self.client_actor[k], []).append(k)
        answers = self.store.get([self.actors[a].validate.remote(ref, clients) for a, clients in by_actor.items()])
        del ref
        restarts = 0
        replies = []
        for actor, answer in zip(by_actor, answers):
            incarnation = answer["incarnation"]
            restarts += self.incarnations.setdefault(actor, incarnation) != incarnation
            self.incarnations[actor] = incarnation
            replies += answer["replies"]
        replies.sort(key=lambda r: r["client"])  # sums in client order, whatever the actors
        count = sum(r["count"] for r in replies)
        values = {
            "validation_accuracy": sum(r["correct"] for r in replies) / count,
            "validation_loss": sum(r["loss_sum"] for r in replies) / count,
            "validation_clients": len(replies),
            "bytes_validation_down": size * len(replies),
            "bytes_validation_up": sum(serialized_nbytes(r) for r in replies),
        }
        return values, restarts

    def evaluate(self) -> dict[str, float]:
        model = self.ctx.model("eval")
        load_weights(model, self.algorithm.global_weights(self.state))
        batch = self.config.eval.batch_size
        if not self.domains:
            accuracy, loss = evaluate(model, self.test_x, self.test_y, batch)
            return {"accuracy": accuracy, "loss": loss}
        accuracy, loss, per_domain = evaluate_by_group(
            model, self.test_x, self.test_y, self.test_domain, len(self.domains), batch
        )
        return {
            "accuracy": accuracy,
            "loss": loss,
            **{f"domain_accuracy/{name}": a for name, a in zip(self.domains, per_domain)},
            "domain_accuracy_mean": float(np.nanmean(per_domain)),
        }

    def wall_time(self) -> float:
        return self.previous_wall + time.perf_counter() - self.started

    def checkpoint_data(self) -> dict[str, Any]:
        return {
            "round": self.completed,
            "state": self.state,
            "wall_time_s": self.wall_time(),
            "log_summary": dict(self.ctx.log.summary),
            "dataset": self.config.dataset.name,  # what it trained on, for a resume that lost data.json
        }

    # ------------------------------------------------------------------ end
    def summary(self, finished: bool) -> dict[str, Any]:
        """summary.json (raysim.outputs.summary), from the metrics history and the server's state."""
        spec = self.ctx.spec
        return run_summary(
            self.config,
            self.metrics,
            completed=self.completed,
            finished=finished,
            own_model=lambda r: self.algorithm.own_model(self.state, r),
            extras={**self.ctx.log.summary, **self.algorithm.summary_extras(self.state)},
            wall_time_s=self.wall_time(),
            peak_memory_mb={"clients": self.clients_peak_mb or None, "server": peak_memory_mb(self.device)},
            architectures=[a.describe() for a in spec.architectures] if spec.heterogeneous else None,
            domains=self.domains,
        )

    def finish(self) -> dict[str, Any]:
        summary = self.summary(finished=self.completed >= self.config.rounds)
        for callback in self.callbacks:
            callback.on_run_end(summary)
        return summary

    def completed_rounds(self) -> int:
        return self.completed
