"""Where a run's clients live: which client on which client actor (largest first onto the least
loaded actor), what the server is given, and the handles of a started engine (raysim.engine.start;
the actors themselves, how many a cluster holds and where they go: raysim.engine.ray_actors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raysim.engine.server import ServerInputs


@dataclass
class Engine:
    """The run's server and client actors (handles, or InProcess stand-ins), the object store their
    calls answer through, what keeps the shared arrays alive for the run, and how to stop them
    (`stop(failed)`: a failed run's actors are never kept for the next run)."""

    server: Any
    actors: list
    store: Any
    keep: list = field(default_factory=list)
    stop: Callable[[bool], None] = lambda failed: None


def assign_clients(sizes: list[int], actors: int) -> dict[int, int]:
    """client -> actor, largest clients first onto the least loaded actor (deterministic)."""
    load = [0] * actors
    owner: dict[int, int] = {}
    for client in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        actor = min(range(actors), key=lambda a: (load[a], a))
        owner[client] = actor
        load[actor] += sizes[client]
    return owner


def server_inputs(exp: Any) -> ServerInputs:
    """The part of the experiment the server needs (the training data stays with the clients)."""
    data = exp.dataset
    return ServerInputs(
        exp.algorithm,
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
