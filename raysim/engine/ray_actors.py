"""The engine's Ray side: the client and server actors, the depot that hands the clients their
shards, and how many actors a cluster holds and where they go. Imported only by a run that starts
actors (through raysim.engine.ray_side), so that an in-process run needs no Ray installed.

Each client actor holds a fixed shard of clients (raysim.engine.placement.assign_clients); the
server and the depot live on the driver's node.
"""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from raysim.config import Config, ResourcesConfig
from raysim.engine.client_runtime import ClientRuntime
from raysim.engine.placement import Engine, assign_clients, server_inputs
from raysim.engine.ray_session import ray_session  # noqa: F401 (the session a run on Ray opens)
from raysim.engine.ray_store import RayStore
from raysim.engine.server import ServerInputs, ServerRuntime
from raysim.engine.shard_depot import ShardDepot
from raysim.errors import RaysimError
from raysim.outputs.callbacks import RoundResult
from raysim.outputs.run_dir import RunDir


@ray.remote
class ClientActor:
    def __init__(self, config, algorithm, spec, depot_name: str, actor_index: int, *args, **kwargs):
        refs = ray.get(ray.get_actor(depot_name).shard.remote(actor_index))
        train_x, train_y, client_indices, held_out = ray.get(refs)
        self.runtime = ClientRuntime(
            config, algorithm, spec, train_x, train_y, client_indices, *args, validation_indices=held_out, **kwargs
        )

    def info(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {**self.runtime.info(), "node_id": context.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def validate(self, weights: dict[str, np.ndarray], clients: list[int]) -> dict[str, Any]:
        return self.runtime.validate(weights, clients)

    def run_clients(
        self, round_index: int, clients: list[int], payload: dict[str, Any], parts: dict, chunk_bytes: int
    ) -> Iterator[list[dict[str, Any]]]:
        yield from self.runtime.run_clients(round_index, clients, payload, parts, chunk_bytes)


@ray.remote
class ServerActor:
    def __init__(self, config: Config, inputs: ServerInputs, run_dir: RunDir, actors: list, client_actor: dict):
        self.runtime = ServerRuntime(config, inputs, run_dir, actors, client_actor)

    def completed_rounds(self) -> int:
        return self.runtime.completed_rounds()

    def run_round(self, round_index: int) -> RoundResult:
        return self.runtime.run_round(round_index)

    def finish(self) -> dict[str, Any]:
        return self.runtime.finish()


def plan_actors(resources: ResourcesConfig, num_clients: int) -> tuple[int, str | None]:
    """The number of client actors, and a line saying how it was chosen when it was not fixed."""
    if resources.actors is not None:
        return resources.actors, None
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0) - resources.server_gpus
    fits = [math.floor(cpus / resources.cpus_per_actor + 1e-9)]
    if resources.gpus_per_actor:
        fits.append(math.floor(gpus / resources.gpus_per_actor + 1e-9))
    count = min(num_clients, *fits)
    if count < 1:
        raise RaysimError(
            f"resources.actors=auto: the Ray cluster ({cpus:g} CPUs, {max(gpus, 0):g} free GPUs) "
            f"cannot hold one actor of {resources.cpus_per_actor:g} CPU and "
            f"{resources.gpus_per_actor:g} GPU: lower the per-actor share"
            + (f" or resources.server_gpus={resources.server_gpus:g}" if resources.server_gpus and gpus < 1e-9 else "")
        )
    why = f"{cpus:g} CPUs / {resources.cpus_per_actor:g} per actor"
    if resources.gpus_per_actor:
        why += f", {gpus:g} GPUs / {resources.gpus_per_actor:g} per actor"
    return count, f"resources.actors=auto: {count} client actors ({why}, {num_clients} clients)"


def check_resources(resources: ResourcesConfig, actors: int | None = None) -> None:
    """Fail with one line, instead of hanging, when the actors cannot all be placed."""
    total = ray.cluster_resources()
    actors = resources.actors if actors is None else actors
    wanted = {
        "CPU": actors * resources.cpus_per_actor,
        "GPU": actors * resources.gpus_per_actor + resources.server_gpus,
    }
    short = []
    for kind, need in wanted.items():
        have = total.get(kind, 0.0)
        if need > have + 1e-9:
            share = f"resources.{kind.lower()}s_per_actor={getattr(resources, kind.lower() + 's_per_actor'):g}"
            if kind == "GPU" and resources.server_gpus:
                share += f" + resources.server_gpus={resources.server_gpus:g}"
            short.append(f"{need:g} {kind}s (resources.actors={actors} x {share}) but the Ray cluster has {have:g}")
    if short:
        # every shortfall in the one line, so that 8 GPUs on a CPU machine is named even when CPUs are short too
        raise RaysimError("the run needs " + " and ".join(short) + ": lower resources.actors or the per-actor share")


def client_placement():
    """Inside a Tune trial, the bundles the trial reserved for its client actors; otherwise spread them."""
    group = ray.util.get_current_placement_group()
    if group is None:
        return "SPREAD"
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=-1)


def start_on_ray(config: Config, exp: Any, run_dir: RunDir) -> Engine:
    """The client actors (each holding a fixed shard of clients) and the server actor."""
    res = config.resources
    num_actors, planned = plan_actors(res, config.clients.num)
    if planned:
        print(planned, file=sys.stderr)
    check_resources(res, num_actors)
    owner = assign_clients([len(idx) for idx in exp.parts], num_actors)
    train_x, train_y = ray.put(exp.dataset.train_x), ray.put(exp.dataset.train_y)
    shards = [
        [
            train_x,
            train_y,
            ray.put({k: exp.parts[k] for k in sorted(owner) if owner[k] == a}),
            ray.put(None if exp.holdout is None else {k: exp.holdout[k] for k in sorted(owner) if owner[k] == a}),
        ]
        for a in range(num_actors)
    ]
    # The server and the depot live on the driver's node, so the run directory is written where the
    # user looks and the shards stay reachable while the driver runs.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    depot_name = f"raysim-shards-{uuid.uuid4().hex}"
    depot = ShardDepot.options(name=depot_name, scheduling_strategy=here).remote(shards)
    state_dir = str(run_dir.client_state_dir)
    placement = client_placement()
    actors = [
        ClientActor.options(
            num_cpus=res.cpus_per_actor,
            num_gpus=res.gpus_per_actor,
            max_restarts=res.max_restarts,
            max_task_retries=res.max_task_retries,
            scheduling_strategy=placement,
        ).remote(config, exp.algorithm, exp.spec, depot_name, a, exp.mean, exp.std, state_dir, res.gpus_per_actor)
        for a in range(num_actors)
    ]
    server = ServerActor.options(num_cpus=0, num_gpus=res.server_gpus, scheduling_strategy=here).remote(
        config, server_inputs(exp), run_dir, actors, owner
    )
    return Engine(server, actors, RayStore(), keep=[depot, shards], stop=lambda: _kill([server, *actors, depot]))


def _kill(handles: list) -> None:
    for handle in handles:
        ray.kill(handle, no_restart=True)


def cluster_totals() -> dict[str, float]:
    """The attached Ray cluster's resources (CPU, GPU, ...)."""
    return ray.cluster_resources()
