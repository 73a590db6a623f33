"""A paper's table as data: its cells (each a shipped config per scale), its methods, its figures.

A table file (configs/tables/NAME.yaml, shipped with the package):

    title: "DCFL, Table II: ..."       # what the paper's table shows
    source: "paper 002, Table II"      # where its figures come from
    report: experiments/dcfl/README.md # where the measured table is written up
    metric: last5_accuracy             # the measured figure set beside the paper's
    seeds: 3                           # seeds 0..n-1 unless --seeds says otherwise
    cells:
      fmnist_ck2:
        label: "FMNIST, C_k = 2"
        config: {cpu: dcfl/fmnist_ck2_cpu, paper: dcfl/fmnist_ck2}  # shipped config per scale
        overrides: {rounds: 40}        # optional, dotted keys, at every scale ({cpu: {...}} for one scale)
        method_config: {feddm: {cpu: feddm/fmnist_cpu}}  # optional: a method's own config of this cell
        paper: {fedavg: 74.3, dcfl: [85.1, 0.4]}                   # percent: mean or [mean, std]
        paper_rounds: {fedavg: {0.73: 72, 0.78: null}}  # optional: rounds to a test accuracy (null: never)
    methods:
      fedavg: {label: FedAvg, algorithm: {name: fedavg}}  # `algorithm` replaces the config's section
      dcfl: {label: DCFL, overrides: {algorithm.base: fedavg}}
    orderings: ["dcfl > fedavg"]       # checked per cell and seed; default: the paper's best cell by cell
    minutes: {cpu: {fedavg: 1.5, dcfl: 4}}  # one run's wall time on the reference 2-core machine

A run's config is the cell's config at the chosen scale (or the method's own config of the cell,
where `method_config` names one: a method whose algorithm section differs between cells and scales,
as FedDM's scaled-down settings do), with the method's `algorithm` section (if it gives one) in
place of the config's, then the cell's and the method's overrides, the seed, and `dataset.root`
under the data folder. The methods of a cell share everything but the algorithm (tested).
`paper_rounds` targets must be among the cell's `eval.targets` (tested), so that every run reports
its rounds to them (summary.json's rounds_to_accuracy).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raysim.config import Config, read_yaml
from raysim.config.files import ROOT as CONFIGS_ROOT
from raysim.config.files import resolve
from raysim.errors import RaysimError

TABLES_DIR = CONFIGS_ROOT / "tables"
SCALES = ("cpu", "paper")
METRICS = ("last5_accuracy", "final_accuracy", "best_accuracy")
_ORDERING = re.compile(r"^\s*([\w.-]+)\s*>\s*([\w.-]+)\s*$")


@dataclass
class Method:
    name: str
    label: str
    algorithm: dict[str, Any] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class Cell:
    name: str
    label: str
    configs: dict[str, str]  # scale -> shipped config name
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # scale -> dotted key -> value
    paper: dict[str, tuple[float, float | None]] = field(default_factory=dict)  # method -> (mean, std) in %
    method_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # method -> scale -> config
    # method -> target ("0.73", as summary.json's rounds_to_accuracy keys it) -> rounds, None: never reached
    paper_rounds: dict[str, dict[str, int | None]] = field(default_factory=dict)


@dataclass
class Table:
    name: str
    title: str
    source: str
    report: str
    metric: str
    seeds: int
    cells: dict[str, Cell]
    methods: dict[str, Method]
    orderings: list[tuple[str, str]]  # (better, worse)
    minutes: dict[str, dict[str, float]]  # scale -> method -> minutes a run (reference machine)
    path: Path

    def cell_orderings(self, cell: Cell) -> list[tuple[str, str]]:
        """The orderings checked in `cell`: the table's, where the paper gives both figures; without
        any, the paper's best method of the cell against each other one with a figure."""
        if self.orderings:
            return [(a, b) for a, b in self.orderings if a in cell.paper and b in cell.paper]
        if len(cell.paper) < 2:
            return []
        best = max(cell.paper, key=lambda m: cell.paper[m][0])
        return [(best, m) for m in self.methods if m in cell.paper and m != best]

    def config(self, cell: str, method: str, scale: str, seed: int, data_root: str | Path | None) -> Config:
        """The validated config of one run (see the module docstring)."""
        from raysim.config.load import config_from_dict

        return config_from_dict(self.config_tree(cell, method, scale, seed, data_root))

    def config_tree(
        self, cell: str, method: str, scale: str, seed: int, data_root: str | Path | None
    ) -> dict[str, Any]:
        c, m = self.cells[cell], self.methods[method]
        if scale not in c.configs:
            raise RaysimError(
                f"table {self.name}: cell {cell} has no {scale}-scale config "
                f"(it has {', '.join(c.configs)}): choose --scale {' or '.join(c.configs)} or leave the cell out"
            )
        from raysim.config.load import apply_overrides

        tree = read_yaml(resolve(c.method_configs.get(method, {}).get(scale, c.configs[scale])))
        if m.algorithm is not None:
            tree["algorithm"] = copy.deepcopy(m.algorithm)
        # the cell's overrides hold for every method, the method's for it alone (apply_overrides)
        tree = apply_overrides(tree, c.overrides.get(scale, {}).items())
        tree = apply_overrides(tree, m.overrides.items())
        tree["seed"] = seed
        dataset = tree.setdefault("dataset", {})
        if data_root is not None and dataset.get("name", "embedded") != "embedded":
            dataset["root"] = str(Path(data_root) / dataset["name"])
        return tree


def list_tables() -> list[Table]:
    return [load_table(path) for path in sorted(TABLES_DIR.glob("*.yaml"))]


