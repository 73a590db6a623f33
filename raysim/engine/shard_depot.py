"""The depot that hands the client actors their shards (raysim.engine.ray_actors).

A module of its own that imports Ray and nothing of torch: Ray starts the depot's worker process by
importing the module its class is defined in, and this one costs that process Ray's import alone,
not torch's (seconds of CPU and some 300 MB of memory on every run that starts actors).
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class ShardDepot:
    """The references to the training set and to each client actor's client indices, held for the
    whole run. Client actors look it up by name and read their shard from it, on start and again on
    a restart. Handing them the references, or this actor's handle, as constructor arguments instead
    makes Ray warn on every run that a restart might fail (ray-project/ray#53727)."""

    def __init__(self, shards: list[list]):
        self.shards = shards  # references nested in lists: kept as references, not resolved

    def shard(self, actor_index: int) -> list:
        return self.shards[actor_index]
