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
    minutes: {cpu: {fedavg: 1.5, dcfl: 4}}  # one run's wall time on the reference 2-core machine;
                                       # a cell's own `minutes` (same form) replace them at its scales
    extra:                             # optional: summary.json numbers shown per cell and method
      cka_label_spearman: {label: "CKA-label rho (last round)"}
      ensemble_accuracy: {label: "average ensemble", unit: percent}
      bytes_up: {label: "MB up", unit: MB}
    figures: [rounds, mb]              # accuracy against rounds (curves.png), MB moved (curves_mb.png),
                                       # compute (curves_compute.png), and the accuracy-MB front (pareto.png)
    leaderboard: true                  # per cell, the methods ranked by `metric` with what each spent:
                                       # MB in all and to each eval.targets accuracy, compute, peak memory

A run's config is the cell's config at the chosen scale (or the method's own config of the cell,
where `method_config` names one: a method whose algorithm section differs between cells and scales,
as FedDM's scaled-down settings do), with the method's `algorithm` section (if it gives one) in
place of the config's, then the cell's and the method's overrides, the seed, and `dataset.root`
under --data-root when one is given (else each run reads its dataset's folder in the data home). The
methods of a cell share everything but the algorithm (tested).
`paper_rounds` targets must be among the cell's `eval.targets` (tested), so that every run reports
its rounds to them (summary.json's rounds_to_accuracy).
"""

from __future__ import annotations

import copy
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from raysim.algorithm import Algorithm
from raysim.config import Config, build_dataclass, read_yaml
from raysim.config.files import FAST_SAFE_LOADER, resolve
from raysim.config.files import ROOT as CONFIGS_ROOT
from raysim.errors import RaysimError, need
from raysim.experiment import apply_overrides, config_from_dict
from raysim.registry import algorithm_class
from raysim.reproduce.paper_orderings import PaperOrdering
from raysim.reproduce.paper_orderings import check as check_paper_ordering

TABLES_DIR = CONFIGS_ROOT / "tables"
Scale = Literal["cpu", "paper"]
Metric = Literal["last5_accuracy", "final_accuracy", "best_accuracy", "selected_accuracy"]
# a figure's x axis: rounds, cumulative megabytes moved up and down, cumulative compute, or the
# Pareto picture of the table's figure against the megabytes moved in all (raysim.reproduce.curves)
Axis = Literal["rounds", "mb", "compute", "pareto"]
SCALES = typing.get_args(Scale)
METRICS = typing.get_args(Metric)
_ORDERING = re.compile(r"^\s*([\w.-]+)\s*>\s*([\w.-]+)\s*$")


@dataclass
class Extra:
    """A summary.json number a table shows per cell and method (mean +- std over the seeds)."""

    label: str = ""
    unit: Literal["", "percent", "MB"] = ""  # percent: x 100 (an accuracy); MB: bytes / 1e6
    digits: int = 2

    @property
    def scale(self) -> float:
        return {"percent": 100.0, "MB": 1e-6}.get(self.unit, 1.0)


@dataclass
class Method:
    """A method of a table: a label, and how its runs differ from the cell's config."""

    label: str = ""
    algorithm: dict[str, Any] | None = None  # replaces the config's algorithm section
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys, for this method alone
    # the reading it is ranked by on a leaderboard, where not the table's `metric` (one-shot methods:
    # a model chosen without the test set)
    metric: Metric | None = None
    name: str = field(default="", init=False)  # its key in the table

    def __post_init__(self):
        need(self.algorithm is None or "name" in self.algorithm, "'algorithm' must be a section with a name")


@dataclass
class Cell:
    """A cell of a table: its config per scale, the paper's figures, and what the cell changes."""

    config: dict[Scale, str]  # scale -> shipped config name
    label: str = ""
    # dotted key -> value at every scale, or scale -> such a mapping; read as scale -> dotted key -> value
    overrides: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, float | list[float]] = field(default_factory=dict)  # read as method -> (mean, std) in %
    # method -> {target accuracy: rounds or null (never)}; read with the targets as summary.json keys them ("0.73")
    paper_rounds: dict[str, dict[float, int | None]] = field(default_factory=dict)
    method_config: dict[str, dict[Scale, str]] = field(default_factory=dict)  # method -> scale -> its own config
    # a run's minutes in this cell, where its runs take another time than the table's `minutes` say
    minutes: dict[Scale, dict[str, float]] = field(default_factory=dict)
    name: str = field(default="", init=False)

    def __post_init__(self):
        need(bool(self.config), f"config must map a scale ({', '.join(SCALES)}) to a shipped config")
        if not (self.overrides and set(self.overrides) <= set(SCALES)):  # the same at every scale
            self.overrides = {scale: self.overrides for scale in SCALES}
        need(
            all(isinstance(v, dict) for v in self.overrides.values()),
            "overrides must map dotted keys to values (or a scale to such a mapping)",
        )
        for method, figure in self.paper.items():
            numbers = figure if isinstance(figure, list) else [figure]
            need(len(numbers) in (1, 2), f"paper figure of {method} must be a number or [mean, std]")
        self.paper = {
            m: (float(f[0]), float(f[1]) if len(f) == 2 else None) if isinstance(f, list) else (float(f), None)
            for m, f in self.paper.items()
        }
        need(
            all(0 < t <= 1 and (r is None or r >= 1) for v in self.paper_rounds.values() for t, r in v.items()),
            "paper_rounds must map a method to {target accuracy in (0, 1]: rounds >= 1 or null}",
        )
        self.paper_rounds = {m: {str(float(t)): r for t, r in v.items()} for m, v in self.paper_rounds.items()}
        need(
            all(set(v) <= set(self.config) for v in self.method_config.values()),
            "method_config must map a method to {scale: config} at the cell's scales",
        )


@dataclass
class Table:
    """A table file, read by raysim.config.parse.build_dataclass like a config (one-line errors)."""

    title: str  # what the paper's table shows
    cells: dict[str, Cell]
    methods: dict[str, Method | None]
    source: str = ""  # where its figures come from
    report: str = ""  # where the measured table is written up
    metric: Metric = "last5_accuracy"  # the measured figure set beside the paper's
    seeds: int = 3  # seeds 0..n-1 unless --seeds says otherwise
    orderings: list[str] = field(default_factory=list)  # read as (better, worse) pairs
    minutes: dict[Scale, dict[str, float]] = field(default_factory=dict)  # a run's minutes, reference machine
    extra: dict[str, Extra | None] = field(default_factory=dict)  # summary.json key (dotted) -> how it is shown
    figures: list[Axis] = field(default_factory=lambda: ["rounds"])  # accuracy against each axis, per cell
    leaderboard: bool = False  # per cell, methods ranked by `metric` beside their bytes, compute and memory
    # sections setting a paper's ordering beside this table's (raysim.reproduce.paper_orderings)
    paper_orderings: dict[str, PaperOrdering] = field(default_factory=dict)
    name: str = field(default="", init=False)
    path: Path = field(default=Path(), init=False)

    def __post_init__(self):
        need(self.seeds >= 1, "seeds must be a positive integer")
        need(bool(self.cells), "needs 'cells': name -> {label, config, paper}")
        need(bool(self.methods), "needs 'methods': name -> {label, ...}")
        self.methods = {str(n): m or Method() for n, m in self.methods.items()}
        for name, method in self.methods.items():
            method.name, method.label = name, method.label or name
        for name, cell in self.cells.items():
            cell.name, cell.label = str(name), cell.label or str(name)
            for what, methods in (
                ("paper figure", cell.paper),
                ("paper_rounds", cell.paper_rounds),
                ("method_config", cell.method_config),
                ("minutes", {m for v in cell.minutes.values() for m in v}),
            ):
                unknown = sorted(set(methods) - set(self.methods))
                need(not unknown, f"cell {name}: {what} for unknown method {', '.join(unknown)}")
            # a cell's algorithm keys hold for every method: not for one that brings its own section
            shared = sorted({k for v in cell.overrides.values() for k in v if k.startswith("algorithm.")})
            own = sorted(m for m, method in self.methods.items() if method.algorithm is not None)
            need(
                not (shared and own),
                f"cell {name} sets {', '.join(shared)} for every method, but {', '.join(own)} bring their own "
                "algorithm section: set it in the overrides of the methods it is meant for",
            )
        pairs = []
        for text in self.orderings:
            match = _ORDERING.match(str(text))
            need(match is not None, f"ordering {text!r} must read 'method > method'")
            need(set(match.groups()) <= set(self.methods), f"ordering {text!r} names a method the table does not have")
            pairs.append(match.groups())
        self.orderings = pairs
        unknown = sorted({m for v in self.minutes.values() for m in v} - set(self.methods))
        need(not unknown, f"minutes name unknown method(s) {', '.join(unknown)}")
        self.extra = {str(key): extra or Extra() for key, extra in self.extra.items()}
        for key, extra in self.extra.items():
            extra.label = extra.label or key
        need(bool(self.figures) and len(set(self.figures)) == len(self.figures), "figures: each axis at most once")
        for name, ordering in self.paper_orderings.items():
            ordering.name = str(name)
            paper = load_table(ordering.table)
            check_paper_ordering(ordering, set(self.cells), set(self.methods), set(paper.cells))

    def metric_of(self, method: str) -> str:
        """The reading `method` is ranked by: its own (Method.metric) or the table's."""
        return self.methods[method].metric or self.metric

    def cell_orderings(self, cell: Cell) -> list[tuple[str, str]]:
        """The orderings checked in `cell`: the table's, where the paper gives both figures (in a
        cell with no paper figures at all, a question of raysim's own such as an ablation, every
        one); without any, the paper's best method of the cell against each other one with a figure."""
        if self.orderings:
            if not cell.paper:
                return list(self.orderings)
            return [(a, b) for a, b in self.orderings if a in cell.paper and b in cell.paper]
        if len(cell.paper) < 2:
            return []
        best = max(cell.paper, key=lambda m: cell.paper[m][0])
        return [(best, m) for m in self.methods if m in cell.paper and m != best]

    def config(self, cell: str, method: str, scale: str, seed: int, data_root: str | Path | None) -> Config:
        """The validated config of one run (see the module docstring)."""

        return config_from_dict(self.config_tree(cell, method, scale, seed, data_root))

    def config_tree(
        self, cell: str, method: str, scale: str, seed: int, data_root: str | Path | None
    ) -> dict[str, Any]:
        c, m = self.cells[cell], self.methods[method]
        if scale not in c.config:
            raise RaysimError(
                f"table {self.name}: cell {cell} has no {scale}-scale config "
                f"(it has {', '.join(c.config)}): choose --scale {' or '.join(c.config)} or leave the cell out"
            )

        tree = read_yaml(resolve(c.method_config.get(method, {}).get(scale, c.config[scale])))
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


def datasets_of_tables(tables: list[Table]) -> dict[str, list[str]]:
    """dataset -> the tables whose runs read it (their dataset, or a transfer set), at either scale."""

    used: dict[str, list[str]] = {}
    for table in tables:
        for cell, c in table.cells.items():
            for method in table.methods:
                for scale in c.config:
                    tree = table.config_tree(cell, method, scale, 0, None)
                    named = tree.get("algorithm", {}).get("name")
                    if named is not None and not _reads_extra_datasets(algorithm_class(named)):
                        # the run's own dataset only: no config to build (the tables hold about a
                        # thousand runs, and validating each made `raysim data list` take seconds)
                        names = [tree["dataset"].get("name", "embedded")]
                    else:
                        config = config_from_dict(tree)
                        extra = algorithm_class(config.algorithm.name).extra_datasets(config)
                        names = [config.dataset.name, *(name for name, _, _ in extra)]
                    for name in names:
                        if table.name not in used.setdefault(name, []):
                            used[name].append(table.name)
    return used


def _reads_extra_datasets(algorithm: type) -> bool:
    return algorithm.extra_datasets.__func__ is not Algorithm.extra_datasets.__func__


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
        raw = yaml.load(path.read_text(), Loader=FAST_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise RaysimError(f"table file '{path}' is not valid YAML ({str(exc).splitlines()[0]}): fix it") from None
    return _parse(path, raw)


def _parse(path: Path, raw: Any) -> Table:
    try:
        table = build_dataclass(Table, raw, "", noun="key")
    except RaysimError as exc:
        raise RaysimError(f"table file '{path}': {exc}") from None
    table.name, table.path = path.stem, path
    return table


def cell_name(name: str) -> tuple[str, str, str, str] | None:
    """TABLE:CELL:METHOD[:SCALE] (raysim run, raysim bench cell) as (table, cell, method, scale),
    the scale cpu when not named; None where `name` is not a cell's (another part count, or a file
    that exists). The one reading of such a name: load_named_config and check_cell_name use it."""
    parts = name.split(":")
    if len(parts) not in (3, 4) or Path(name).exists():
        return None
    return parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else "cpu"
