"""summary.json's content: built from the config and the run's metrics history (what metrics.parquet
holds, earlier rounds of a resumed run included), plus what only the server knows at the end (the
method's own models, its extra keys, the wall time, the peak memory).

Model selection without the test set (eval.selection): selected_round is the last evaluated round
(`final`), or (`federated`) the candidate round with the highest validation_accuracy (the earliest on
a tie); selected_accuracy is that round's test accuracy. From the history, so that a resumed run
picks as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from raysim.config import Config
from raysim.outputs.metrics import PHASE_MACS, PHASE_SECONDS, MetricsTable, phase_macs
from raysim.run_format import RUN_FORMAT

LAST_EVALUATIONS = 5  # summary.json's last5_accuracy


def rounds_to_accuracy(accuracy: list[tuple[int, float]], targets: list[float]) -> dict[str, int | None]:
    """summary.json's rounds_to_accuracy: for each target ("0.8"), the first round whose test accuracy
    reaches it (rounds as metrics.parquet numbers them; with eval.every > 1, the first evaluated one),
    None if none did. `accuracy` is the run's (round, accuracy) history, in round order."""
    return {str(float(t)): next((r for r, a in accuracy if a >= t), None) for t in targets}


def selected_model(
    selection: str, accuracy: list[tuple[int, float]], validation: list[tuple[int, float]]
) -> tuple[int | None, float | None]:
    """(round, test accuracy) of the model eval.selection picks: `final`, the last evaluated round;
    `federated`, the round of `validation` (its (round, validation_accuracy) history) scoring the
    highest, the earliest on a tie."""
    if selection == "federated":
        if not validation:
            return None, None
        chosen = max(validation, key=lambda rv: (rv[1], -rv[0]))[0]
        return chosen, dict(accuracy).get(chosen)
    return accuracy[-1] if accuracy else (None, None)


def run_summary(
    config: Config,
    metrics: MetricsTable,
    *,
    completed: int,
    finished: bool,
    own_model: Callable[[int], bool],
    extras: dict[str, Any],
    wall_time_s: float,
    peak_memory_mb: dict[str, float | None],
    architectures: list[str] | None = None,
    domains: list[str] = (),
) -> dict[str, Any]:
    """summary.json. `own_model(round)`: whether that round's global model is the method's own
    (Algorithm.own_model); `extras`: the keys the run's log and the algorithm add, last;
    `architectures`: with clients.models, each client's architecture (described); `domains`:
    domain-skew data's domain names."""
    accuracy = metrics.server_values("accuracy")
    loss = metrics.server_values("loss")
    # the best of the method's own models (Algorithm.own_model), the earliest round on a tie
    own = [(r, v) for r, v in accuracy if own_model(r)] or accuracy
    best_round, best = max(own, key=lambda rv: (rv[1], -rv[0])) if own else (None, None)
    federated = config.eval.selection == "federated"
    validation = metrics.server_values("validation_accuracy") if federated else []
    selected_round, selected = selected_model(config.eval.selection, accuracy, validation)
    return {
        "run_format": RUN_FORMAT,  # how a later raysim reads this directory (raysim.run_format)
        "algorithm": config.algorithm.name,
        "dataset": config.dataset.name,
        "evaluated_on": config.eval.split,  # test, or the held-out validation share of the training split
        "seed": config.seed,
        "rounds": completed,
        "rounds_planned": config.rounds,
        "finished": finished,
        "final_accuracy": accuracy[-1][1] if accuracy else None,
        "final_loss": loss[-1][1] if loss else None,
        # the best test accuracy over the evaluated rounds: chosen by looking at the test set
        "best_accuracy": best,
        "best_round": best_round,
        # the model chosen without the test set (eval.selection), and its test accuracy
        "selection": config.eval.selection,
        "selected_round": selected_round,
        "selected_accuracy": selected,
        # DynaFed's reported metric: the mean test accuracy of the last LAST_EVALUATIONS evaluations
        "last5_accuracy": float(np.mean([v for _, v in accuracy[-LAST_EVALUATIONS:]])) if accuracy else None,
        **({"rounds_to_accuracy": rounds_to_accuracy(accuracy, config.eval.targets)} if config.eval.targets else {}),
        "bytes_up": sum(v for _, v in metrics.server_values("bytes_up")),
        "bytes_down": sum(v for _, v in metrics.server_values("bytes_down")),
        **(validation_bytes(metrics) if federated else {}),
        "wall_time_s": wall_time_s,
        # the peak memory of a client actor's process and of the server's, in MiB (on CUDA: tensors
        # on the GPU), over this process's life (a resumed run: since it resumed)
        "peak_memory_mb": peak_memory_mb,
        **achieved_rates(metrics),
        **client_models(architectures),
        **domain_summary(metrics, domains),
        **extras,
    }


def achieved_rates(metrics: MetricsTable) -> dict[str, Any]:
    """With eval.count_macs: each counted phase's achieved GMAC/s over the run, its multiply-accumulates
    over its wall time (the clients' phase: every actor's clients together, in the phase's wall
    time). `raysim bench cell` sets these beside the machine's measured peak."""
    macs = phase_macs(metrics.rows)
    rates = {}
    for phase in PHASE_MACS:
        seconds = sum(v for _, v in metrics.server_values(PHASE_SECONDS[phase]))
        if macs[phase] and seconds > 0:
            rates[phase] = macs[phase] / seconds / 1e9
    return {"gmacs_per_s": rates} if rates else {}


def validation_bytes(metrics: MetricsTable) -> dict[str, int]:
    """With federated selection: the part of bytes_up and bytes_down that validation moved."""
    return {
        key: sum(v for _, v in metrics.server_values(key)) for key in ("bytes_validation_up", "bytes_validation_down")
    }


def client_models(architectures: list[str] | None) -> dict[str, Any]:
    """With clients.models: which clients have which architecture."""
    if architectures is None:
        return {}
    groups: dict[str, list[int]] = {}
    for k, arch in enumerate(architectures):
        groups.setdefault(arch, []).append(k)
    return {"client_models": groups}


def domain_summary(metrics: MetricsTable, domains: list[str]) -> dict[str, Any]:
    """Domain-skew runs: the last evaluation's per-domain accuracies and their mean (the papers' figure)."""
    if not domains:
        return {}

    def last(metric: str) -> float | None:
        values = metrics.server_values(metric)
        return values[-1][1] if values else None

    return {
        "final_domain_accuracy_mean": last("domain_accuracy_mean"),
        "final_domain_accuracy": {name: last(f"domain_accuracy/{name}") for name in domains},
    }
