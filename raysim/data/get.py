"""`raysim data get` and `raysim data list`: datasets into the data home, whole or not at all.

Each dataset is got in `DATA_HOME/.incoming/<name>/`: its archives are downloaded there (resumed
after a kill, raysim.data.download), checked, unpacked into `.incoming/<name>/unpacked/`, and that
folder is renamed to `DATA_HOME/<name>` with a record of what it holds (`.raysim-data.json`) once
everything is in it. A killed or failed `get` therefore leaves no dataset folder, only its
downloads, which the next `get` goes on from; an unpacking cut short is redone from the archives.
The archives are removed once the dataset is in place.

Archives are unpacked without following what they say about the world outside their folder: tar
members through Python's "data" filter (no absolute paths, links out or device files), zip members
by zipfile's own path cleaning.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import os
import shutil
import stat
import tarfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from raysim.data.catalogue import DOWNLOADABLE, Archive, Entry, entry
from raysim.data.download import ChecksumMismatch, fetch
from raysim.data.home import DATA_ENV
from raysim.errors import RaysimError

RECORD = ".raysim-data.json"
INCOMING = ".incoming"


TOTAL_TIMEOUT_S = 4 * 3600  # a whole dataset's get, however its server trickles (--timeout)


def get(
    name: str, home: Path, mirror: str | None, bar: bool = True, timeout_s: float | None = TOTAL_TIMEOUT_S
) -> tuple[Path, bool]:
    """DATA_HOME/<name>, got now (True) or there already (False); one line past `timeout_s` seconds."""
    known = entry(name)
    target = home / name
    work = home / INCOMING / name
    if os.path.lexists(target / RECORD):
        problem = record_problem(target, known)
        if problem is not None:
            raise RaysimError(
                f"{target / RECORD} does not describe the files there ({problem}): move {target} away and run "
                "the command again"
            )
        shutil.rmtree(work, ignore_errors=True)  # a get killed after the move left its archives
        _remove_if_empty(home / INCOMING)
        return target, False
    if target.exists():
        raise RaysimError(
            f"{target} exists but was not made by 'raysim data get': if it holds {name}, use it as it is "
            f"(runs read it); else move it away and run the command again"
        )
    try:
        work.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with _locked(work):
            _download_and_unpack(known, work, target, mirror, bar, deadline)
    except ChecksumMismatch:  # another file than raysim's: none of the downloads is kept
        shutil.rmtree(work, ignore_errors=True)
        _remove_if_empty(home / INCOMING)
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise RaysimError(
                f"no space left on device while getting {name} into {home}: free some space (or set {DATA_ENV} to "
                "a larger disk) and run the same command again; the downloads are kept"
            ) from None
        raise RaysimError(f"cannot get {name} into {home} ({exc.strerror or exc}): {exc.filename or ''}") from None
    shutil.rmtree(work, ignore_errors=True)
    _remove_if_empty(home / INCOMING)
    return target, True


def _download_and_unpack(
    known: Entry, work: Path, target: Path, mirror: str | None, bar: bool, deadline: float | None = None
) -> None:
    for number, archive in enumerate(known.archives, 1):
        urls = [f"{mirror}/{known.name}/{archive.file}"] if mirror else list(archive.urls)
        label = f"{known.name} {number}/{len(known.archives)} {archive.file}"
        fetch(urls, work / archive.file, archive.checksum, label, bar, deadline)
    unpacked = work / "unpacked"
    if unpacked.exists():  # an unpacking cut short: redone from the archives
        shutil.rmtree(unpacked)
    for archive in known.archives:
        _unpack(archive, work / archive.file, unpacked / archive.into)
    if known.name == "domainnet":
        _sort_domainnet(unpacked)
    record = {**_record(known), "files": _files(unpacked)}
    (unpacked / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    os.replace(unpacked, target)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


@contextmanager
def _locked(work: Path) -> Iterator[None]:
    """One `get` of a dataset at a time (two would append to the same downloads)."""

    fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RaysimError(f"another 'raysim data get' is getting {work.name}: wait for it to finish") from None
    try:
        yield
    finally:
        os.close(fd)


def _files(folder: Path) -> dict[str, int]:
    """Every plain file under `folder` (but the record), by its relative path: its size in bytes."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if relative != RECORD:
                files[relative] = os.lstat(path).st_size
    return files


