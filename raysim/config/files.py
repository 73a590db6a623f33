"""Config files: YAML with `extends:` chains, and the configs shipped inside the package
(raysim/configs/), found by name from any folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from raysim.errors import RaysimError

# The configs shipped in the package: `raysim run quickstart` reads raysim/configs/quickstart.yaml, and
# `raysim run fedhydra/mnist_2cc_cpu` raysim/configs/fedhydra/mnist_2cc_cpu.yaml; a file path that exists
# always wins over a shipped name.
ROOT = Path(__file__).resolve().parents[1] / "configs"

EXTENDS_KEY = "extends"
# Top-level section of a config file: algorithm keys for one method alone, applied when that method runs
# (`per_method: {feddf: {kd_lr: 0.01}}`); the resolved config holds their effect, not the section.
PER_METHOD = "per_method"
# In a `per_method:` entry: take that method's keys from another config (`per_method: {feddm: {from:
# feddm/base_cpu}}`), so that a config combining several families states each one's setting once
FROM_KEY = "from"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's tree, with its `extends:` chain merged in.

    `extends: base.yaml` names another config (a path relative to this file's folder, or a shipped
    config's name such as `fedaf/cifar10_cpu`); this file's keys are laid over that tree section by
    section (`merge_trees`), except that an `algorithm:` naming another algorithm replaces the base's
    algorithm section whole (its parameters belong to the other algorithm). This is how the shipped
    configs of a family share their base, and how a user's file changes a shipped cell.
    """
    return _read_extending(Path(path), ())


def merge_trees(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid over `base`: sections merge key by key, any other value (lists too) replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_trees(merged[key], value)
        else:
            merged[key] = value
    return merged


MAX_EXTENDS = 64  # files in one `extends:` chain (the shipped configs use a few)


def _read_extending(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """`path`'s tree over its `extends:` chain, read file by file (no recursion: a chain of any
    length is one line, never a RecursionError) and merged from the last base up."""
    trees: list[tuple[Path, dict[str, Any]]] = []
    seen = set(chain)
    while True:
        if len(trees) >= MAX_EXTENDS:
            raise RaysimError(
                f"config file '{trees[0][0]}' extends a chain of more than {MAX_EXTENDS} files (at '{path}'): "
                "shorten its 'extends:' chain (merge some of the files into one)"
            )
        data = _with_method_sources(path, read_one_yaml(path))
        seen.add(path.resolve())
        trees.append((path, data))
        if EXTENDS_KEY not in data:
            break
        base_path = _extended_file(path, data.pop(EXTENDS_KEY))
        if base_path.resolve() in seen:
            loop = " -> ".join(str(p.resolve()) for p, _ in trees) + f" -> {base_path.resolve()}"
            raise RaysimError(f"config file '{path}' extends itself through {loop}: break the loop of 'extends:'")
        path = base_path
    merged = trees[-1][1]
    for _, data in reversed(trees[:-1]):
        if _algorithm_name(data) not in (None, _algorithm_name(merged)):
            merged.pop("algorithm", None)  # another algorithm: the base's algorithm parameters do not apply
        merged = merge_trees(merged, data)
    return merged


def _algorithm_name(tree: dict[str, Any]) -> Any:
    section = tree.get("algorithm")
    return section.get("name") if isinstance(section, dict) else None


def _with_method_sources(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each `per_method:` entry's `from: NAME` replaced by the keys config NAME's own file
    writes for that method (`method_keys`), under the entry's other keys. Taken here, file by file,
    so that they sit where the naming file's keys sit in an `extends:` chain (a base's entry for the
    method does not override them); `from:` stays as `{file: PATH}` for raysim.experiment, which
    checks the method's own parameters (the registry is not this module's to import)."""
    section = data.get(PER_METHOD)
    if not isinstance(section, dict) or not any(isinstance(e, dict) and FROM_KEY in e for e in section.values()):
        return data
    entries = {}
    for method, entry in section.items():
        if isinstance(entry, dict) and isinstance(entry.get(FROM_KEY), str):
            source = _named_file(path, entry[FROM_KEY], f"{PER_METHOD}.{method}.{FROM_KEY}").resolve()
            entry = {**method_keys(source, str(method)), **entry, FROM_KEY: {"file": str(source)}}
        entries[method] = entry
    return {**data, PER_METHOD: entries}


def method_keys(source: Path, method: str) -> dict[str, Any]:
    """The algorithm keys config file `source` itself writes for `method`: its `algorithm:` section
    (but `name`), then its `per_method:` entry for the method. Its own file, not its `extends:` chain:
    a family's scaled config (e.g. feddm/base_cpu) writes its scaling over its paper-scale base, and
    that scaling is what another config takes from it; the base's choices stay the base's."""
    own = read_one_yaml(source)
    shared = own.get("algorithm") or {}
    entry = (own.get(PER_METHOD) or {}).get(method) or {}
    if not isinstance(shared, dict) or not isinstance(entry, dict) or FROM_KEY in entry:
        raise RaysimError(
            f"config file '{source}', named by a '{FROM_KEY}:' for {method}, must hold an algorithm section and "
            f"{PER_METHOD} entries of keys, none of them with a '{FROM_KEY}:' of its own: take the keys from the "
            "file that writes them"
        )
    return {**{k: v for k, v in shared.items() if k != "name"}, **entry}


def _extended_file(path: Path, target: Any) -> Path:
    """The file an `extends:` value names: relative to the extending file, else a shipped config."""
    return _named_file(path, target, EXTENDS_KEY)


def _named_file(path: Path, target: Any, key: str) -> Path:
    """The file a config's `key` names: relative to the naming file, else a shipped config."""
    if not isinstance(target, str) or not target:
        raise RaysimError(
            f"config file '{path}': '{key}' must name a config file (e.g. {key}: base.yaml), got {target!r}"
        )
    beside = path.parent / target
    if beside.is_file():
        return beside
    name = target.removesuffix(".yaml")
    shipped = (ROOT / f"{name}.yaml").resolve()
    if shipped.is_relative_to(ROOT) and shipped.is_file():
        return shipped
    raise RaysimError(
        f"config file '{path}': '{key}: {target}' is neither a file beside it nor a shipped "
        f"config: fix the '{key}:' line (list shipped configs with 'raysim configs')"
    )


# libyaml's safe loader where PyYAML was built with it: the same documents, read about ten times faster
# (a table's cells are many files: `raysim data list` and `reproduce --list` read them all)
class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int):
        super().__init__(f"key '{key}' appears twice in one mapping (again at line {line})")
        self.key, self.line = key, line


