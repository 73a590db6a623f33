"""Which Ray cluster a run goes to, checked before anything starts (Ray-free: the check of --address
runs before Ray is imported)."""

from __future__ import annotations

import os
import re

from raysim.config import ResourcesConfig
from raysim.errors import RaysimError


def cluster_address(resources: ResourcesConfig, address: str | None = None) -> str | None:
    """The Ray cluster a session attaches to: `address` (--address), else the config's
    resources.address, else RAY_ADDRESS; None: a private local Ray.

    The config's is the user's own only in a config they give: a resumed run's stored
    resources.address is dropped before it gets here (raysim.resume.resume_config), so that a run
    directory from someone else never chooses where its run executes."""
    for value, source in ((address, "--address"), (resources.address, "resources.address")):
        if value:
            return check_address(value, source)
    return check_address(os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS")


_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?"
# HOST:PORT (a cluster's GCS, e.g. 10.0.0.5:6379) or ray://HOST:PORT (Ray Client); HOST a name, an
# IPv4 address or a bracketed IPv6 one
_ADDRESS = re.compile(rf"(?:ray://)?(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9A-Fa-f:.]+\]):(\d{{1,5}})")


def check_address(address: str | None, source: str = "--address") -> str | None:
    """`address` if it has the form of a Ray address ('auto', 'local', HOST:PORT or ray://HOST:PORT),
    else one line naming where it came from (--address, resources.address, RAY_ADDRESS) - before
    anything starts, not a traceback from ray.init."""
    if address is None or address in ("auto", "local"):
        return address
    match = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise RaysimError(
            f"{source} {address!r} is not a Ray cluster address: give HOST:PORT (the head node's, e.g. "
            "10.0.0.5:6379), ray://HOST:PORT (Ray Client, e.g. ray://10.0.0.5:10001), 'auto' (the cluster "
            "this machine belongs to) or 'local'"
        )
    return address
