"""The engine: the server's round loop, the clients' runtime, the object store between them, and
their start and end (raysim.engine.start).

Ray is imported only by the engine's Ray side (ray_actors, actor_pool, ray_store, ray_session,
shard_depot), loaded through `ray_side()` by the paths that start actors, so that an in-process run
(resources.in_process) needs no Ray installed.
"""

from __future__ import annotations

from types import ModuleType

from raysim.errors import RaysimError


def ray_side() -> ModuleType:
    """raysim.engine.ray_actors (the actors, the Ray session, the store), imported on first use."""
    # lazy: Ray only where actors run, so that an in-process run needs no Ray installed
    try:
        from raysim.engine import ray_actors
    except ModuleNotFoundError as exc:
        raise ray_missing(exc) from None
    return ray_actors


def ray_missing(exc: ModuleNotFoundError) -> Exception:
    """What to raise for `exc`: one line where the missing module is Ray (a Python without it can
    still run in process), else `exc` itself (a missing module of Ray's own is a broken install)."""
    if exc.name != "ray":
        return exc
    return RaysimError(
        "Ray is not installed in this Python: install raysim with its dependencies (pip install -e . brings "
        "ray[default,tune]); without Ray only runs with resources.in_process=true work (no actors, no sweeps)"
    )
