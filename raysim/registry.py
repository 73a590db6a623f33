"""Which algorithm a config names: a built-in found by convention, or the user's own class.

Built-ins live in families (`raysim.algorithms.<family>`, discovered), each naming its algorithms
in `ALGORITHMS`: `algorithm.name: fedavg` is the `Algorithm` subclass whose `name` is "fedavg" in
the module `raysim.algorithms.<family>.fedavg`. Only the family package and the one module asked for
are imported (one-shot machinery pulls in scipy, which a FedAvg run should not pay for).
`algorithm.name: package.module:Class` loads a researcher's class from their own file; it is
validated like a built-in (unknown or ill-typed parameters fail before Ray starts).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import asdict, fields
from typing import Any

from raysim.config.parse import build_dataclass
from raysim.config.schema import AlgorithmSection
from raysim.errors import RaysimError
from raysim.plugins import load_object

# Imported by name only: the algorithms import raysim's engine, never the reverse.
BUILTIN_PACKAGE = "raysim.algorithms"


def builtin_modules() -> dict[str, str]:
    """algorithm name -> its module, over every family (a name in two families is a bug, said plainly)."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    modules: dict[str, str] = {}
    for family in pkgutil.iter_modules(package.__path__):
        if not family.ispkg or family.name.startswith("_"):
            continue
        names = importlib.import_module(f"{BUILTIN_PACKAGE}.{family.name}").ALGORITHMS
        for name in names:
            if name in modules:
                raise RaysimError(f"algorithm '{name}' is named by two families: {modules[name]} and {family.name}")
            modules[name] = f"{BUILTIN_PACKAGE}.{family.name}.{name}"
    return modules


def builtin_names() -> list[str]:
    """The built-in algorithms, in alphabetical order."""
    return sorted(builtin_modules())


def algorithm_class(name: str) -> type:
    from raysim.algorithm import Algorithm

    if ":" in name:
        cls = load_object(name, "algorithm.name", "algorithm class")
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise RaysimError(
                f"algorithm.name='{name}' is not a subclass of raysim.algorithm.Algorithm: "
                "derive your class from it (or from raysim.algorithms.fedavg.FedAvg)"
            )
        return cls
    known = builtin_modules()
    if name not in known:
        raise RaysimError(
            f"unknown algorithm '{name}': choose one of {', '.join(sorted(known))} "
            "or give your own as package.module:Class (algorithm.name)"
        )
    module = importlib.import_module(known[name])
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Algorithm) and obj.name == name
    ]
    if len(found) != 1:  # a broken convention is the developer's bug, said plainly
        raise RaysimError(
            f"module {module.__name__} must define exactly one Algorithm subclass with name = "
            f"'{name}', found {len(found)}"
        )
    return found[0]


def resolve_params(section: dict[str, Any]) -> AlgorithmSection:
    """`algorithm:` section -> its name and the algorithm's Params (every default filled in), validated."""
    section = dict(section)
    name = str(section.pop("name", "fedavg"))
    cls = algorithm_class(name)
    known = [f.name for f in fields(cls.Params)]
    for key in section:
        if key not in known:
            takes = f"its parameters are {', '.join(known)}" if known else "it takes no parameters"
            raise RaysimError(
                f"unknown config key 'algorithm.{key}' for algorithm '{name}': {takes} (see 'raysim algorithms')"
            )
    params = build_dataclass(cls.Params, section, "algorithm")
    check = getattr(params, "validate", None)
    if check is not None:
        check()
    return AlgorithmSection(name, params)


def class_and_params(config) -> tuple[type, Any]:
    """The config's algorithm class and its Params."""
    return algorithm_class(config.algorithm.name), config.algorithm.params


def make_algorithm(config):
    cls, params = class_and_params(config)
    return cls(params, config)


def check_algorithm_config(config) -> None:
    """The algorithm's checks of the whole config (Algorithm.check_config), before Ray starts."""
    cls, params = class_and_params(config)
    cls.check_config(config, params)


def describe_algorithms() -> list[tuple[str, str]]:
    rows = []
    for name in builtin_names():
        cls = algorithm_class(name)
        params = ", ".join(f"algorithm.{k}={v}" for k, v in asdict(cls.Params()).items())
        rows.append((name, cls.summary + (f" [{params}]" if params else "")))
    return rows
