"""The engine's start and end: on Ray, the client actors and the server actor in a Ray session
(raysim.engine.ray_actors); with resources.in_process, one client runtime holding every client and
the server in this process, through an in-process object store, with no Ray imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from raysim.config import Config
from raysim.engine import ray_side
from raysim.engine.client_runtime import ClientRuntime
from raysim.engine.in_process import InProcess
from raysim.engine.placement import Engine, server_inputs
from raysim.engine.server import ServerRuntime
from raysim.engine.store import LocalStore
from raysim.outputs.run_dir import RunDir


@contextmanager
def running_engine(config: Config, exp: Any, run_dir: RunDir, address: str | None) -> Iterator[Engine]:
    """The run's actors and server, from the prepared experiment (raysim.runner.Experiment), stopped on
    leaving: on Ray, in a Ray session (attached to `address`'s cluster, or a private one), or, with
    resources.in_process, in this process."""
    if config.resources.in_process:
        yield _in_process(config, exp, run_dir)
        return
    ray_actors = ray_side()
    with ray_actors.ray_session(config.resources, address):
        engine = ray_actors.start_on_ray(config, exp, run_dir)
        try:
            yield engine
        except BaseException:
            engine.stop(failed=True)  # a failed run's actors are not kept for another run
            raise
        engine.stop(failed=False)


def _in_process(config: Config, exp: Any, run_dir: RunDir) -> Engine:
    """resources.in_process: one client runtime holding every client, and the server, in this process."""
    res = config.resources
    clients = ClientRuntime(
        config,
        exp.algorithm,
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
    store = LocalStore()
    actors = [InProcess(clients, store)]
    server = InProcess(ServerRuntime(config, server_inputs(exp), run_dir, actors, {k: 0 for k in clients.data}), store)
    return Engine(server, actors, store)
