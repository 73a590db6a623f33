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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.config import Config, parse_override, read_yaml
from raysim.config.load import apply_overrides, config_from_dict
from raysim.errors import RaysimError

SPACE_FORMS = ("grid", "choice", "uniform", "loguniform")
METRICS = ("best_accuracy", "final_accuracy", "last5_accuracy")
MAX_CHECKED_COMBINATIONS = 256  # up to this many, every combination of values is validated before the sweep


def _whole(value: Any, name: str, path: Path, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RaysimError(f"sweep '{path}': {name} must be a whole number >= {low}, got {value!r}")
    return value


def _real(value: Any, name: str, path: Path, above: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > above:
        raise RaysimError(f"sweep '{path}': {name} must be a number > {above:g}, got {value!r}")
    return float(value)


@dataclass
class SchedulerSpec:
    kind: str = "asha"
    grace_period: int = 1  # rounds every trial runs before it can be stopped
    reduction_factor: float = 2.0


@dataclass
class Sweep:
    base: Path
    base_tree: dict[str, Any]
    space: dict[str, dict[str, list]]
    metric: str = "best_accuracy"
    samples: int = 1
    concurrency: int = 1
    scheduler: SchedulerSpec | None = None
    seed: int = 0
    source: dict[str, Any] = field(default_factory=dict)  # the file as read, for `--resume`

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


def _check_space(space: Any, path: Path) -> dict[str, dict[str, list]]:
    if not isinstance(space, dict) or not space:
        raise RaysimError(
            f"sweep '{path}': 'space' must map config keys to a search form, "
            "e.g. space: {{algorithm.gamma: {{grid: [0.5, 0.9]}}}}"
        )
    checked = {}
    for key, spec in space.items():
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SPACE_FORMS:
            raise RaysimError(
                f"sweep '{path}': space.{key} must be one of "
                f"{{grid: [...]}}, {{choice: [...]}}, {{uniform: [low, high]}}, "
                f"{{loguniform: [low, high]}}, got {spec!r}"
            )
        form, values = next(iter(spec.items()))
        if not isinstance(values, list) or not values:
            raise RaysimError(f"sweep '{path}': space.{key}.{form} must be a non-empty list, got {values!r}")
        if form in ("uniform", "loguniform"):
            if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values) or values[0] >= values[1]:
                raise RaysimError(
                    f"sweep '{path}': space.{key}.{form} must be [low, high] numbers with low < high, got {values!r}"
                )
            if form == "loguniform" and values[0] <= 0:
                raise RaysimError(f"sweep '{path}': space.{key}.loguniform needs low > 0, got {values[0]}")
        checked[str(key)] = {form: list(values)}
    return checked


def sweep_from_dict(data: dict[str, Any], path: Path, overrides: list[str] = ()) -> Sweep:
    known = {"base", "overrides", "space", "metric", "samples", "concurrency", "scheduler", "seed"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RaysimError(
            f"sweep '{path}': unknown key(s) {', '.join(unknown)}; valid keys are {', '.join(sorted(known))}"
        )
    if "base" not in data:
        raise RaysimError(
            f"sweep '{path}' has no 'base': name the experiment config to sweep, e.g. base: ../fedaf/cifar10_cpu.yaml"
        )
    if not isinstance(data["base"], str) or not data["base"]:
        raise RaysimError(
            f"sweep '{path}': base must be the path of an experiment config, e.g. base: ../fedaf/cifar10_cpu.yaml, "
            f"got {data['base']!r}"
        )
    base = Path(data["base"])
    base = base if base.is_absolute() else (path.parent / base)
    tree = read_yaml(base)
    fixed = data.get("overrides") or {}
    if not isinstance(fixed, dict):
        raise RaysimError(f"sweep '{path}': 'overrides' must map config keys to values")
    tree = apply_overrides(tree, ((str(key), value) for key, value in fixed.items()))
    # command-line key=value, applied to the base like `raysim run` does
    tree = apply_overrides(tree, [parse_override(text) for text in overrides])
    root = (tree.get("dataset") or {}).get("root")
    if root and not Path(root).is_absolute():  # trials run in other directories (and on other nodes)
        tree["dataset"]["root"] = str(Path(root).resolve())
    metric = data.get("metric", "best_accuracy")
    if not isinstance(metric, str) or metric not in METRICS:
        raise RaysimError(
            f"sweep '{path}': metric must be best_accuracy, final_accuracy or last5_accuracy, got '{metric}'"
        )
    scheduler = data.get("scheduler")
    if scheduler is not None:
        if not isinstance(scheduler, dict) or scheduler.get("kind", "asha") != "asha":
            raise RaysimError(
                f"sweep '{path}': scheduler must be {{kind: asha, grace_period: N, "
                f"reduction_factor: F}} or absent, got {scheduler!r}"
            )
        extra = sorted(set(scheduler) - {"kind", "grace_period", "reduction_factor"})
        if extra:
            raise RaysimError(f"sweep '{path}': unknown scheduler key(s) {', '.join(extra)}")
        scheduler = SchedulerSpec(
            grace_period=_whole(scheduler.get("grace_period", 1), "scheduler.grace_period", path, 1),
            reduction_factor=_real(scheduler.get("reduction_factor", 2.0), "scheduler.reduction_factor", path, 1),
        )
    sweep = Sweep(
        base=base,
        base_tree=tree,
        space=_check_space(data.get("space"), path),
        metric=metric,
        samples=_whole(data.get("samples", 1), "samples", path, 1),
        concurrency=_whole(data.get("concurrency", 1), "concurrency", path, 1),
        scheduler=scheduler,
        seed=_whole(data.get("seed", 0), "seed", path, 0),
        source=data,
    )
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