def load_table(name_or_path: str | Path) -> Table:
    """A shipped table by name (`raysim reproduce --list`), or a table file's path."""
    path = Path(name_or_path)
    if not path.is_file():
        path = TABLES_DIR / f"{str(name_or_path).removesuffix('.yaml')}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(TABLES_DIR.glob("*.yaml")))
        raise RaysimError(f"no table '{name_or_path}': give a shipped table ({known}) or a table file's path")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RaysimError(f"table file '{path}' is not valid YAML ({str(exc).splitlines()[0]}): fix it") from None
    return _parse(path, raw)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _parse(path: Path, raw: Any) -> Table:
    where = f"table file '{path}'"

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise RaysimError(f"{where}: {what}")

    need(isinstance(raw, dict), "must be a mapping with title, cells and methods")
    unknown = set(raw) - {"title", "source", "report", "metric", "seeds", "cells", "methods", "orderings", "minutes"}
    need(not unknown, f"unknown key(s) {', '.join(sorted(unknown))}")
    need(isinstance(raw.get("title"), str), "needs a 'title' (what the paper's table shows)")
    metric = raw.get("metric", "last5_accuracy")
    need(metric in METRICS, f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    seeds = raw.get("seeds", 3)
    need(isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1, "seeds must be a positive integer")

    methods = {}
    need(isinstance(raw.get("methods"), dict) and raw["methods"], "needs 'methods': name -> {label, ...}")
    for name, spec in raw["methods"].items():
        spec = spec or {}
        need(isinstance(spec, dict), f"method {name} must be a mapping")
        extra = set(spec) - {"label", "algorithm", "overrides"}
        need(not extra, f"method {name} has unknown key(s) {', '.join(sorted(extra))}")
        algorithm = spec.get("algorithm")
        need(
            algorithm is None or (isinstance(algorithm, dict) and "name" in algorithm),
            f"method {name}: 'algorithm' must be a section with a name",
        )
        overrides = spec.get("overrides") or {}
        need(
            isinstance(overrides, dict) and all(isinstance(k, str) for k in overrides),
            f"method {name}: overrides must map dotted keys to values",
        )
        methods[str(name)] = Method(str(name), str(spec.get("label", name)), algorithm, overrides)

    cells = {}
    need(isinstance(raw.get("cells"), dict) and raw["cells"], "needs 'cells': name -> {label, config, paper}")
    for name, spec in raw["cells"].items():
        need(isinstance(spec, dict), f"cell {name} must be a mapping")
        extra = set(spec) - {"label", "config", "overrides", "paper", "paper_rounds", "method_config"}
        need(not extra, f"cell {name} has unknown key(s) {', '.join(sorted(extra))}")
        configs = spec.get("config")
        need(
            isinstance(configs, dict) and configs and set(configs) <= set(SCALES),
            f"cell {name}: config must map a scale ({', '.join(SCALES)}) to a shipped config",
        )
        paper = {}
        figures = spec.get("paper") or {}
        need(isinstance(figures, dict), f"cell {name}: paper must map a method to its figure")
        for method, figure in figures.items():
            need(method in methods, f"cell {name}: paper figure for unknown method {method}")
            numbers = figure if isinstance(figure, list) else [figure]
            need(
                len(numbers) in (1, 2) and all(_number(x) for x in numbers),
                f"cell {name}: paper figure of {method} must be a number or [mean, std]",
            )
            paper[method] = (float(numbers[0]), float(numbers[1]) if len(numbers) == 2 else None)
        paper_rounds = {}
        for method, by_target in (spec.get("paper_rounds") or {}).items():
            need(
                method in methods
                and isinstance(by_target, dict)
                and all(_number(t) and 0 < t <= 1 for t in by_target)
                and all(r is None or (_number(r) and r == int(r) >= 1) for r in by_target.values()),
                f"cell {name}: paper_rounds must map a method to {{target accuracy in (0, 1]: rounds or null}}",
            )
            paper_rounds[method] = {str(float(t)): None if r is None else int(r) for t, r in by_target.items()}
        overrides = spec.get("overrides") or {}
        need(isinstance(overrides, dict), f"cell {name}: overrides must map dotted keys to values")
        if not (overrides and set(overrides) <= set(SCALES)):  # the same at every scale
            overrides = {scale: overrides for scale in SCALES}
        need(
            all(isinstance(v, dict) and all(isinstance(k, str) for k in v) for v in overrides.values()),
            f"cell {name}: overrides must map dotted keys to values (or a scale to such a mapping)",
        )
        own = spec.get("method_config") or {}
        need(
            isinstance(own, dict)
            and all(m in methods and isinstance(v, dict) and set(v) <= set(configs) for m, v in own.items()),
            f"cell {name}: method_config must map a method of the table to {{scale: config}} at the cell's scales",
        )
        cells[str(name)] = Cell(
            str(name),
            str(spec.get("label", name)),
            dict(configs),
            overrides,
            paper,
            {m: dict(v) for m, v in own.items()},
            paper_rounds,
        )

    orderings = []
    for text in raw.get("orderings") or []:
        match = _ORDERING.match(str(text))
        need(match is not None, f"ordering {text!r} must read 'method > method'")
        a, b = match.groups()
        need(a in methods and b in methods, f"ordering {text!r} names a method the table does not have")
        orderings.append((a, b))
    minutes = raw.get("minutes") or {}
    need(
        isinstance(minutes, dict)
        and set(minutes) <= set(SCALES)
        and all(
            isinstance(v, dict) and all(m in methods and _number(x) for m, x in v.items()) for v in minutes.values()
        ),
        "minutes must map a scale to {method: minutes a run}",
    )
    return Table(
        path.stem,
        raw["title"],
        str(raw.get("source", "")),
        str(raw.get("report", "")),
        metric,
        seeds,
        cells,
        methods,
        orderings,
        {scale: dict(v) for scale, v in minutes.items()},
        path,
    )
