"""resources.in_process: the server and the clients run in the driver process, serially, without Ray.

The runtimes are the ones the actors host; `InProcess` only answers like an actor handle
(`handle.method.remote(*args)` returns a reference in the in-process store), so the server's round -
payload in the store, replies fetched from it - is the same code path as with actors.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import torch

from raysim.engine.store import LocalRef, LocalStore


class InProcess:
    def __init__(self, runtime: Any, store: LocalStore):
        self._runtime, self._store = runtime, store

    def __getattr__(self, name: str) -> SimpleNamespace:
        method = getattr(self._runtime, name)

        def remote(*args: Any) -> LocalRef | list[LocalRef]:
            # The torch threads the runtime's actor would have: the server and the clients share
            # this process, and the thread count changes the numbers of multi-threaded kernels. The
            # server calls the clients in the middle of its round, so the caller's count is restored
            # afterwards (else a server that trains, as DynaFed's does, would go on with one thread).
            caller_threads = torch.get_num_threads()
            torch.set_num_threads(self._runtime.threads)
            try:
                # references among the arguments are resolved, as Ray does for actors
                resolved = [self._store.get(a) if isinstance(a, LocalRef) else a for a in args]
                out = method(*resolved)
                if inspect.isgenerator(out):  # a streaming method: one reference per item, all ready
                    return [self._store.put(item) for item in out]
                return self._store.put(out)
            finally:
                torch.set_num_threads(caller_threads)

        return SimpleNamespace(remote=remote)
