"""The engine: the server's round loop, the clients' runtime, the object store between them, and
their start and end (raysim.engine.start).

Ray is imported only by the engine's Ray side (ray_actors, actor_pool, ray_store, ray_session,
shard_depot), loaded through `ray_side()` by the paths that start actors, so that an in-process run
(resources.in_process) needs no Ray installed.
"""

from __future__ import annotations

from types import ModuleType


def ray_side() -> ModuleType:
    """raysim.engine.ray_actors (the actors, the Ray session, the store), imported on first use."""
    # lazy: Ray only where actors run, so that an in-process run needs no Ray installed
    from raysim.engine import ray_actors

    return ray_actors
