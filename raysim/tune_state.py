"""Tune state that only its maker restores: an HMAC of a sweep directory under a per-user key.

`raysim tune --resume DIR` hands `DIR/tune/` to `Tuner.restore`, which unpickles `tuner.pkl`, the
search state and cloudpickled fields of the experiment state: a sweep directory received from
someone else could run code. So while a sweep runs, raysim signs what restoring reads (sweep.yaml,
base.yaml and every file under tune/ except the plain result logs Tune appends to) with a key kept
outside any sweep directory, and `--resume` checks the signature before Tune or the sweep's config
is read. A directory made elsewhere, changed since, or made by another user is refused unless the
user vouches for it (`--allow-code`).

The signature is renewed whenever the state changes (every SIGN_EVERY_S seconds at most) and once
more when Tune returns, Ctrl-C included. A sweep killed outright (SIGKILL, power loss) within that
interval after Tune last saved can be left with a stale signature; the refusal then names
`--allow-code` as the way on for the sweep's own maker.

Key: $RAYSIM_KEY_FILE, default $XDG_CONFIG_HOME/raysim/sweep.key (~/.config/raysim/sweep.key),
32 random bytes created on first use, readable by its owner only. A key that is not a regular file
of this user's, readable by them alone and of a key's size, is refused in one line (a key others can
read lets them forge signatures; /etc/passwd is no key).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from pathlib import Path

from raysim.errors import RaysimError
from raysim.outputs.safe_write import write_text

SIGNATURE_FILE = "tune_state.sig"
SIGNED_CONFIGS = ("sweep.yaml", "base.yaml")
# Plain data Tune appends to during a trial and never unpickles: left out, so they need no re-signing.
UNSIGNED_NAMES = ("result.json", "progress.csv")
UNSIGNED_PREFIXES = ("events.out.tfevents",)
SIGN_EVERY_S = 2.0


def key_file() -> Path:
    if os.environ.get("RAYSIM_KEY_FILE"):
        return Path(os.environ["RAYSIM_KEY_FILE"]).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join("~", ".config")
    return Path(config_home).expanduser() / "raysim" / "sweep.key"


KEY_BYTES = 32  # what raysim writes: secrets.token_bytes(32)
KEY_SIZES = (16, 1024)  # a key of the user's own making is accepted within these sizes (bytes)


def user_key() -> bytes:
    """This user's key, created (owner-only) the first time; refused in one line unless it is a
    regular file of this user's, readable by them alone, of a key's size."""
    path = key_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL never follows a link at `path`: a planted link (dangling or not) is left to the checks below
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RaysimError(
            f"cannot create the sweep-signing key {path} ({exc.strerror}): set RAYSIM_KEY_FILE to a writable path"
        ) from None
    else:
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    """The key at `path`, opened without following a link or blocking on a pipe, and checked on the
    open file (what is read is what was checked)."""
    if os.environ.get("RAYSIM_KEY_FILE"):  # a file the user chose (maybe not theirs to change): choose another
        remake = "point RAYSIM_KEY_FILE at a key file only you can read (chmod 600), or unset it to use raysim's own"
        private = remake
    else:
        remake = f"remove it ('rm {path}') so that raysim makes a new one"
        private = f"{remake} (or 'chmod 600 {path}' if no one else has read it)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RaysimError(
                f"the sweep-signing key {path} is a symbolic link: raysim reads only a regular file of yours; {remake}"
            ) from None
        raise RaysimError(f"cannot read the sweep-signing key {path} ({exc.strerror}): {remake}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            what = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise RaysimError(f"the sweep-signing key {path} is {what}: {remake}")
        if info.st_uid != os.getuid():
            raise RaysimError(
                f"the sweep-signing key {path} belongs to another user (uid {info.st_uid}), so a signature "
                f"under it proves nothing: {remake}"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise RaysimError(
                f"the sweep-signing key {path} can be read or written by others (mode {mode:04o}), so a signature "
                f"under it proves nothing: {private}"
            )
        low, high = KEY_SIZES
        if not low <= info.st_size <= high:
            raise RaysimError(
                f"the sweep-signing key {path} is {info.st_size} bytes, not a key (raysim writes {KEY_BYTES} "
                f"random bytes; {low} to {high} are accepted): {remake}"
            )
        key = b""
        while len(key) <= high:
            chunk = os.read(fd, high + 1 - len(key))
            if not chunk:
                break
            key += chunk
    except OSError as exc:
        raise RaysimError(f"cannot read the sweep-signing key {path} ({exc.strerror}): {remake}") from None
    finally:
        os.close(fd)
    if not low <= len(key) <= high or len(set(key)) < 8:
        raise RaysimError(
            f"the sweep-signing key {path} does not look like a key ({len(key)} bytes, {len(set(key))} distinct "
            f"values; raysim writes {KEY_BYTES} random bytes): {remake}"
        )
    return key


def signed_files(sweep_dir: Path, tune_dir: str) -> list[Path]:
    files = [sweep_dir / name for name in SIGNED_CONFIGS if (sweep_dir / name).is_file()]
    for path in sorted((sweep_dir / tune_dir).rglob("*")):
        if path.is_file() and path.name not in UNSIGNED_NAMES and not path.name.startswith(UNSIGNED_PREFIXES):
            files.append(path)
    return files


def state_digest(sweep_dir: Path, tune_dir: str, key: bytes) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for path in signed_files(sweep_dir, tune_dir):
        try:
            content = path.read_bytes()
        except FileNotFoundError:  # replaced while we read (Tune writes atomically): signed next time
            continue
        name = path.relative_to(sweep_dir).as_posix().encode()
        mac.update(len(name).to_bytes(8, "big") + name + hashlib.sha256(content).digest())
    return mac.hexdigest()


def sign(sweep_dir: Path, tune_dir: str) -> None:
    digest = state_digest(sweep_dir, tune_dir, user_key())
    write_text(sweep_dir / SIGNATURE_FILE, json.dumps({"hmac_sha256": digest}) + "\n")


def verify(sweep_dir: Path, tune_dir: str) -> None:
    """One line and no unpickling when the sweep's state is not signed by this user as it is now."""
    way_on = (
        f"restore it only if you made it: 'raysim tune --resume {sweep_dir} --allow-code' "
        "(Tune's state is pickled: restoring runs what it holds)"
    )
    path = sweep_dir / SIGNATURE_FILE
    try:
        recorded = json.loads(path.read_text()).get("hmac_sha256", "")
    except (OSError, ValueError, AttributeError):
        raise RaysimError(
            f"'{sweep_dir}' has no readable {SIGNATURE_FILE} (made elsewhere, or before raysim signed "
            f"sweeps under your key {key_file()}): {way_on}"
        ) from None
    if not isinstance(recorded, str) or not hmac.compare_digest(
        recorded, state_digest(sweep_dir, tune_dir, user_key())
    ):
        raise RaysimError(
            f"the Tune state in '{sweep_dir}' does not match its signature under your key ({key_file()}): "
            f"it was made elsewhere or by someone else, changed since, or its sweep was killed while "
            f"saving: {way_on}"
        )


class KeepSigned:
    """While the block runs, re-sign whenever a signed file changes; sign once more at the end."""

    def __init__(self, sweep_dir: Path, tune_dir: str):
        self.sweep_dir, self.tune_dir = sweep_dir, tune_dir
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="raysim-sign-tune-state", daemon=True)
        self.seen: tuple | None = None

    def _stamp(self) -> tuple:
        stamps = []
        for path in signed_files(self.sweep_dir, self.tune_dir):
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            stamps.append((str(path), info.st_mtime_ns, info.st_size))
        return tuple(stamps)

    def _sign_if_changed(self) -> None:
        stamp = self._stamp()
        if stamp != self.seen:
            sign(self.sweep_dir, self.tune_dir)
            self.seen = stamp

    def _loop(self) -> None:
        while not self.stop.wait(SIGN_EVERY_S):
            try:
                self._sign_if_changed()
            except OSError:  # a folder Tune replaced while we walked it: the next pass signs it
                self.seen = None

    def __enter__(self):
        user_key()  # a key that cannot be made fails before the sweep starts
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self._sign_if_changed()
