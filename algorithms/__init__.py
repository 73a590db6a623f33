"""The algorithm registry: one module per algorithm, imported only when used."""
from __future__ import annotations

import importlib
from dataclasses import asdict, fields
from typing import Any

from raysim.errors import RaysimError

# name -> "module:Class"
REGISTRY: dict[str, str] = {
    "fedavg": "algorithms.fedavg:FedAvg",
    "fedprox": "algorithms.fedprox:FedProx",
    "scaffold": "algorithms.scaffold:Scaffold",
    "fednova": "algorithms.fednova:FedNova",
    "moon": "algorithms.moon:Moon",
    "feddyn": "algorithms.feddyn:FedDyn",
    "fedbn": "algorithms.fedbn:FedBN",
    "feddisco": "algorithms.feddisco:FedDisco",
    "feddm": "algorithms.feddm:FedDM",
    "fedaf": "algorithms.fedaf:FedAF",
    "dynafed": "algorithms.dynafed:DynaFed",
}


def algorithm_class(name: str):
    if name not in REGISTRY:
        raise RaysimError(f"unknown algorithm '{name}': choose one of {', '.join(REGISTRY)} (algorithm.name)")
    module_name, class_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def resolve_params(section: dict[str, Any]) -> dict[str, Any]:
    """`algorithm:` section -> {name, every parameter with its default filled in}, validated."""
    from raysim.config import build_dataclass

    section = dict(section)
    name = section.pop("name", "fedavg")
    cls = algorithm_class(str(name))
    known = [f.name for f in fields(cls.Params)]
    for key in section:
        if key not in known:
            takes = f"its parameters are {', '.join(known)}" if known else "it takes no parameters"
            raise RaysimError(f"unknown config key 'algorithm.{key}' for algorithm '{name}': {takes} "
                              "(see 'raysim algorithms')")
    params = build_dataclass(cls.Params, section, "algorithm")
    check = getattr(params, "validate", None)
    if check is not None:
        check()
    return {"name": name, **asdict(params)}


def make_algorithm(config):
    section = dict(config.algorithm)
    cls = algorithm_class(section.pop("name"))
    from raysim.config import build_dataclass
    return cls(build_dataclass(cls.Params, section, "algorithm"), config)


def describe_algorithms() -> list[tuple[str, str]]:
    rows = []
    for name in REGISTRY:
        cls = algorithm_class(name)
        params = ", ".join(f"algorithm.{k}={v}" for k, v in asdict(cls.Params()).items())
        rows.append((name, cls.summary + (f" [{params}]" if params else "")))
    return rows
