"""Where a run's clients live: how many client actors (resources.actors, or `auto` from the cluster's
size), which client on which actor, the actors' and the server's creation, and their end.

Each client actor holds a fixed shard of clients (largest first onto the least loaded actor); the
server and the depot that hands out the shards live on the driver's node. With
resources.in_process, one client runtime holds every client and the server runs in this process.
"""

from __future__ import annotations

import math
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray

from raysim.config import Config, ResourcesConfig
from raysim.engine.server import ServerInputs
from raysim.errors import RaysimError
from raysim.outputs.run_dir import RunDir


@dataclass
class Engine:
    """The run's server and client actors (handles, or InProcess stand-ins), and what keeps the shared
    arrays, and the depot that hands them out, alive for the run."""

    server: Any
    actors: list
    keep: list = field(default_factory=list)
    in_process: bool = False

    def stop(self) -> None:
        if not self.in_process:
            for handle in [self.server, *self.actors, self.keep[0]]:
                ray.kill(handle, no_restart=True)


def start_engine(config: Config, exp: Any, run_dir: RunDir) -> Engine:
    """The run's actors and server, from the prepared experiment (raysim.runner.Experiment), in an
    open Ray session."""
    if config.resources.in_process:
        return _in_process(config, exp, run_dir)
    return _on_ray(config, exp, run_dir)


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


def assign_clients(sizes: list[int], actors: int) -> dict[int, int]:
    """client -> actor, largest clients first onto the least loaded actor (deterministic)."""
    load = [0] * actors
    owner: dict[int, int] = {}
    for client in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        actor = min(range(actors), key=lambda a: (load[a], a))
        owner[client] = actor
        load[actor] += sizes[client]
    return owner


def client_placement():
    """Inside a Tune trial, the bundles the trial reserved for its client actors; otherwise spread them."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.get_current_placement_group()
    if group is None:
        return "SPREAD"
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=-1)


def server_inputs(exp: Any) -> ServerInputs:
    """The part of the experiment the server needs (the training data stays with the clients)."""
    data = exp.dataset
    return ServerInputs(
        exp.spec,
        data.test_x,
        data.test_y,
        exp.mean,
        exp.std,
        partition_counts=exp.counts,
        class_names=data.classes,
        test_domain=data.test_domain,
        domains=data.domains,
        data_digest=exp.data_digest,
    )


def _on_ray(config: Config, exp: Any, run_dir: RunDir) -> Engine:
    """The client actors (each holding a fixed shard of clients) and the server actor."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raysim.engine.client_actor import ClientActor, ShardDepot
    from raysim.engine.server import ServerActor

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
        ).remote(config, exp.spec, depot_name, a, exp.mean, exp.std, state_dir, res.gpus_per_actor)
        for a in range(num_actors)
    ]
    server = ServerActor.options(num_cpus=0, num_gpus=res.server_gpus, scheduling_strategy=here).remote(
        config, server_inputs(exp), run_dir, actors, owner
    )
    return Engine(server, actors, [depot, shards])


def _in_process(config: Config, exp: Any, run_dir: RunDir) -> Engine:
    """resources.in_process: one client runtime holding every client, and the server, in this process."""
    from raysim.engine.client_actor import ClientRuntime
    from raysim.engine.in_process import InProcess
    from raysim.engine.server import ServerRuntime

    res = config.resources
    clients = ClientRuntime(
        config,
        exp.spec,
        exp.dataset.train_x,
        exp.dataset.train_y,
        dict(enumerate(exp.parts)),
        exp.mean,
        exp.std,
        str(run_dir.client_state_dir),
        res.gpus_per_actor,
        validation_indices=None if exp.holdout is None else dict(enumerate(exp.holdout)),
    )
    actors = [InProcess(clients)]
    server = InProcess(ServerRuntime(config, server_inputs(exp), run_dir, actors, {k: 0 for k in clients.data}))
    return Engine(server, actors, [], in_process=True)
