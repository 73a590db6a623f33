"""The setup layer above the config package: a config file or tree and key=value overrides -> a
validated Config, the algorithm's parameters (its Params) resolved through the registry.

raysim.config is the bottom layer (schema, parsing, files) and imports nothing of raysim above it;
this module imports it, raysim.algorithm and the registry, and nothing of raysim imports back but
the layers above (tables, sweeps, runs, commands). A table's cell named by the user
(TABLE:CELL:METHOD[:SCALE]) is read by raysim.reproduce, which builds on this module.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raysim.config.files import FROM_KEY, PER_METHOD, method_keys, read_one_yaml, read_yaml, resolve
from raysim.config.parse import build_dataclass, parse_override, set_path
from raysim.config.schema import DEFAULT_ALGORITHM, Config, client_architectures, validate
from raysim.errors import RaysimError
from raysim.registry import algorithm_class, check_algorithm_config, resolve_params


def load_config(
    path: str | Path | None = None, overrides: list[str] = (), base: dict[str, Any] | None = None
) -> Config:
    """Read a YAML file (or start from `base`), apply overrides, validate everything."""
    tree = dict(base or {}) if path is None else read_yaml(path)
    tree = apply_overrides(tree, [parse_override(text) for text in overrides])
    return config_from_dict(tree)


def apply_overrides(tree: dict[str, Any], items: Iterable[tuple[list[str] | str, Any]]) -> dict[str, Any]:
    """`tree` with one batch of overrides (key path or dotted key, value) laid over it: the command
    line's, a table cell's, a table method's, a sweep's fixed ones or a trial's.

    A batch that switches `algorithm.name` runs another method on a section written for the first:
    its shared keys carry over (a generator's width, a batch, the steps a cell scales down), but a
    key that is one of the new method's own parameters (Algorithm.own_params: its distillation
    optimiser, learning rate, temperature, augmentation ...) is refused unless this batch sets it
    too or the config's `per_method:` section sets it for that method: one method's value must not
    silently replace another's authors' default."""
    tree = method_sources(copy.deepcopy(tree))
    items = [(key.split(".") if isinstance(key, str) else list(key), value) for key, value in items]
    section = tree.get("algorithm")
    written = dict(section) if isinstance(section, dict) else {}
    for key_path, value in items:
        set_path(tree, key_path, copy.deepcopy(value))
    section = tree.get("algorithm")
    name = section.get("name") if isinstance(section, dict) else None
    explicit = {p[1] for p, _ in items if p[0] == "algorithm" and len(p) == 2}
    per_method = tree.get(PER_METHOD)
    if explicit and isinstance(per_method, dict) and isinstance(per_method.get(name), dict):
        # a key this batch sets for the method that runs beats the config's per_method value of it
        per_method[name] = {k: v for k, v in per_method[name].items() if k not in explicit}
    if "name" in written and isinstance(name, str) and name != written["name"]:
        per_method = tree.get(PER_METHOD) or {}
        meant = per_method.get(name) if isinstance(per_method, dict) else None
        meant = set(meant) if isinstance(meant, dict) else set()
        carried = sorted((set(written) & algorithm_class(name).own_params()) - explicit - meant)
        if carried:
            shown = ", ".join(f"algorithm.{k}={written[k]!r}" for k in carried)
            raise RaysimError(
                f"algorithm.name={name} runs on a section written for {written['name']} that sets {name}'s own "
                f"parameter(s) {shown}: remove them from the shared section, or say they are meant for "
                f"{name} ({PER_METHOD}: {{{name}: {{{carried[0]}: ...}}}} in the config, or "
                f"algorithm.{carried[0]}=... beside algorithm.name={name})"
            )
    return tree


def method_sources(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` with each `per_method:` entry's `from:` settled: the keys the named config's own file
    writes for the method (raysim.config.files.method_keys) under the entry's other keys - taken
    already where the entry was read from a file, here where it comes as a name in a tree - and
    checked: a key that is the method's own parameter (Algorithm.own_params) is not taken from a
    shared section written for another method, as `algorithm.name=` refuses it when it switches."""
    section = tree.get(PER_METHOD)
    if not isinstance(section, dict) or not any(isinstance(e, dict) and FROM_KEY in e for e in section.values()):
        return tree
    entries = {}
    for method, entry in section.items():
        if isinstance(entry, dict) and FROM_KEY in entry:
            entry = dict(entry)
            named = entry.pop(FROM_KEY)
            if isinstance(named, dict) and isinstance(named.get("file"), str):
                source = Path(named["file"])  # taken where the file was read
            elif isinstance(named, str) and named:
                source = resolve(named)
                entry = {**method_keys(source, str(method)), **entry}
            else:
                raise RaysimError(
                    f"'{PER_METHOD}.{method}.{FROM_KEY}' must name a config file (e.g. {FROM_KEY}: "
                    f"feddm/base_cpu), got {named!r}"
                )
            _check_taken(source, str(method))
        entries[method] = entry
    return {**tree, PER_METHOD: entries}


def _check_taken(source: Path, method: str) -> None:
    section = read_yaml(source).get("algorithm")
    if isinstance(section, dict) and section.get("name") == method:
        return
    own = read_one_yaml(source)
    shared = own.get("algorithm") or {}
    written = set((own.get(PER_METHOD) or {}).get(method) or {})
    theirs = sorted((set(shared) & algorithm_class(method).own_params()) - written)
    if theirs:
        raise RaysimError(
            f"'{FROM_KEY}: {source}' for {method}: that file's algorithm section, written for another method, sets "
            f"{method}'s own parameter(s) {', '.join(theirs)}: name a file written for {method}, or set them in "
            f"this config's {PER_METHOD} entry for {method} instead of '{FROM_KEY}:'"
        )


def config_from_dict(tree: dict[str, Any]) -> Config:
    tree = dict(tree)
    algorithm = tree.pop("algorithm", None) or {}
    if not isinstance(algorithm, dict):
        raise RaysimError("config key 'algorithm' must be a section with at least 'name' (e.g. algorithm.name=fedavg)")
    tree = method_sources(tree)
    algorithm = {**algorithm, **_per_method(tree.pop(PER_METHOD, None), str(algorithm.get("name", DEFAULT_ALGORITHM)))}
    resources = tree.get("resources")
    if isinstance(resources, dict) and resources.get("actors") == "auto":
        tree["resources"] = {**resources, "actors": None}
    config = dataclasses.replace(build_dataclass(Config, tree, ""), algorithm=resolve_params(algorithm))
    validate(config)
    check_algorithm_config(config)
    client_architectures(config)  # a malformed clients.models fails here, before Ray starts
    return config


def _per_method(section: Any, name: str) -> dict[str, Any]:
    """The `per_method:` keys of the method that runs; every entry is checked against its method."""
    if section is None:
        return {}
    if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
        raise RaysimError(
            f"config key '{PER_METHOD}' must map an algorithm's name to its keys, "
            f"e.g. {PER_METHOD}: {{feddf: {{kd_lr: 0.001}}}}"
        )
    for method, keys in section.items():
        resolve_params({**keys, "name": str(method)})
    return dict(section.get(name) or {})
