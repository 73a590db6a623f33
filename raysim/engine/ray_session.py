"""Starting or attaching to Ray (how many actors it hosts, and where: raysim.engine.ray_actors)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import ray

from raysim.config import ResourcesConfig
from raysim.data.home import DATA_ENV, data_home
from raysim.engine import reaper
from raysim.engine.address import cluster_address
from raysim.errors import RaysimError, disk_full, first_line


@contextmanager
def ray_session(resources: ResourcesConfig, address: str | None = None) -> Iterator[None]:
    """Attach to a cluster (`cluster_address`) or start a private local Ray.

    An already initialised Ray (a test session, a Tune trial's driver) is reused and left running.
    """
    if ray.is_initialized():
        yield
        return
    target = cluster_address(resources, address)
    # a private Ray is watched from before its start: its processes are stopped should the driver die
    watcher = None if target else _watch_private_ray()
    try:
        if target:
            _connect(target)
        else:
            # Ray's notice that it turned token authentication on is nothing the user can act on, and
            # it would sit beside our one-line errors.
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            _start_private(resources)
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if watcher is not None:  # closing its pipe: it finds nothing left and exits
            watcher.stdin.close()
            try:
                watcher.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stuck: it must not hide what happened in the block
                watcher.kill()


def _start_private(resources: ResourcesConfig) -> None:
    """A private local Ray, or one line when it does not come up (on a machine too busy for its
    processes to start in time, Ray 2.60 raises 'The current node timed out during startup')."""
    try:
        ray.init(
            address="local",
            num_cpus=resources.num_cpus or os.cpu_count(),
            num_gpus=resources.num_gpus,  # None: the GPUs Ray detects
            include_dashboard=False,
            object_store_memory=resources.object_store_mb * 2**20,
            logging_level=logging.WARNING,
        )
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for a start-up timeout
        if ray.is_initialized():
            ray.shutdown()
        if disk_full(exc) is not None:
            raise
        raise RaysimError(
            f"Ray could not start on this machine ({type(exc).__name__}: {first_line(exc)}): if the machine is "
            "busy, run the command again later (Ray's processes must start within its timeout); else start Ray "
            "yourself ('ray start --head', which says why it fails) and pass --address"
        ) from None


def _connect(target: str) -> None:
    """Attach to the cluster at `target`, or one line saying it does not answer."""
    try:
        # Ray's own warnings while it retries (its core's, once a second; Ray Client's) would sit
        # beside the one line below: held back, and passed on only if the cluster answers
        with _stderr_held() as held, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Ray Client connection timed out", category=UserWarning)
            # the server actor runs on this node and reads transfer sets from this data home
            runtime_env = {"env_vars": {DATA_ENV: str(data_home())}}
            ray.init(address=target, logging_level=logging.WARNING, runtime_env=runtime_env)
            held.passed_on = True
    except (OSError, RuntimeError, ValueError) as exc:  # ConnectionError, TimeoutError: nothing answers there
        if ray.is_initialized():
            ray.shutdown()
        raise RaysimError(
            f"cannot connect to the Ray cluster at {target} ({type(exc).__name__}: {first_line(exc)}): check "
            "the address and that the cluster is up ('ray status' on its head node) and reachable from here, "
            "or leave out --address (and RAY_ADDRESS) to run on a private local Ray"
        ) from None


class _Held:
    passed_on = False


@contextmanager
def _stderr_held() -> Iterator[_Held]:
    """File descriptor 2 (where Ray's C++ core logs) goes to a temporary file for the block; what
    was written there is passed on to stderr afterwards if `passed_on` was set, else dropped."""

    held = _Held()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to hold (a closed or replaced one): nothing to do
        yield held
        return
    with tempfile.TemporaryFile() as buffer:
        os.dup2(buffer.fileno(), 2)
        try:
            yield held
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            if held.passed_on:
                buffer.seek(0)
                text = memoryview(buffer.read())
                while text:
                    text = text[os.write(2, text) :]


def _watch_private_ray():
    """A watcher that stops this private Ray's processes should the driver die without shutting it
    down (raysim.engine.reaper); None where it cannot start (the run goes on without it)."""

    try:
        return reaper.start({child.pid for child in psutil.Process().children(recursive=True)})
    except OSError:
        return None
