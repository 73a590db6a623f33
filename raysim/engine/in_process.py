"""resources.in_process: the server and the clients run in the driver process, serially.

The runtimes are the ones the actors host; `InProcess` only answers like an actor handle
(`handle.method.remote(*args)` returns an object reference), so the server's round - payload in
the object store, replies fetched with ray.wait/ray.get - is the same code path as with actors.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ray
import torch


class InProcess:
    def __init__(self, runtime: Any):
        self._runtime = runtime

    def __getattr__(self, name: str) -> SimpleNamespace:
        method = getattr(self._runtime, name)

        def remote(*args: Any) -> ray.ObjectRef:
            # The torch threads the runtime's actor would have: the server and the clients share
            # this process, and the thread count must not change the numbers.
            torch.set_num_threads(self._runtime.threads)
            resolved = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args]  # as Ray does for actors
            return ray.put(method(*resolved))
        return SimpleNamespace(remote=remote)
