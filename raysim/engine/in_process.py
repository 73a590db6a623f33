"""resources.in_process: the server and the clients run in the driver process, serially.

The runtimes are the ones the actors host; `InProcess` only answers like an actor handle
(`handle.method.remote(*args)` returns an object reference), so the server's round - payload in
the object store, replies fetched with ray.wait/ray.get - is the same code path as with actors.
"""

from __future__ import annotations

import inspect
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
            # this process, and the thread count changes the numbers of multi-threaded kernels. The
            # server calls the clients in the middle of its round, so the caller's count is restored
            # afterwards (else a server that trains, as DynaFed's does, would go on with one thread).
            caller_threads = torch.get_num_threads()
            torch.set_num_threads(self._runtime.threads)
            try:
                resolved = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args]  # as Ray does for actors
                out = method(*resolved)
                if inspect.isgenerator(out):  # a streaming method: one reference per item, all ready
                    return [ray.put(item) for item in out]
                return ray.put(out)
            finally:
                torch.set_num_threads(caller_threads)

        return SimpleNamespace(remote=remote)
