"""The server actor: owns the global state, runs one round at a time, evaluates, logs, checkpoints.

One round (paper-agnostic):
  payload = algorithm.broadcast(state)     -> one ray.put, read by every sampled client
  replies = client actors' client_update   -> consumed as they finish (ray.wait)
  state   = algorithm.server_update(state, replies sorted by client id)
  evaluate the global weights on the test split; write metrics, TensorBoard, checkpoint.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from algorithms import make_algorithm
from raysim.algorithm import Context, ModelSpec, Reply
from raysim.config import Config
from raysim.engine.client_actor import to_model_input
from raysim.engine.devices import configure_torch, pick_device
from raysim.outputs.files import save_torch, write_json
from raysim.outputs.metrics import MetricsTable
from raysim.outputs.tensorboard import TensorBoardLogger
from raysim.seeding import MODEL_INIT, derive_seed, sample_clients
from raysim.tensors import load_weights, serialized_nbytes
from raysim.training import evaluate, evaluate_by_group

CHECKPOINT = "checkpoints/last.pt"
LAST_EVALUATIONS = 5  # summary.json's last5_accuracy


class ServerRuntime:
    def __init__(self, config: Config, spec: ModelSpec, test_x: np.ndarray, test_y: np.ndarray,
                 mean: np.ndarray, std: np.ndarray, run_dir: str, actors: list, client_actor: dict[int, int],
                 partition_counts: np.ndarray | None = None, class_names: list[str] | None = None,
                 test_domain: np.ndarray | None = None, domains: list[str] | None = None):
        self.config = config
        self.run_dir = Path(run_dir)
        self.device = pick_device(config.resources.server_gpus)
        # Fixed by the config and the node, never by the number of actors (see resources.server_threads).
        threads = config.resources.server_threads or len(os.sched_getaffinity(0))
        self.threads = configure_torch(threads, self.device, config.resources.deterministic)
        self.ctx = Context(config, spec, self.device, mean, std)
        self.algorithm = make_algorithm(config)
        self.actors = actors
        self.client_actor = client_actor
        self.test_x = to_model_input(test_x, mean, std, self.device)
        self.test_y = torch.from_numpy(np.asarray(test_y, dtype=np.int64)).to(self.device)
        self.ctx.test_x, self.ctx.test_y = self.test_x, self.test_y
        # Domain-skew data (DomainNet): the papers report the mean of the per-domain test accuracies.
        self.domains = list(domains) if domains is not None and test_domain is not None else []
        self.test_domain = (torch.from_numpy(np.asarray(test_domain, dtype=np.int64)).to(self.device)
                            if self.domains else None)

        checkpoint_path = self.run_dir / CHECKPOINT
        if checkpoint_path.exists():
            checkpoint = torch.load(checkpoint_path, weights_only=False)
            self.state, self.completed = checkpoint["state"], checkpoint["round"]
            self.previous_wall = checkpoint["wall_time_s"]
        else:
            torch.manual_seed(derive_seed(config.seed, MODEL_INIT))
            model = spec.build("cpu")
            self.state, self.completed, self.previous_wall = self.algorithm.server_init(model, self.ctx), 0, 0.0
        self.started = time.perf_counter()
        self.metrics = MetricsTable(self.run_dir / "metrics.parquet", resume_through_round=self.completed)
        self.tensorboard = None
        if config.output.tensorboard:
            self.tensorboard = TensorBoardLogger(self.run_dir / "tensorboard", purge_step=self.completed + 1)
            if self.completed == 0 and partition_counts is not None:
                from raysim.plots import partition_figure
                self.tensorboard.figure("partition", partition_figure(partition_counts, class_names))

    # ------------------------------------------------------------------ round
    def run_round(self, round_index: int) -> dict[str, Any]:
        if round_index != self.completed + 1:
            raise ValueError(f"round {round_index} requested after round {self.completed}")
        t0 = time.perf_counter()
        config = self.config
        sampled = sample_clients(config.seed, round_index, config.clients.num, config.clients_per_round())

        payload = self.algorithm.broadcast(self.state, round_index)
        payload_ref = ray.put(payload)
        bytes_down = serialized_nbytes(payload) * len(sampled)
        t1 = time.perf_counter()

        pending = {self.actors[self.client_actor[k]].run_client.remote(payload_ref, round_index, k): k
                   for k in sampled}
        results: dict[int, dict[str, Any]] = {}
        fetch = 0.0  # time spent moving finished replies out of the object store (the upload)
        while pending:  # consume results as they finish
            done, _ = ray.wait(list(pending), num_returns=1)
            t = time.perf_counter()
            results[pending.pop(done[0])] = ray.get(done[0])
            fetch += time.perf_counter() - t
        del payload_ref
        t2 = time.perf_counter()

        replies = [Reply(k, results[k]["num_samples"], results[k]["message"]) for k in sampled]
        self.state = self.algorithm.server_update(self.state, replies, round_index, self.ctx)
        t3 = time.perf_counter()

        values: dict[str, float] = {}
        if round_index % config.eval.every == 0 or round_index == config.rounds:
            model = self.ctx.model("eval")
            load_weights(model, self.algorithm.global_weights(self.state))
            if self.domains:
                values["accuracy"], values["loss"], per_domain = evaluate_by_group(
                    model, self.test_x, self.test_y, self.test_domain, len(self.domains), config.eval.batch_size)
                values.update({f"domain_accuracy/{name}": a for name, a in zip(self.domains, per_domain)})
                values["domain_accuracy_mean"] = float(np.nanmean(per_domain))
            else:
                values["accuracy"], values["loss"] = evaluate(model, self.test_x, self.test_y, config.eval.batch_size)
        t4 = time.perf_counter()

        bytes_up = sum(results[k]["bytes_up"] for k in sampled)
        values.update({"bytes_up": bytes_up, "bytes_down": bytes_down, "participants": len(sampled),
                       "time_broadcast_s": t1 - t0, "time_clients_s": t2 - t1, "time_fetch_s": fetch,
                       "time_server_update_s": t3 - t2, "time_eval_s": t4 - t3})
        for k in sampled:
            self.metrics.add(round_index, k, "bytes_up", results[k]["bytes_up"])
            self.metrics.add(round_index, k, "time_s", results[k]["seconds"])
            for name, value in results[k]["metrics"].items():
                self.metrics.add(round_index, k, name, value)
        self.completed = round_index
        values["round_time_s"] = time.perf_counter() - t0
        self._log_round(round_index, values)
        if round_index % config.output.checkpoint_every == 0 or round_index == config.rounds:
            self.checkpoint()
        return {"round": round_index, **values}

    def _log_round(self, round_index: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.metrics.add(round_index, None, name, value)
        self.metrics.flush()
        if self.tensorboard:
            for tag, (images, per_row) in self.algorithm.images(self.state, self.ctx).items():
                self.tensorboard.image_grid(tag, images, round_index, nrow=per_row)
            self.tensorboard.scalars(round_index, {
                ("test/" if name in ("accuracy", "loss") or name.startswith("domain_accuracy") else "comm/" if name.startswith("bytes")
                 else "time/" if name.startswith("time") else "round/") + name: value
                for name, value in values.items()})
            self.tensorboard.flush()
        write_json(self.run_dir / "summary.json", self.summary(finished=False))

    def wall_time(self) -> float:
        return self.previous_wall + time.perf_counter() - self.started

    def checkpoint(self) -> None:
        save_torch(self.run_dir / CHECKPOINT,
                   {"round": self.completed, "state": self.state, "wall_time_s": self.wall_time()})

    # ------------------------------------------------------------------ end
    def summary(self, finished: bool) -> dict[str, Any]:
        accuracy = self.metrics.server_values("accuracy")
        loss = self.metrics.server_values("loss")
        best_round, best = max(accuracy, key=lambda rv: (rv[1], -rv[0])) if accuracy else (None, None)
        return {
            "algorithm": self.config.algorithm["name"], "dataset": self.config.dataset.name,
            "seed": self.config.seed, "rounds": self.completed, "rounds_planned": self.config.rounds,
            "finished": finished,
            "final_accuracy": accuracy[-1][1] if accuracy else None,
            "final_loss": loss[-1][1] if loss else None,
            "best_accuracy": best, "best_round": best_round,
            # DynaFed's reported metric: the mean test accuracy of the last LAST_EVALUATIONS evaluations
            "last5_accuracy": float(np.mean([v for _, v in accuracy[-LAST_EVALUATIONS:]])) if accuracy else None,
            "bytes_up": sum(v for _, v in self.metrics.server_values("bytes_up")),
            "bytes_down": sum(v for _, v in self.metrics.server_values("bytes_down")),
            "wall_time_s": self.wall_time(),
            **self.domain_summary(),
            **self.algorithm.summary_extras(self.state),
        }

    def domain_summary(self) -> dict[str, Any]:
        """Domain-skew runs: the last evaluation's per-domain accuracies and their mean (the papers' figure)."""
        if not self.domains:
            return {}

        def last(metric: str) -> float | None:
            values = self.metrics.server_values(metric)
            return values[-1][1] if values else None
        return {"final_domain_accuracy_mean": last("domain_accuracy_mean"),
                "final_domain_accuracy": {name: last(f"domain_accuracy/{name}") for name in self.domains}}

    def finish(self) -> dict[str, Any]:
        summary = self.summary(finished=self.completed >= self.config.rounds)
        write_json(self.run_dir / "summary.json", summary)
        save_torch(self.run_dir / "checkpoints/final_model.pt", self.algorithm.global_weights(self.state))
        if self.tensorboard:
            self.tensorboard.close()
        return summary

    def completed_rounds(self) -> int:
        return self.completed


@ray.remote
class ServerActor:
    def __init__(self, *args, **kwargs):
        self.runtime = ServerRuntime(*args, **kwargs)

    def completed_rounds(self) -> int:
        return self.runtime.completed_rounds()

    def run_round(self, round_index: int) -> dict[str, Any]:
        return self.runtime.run_round(round_index)

    def finish(self) -> dict[str, Any]:
        return self.runtime.finish()
