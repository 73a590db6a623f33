"""Atomic writes: a run killed at any moment never leaves a half-written file behind."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))
