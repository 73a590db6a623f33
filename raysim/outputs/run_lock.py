"""One process owns a run directory at a time.

An OS lock (`flock`) on RUN_DIR/.lock, held for as long as the run goes on: a second `raysim run`
with the same `--out`, or a `--resume` of a run that is still running, is refused instead of
overwriting the first. The kernel drops the lock when its process dies, so a SIGKILLed run can be
resumed at once. (Local file systems; on NFS, flock is only as good as the server's lock support.)

A run directory may come from someone else: `.lock` is opened without following a link (a link or
anything but a plain file of its own there is refused in one line, its target untouched), and the
directory's own links are refused before the lock is taken (RunDir.refuse_links).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raysim.errors import RaysimError
from raysim.outputs.run_dir import LOCK as LOCK_FILE
from raysim.outputs.run_dir import RunDir

_held: dict[Path, int] = {}  # run directory (resolved) -> file descriptor holding its lock


def lock_run_dir(run_dir: Path) -> bool:
    """Take `run_dir`'s lock for this process; False if this process holds it already."""
    key = Path(run_dir).resolve()
    if key in _held:
        return False
    RunDir(run_dir).refuse_links()  # before anything is created through a linked folder
    key.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(Path(run_dir) / LOCK_FILE)
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


def _open_lock(path: Path) -> int:
    """RUN_DIR/.lock, created or opened without following a link; refused in one line if it is not a
    plain file of its own (a link, a hard link to another file, a pipe), which stays untouched."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    way_out = f"remove it ('rm {path}') and run again"
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RaysimError(
                f"'{path}' is a symbolic link (to '{os.readlink(path)}'), not the lock file raysim makes: raysim "
                f"does not write through links; {way_out}"
            ) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        what = "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a plain file"
        raise RaysimError(f"'{path}' is {what}, not the lock file raysim makes: raysim does not write to it; {way_out}")
    return fd


def unlock_run_dir(run_dir: Path) -> None:
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the lock


def unlock_and_remove(run_dir: Path) -> None:
    """Release `run_dir`'s lock and remove the lock file, if it is still the one this process holds:
    for a refused resume that created it, so that the refusal leaves the directory as it was."""
    key = Path(run_dir).resolve()
    fd = _held.get(key)
    if fd is None:
        return
    path = Path(run_dir) / LOCK_FILE
    try:
        mine, there = os.fstat(fd), os.lstat(path)
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            path.unlink()
    except OSError:
        pass
    unlock_run_dir(run_dir)


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
