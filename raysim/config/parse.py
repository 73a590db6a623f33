"""Typed parsing: a mapping (a YAML tree) -> a dataclass, each value checked against its annotation,
unknown keys and bad values refused in one line naming the key. Configs, their algorithm's Params,
tables and sweeps are all read through `build_dataclass`. Also the command line's `key.sub=value`.

A field's range is declared on its annotation, `Annotated[int, Bound(ge=1)]` (raysim.algorithm names
the common ones: Count, NonNegative, Positive ...), and checked by `coerce` right after the value's
type, in one line: "algorithm.steps must be >= 1, got 0". Choices are `Literal[...]`. A rule that
joins several fields stays beside them, in the dataclass's `__post_init__` (raising RaysimError).
A subclass that overrides a bounded field's default repeats its annotation.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass, fields
from typing import Any

import yaml

from raysim.config.files import FAST_SAFE_LOADER, copy_tree
from raysim.errors import RaysimError


@dataclass(frozen=True)
class Bound:
    """A number's range, in `Annotated[int | float, Bound(...)]`: ge/gt the lowest value (inclusive or
    not), le/lt the highest; `why` is said after the range in the refusal."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    why: str = ""

    def describe(self) -> str:
        """ ">= 1", "> 0", "in [0, 1)" ..."""
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        high = ("]", self.le) if self.le is not None else (")", self.lt) if self.lt is not None else None
        if low and high:
            return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
        if high:
            return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
        return "any number"

    def holds(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def check(self, key: str, value: float) -> None:
        if not self.holds(value):
            why = f" ({self.why})" if self.why else ""
            raise RaysimError(f"{key} must be {self.describe()}{why}, got {value}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


_SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def coerce(value: Any, tp: Any, key: str, noun: str = "config key") -> Any:
    """Check `value` against the annotation `tp`, converting int->float where harmless. `noun` names
    what `key` is in the one-line error ("config key", or "key" in a table or sweep file)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        inner, *extras = typing.get_args(tp)
        value = coerce(value, inner, key, noun)
        for bound in extras:
            if isinstance(bound, Bound) and value is not None:
                bound.check(key, value)
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, key, noun)
            except RaysimError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value in allowed and not isinstance(value, bool):
            return value
        raise RaysimError(f"{noun} '{key}' must be one of {', '.join(map(str, allowed))}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, {} if value is None else value, key, noun)
    if tp is float:
        if isinstance(value, str) and _SCIENTIFIC.match(value):
            value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RaysimError(f"{noun} '{key}' must be a number, got {value!r}")
        if not math.isfinite(value):
            raise RaysimError(f"{noun} '{key}' must be a finite number, got {value}")
        check_named_number(key, value)
        check_model_size(key, value)
        # keep ints as ints where a count makes sense (clients.per_round=4 means 4 clients)
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise RaysimError(f"{noun} '{key}' must be an integer, got {value!r}")
        check_model_size(key, value)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RaysimError(f"{noun} '{key}' must be true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise RaysimError(f"{noun} '{key}' must be a string, got {value!r}")
        return str(value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise RaysimError(f"{noun} '{key}' must be a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [coerce(v, item_tp, f"{key}[{i}]", noun) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RaysimError(f"{noun} '{key}' must be a mapping, got {value!r}")
        key_tp, value_tp = typing.get_args(tp) or (Any, Any)
        return {_mapping_key(k, key_tp, key, noun): coerce(v, value_tp, f"{key}.{k}", noun) for k, v in value.items()}
    if tp is Any:
        return value
    raise RaysimError(f"{noun} '{key}' has unsupported type {_type_name(tp)}")


def _mapping_key(k: Any, tp: Any, key: str, noun: str) -> Any:
    try:
        return coerce(k, tp, key, noun)
    except RaysimError as exc:
        raise RaysimError(f"the keys of {exc}") from None


def check_named_number(key: str, value: float) -> None:
    """Ranges that hold for a key wherever it appears (local.*, algorithm.*): learning rates,
    momenta and weight decays, by the name's last part."""
    name = key.rsplit(".", 1)[-1]
    if (name == "lr" or name.endswith("_lr")) and value < 0:
        raise RaysimError(f"config key '{key}' is a learning rate and must be >= 0, got {value}")
    if (name == "momentum" or name.endswith("_momentum")) and not 0 <= value < 1:
        raise RaysimError(f"config key '{key}' is a momentum and must be in [0, 1), got {value}")
    if (name == "weight_decay" or name.endswith("_weight_decay")) and value < 0:
        raise RaysimError(f"config key '{key}' is a weight decay and must be >= 0, got {value}")


# The model keys that size its layers (model.*, clients.models' entries), with the most each may be
# and the weights one layer then holds: refused in one line before a model is built, not a
# traceback from an allocation of terabytes (or a machine brought to a halt).
MODEL_SIZE_LIMITS = {
    # key: (most, the papers' value, weights of one layer at value v, what that layer is)
    "width": (4096, 128, lambda v: 9 * v * v, "a 3x3 convolution from width to width channels"),
    "hidden": (16384, 128, lambda v: 3 * 64 * 64 * v, "the first layer on 64x64 RGB images"),
    "width_multiplier": (8, 1, lambda v: 9 * (512 * v) ** 2, "ResNet-18's widest 3x3 convolution"),
}


def check_model_size(key: str, value: float) -> None:
    """model.width, model.hidden and model.width_multiplier (also in clients.models) within what a
    machine can hold: the refusal names the key and the memory one layer would need."""
    parts = key.split(".")
    name = parts[-1]
    if parts[0] not in ("model", "clients") or name not in MODEL_SIZE_LIMITS:
        return
    most, usual, weights, layer = MODEL_SIZE_LIMITS[name]
    if value > most:
        raise RaysimError(
            f"config key '{key}'={value} is far too large: {layer} would hold {weights(value):.3g} weights "
            f"({_bytes(4 * weights(value))} as float32): give at most {most} (the papers use {usual})"
        )


def _bytes(n: float) -> str:
    unit = "bytes"
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            break
        n /= 1000
    return f"{n:.3g} {unit}"


def build_dataclass(cls: type, values: dict[str, Any], prefix: str, noun: str = "config key") -> Any:
    """Instantiate dataclass `cls` from a mapping, rejecting unknown keys, missing required ones and
    bad types (nested dataclasses, lists, mappings and Literal choices included) and values out of
    their Bound, in one line each. What only the whole object can check (`__post_init__`) raises
    RaysimError itself."""
    where = f"'{prefix}'" if prefix else "the file"
    if not isinstance(values, dict):
        raise RaysimError(f"{noun} {where} must be a mapping of keys, got {values!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    known = {f.name: f for f in fields(cls) if f.init}
    for key in values:
        if key not in known:
            name = f"'{prefix}.{key}'" if prefix else f"'{key}'"
            raise RaysimError(
                f"unknown {noun} {name}: valid keys{' under ' + repr(prefix) if prefix else ''} "
                f"are {', '.join(sorted(known))}"
            )
    missing = [
        n
        for n, f in known.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RaysimError(f"{where} needs {', '.join(repr(m) for m in missing)} ({noun}s it cannot do without)")
    kwargs = {
        name: coerce(value, hints[name], f"{prefix}.{name}" if prefix else name, noun) for name, value in values.items()
    }
    return cls(**kwargs)


@functools.lru_cache(maxsize=1024)
def _override_value(raw: str) -> Any:
    """An override's value as YAML reads it (memoised: listing the tables applies thousands)."""
    return yaml.load(raw, Loader=FAST_SAFE_LOADER)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise RaysimError(f"override '{text}' is not of the form key.sub=value (e.g. rounds=10)")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise RaysimError(f"override '{text}' has an empty key: write it as key.sub=value")
    try:
        value = copy_tree(_override_value(raw)) if raw != "" else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RaysimError(f"config key '{'.'.join(path)}': '{part}' is a value, not a section")
        node = child
    node[path[-1]] = value
