"""Stops the private local Ray of a driver that died without shutting it down.

When `raysim run` or `raysim tune` is killed outright (SIGKILL, the OOM killer), Ray's GCS, raylet
and workers notice and exit, but its dashboard and runtime-env agents linger for about a minute
(Ray 2.60). `ray_session` therefore starts this watcher before it starts a private Ray, so that no
moment of Ray's start is uncovered: it is told the driver's pid and the driver's processes of
before, and until the driver closes the stdin pipe (when it has shut Ray down, or died) it notes,
at `POLL_S` intervals, the driver's new descendants that are Ray's. Then it adds the processes that hold
open a file of the driver's Ray session (`/tmp/ray/session_<time>_<driver pid>/`: every Ray process
does, agents included, as they inherit the raylet's log files), which finds those started since the
last poll, and stops whichever of them still run (each checked by its start time, so a reused pid
is never touched). It imports nothing of raysim or Ray, so it costs one small process.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time

import psutil

STOP_GRACE_S = 2.0  # SIGTERM first; SIGKILL for what is left after this


POLL_S = (0.1, 5.0)  # the first poll's wait, growing by half each time to the last: Ray's start is watched closely
# a Ray process's name or command line: ray::<worker or agent>, raylet, gcs_server, .../ray/<module>
RAY_PROCESS = re.compile(r"(?<![A-Za-z])ray(?:::|let|/)|gcs_server")


def start(driver_children: set[int]) -> subprocess.Popen:
    """Watch the Ray processes the calling driver starts from now on (`driver_children`: its
    descendants of before, never watched) until the returned pipe is closed or the driver dies."""
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
    watcher.stdin.write((json.dumps({"driver": os.getpid(), "before": sorted(driver_children)}) + "\n").encode())
    watcher.stdin.flush()
    return watcher


def new_ray_descendants(driver: int, before: set[int], seen: dict[int, float]) -> None:
    """Add to `seen` (pid -> start time) the driver's descendants not in `before` that are Ray's."""

    try:
        children = psutil.Process(driver).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for child in children:
        if child.pid in before or child.pid in seen or child.pid == os.getpid():
            continue
        try:
            if RAY_PROCESS.search(" ".join([child.name(), *child.cmdline()])):
                seen[child.pid] = child.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def session_processes(driver: int, since: float, seen: dict[int, float]) -> None:
    """Add to `seen` this user's Ray processes started since `since` that hold a file of the driver's
    Ray session open (its folder is named after the driver's pid)."""

    session = re.compile(rf"/session_[0-9_-]+_{driver}/")
    for process in psutil.process_iter(["pid", "create_time"]):
        pid, created = process.info["pid"], process.info["create_time"]
        if pid in seen or pid == os.getpid() or created is None or created < since:
            continue
        try:  # a Ray process (not, say, a `tail -f` of its log)
            ray = RAY_PROCESS.search(" ".join([process.name(), *process.cmdline()]))
            if ray and any(session.search(f.path) for f in process.open_files()):
                seen[pid] = created
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def stop_leftovers(processes: dict[int, float]) -> None:

    alive = []
    for pid, created in processes.items():
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
    since = time.time() - 1.0  # create times are rounded: a process started with this watcher counts
    told = json.loads(sys.stdin.readline() or "{}")
    driver, before = told.get("driver", -1), set(told.get("before", []))
    seen: dict[int, float] = {}
    wait, longest = POLL_S
    while True:  # until the driver closes the pipe (Ray shut down) or dies
        ready, _, _ = select.select([sys.stdin], [], [], wait)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
        new_ray_descendants(driver, before, seen)
        wait = min(wait * 1.5, longest)
    time.sleep(0.2)  # a driver shutting Ray down normally has already stopped them: nothing to do
    session_processes(driver, since, seen)
    stop_leftovers(seen)


if __name__ == "__main__":
    main()
