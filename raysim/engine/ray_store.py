"""Ray's object store, behind the interface of raysim.engine.store."""

from __future__ import annotations

from typing import Any

import ray


class RayStore:
    def put(self, value: Any) -> ray.ObjectRef:
        return ray.put(value)

    def get(self, refs: ray.ObjectRef | list[ray.ObjectRef]) -> Any:
        return ray.get(refs)

    def is_ref(self, value: Any) -> bool:
        return isinstance(value, ray.ObjectRef)

    def wait(self, refs: list, num_returns: int = 1) -> tuple[list, list]:
        return ray.wait(refs, num_returns=num_returns)
