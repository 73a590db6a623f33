"""Stops the private local Ray of a driver that died without shutting it down.

When `raysim run` or `raysim tune` is killed outright (SIGKILL, the OOM killer), Ray's GCS, raylet
and workers notice and exit, but its dashboard and runtime-env agents linger for about a minute
(Ray 2.60). `ray_session` therefore starts this watcher beside a private Ray: it reads the Ray
processes (pid and start time) from its stdin, then waits for the stdin pipe to close, which
happens when the driver shuts Ray down or dies. It then stops whichever of those processes are
still running. It imports nothing of raysim or Ray, so it costs one small process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

STOP_GRACE_S = 2.0  # SIGTERM first; SIGKILL for what is left after this


def ray_processes_started_since(before: set[int]) -> list[int]:
    """This process's descendants that were not in `before` and are Ray's (by name or command line):
    the caller's other children are never watched."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in before and "ray" in " ".join([child.name(), *child.cmdline()]):
                found.append(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def start(pids: list[int]) -> subprocess.Popen:
    """Watch `pids` (the private Ray's processes) until the returned pipe is closed or the caller dies."""
    import psutil

    processes = []
    for pid in pids:
        try:
            processes.append([pid, psutil.Process(pid).create_time()])
        except psutil.NoSuchProcess:
            continue
    watcher = subprocess.Popen(
        # -I and cwd=/: nothing from the working directory (perhaps a received run directory) or
        # PYTHON* variables is on the watcher's import path; it needs only the standard library and psutil
        [sys.executable, "-I", __file__],
        cwd=os.sep,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C in the terminal is for the driver, not for the watcher
    )
    watcher.stdin.write((json.dumps(processes) + "\n").encode())
    watcher.stdin.flush()
    return watcher


def stop_leftovers(processes: list[list]) -> None:
    import psutil

    alive = []
    for pid, created in processes:
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - created) < 1e-3 and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    for process in alive:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(alive, timeout=STOP_GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def main() -> None:
    processes = json.loads(sys.stdin.readline() or "[]")
    while sys.stdin.buffer.read(4096):  # blocks until the driver closes the pipe or dies
        pass
    time.sleep(0.2)  # a driver shutting Ray down normally has already stopped them: nothing to do
    stop_leftovers(processes)


if __name__ == "__main__":
    main()
