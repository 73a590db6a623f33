"""`raysim report RUN...`: runs side by side, seeds of the same experiment folded into mean +- std."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from raysim.config import NEUTRAL_KEYS, Config
from raysim.errors import RaysimError
from raysim.plots import curves_figure, save_figure
from raysim.results import RunRecord, read_curves, read_run, rounds_to, stat
from raysim.text_table import text_table


def experiment_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The config, flattened, without the settings that change no number (raysim.config.NEUTRAL_KEYS),
    the seed, and eval.targets (each run's own targets are read from its summary): runs differing
    only there are repeats of one experiment. raysim writes every key of its time into config.yaml,
    so a key a run lacks was added since, and the run ran at its default (an algorithm parameter
    whose default changed behaviour states its earlier value: raysim.run_format)."""
    flat = {**_schema_defaults(), **flatten(config)}
    return {k: v for k, v in flat.items() if k not in NEUTRAL_KEYS and k not in ("seed", "eval.targets")}


@functools.cache
def _schema_defaults() -> dict[str, Any]:
    """Every key of the schema at its default, flattened; not the algorithm's (its parameters are its own)."""
    return {k: v for k, v in flatten(Config().to_dict()).items() if not k.startswith("algorithm.")}


def experiment_key(config: dict[str, Any]) -> str:
    return json.dumps(experiment_settings(config), sort_keys=True)


def label(config: dict[str, Any], differing: set[str]) -> str:
    flat = flatten(config)
    parts = [config["algorithm"]["name"], config["dataset"]["name"]]
    parts += [f"{k}={flat[k]}" for k in sorted(differing) if k in flat and k not in ("algorithm.name", "dataset.name")]
    return " ".join(str(p) for p in parts)


def differing_keys(configs: list[dict[str, Any]]) -> set[str]:
    """Settings that tell the rows apart. An algorithm's own parameters count only between runs of
    that algorithm: FedDM's rho does not label it against FedAvg, which has none."""
    flats = [experiment_settings(c) for c in configs]

    def differ(group: list[dict[str, Any]], keys: set[str]) -> set[str]:
        return {k for k in keys if len({json.dumps(f.get(k)) for f in group}) > 1}

    shared = {k for f in flats for k in f if not k.startswith("algorithm.")}
    keys = differ(flats, shared | {"algorithm.name"})
    for name in {f["algorithm.name"] for f in flats}:
        group = [f for f in flats if f["algorithm.name"] == name]
        keys |= differ(group, {k for f in group for k in f if k.startswith("algorithm.")})
    return keys


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def mean_std(values: list[float | None]) -> str:
    """A fraction's mean +- sample std over seeds, as `report` shows it (raysim.results.stat)."""
    return stat(values).shown(digits=4)


def read_runs(run_dirs: list[str]) -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    return [(r.path, r.summary, r.config) for r in map(read_run, run_dirs)]


def group_runs(
    runs: list[tuple[Path, dict[str, Any], dict[str, Any]]], repeats: list[str] | None = None
) -> dict[str, list]:
    """Experiments, in the order first met: runs whose configs differ only by seed and settings that
    change no number (experiment_key) fold into one, as a list of (run_dir, summary, config), one run
    per seed: a directory given twice is read once, and a second run of a seed already counted is
    left out and described in `repeats`."""
    groups: dict[str, list] = {}
    kept: dict[tuple[str, Any], Path] = {}
    read: set[Path] = set()
    for run_dir, summary, config in runs:
        if Path(run_dir).resolve() in read:
            continue
        read.add(Path(run_dir).resolve())
        key = experiment_key(config)
        seed = config.get("seed")
        if (key, seed) in kept:
            if repeats is not None:
                repeats.append(f"{run_dir} repeats seed {seed} of {kept[(key, seed)]}: counted once")
            continue
        kept[(key, seed)] = run_dir
        groups.setdefault(key, []).append((run_dir, summary, config))
    return groups


