"""User code named in a config: `package.module:name` (an algorithm class, a model factory)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Collection
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raysim.errors import RaysimError

_refusal: str | None = None  # set while a config whose code the user has not vouched for is read
_vouched: frozenset[str] = frozenset()  # within such a block, the names the user's own config gives


@contextmanager
def user_code_refused(why: str, vouched: Collection[str] = ()):
    """Within the block, a config naming user code is refused with `why` instead of imported, but
    for the `package.module:name` paths in `vouched` (those the user's own config names).

    Used for `raysim run --resume` and for the runs `raysim reproduce` finds in its folder: a run
    directory may come from someone else, and importing `algorithm.name: helpers:Plain` would run
    that module's code (the working directory, often the run directory itself, is on the import path).
    """
    global _refusal, _vouched
    before = _refusal, _vouched
    _refusal, _vouched = why, frozenset(vouched)
    try:
        yield
    finally:
        _refusal, _vouched = before


def load_object(path: str, key: str, what: str) -> Any:
    """Import `package.module:name` and return `name`; one-line RaysimError naming `key` otherwise.

    The module is found on sys.path, which includes the working directory, so a researcher's
    `my_algo.py` beside their config works as `my_algo:MyAlgorithm`.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise RaysimError(f"{key}='{path}' is not of the form package.module:name: write e.g. my_algo:MyAlgorithm")
    if _refusal is not None and path not in _vouched:
        raise RaysimError(f"{key}='{path}' is user code, {_refusal}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise RaysimError(
                f"{key}='{path}': no module '{module_name}' on the Python path (working directory "
                f"{Path.cwd()}): run from the folder that holds it or add it to PYTHONPATH"
            ) from None
        raise  # the user's module itself failed to import something: their traceback is the useful one
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise RaysimError(
            f"{key}='{path}': module '{module_name}' ({getattr(module, '__file__', '?')}) "
            f"has no {what} named '{attribute}'"
        ) from None
