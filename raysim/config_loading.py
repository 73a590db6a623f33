"""Reading an experiment config: YAML (or a tree) and key=value overrides -> a validated Config
with the algorithm's parameters resolved through the registry.

Kept apart from raysim.config (the schema, parsing and value checks) so that the schema needs no
algorithm: raysim.algorithm imports the schema, the registry imports raysim.algorithm, and this
module imports both; nothing imports back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raysim.config import (
    Config,
    build_dataclass,
    client_architectures,
    parse_override,
    read_yaml,
    set_path,
    validate,
)
from raysim.errors import RaysimError
from raysim.registry import check_algorithm_config, resolve_params


def load_config(
    path: str | Path | None = None, overrides: list[str] = (), base: dict[str, Any] | None = None
) -> Config:
    """Read a YAML file (or start from `base`), apply overrides, validate everything."""
    tree = dict(base or {}) if path is None else read_yaml(path)
    for text in overrides:
        key_path, value = parse_override(text)
        set_path(tree, key_path, value)
    return config_from_dict(tree)


def config_from_dict(tree: dict[str, Any]) -> Config:
    tree = dict(tree)
    algorithm = tree.pop("algorithm", None) or {}
    if not isinstance(algorithm, dict):
        raise RaysimError("config key 'algorithm' must be a section with at least 'name' (e.g. algorithm.name=fedavg)")
    resources = tree.get("resources")
    if isinstance(resources, dict) and resources.get("actors") == "auto":
        tree["resources"] = {**resources, "actors": None}
    config = build_dataclass(Config, tree, "")
    config.algorithm = resolve_params(algorithm)
    validate(config)
    check_algorithm_config(config)
    client_architectures(config)  # a malformed clients.models fails here, before Ray starts
    return config