def report(run_dirs: list[str]) -> str:
    runs = read_runs(run_dirs)
    repeats: list[str] = []
    groups = group_runs(runs, repeats)
    differing = differing_keys([c for _, _, c in runs])
    # "selected acc": the test accuracy of the model eval.selection chose without the test set (the
    # last, or federated validation's pick); "best acc (test-selected)": the best test accuracy over
    # the rounds, a figure chosen by looking at the test set.
    header = [
        "experiment",
        "seeds",
        "final acc",
        "selected acc",
        "best acc (test-selected)",
        "last-5 acc",
        "rounds",
        "MB up",
        "MB down",
        "time s",
    ]
    at = header.index("rounds")  # where the columns of some runs only go
    # Domain-skew runs (DomainNet): the papers' figure, the mean of the per-domain test accuracies.
    domains = any(s.get("final_domain_accuracy_mean") is not None for _, s, _ in runs)
    if domains:
        header.insert(at, "domain mean acc")
    # One-shot runs: the client models' own accuracy and their ensembles' (FedHydra's Tables 3 and Fig. 7).
    one_shot = [key for key in ONE_SHOT_COLUMNS if any(s.get(key) is not None for _, s, _ in runs)]
    header[at:at] = [ONE_SHOT_COLUMNS[key] for key in one_shot]
    targets = sorted({t for _, s, _ in runs for t in s.get("rounds_to_accuracy") or {}}, key=float)
    header += [f"rounds@{t}" for t in targets]
    rows = []
    for members in groups.values():
        summaries = [s for _, s, _ in members]
        unfinished = sum(1 for s in summaries if s.get("finished") is False)
        rows.append(
            [
                label(members[0][2], differing) + (f" [{unfinished} unfinished]" if unfinished else ""),
                str(len(members)),
                mean_std([s["final_accuracy"] for s in summaries]),
                mean_std([s["selected_accuracy"] for s in summaries]),
                mean_std([s["best_accuracy"] for s in summaries]),
                mean_std([s.get("last5_accuracy") for s in summaries]),  # absent from format-1 runs
                "/".join(sorted({str(s["rounds"]) for s in summaries})),
                f"{np.mean([s['bytes_up'] for s in summaries]) / 1e6:.2f}",
                f"{np.mean([s['bytes_down'] for s in summaries]) / 1e6:.2f}",
                f"{np.mean([s['wall_time_s'] for s in summaries]):.1f}",
                *[rounds_to(summaries, t) for t in targets],
            ]
        )
        # The header's order: the one-shot columns were inserted at `at` after the domain column.
        if domains:
            rows[-1].insert(at, mean_std([s.get("final_domain_accuracy_mean") for s in summaries]))
        rows[-1][at:at] = [mean_std([s.get(key) for s in summaries]) for key in one_shot]
    text = table(header, rows)
    notes = (
        repeats
        + [
            f"{run_dir} is unfinished ({summary.get('rounds')} of {summary.get('rounds_planned', '?')} rounds): "
            f"its figures are those of its last round so far (continue it with 'raysim run --resume {run_dir}')"
            for members in groups.values()
            for run_dir, summary, _ in members
            if summary.get("finished") is False
        ]
        + [
            line
            for members in groups.values()
            for run_dir, summary, config in members
            if (line := diverged_note(RunRecord(run_dir, summary, config)))
        ]
    )
    if notes:
        text += "\n" + "\n".join(f"note: {line}" for line in notes)
    clients = client_table(groups, differing)
    return f"{text}\n\n{clients}" if clients else text


def diverged_note(record: RunRecord) -> str | None:
    """A line for a run whose model diverged, or whose metrics cannot tell (the report itself needs
    only its summary, so unreadable metrics do not refuse it); None otherwise."""
    try:
        at = record.diverged_at()
    except RaysimError as exc:
        return f"{record.path}: whether its model diverged is not known ({exc})"
    return None if at is None else f"{record.path} diverged at round {at}: its test loss is not finite from then on"


ONE_SHOT_COLUMNS = {
    "best_client_accuracy": "best client acc",
    "ensemble_accuracy": "ensemble acc",
    "teacher_accuracy": "teacher acc",
    "teacher_accuracy_given_label": "teacher acc given label",
    "ensemble_accuracy_stratified_unscaled": "label-weighted acc",
    "ensemble_accuracy_stratified_unscaled_given_label": "label-weighted given label",
    "ensemble_accuracy_stratified": "eq. 8-11 acc",
    "ensemble_accuracy_stratified_given_label": "eq. 8-11 given label",
}
MAX_CLIENT_COLUMNS = 10


def table(header: list[str], rows: list[list[str]]) -> str:
    return text_table(header, rows)


def client_table(groups: dict[str, list], differing: set[str]) -> str:
    """Each client model's own test accuracy (one-shot runs with at most MAX_CLIENT_COLUMNS clients)."""
    with_clients = [m for m in groups.values() if all(s.get("client_accuracy") for _, s, _ in m)]
    if not with_clients:
        return ""
    ids = sorted({k for m in with_clients for _, s, _ in m for k in s["client_accuracy"]}, key=int)
    if len(ids) > MAX_CLIENT_COLUMNS:
        return ""
    header = ["client models' own accuracy", *[f"client {k}" for k in ids]]
    rows = []
    for members in with_clients:
        models = members[0][1].get("client_models", {})
        arch = {str(k): name for name, ks in models.items() for k in ks}
        rows.append(
            [
                label(members[0][2], differing),
                *[
                    mean_std([s["client_accuracy"].get(k) for _, s, _ in members])
                    + (f" ({arch[k]})" if k in arch else "")
                    for k in ids
                ],
            ]
        )
    return table(header, rows)


PLOT_FORMATS = (".png", ".pdf", ".svg")


def check_plot_path(path: str | Path) -> Path:
    path = Path(path)
    check_plot_file(path)
    if path.suffix.lower() not in PLOT_FORMATS:
        raise RaysimError(f"--plot {path}: the file name must end in {', '.join(PLOT_FORMATS)}")
    return path


def check_plot_file(path: Path) -> None:
    """--plot names a file that can be written: not a folder, not under a file."""
    if path.is_dir():
        raise RaysimError(f"--plot {path} is a folder: give a file name in it (e.g. {path / 'plot.png'})")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise RaysimError(f"--plot {path}: '{parent}' is a file, not a folder: give another path")


def report_figure(run_dirs: list[str]):
    """The curves of `report`'s experiments (seeds folded as in its table): raysim.plots.curves_figure."""

    runs = read_runs(run_dirs)
    curves = {run_dir: read_curves(run_dir) for run_dir, _, _ in runs}  # every run checked before drawing
    differing = differing_keys([c for _, _, c in runs])
    return curves_figure(
        {label(members[0][2], differing): [curves[d] for d, _, _ in members] for members in group_runs(runs).values()}
    )


def plot_report(run_dirs: list[str], path: str | Path) -> Path:
    """Write report_figure(run_dirs) to `path` (.png, .pdf or .svg)."""

    path = check_plot_path(path)
    figure = report_figure(run_dirs)
    try:
        save_figure(figure, path)
    except OSError as exc:
        raise RaysimError(f"cannot write the plot '{path}': {exc.strerror or exc}") from None
    return path
