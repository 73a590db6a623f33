"""Starting or attaching to Ray, and checking that the cluster can host the actors asked for."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator

import ray

from raysim.config import ResourcesConfig
from raysim.errors import RaysimError


@contextmanager
def ray_session(resources: ResourcesConfig, address: str | None = None) -> Iterator[None]:
    """Attach to a cluster (address, resources.address or RAY_ADDRESS) or start a private local Ray.

    An already initialised Ray (a test session, a Tune trial's driver) is reused and left running.
    """
    if ray.is_initialized():
        yield
        return
    target = address or resources.address or os.environ.get("RAY_ADDRESS")
    if target:
        ray.init(address=target, logging_level=logging.WARNING)
    else:
        ray.init(address="local", num_cpus=resources.num_cpus or os.cpu_count(),
                 num_gpus=resources.num_gpus or 0, include_dashboard=False,
                 object_store_memory=resources.object_store_mb * 2**20, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def check_resources(resources: ResourcesConfig) -> None:
    """Fail with one line, instead of hanging, when the actors cannot all be placed."""
    total = ray.cluster_resources()
    wanted = {"CPU": resources.actors * resources.cpus_per_actor,
              "GPU": resources.actors * resources.gpus_per_actor + resources.server_gpus}
    for kind, need in wanted.items():
        have = total.get(kind, 0.0)
        if need > have + 1e-9:
            raise RaysimError(
                f"the run needs {need:g} {kind}s (resources.actors={resources.actors} x "
                f"resources.{kind.lower()}s_per_actor={getattr(resources, kind.lower() + 's_per_actor'):g}"
                + (f" + resources.server_gpus={resources.server_gpus:g}" if kind == "GPU" and resources.server_gpus else "")
                + f") but the Ray cluster has {have:g}: lower resources.actors or the per-actor share")
