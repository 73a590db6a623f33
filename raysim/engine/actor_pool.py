"""Client and server actors kept between the runs of one driver (`reusing_actors`), so that a run
does not pay their start when the run before it had the same kind: a new actor is a new process
that imports torch (and, at its optimiser's first step, torch._dynamo), some 5-7 s of CPU each.

Only inside `reusing_actors()`: `raysim reproduce` opens it around a table's runs, the tests around
their Ray session. Elsewhere (a single `raysim run`, a notebook's own Ray, a Tune trial) a run's
actors end with it, so that idle actors never hold CPUs that the user's other Ray work needs.
Within it, the actors of a run that ended normally are kept idle, their clients or server state
dropped, for the next run asking for the same kind (a role, `client` or `server`, and its CPU and
GPU share, restarts, CUDA determinism, TF32 and compiling, which a process cannot take back); those
of a run that failed are stopped, as are the idle actors of a role that a run taking actors of it
does not take, and all idle ones when a run starts actors it will not keep (they would hold the CPU
and GPU shares it needs). A
sweep stops the idle ones (`clear`) before its trials reserve the cluster.

Results do not depend on it: a kept actor builds the next run's clients or server from that run's
config, its torch settings included, as a new one does, with its compiled graphs dropped and its
peak memory reset (raysim.engine.devices.reset_peak_memory), so that the run's reported peak is its
own. A client actor reads what it holds from a
slot of the depot (raysim.engine.shard_depot), on start, on a restart and when it is given the next
run.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray

from raysim.engine.shard_depot import ShardDepot

Kind = tuple  # (role, the actor options and process-wide settings a kept actor shares with the next run)


@dataclass
class _Pool:
    node_id: str  # the Ray session's driver node: a pool outlives no Ray session
    depot: Any
    depot_name: str
    kinds: dict[str, Kind] = field(default_factory=dict)  # role -> the kind its idle actors are
    idle: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)  # role -> [(slot, actor handle)]
    next_slot: int = 0

    def all_idle(self) -> list:
        return [handle for idle in self.idle.values() for _, handle in idle]


_lock = threading.Lock()  # runs side by side (raysim reproduce --parallel) take and give back at once
_depth = 0
_pool: _Pool | None = None


@contextmanager
def reusing_actors() -> Iterator[None]:
    """Within the block, client and server actors are kept between runs (see the module); on
    leaving it, the idle ones are stopped."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            last = _depth == 0
        if last:
            clear()


def active() -> bool:
    return _depth > 0


def idle_actors(role: str = "client") -> list:
    """The handles of the actors of `role` kept idle now."""
    with _lock:
        return [] if _pool is None else [handle for _, handle in _pool.idle.get(role, [])]


def clear() -> None:
    """Stop the idle actors and the pool's depot."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None and _alive(pool):
        _kill([*pool.all_idle(), pool.depot])


def stop_idle() -> None:
    """Stop the idle actors: a run that starts its own (not kept) needs the CPUs they hold."""
    with _lock:
        pool = _pool
        stale = [] if pool is None else pool.all_idle()
        if pool is not None:
            pool.idle, pool.kinds = {}, {}
    if stale and _alive(pool):
        _kill(stale)


def take(kind: Kind, count: int, scheduling_strategy: Any) -> tuple[_Pool, list[tuple[int, Any]]]:
    """The pool (its depot) and `count` slots for a run's actors of `kind` (its first item: the
    role): (slot, kept actor) for as many kept actors of `kind` as there are, (slot, None) for the
    ones to start. Idle actors of the role that the run does not take are stopped: they would hold
    CPU or GPU shares that the run's new actors may need."""
    global _pool
    with _lock:
        if _pool is None or not _alive(_pool):
            name = f"raysim-shards-{uuid.uuid4().hex}"
            depot = ShardDepot.options(name=name, scheduling_strategy=scheduling_strategy).remote()
            _pool = _Pool(ray.get_runtime_context().get_node_id(), depot, name)
        pool, role = _pool, kind[0]
        idle = pool.idle.get(role, [])
        kept, stale = (idle[:count], idle[count:]) if pool.kinds.get(role) == kind else ([], idle)
        pool.idle[role], pool.kinds[role] = [], kind
        fresh = [(pool.next_slot + i, None) for i in range(count - len(kept))]
        pool.next_slot += len(fresh)
    _kill([handle for _, handle in stale])
    return pool, kept + fresh


def give_back(pool: _Pool, kind: Kind, slots: list[tuple[int, Any]], reusable: bool) -> None:
    """A run's actors of `kind`, taken from `pool`, when the run ends: kept idle, what they held
    dropped, if the run ended normally and the pool is still the one in use and keeps `kind`; else
    stopped. Their slots are emptied either way. The depot's release and the actors' unload are
    sent before the actors are idle again, so that another run taking them (runs side by side)
    sends its assign and load after them (Ray keeps the order of one process's calls to an actor)."""
    with _lock:
        alive = _alive(pool)
        keep = reusable and pool is _pool and alive and pool.kinds.get(kind[0]) == kind
        if alive:
            for slot, handle in slots:
                pool.depot.release.remote(slot)
                if keep:
                    handle.unload.remote()
        if keep:
            pool.idle.setdefault(kind[0], []).extend(slots)
    if not keep:  # a run that failed before starting them all gives back slots without actors
        _kill([handle for _, handle in slots if handle is not None])


def _alive(pool: _Pool) -> bool:
    """Whether the pool belongs to the Ray session this process is connected to now."""
    return ray.is_initialized() and ray.get_runtime_context().get_node_id() == pool.node_id


def _kill(handles: list) -> None:
    for handle in handles:
        ray.kill(handle, no_restart=True)