# libyaml's parser where installed (the same trees as PyYAML's own, several times faster)
FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(FAST_SAFE_LOADER):
    """yaml's safe loader, refusing a key given twice in one mapping (yaml would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: yaml refuses it itself
                break
            if duplicate:
                raise DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


SAFE_LOADER = _Loader


# Parsed trees by file text: listing the tables builds every run's config (about a thousand), each
# reading its chain of bases again. Keyed by the text read now, so an edited file is parsed again.
_PARSED: dict[str, Any] = {}
_PARSED_MAX = 512


def _parse(text: str) -> Any:
    if text not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = yaml.load(text, Loader=SAFE_LOADER)
    return copy_tree(_PARSED[text])  # callers edit their trees


def copy_tree(node: Any) -> Any:
    """A copy of a parsed YAML tree: new mappings and lists, the scalars (immutable) shared."""
    if isinstance(node, dict):
        return {key: copy_tree(value) for key, value in node.items()}
    if isinstance(node, list):
        return [copy_tree(value) for value in node]
    if isinstance(node, set):  # YAML's !!set
        return set(node)
    return node


def read_one_yaml(path: Path) -> dict[str, Any]:
    """One config file's own tree, without its `extends:` chain."""
    if not path.is_file():
        raise RaysimError(
            f"config file '{path}' does not exist: give the path to a YAML file (see configs/quickstart.yaml)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise RaysimError(
            f"config file '{path}' is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at line {line}): "
            "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise RaysimError(f"cannot read config file '{path}' ({exc.strerror}): check its permissions") from None
    try:
        data = _parse(text)
    except DuplicateKey as exc:
        raise RaysimError(f"config file '{path}': {exc}: keep one of them") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise RaysimError(f"config file '{path}' is not valid YAML{where} ({problem}): fix the syntax") from None
    if data is None:
        raise RaysimError(
            f"config file '{path}' is empty: write the keys it sets (see configs/quickstart.yaml), or run a "
            "shipped config by name (raysim configs lists them)"
        )
    if not isinstance(data, dict):
        raise RaysimError(f"config file '{path}' must hold a mapping of keys (like configs/quickstart.yaml)")
    return data


def resolve(path_or_name: str | Path) -> Path:
    """An existing file path as given; otherwise the shipped config of that name (`.yaml` optional)."""
    text = str(path_or_name)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise RaysimError(
            f"'{text}' is a folder, not a config file: give a YAML file or a shipped "
            "config's name (list them with 'raysim configs')"
        )
    name = text[: -len(".yaml")] if text.endswith(".yaml") else text
    shipped = (ROOT / f"{name}.yaml").resolve()
    if name and shipped.is_relative_to(ROOT) and shipped.is_file():
        return shipped
    raise RaysimError(
        f"config '{text}' does not exist, neither as a file nor as a shipped config: give "
        "a YAML file's path or a shipped config's name (list them with 'raysim configs')"
    )


def list_configs() -> list[tuple[str, str]]:
    """(name, first comment line or '') of every shipped config, sorted by name."""
    rows = []
    for path in sorted(ROOT.rglob("*.yaml")):
        name = path.relative_to(ROOT).with_suffix("").as_posix()
        if name.startswith("tables/"):  # the papers' tables: `raysim reproduce --list`
            continue
        rows.append((name, _first_comment(path)))
    return sorted(rows)


def _first_comment(path: Path) -> str:
    """The first line of the file's leading comment block, without '#'; '' when it has none."""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        return line.lstrip("#").strip() if line.startswith("#") else ""
    return ""
