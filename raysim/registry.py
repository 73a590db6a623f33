"""Which algorithm a config names: a built-in found by convention, or the user's own class.

Built-ins live in families (`raysim.algorithms.<family>`, discovered). An algorithm is named once,
in its class: `algorithm.name: fedavg` is the `Algorithm` subclass whose body sets `name = "fedavg"`,
in the module `raysim.algorithms.<family>.fedavg` (tests/test_layout.py holds module and name equal).
The names are read from the families' sources (`family_algorithms`), not by importing them: only the
one module asked for is imported (one-shot machinery pulls in scipy, which a FedAvg run should not
pay for). A family's `ALGORITHMS` is the same list, derived here.
`algorithm.name: package.module:Class` loads a researcher's class from their own file; it is
validated like a built-in (unknown or ill-typed parameters fail before Ray starts).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Iterable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from raysim.algorithm import Algorithm
from raysim.config.parse import build_dataclass
from raysim.config.schema import DEFAULT_ALGORITHM, AlgorithmSection
from raysim.errors import RaysimError
from raysim.plugins import load_object
from raysim.vectorized import refusal

# Imported by name only: the algorithms import raysim's engine, never the reverse.
BUILTIN_PACKAGE = "raysim.algorithms"


# A top-level class's header line, and `name = "..."` (a plain string) in its body.
_CLASS_LINE = re.compile(r"^class [A-Za-z_]\w*\b")
_NAME_LINE = re.compile(r'^    name(?: *: *ClassVar\[str\])? *= *"([A-Za-z0-9_]+)"\s*(#.*)?$')


def family_algorithms(folders: Iterable[str]) -> dict[str, str]:
    """algorithm name -> module name (within the family), for each module in the family's folders whose
    top-level class sets `name = "..."` in its body: read from the source, nothing imported."""
    found: dict[str, str] = {}
    for module in pkgutil.iter_modules(list(folders)):
        if module.ispkg:
            continue
        in_class = False
        for line in (Path(module.module_finder.path) / f"{module.name}.py").read_text().splitlines():
            if line[:1] not in ("", " ", "\t", ")"):  # a top-level statement: a class, or the class is over
                in_class = bool(_CLASS_LINE.match(line))
            elif in_class and (match := _NAME_LINE.match(line)):
                found[match.group(1)] = module.name
    return found


def builtin_modules() -> dict[str, str]:
    """algorithm name -> its module, over every family (a name in two families is a bug, said plainly)."""
    return dict(_builtin_modules())


@functools.cache  # the sources are read once a process
def _builtin_modules() -> dict[str, str]:
    package = importlib.import_module(BUILTIN_PACKAGE)
    modules: dict[str, str] = {}
    for family in pkgutil.iter_modules(package.__path__):
        if not family.ispkg or family.name.startswith("_"):
            continue
        folders = [str(Path(folder) / family.name) for folder in package.__path__]
        for name, module in family_algorithms(folders).items():
            if name in modules:
                raise RaysimError(f"algorithm '{name}' is named by two families: {modules[name]} and {family.name}")
            modules[name] = f"{BUILTIN_PACKAGE}.{family.name}.{module}"
    return modules


def builtin_names() -> list[str]:
    """The built-in algorithms, in alphabetical order."""
    return sorted(builtin_modules())


def algorithm_class(name: str) -> type:

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
    name = str(section.pop("name", DEFAULT_ALGORITHM))
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
    """The algorithm's checks of the whole config (Algorithm.check_config) and whether its clients can
    train vectorised (resources.vectorize_clients), before Ray starts."""
    cls, params = class_and_params(config)
    cls.check_config(config, params)
    if config.resources.vectorize_clients:
        reason = refusal(config.algorithm.name, cls)
        if reason is not None:
            raise RaysimError(reason)


def describe_algorithms() -> list[tuple[str, str]]:
    rows = []
    for name in builtin_names():
        cls = algorithm_class(name)
        params = ", ".join(f"algorithm.{k}={v}" for k, v in asdict(cls.Params()).items())
        rows.append((name, cls.summary + (f" [{params}]" if params else "")))
    return rows
