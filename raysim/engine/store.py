"""The object store a round's payloads, parts and replies pass through: Ray's, where the clients run
in actors, or, with resources.in_process, one in this process, so that an in-process run needs no Ray
installed (a single-GPU box, a notebook, a machine without Ray).

Both take a value with `put` and give it back with `get`. The in-process store keeps each value
serialised, as Ray's does: what a reader gets is its own copy, so a client that changes a payload
in place cannot change what the server or the next client reads, and the numbers are those of a
run on Ray.
"""

from __future__ import annotations

import pickle
from typing import Any

from raysim.engine import ray_side


class LocalRef:
    """A value put in the in-process store (the counterpart of a ray.ObjectRef)."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes):
        self.blob = blob


class LocalStore:
    """resources.in_process: values kept serialised in this process."""

    def put(self, value: Any) -> LocalRef:
        return LocalRef(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def get(self, refs: LocalRef | list[LocalRef]) -> Any:
        if isinstance(refs, list):
            return [pickle.loads(ref.blob) for ref in refs]
        return pickle.loads(refs.blob)

    def is_ref(self, value: Any) -> bool:
        return isinstance(value, LocalRef)


def object_store(in_process: bool):
    """The run's store: LocalStore in process, else Ray's (raysim.engine.ray_store.RayStore)."""
    return LocalStore() if in_process else ray_side().RayStore()
