"""The engine's Ray side: the client and server actors, the depot that hands the clients their
shards, and how many actors a cluster holds and where they go. Imported only by a run that starts
actors (through raysim.engine.ray_side), so that an in-process run needs no Ray installed.

Each client actor holds a fixed shard of clients (raysim.engine.placement.assign_clients), read
from its slot of the depot; the server and the depot live on the driver's node. Within
`reusing_actors()` (raysim.engine.actor_pool) client and server actors are kept for the driver's
next run.
"""

from __future__ import annotations

import gc
import math
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from raysim.config import Config, ResourcesConfig
from raysim.engine import actor_pool
from raysim.engine.actor_pool import reusing_actors  # noqa: F401 (what raysim reproduce opens)
from raysim.engine.client_runtime import ClientRuntime
from raysim.engine.devices import reset_peak_memory
from raysim.engine.placement import Engine, assign_clients, server_inputs
from raysim.engine.ray_session import ray_session  # noqa: F401 (the session a run on Ray opens)
from raysim.engine.ray_store import RayStore
from raysim.engine.server import ServerInputs, ServerRuntime
from raysim.engine.shard_depot import ShardDepot
from raysim.errors import RaysimError
from raysim.outputs.callbacks import RoundResult
from raysim.outputs.run_dir import RunDir


class _Kept:
    """An actor the pool can give another run (raysim.engine.actor_pool): `unload` drops what the
    last run's runtime held."""

    runtime: Any = None

    def unload(self) -> None:
        if self.runtime is not None:
            device, compiled = self.runtime.device, self.runtime.config.resources.compile
            self.runtime = None
            _free(device, compiled)


@ray.remote
class ClientActor(_Kept):
    """The clients of slot `slot` of the depot named `depot_name`: built on start, on a restart, and
    at `load` when a kept actor is given the next run's clients (raysim.engine.actor_pool)."""

    def __init__(self, depot_name: str, slot: int):
        self.depot_name, self.slot = depot_name, slot
        self.runtime: ClientRuntime | None = None
        self.load()

    def load(self) -> None:
        self.unload()  # the previous run's clients freed before the next ones are built
        refs = ray.get(ray.get_actor(self.depot_name).shard.remote(self.slot))
        if refs is None:  # a kept actor restarted while idle: it is given its next run by `load`
            return
        (config, algorithm, spec, mean, std, state_dir, gpus), train_x, train_y, client_indices, held_out = ray.get(
            refs
        )
        self.runtime = ClientRuntime(
            config,
            algorithm,
            spec,
            train_x,
            train_y,
            client_indices,
            mean,
            std,
            state_dir,
            gpus,
            validation_indices=held_out,
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


def _free(device: torch.device, compiled: bool) -> None:
    """What a kept actor's last run held, freed before it is given the next: its tensors, its
    compiled graphs (which count toward Dynamo's recompile limit, raysim.compiled) and its peak
    memory, so that the next run's reported peak is its own."""
    gc.collect()
    if compiled:
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    reset_peak_memory(device)


@ray.remote
class ServerActor(_Kept):
    """The run's server, built on start or, for a kept actor, at `load` (raysim.engine.actor_pool)."""

    def __init__(self, *run):
        self.runtime: ServerRuntime | None = None
        if run:
            self.load(*run)

    def load(self, config: Config, inputs: ServerInputs, run_dir: RunDir, actors: list, client_actor: dict) -> None:
        self.unload()
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
    arguments = ray.put(
        (config, exp.algorithm, exp.spec, exp.mean, exp.std, str(run_dir.client_state_dir), res.gpus_per_actor)
    )
    shards = [
        [
            arguments,
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
    placement = client_placement()
    # what a kept actor shares with the next run: its actor options and the process-wide settings
    # that a process cannot take back (CUDA determinism, TF32, compiled graphs)
    settings = (res.deterministic, res.tf32, res.compile)
    kind = ("client", res.cpus_per_actor, res.gpus_per_actor, res.max_restarts, res.max_task_retries, *settings)
    server_kind = ("server", res.server_gpus, *settings)
    # a Tune trial's actors live in its bundles
    pooled = res.reuse_actors and actor_pool.active() and placement == "SPREAD"
    if pooled:
        pool, slots = actor_pool.take(kind, num_actors, here)
        ((server_slot, server),) = actor_pool.take(server_kind, 1, here)[1]
        depot, depot_name = pool.depot, pool.depot_name
    else:
        actor_pool.stop_idle()
        depot_name = f"raysim-shards-{uuid.uuid4().hex}"
        depot = ShardDepot.options(name=depot_name, scheduling_strategy=here).remote()
        slots, server = [(a, None) for a in range(num_actors)], None
    started: list = []  # the actors this run started, stopped should it fail before its engine exists

    def stop(failed: bool) -> None:
        if pooled:
            actor_pool.give_back(pool, kind, slots, reusable=not failed)
            actor_pool.give_back(pool, server_kind, [(server_slot, server)], reusable=not failed)
        else:
            _kill([*started, depot])

    try:
        ray.get([depot.assign.remote(slot, shard) for (slot, _), shard in zip(slots, shards)])
        options = {
            "num_cpus": res.cpus_per_actor,
            "num_gpus": res.gpus_per_actor,
            "max_restarts": res.max_restarts,
            "max_task_retries": res.max_task_retries,
            "scheduling_strategy": placement,
        }
        kept = [handle for _, handle in slots if handle is not None]
        slots = [(slot, handle or ClientActor.options(**options).remote(depot_name, slot)) for slot, handle in slots]
        actors = [handle for _, handle in slots]
        started.extend(actors)
        loading = [handle.load.remote() for handle in kept]
        run = (config, server_inputs(exp), run_dir, actors, owner)
        server_options = {"num_cpus": 0, "num_gpus": res.server_gpus, "scheduling_strategy": here}
        if pooled:  # a kept server, or a new one to keep, is given the run by `load`
            server = server or ServerActor.options(**server_options).remote()
            loading.append(server.load.remote(*run))
        else:
            server = ServerActor.options(**server_options).remote(*run)
        started.append(server)
        _load(loading)
    except BaseException:
        stop(failed=True)
        raise
    return Engine(server, actors, RayStore(), keep=[shards], stop=stop)


def _load(loading: list) -> None:
    """Kept actors build the run's clients and server before its first round; an error there is the
    run's error as it would be from a new actor's start (one line for raysim's own)."""
    try:
        ray.get(loading)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, RaysimError):
            raise exc.cause from None
        raise


def _kill(handles: list) -> None:
    for handle in handles:
        ray.kill(handle, no_restart=True)


def cluster_totals() -> dict[str, float]:
    """The attached Ray cluster's resources (CPU, GPU, ...)."""
    return ray.cluster_resources()
