"""Writes into run, table and sweep folders: atomic, and never through a planted link.

A run killed at any moment never leaves a half-written file behind: each file is written under a
fresh name beside it and renamed onto its own. That fresh name is unpredictable and created
exclusively (O_CREAT | O_EXCL | O_NOFOLLOW), so nothing planted in a folder someone sent can be
under it, and the rename replaces whatever sits at the final name - a symbolic link included -
instead of writing through it. Folders raysim writes into must be real folders: a symbolic link
there is refused in one line, since every file written into it would land elsewhere.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raysim.errors import RaysimError


def refuse_link(path: Path) -> None:
    """One line if `path` is a symbolic link (raysim writes neither through one nor into one)."""
    path = Path(path)
    if path.is_symlink():
        raise RaysimError(
            f"'{path}' is a symbolic link (to '{os.readlink(path)}'): raysim writes neither through links nor "
            "into linked folders, so that a folder from elsewhere cannot send its files outside it; remove the "
            "link (or pass the real folder it points to, if you trust it)"
        )


def real_folder(folder: Path, below: Path | None = None) -> Path:
    """`folder`, created where missing; refused in one line if it - or, given `below`, any folder
    between `below` and it - is a symbolic link."""
    folder = Path(folder)
    levels = [folder]
    if below is not None:
        levels = [p for p in reversed(folder.parents) if Path(below) in p.parents] + levels
    for level in levels:
        refuse_link(level)
        level.mkdir(parents=True, exist_ok=True)
        refuse_link(level)  # (mkdir leaves an existing link be)
    return folder


def fresh_file(folder: Path, name: str) -> Path:
    """A new, empty file in `folder` under an unpredictable name made from `name`, created
    exclusively: it is no file that was there before, nor a link someone planted."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = Path(folder) / f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(path, flags, 0o666)  # (the umask applies, as to any file raysim writes)
        except FileExistsError:
            continue
        os.close(fd)
        return path


def atomic_write(path: Path, write: Callable[[Path], None], previous: Path | None = None) -> None:
    """`write(tmp)` fills a fresh file beside `path`, which then replaces `path` in one rename (a link
    at `path` is replaced, not followed). With `previous`, an existing `path` first becomes `previous`."""
    path = Path(path)
    tmp = fresh_file(real_folder(path.parent), path.name)
    try:
        write(tmp)
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename == str(tmp):
            exc.filename = str(path)  # (a full disk names the file the user knows)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))
