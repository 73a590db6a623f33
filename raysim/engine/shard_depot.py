"""The depot that hands the client actors their shards (raysim.engine.ray_actors).

A module of its own that imports Ray and nothing of torch: Ray starts the depot's worker process by
importing the module its class is defined in, and this one costs that process Ray's import alone,
not torch's (seconds of CPU and some 300 MB of memory on every run that starts actors).
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class ShardDepot:
    """What each client actor slot holds in the current run: the references to its constructor's
    arguments, the training set and its clients' indices. A client actor looks the depot up by name
    and reads its slot from it on start, on a restart, and when a kept actor is given the next run's
    clients (raysim.engine.actor_pool). Handing actors the references, or this actor's handle, as
    constructor arguments instead makes Ray warn on every run that a restart might fail
    (ray-project/ray#53727), and a kept actor's restart would rebuild its first run."""

    def __init__(self, shards: dict[int, list] | None = None):
        self.shards = dict(shards or {})  # references nested in lists: kept as references, not resolved

    def assign(self, slot: int, shard: list) -> None:
        self.shards[slot] = shard

    def release(self, slot: int) -> None:
        self.shards.pop(slot, None)

    def shard(self, slot: int) -> list:
        return self.shards.get(slot)  # None: the slot was emptied (its actor kept idle)
