"""One file over HTTP(S): resumed where a killed or failed download stopped, with a progress bar,
and checked against its checksum before it is used.

The bytes go to `<file>.part`; a second try asks the server for the rest (an HTTP Range request)
and starts again from nothing where the server does not resume. Only a file whose checksum matches
is renamed to its own name; one that does not is removed, and the error names it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from raysim.errors import RaysimError

CHUNK = 1 << 20
TIMEOUT_S = 60
MIRROR_ENV = "RAYSIM_DATA_MIRROR"


class ChecksumMismatch(RaysimError):
    """A downloaded file is not the one its checksum names."""


def mirror_base(option: str | None) -> str | None:
    """--mirror, else RAYSIM_DATA_MIRROR; None: the official locations."""
    base = option or os.environ.get(MIRROR_ENV) or None
    if base is not None and not base.startswith(("http://", "https://", "file://")):
        raise RaysimError(f"mirror {base!r} is not a URL: give http://HOST/PATH or https://HOST/PATH (or file:///DIR)")
    return base.rstrip("/") if base else None


def file_checksum(path: Path, kind: str) -> str:
    h = hashlib.new(kind, usedforsecurity=False) if kind == "md5" else hashlib.new(kind)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


class DeadlineReached(RaysimError):
    """The whole `get` took longer than its total timeout (a server trickling bytes never times out)."""


def fetch(
    urls: list[str], dest: Path, checksum: str, label: str, bar: bool = True, deadline: float | None = None
) -> None:
    """`dest`, downloaded from the first of `urls` that answers and checked against `checksum`
    ("md5:..." or "sha256:..."); one line naming the file if no URL gives a file that matches.
    `deadline` (time.monotonic()): past it, one line (the download so far is kept for the next get)."""
    kind, expected = checksum.split(":", 1)
    if dest.is_file() and file_checksum(dest, kind) == expected:
        return
    part = dest.with_name(dest.name + ".part")
    failures, mismatch = [], None
    for url in urls:
        try:
            _download(url, part, label, bar, deadline)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise RaysimError(
                    f"no space left on device while downloading {dest.name} to {dest.parent}: free some space and "
                    "run the same command again (the download goes on from where it stopped)"
                ) from None
            failures.append(f"{url}: {_reason(exc)}")
            continue
        got = file_checksum(part, kind)
        if got == expected:
            os.replace(part, dest)
            return
        part.unlink()  # another file than raysim's: the next location, if any, is tried
        mismatch = f"{dest.name} from {url} does not match its {kind} checksum ({got}, expected {expected})"
    if mismatch is not None:
        raise ChecksumMismatch(
            f"{mismatch}: nothing was kept; run the command again, and if it recurs, the server (or mirror) "
            "serves another file"
        )
    raise RaysimError(
        f"cannot download {dest.name} ({'; '.join(failures)}): check the network, or serve the archives from a "
        f"mirror (--mirror URL or {MIRROR_ENV}, files at URL/<dataset>/<file>)"
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"


def _download(url: str, part: Path, label: str, bar: bool, deadline: float | None = None) -> None:
    """Append the rest of `url` to `part` (or write it whole where the server does not resume)."""

    def check_deadline() -> float:
        """Seconds left before the deadline (TIMEOUT_S without one); DeadlineReached past it."""
        if deadline is None:
            return TIMEOUT_S
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineReached(
                f"downloading {part.name.removesuffix('.part')} from {url} passed the total timeout: what came is "
                "kept; run the same command again to go on (or give a longer --timeout)"
            )
        return left

    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(
        url, headers={"User-Agent": "raysim", **({"Range": f"bytes={have}-"} if have else {})}
    )
    try:
        response = urllib.request.urlopen(request, timeout=min(TIMEOUT_S, check_deadline()))  # noqa: S310 - http(s) or file URLs only
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing after `have`: the file is whole (its checksum decides)
            return
        raise
    with response:
        resumed = have and getattr(response, "status", 200) == 206
        if not resumed:
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        with (
            open(part, "ab" if resumed else "wb") as out,
            tqdm(
                total=total, initial=have, unit="B", unit_scale=True, desc=label, disable=not bar, leave=False
            ) as progress,
        ):
            while block := response.read1(CHUNK):  # what has arrived: the .part grows as it comes
                out.write(block)
                progress.update(len(block))
                check_deadline()
        if total is not None and part.stat().st_size < total:
            raise ValueError(f"the connection closed after {part.stat().st_size} of {total} bytes")
