"""One process owns a run directory at a time.

An OS lock (`flock`) on RUN_DIR/.lock, held for as long as the run goes on: a second `raysim run`
with the same `--out`, or a `--resume` of a run that is still running, is refused instead of
overwriting the first. The kernel drops the lock when its process dies, so a SIGKILLed run can be
resumed at once. (Local file systems; on NFS, flock is only as good as the server's lock support.)
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raysim.errors import RaysimError
from raysim.outputs.run_dir import LOCK as LOCK_FILE

_held: dict[Path, int] = {}  # run directory (resolved) -> file descriptor holding its lock


def lock_run_dir(run_dir: Path) -> bool:
    """Take `run_dir`'s lock for this process; False if this process holds it already."""
    key = Path(run_dir).resolve()
    if key in _held:
        return False
    key.mkdir(parents=True, exist_ok=True)
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RaysimError(
            f"'{run_dir}' is in use by another raysim process (pid {owner}): wait for it to "
            "finish (then --resume it to add rounds), or choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[key] = fd
    return True


def unlock_run_dir(run_dir: Path) -> None:
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the lock


def release_all() -> None:
    for run_dir in list(_held):
        unlock_run_dir(run_dir)


@contextmanager
def owning(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir`'s lock for the block (re-entrant: a caller that holds it keeps it afterwards)."""
    taken = lock_run_dir(run_dir)
    try:
        yield
    finally:
        if taken:
            unlock_run_dir(run_dir)
