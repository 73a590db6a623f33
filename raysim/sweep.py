"""Sweep files: which base experiment, which keys to vary and how, and what to optimise.

A sweep file (configs/sweeps/*.yaml):

    base: ../fedaf/cifar10_cpu.yaml       # relative to the sweep file
    overrides: {rounds: 3}                # fixed changes to the base
    space:                                # any config key, one of four forms
      algorithm.gamma: {grid: [0.5, 0.9]}
      partition.alpha: {choice: [0.02, 0.05]}
      local.lr: {uniform: [0.005, 0.05]}
      algorithm.lambda_loc: {loguniform: [1.0e-5, 1.0e-2]}
    metric: best_accuracy                 # or final_accuracy, last5_accuracy (mean of the last 5 evaluations)
    samples: 1                            # repeats of the grid (random forms drawn anew each time)
    concurrency: 2                        # trials at once
    scheduler: {kind: asha, grace_period: 1, reduction_factor: 2}   # optional, on per-round accuracy
    seed: 0                               # seeds the random forms

This module only reads and checks the file; `raysim.tuning` runs it with Ray Tune.
"""

from __future__ import annotations

import itertools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from raysim.config import Config, build_dataclass, parse_override, read_yaml
from raysim.errors import RaysimError, need
from raysim.experiment import apply_overrides, config_from_dict

Form = Literal["grid", "choice", "uniform", "loguniform"]
Metric = Literal["best_accuracy", "final_accuracy", "last5_accuracy"]
SPACE_FORMS = typing.get_args(Form)
METRICS = typing.get_args(Metric)
MAX_CHECKED_COMBINATIONS = 256  # up to this many, every combination of values is validated before the sweep


@dataclass
class SchedulerSpec:
    kind: Literal["asha"] = "asha"
    grace_period: int = 1  # rounds every trial runs before it can be stopped
    reduction_factor: float = 2.0

    def __post_init__(self):
        need(self.grace_period >= 1, f"scheduler.grace_period must be a whole number >= 1, got {self.grace_period}")
        need(self.reduction_factor > 1, f"scheduler.reduction_factor must be a number > 1, got {self.reduction_factor}")


@dataclass
class Sweep:
    """A sweep file, read by raysim.config.parse.build_dataclass like a config (one-line errors), and
    the base config it sweeps (`base_path`, `base_tree`: the base with the fixed and command-line
    overrides laid over it)."""

    base: str  # the experiment config to sweep, relative to the sweep file
    space: dict[str, dict[Form, list[Any]]]  # config key -> {form: values}
    overrides: dict[str, Any] = field(default_factory=dict)  # fixed changes to the base
    metric: Metric = "best_accuracy"
    samples: int = 1  # repeats of the grid (random forms drawn anew each time)
    concurrency: int = 1  # trials at once
    scheduler: SchedulerSpec | None = None
    seed: int = 0  # seeds the random forms
    base_path: Path = field(default=Path(), init=False)
    base_tree: dict[str, Any] = field(default_factory=dict, init=False)
    source: dict[str, Any] = field(default_factory=dict, init=False)  # the file as read, for `--resume`

    def __post_init__(self):
        for name, value, low in (
            ("samples", self.samples, 1),
            ("concurrency", self.concurrency, 1),
            ("seed", self.seed, 0),
        ):
            need(value >= low, f"{name} must be a whole number >= {low}, got {value}")
        need(
            bool(self.space),
            "'space' must map config keys to a search form, e.g. space: {algorithm.gamma: {grid: [0.5, 0.9]}}",
        )
        for key, spec in self.space.items():
            need(
                len(spec) == 1,
                f"space.{key} must be one of {{grid: [...]}}, {{choice: [...]}}, {{uniform: [low, high]}}, "
                f"{{loguniform: [low, high]}}, got {spec!r}",
            )
            form, values = next(iter(spec.items()))
            need(bool(values), f"space.{key}.{form} must be a non-empty list, got {values!r}")
            if form in ("uniform", "loguniform"):
                numbers = len(values) == 2 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
                )
                need(
                    numbers and values[0] < values[1],
                    f"space.{key}.{form} must be [low, high] numbers with low < high, got {values!r}",
                )
                need(form == "uniform" or values[0] > 0, f"space.{key}.loguniform needs low > 0, got {values[0]}")

    def trial_config(self, params: dict[str, Any]) -> Config:
        """The base config with one trial's values for the swept keys."""
        return config_from_dict(apply_overrides(self.base_tree, params.items()))

    def example_params(self) -> dict[str, Any]:
        """One value per key (the first of a grid or choice, the low end of a range)."""
        return {key: spec[form][0] for key, spec in self.space.items() for form in spec}

    def each_value(self):
        """Params that between them use every grid and choice value and both ends of every range:
        the whole product when it is small, otherwise each value beside the others' first."""
        values = {key: list(spec[form]) for key, spec in self.space.items() for form in spec}
        for key, spec in self.space.items():
            if "uniform" in spec or "loguniform" in spec:  # and a point inside: ranges draw real numbers
                low, high = spec.get("uniform") or spec["loguniform"]
                values[key].append(low + (high - low) / math.pi)
        product = 1
        for options in values.values():
            product *= len(options)
        if product <= MAX_CHECKED_COMBINATIONS:
            keys = list(values)
            for combination in itertools.product(*(values[k] for k in keys)):
                yield dict(zip(keys, combination))
            return
        first = self.example_params()
        for key, options in values.items():
            for value in options:
                yield {**first, key: value}

    def grid_size(self) -> int:
        size = 1
        for spec in self.space.values():
            if "grid" in spec:
                size *= len(spec["grid"])
        return size


def sweep_from_dict(data: dict[str, Any], path: Path, overrides: list[str] = ()) -> Sweep:
    try:
        sweep = build_dataclass(Sweep, data, "", noun="key")
    except RaysimError as exc:
        raise RaysimError(f"sweep '{path}': {exc}") from None
    base = Path(sweep.base)
    sweep.base_path = base if base.is_absolute() else (path.parent / base)
    tree = apply_overrides(read_yaml(sweep.base_path), sweep.overrides.items())
    # command-line key=value, applied to the base like `raysim run` does
    tree = apply_overrides(tree, [parse_override(text) for text in overrides])
    root = (tree.get("dataset") or {}).get("root")
    if root and not Path(root).is_absolute():  # trials run in other directories (and on other nodes)
        tree["dataset"]["root"] = str(Path(root).resolve())
    sweep.base_tree, sweep.source = tree, data
    # Every swept key must be a real config key, and every value (both ends of a range) valid:
    # fail now, not in the middle of the sweep.
    for params in sweep.each_value():
        try:
            sweep.trial_config(params)
        except RaysimError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            drawn = [k for k, spec in sweep.space.items() if {"uniform", "loguniform"} & set(spec)]
            hint = (
                f" (uniform and loguniform draw real numbers between the ends: for {', '.join(drawn)} "
                "use grid or choice if it takes whole numbers)"
                if drawn
                else ""
            )
            raise RaysimError(f"sweep '{path}': with {shown}: {exc}{hint}") from None
    return sweep


def load_sweep(path: str | Path, overrides: list[str] = ()) -> Sweep:
    path = Path(path)
    if not path.is_file():
        raise RaysimError(f"sweep file '{path}' does not exist: give a YAML file like configs/sweeps/cpu.yaml")
    return sweep_from_dict(read_yaml(path), path.resolve(), overrides)