def record_problem(folder: Path, known: Entry) -> str | None:
    """None if `folder`'s record is the one `get` writes for `known` and every file it lists is there,
    a plain file of that size; else what is wrong, in a few words."""
    path = folder / RECORD
    if not path.is_file() or path.is_symlink():
        return "not a plain file"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return "not valid JSON"
    if not isinstance(record, dict) or {k: record.get(k) for k in _record(known)} != _record(known):
        return f"not raysim's record of {known.name}"
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return "it lists no files"
    for relative, size in files.items():
        parts = Path(str(relative)).parts
        if not parts or Path(str(relative)).is_absolute() or ".." in parts:
            return f"it names {relative!r}, outside the folder"
        try:
            info = os.lstat(folder / relative)
        except OSError:
            return f"{relative} is missing"
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return f"{relative} is not the file it lists"
    return None


def _record(known: Entry) -> dict:
    return {"name": known.name, "source": known.source, "archives": {a.file: a.checksum for a in known.archives}}


def _unpack(archive: Archive, path: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    try:
        if archive.unpack == "copy":
            shutil.copyfile(path, into / archive.file)
        elif archive.unpack == "gunzip":
            with gzip.open(path, "rb") as src, open(into / archive.file.removesuffix(".gz"), "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        elif archive.unpack == "tar":
            with tarfile.open(path) as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(into, filter="data")
                else:  # a Python without extraction filters: the same refusals, made here
                    _check_members(tar)
                    tar.extractall(into)
        elif archive.unpack == "zip":
            with zipfile.ZipFile(path) as z:
                z.extractall(into)
        else:
            raise ValueError(f"unknown unpacking {archive.unpack!r}")
    except (tarfile.TarError, zipfile.BadZipFile, gzip.BadGzipFile, EOFError) as exc:
        raise RaysimError(
            f"{path.name} passed its checksum but cannot be unpacked ({type(exc).__name__}: {exc}): remove "
            f"{path} and run the command again"
        ) from None


def _check_members(tar: tarfile.TarFile) -> None:
    """What Python's "data" filter refuses: absolute or climbing paths, links, devices."""
    for member in tar.getmembers():
        path = Path(member.name)
        if path.is_absolute() or ".." in path.parts or not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"member {member.name!r} would be written outside its folder or is not a file")


def _sort_domainnet(folder: Path) -> None:
    """<domain>/<class>/<image> into <domain>/train/<class>/ or <domain>/test/<class>/, as the
    release's split lists say (lines '<domain>/<class>/<file> <label>'); images in neither are dropped."""
    splits = folder / "splits"
    for listing in sorted(splits.glob("*_*.txt")):
        split = listing.stem.rsplit("_", 1)[1]
        for line in listing.read_text().splitlines():
            if not line.strip():
                continue
            relative = Path(line.split()[0])
            domain, cls, file = relative.parts[-3:]
            source = folder / domain / cls / file
            if not source.is_file():
                raise RaysimError(f"domainnet: {listing.name} names {relative}, which the archive does not hold")
            (folder / domain / split / cls).mkdir(parents=True, exist_ok=True)
            os.replace(source, folder / domain / split / cls / file)
    shutil.rmtree(splits)
    for domain in [d for d in folder.iterdir() if d.is_dir()]:
        for leftover in [c for c in domain.iterdir() if c.is_dir() and c.name not in ("train", "test")]:
            shutil.rmtree(leftover)


@dataclass
class Status:
    name: str
    present: str  # "got by raysim", "placed there", "" (absent)
    disk_bytes: int
    download_bytes: int | None  # what `get` downloads, where known
    partial_bytes: int  # downloaded so far by an unfinished `get`


def status(home: Path) -> list[Status]:
    out = []
    for name in DOWNLOADABLE:
        folder = home / name
        if os.path.lexists(folder / RECORD):
            present = "got by raysim" if record_problem(folder, entry(name)) is None else "bad record"
        else:
            present = "placed there" if folder.is_dir() else ""
        out.append(
            Status(name, present, _bytes(folder) if present else 0, entry(name).size, _bytes(home / INCOMING / name))
        )
    return out


def _bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
