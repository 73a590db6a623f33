"""One experiment from config to run directory: prepare (no Ray), the run directory, then drive the
rounds on the engine (raysim.engine.start starts it) with the driver's callbacks (the progress bar)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from raysim import compiled, precision
from raysim.algorithm import Algorithm, ModelSpec
from raysim.config import Config, dump_config
from raysim.data import ArrayDataset, load_dataset
from raysim.data.arrays import with_validation_split
from raysim.data.identity import DataIdentity, array_digest, identity_of
from raysim.engine.start import running_engine
from raysim.errors import RaysimError, disk_full, first_line
from raysim.outputs.callbacks import Callback, RoundResult, RunStart
from raysim.outputs.received import WRITTEN_BY_A_RUN, check_fresh_out
from raysim.outputs.run_dir import RunDir
from raysim.outputs.run_lock import lock_run_dir, owning, unlock_run_dir
from raysim.outputs.safe_write import write_text
from raysim.partition import class_counts, hold_out, partition, validating_clients
from raysim.registry import algorithm_class
from raysim.results import at_round, first_nonfinite_round, read_curves
from raysim.resume import check_resumable, record_data
from raysim.seeding import PARTITION, VALIDATION, numpy_rng


@dataclass
class Experiment:
    """Everything decided before Ray starts: data, partition, model shape."""

    config: Config
    algorithm: type[Algorithm]  # its class, resolved once here: the server and the clients make it from this
    dataset: ArrayDataset
    parts: list[np.ndarray]
    counts: np.ndarray  # (clients, classes)
    spec: ModelSpec
    mean: np.ndarray
    std: np.ndarray
    data: DataIdentity  # what was read (before any validation split): recorded in the run directory
    data_digest: str | None = None  # for algorithms with needs_data_digest (ctx.data_digest)
    # eval.selection=federated: each client's held-out share (`parts` is then what it trains on)
    holdout: list[np.ndarray] | None = None


def prepare(config: Config) -> Experiment:
    if config.dataset.name == "embedded" and config.dataset.root is not None:
        # Not an error (the run is valid), but a user who set a root almost surely meant another dataset.
        print(
            f"note: dataset.root={config.dataset.root} is ignored: the embedded dataset ships inside raysim "
            f"(set dataset.name, e.g. dataset.name=fashion_mnist, to read files under that root)",
            file=sys.stderr,
        )
    dataset, identity = read_data(config)
    if config.eval.split == "validation":  # the same held-out images for every seed (seeded by 0)
        dataset = with_validation_split(dataset, config.eval.validation_fraction, numpy_rng(0, VALIDATION))
    p = config.partition
    seed = config.seed if p.seed is None else p.seed
    parts = partition(
        dataset.train_y,
        config.clients.num,
        p.kind,
        numpy_rng(seed, PARTITION),
        alpha=p.alpha,
        min_size=p.min_size,
        max_tries=p.max_tries,
        classes_per_client=p.classes_per_client,
        domains=dataset.train_domain,
        num_classes=dataset.num_classes,
    )
    empty = [k for k, idx in enumerate(parts) if len(idx) == 0]
    if empty:
        raise RaysimError(
            f"{len(empty)} clients got no data with partition.kind={p.kind} "
            f"(first: client {empty[0]}): use fewer clients or another partition"
        )
    holdout = None
    if config.eval.selection == "federated":  # the clients train on the rest (digest and counts included)
        parts, holdout = hold_out(parts, config.eval.client_holdout, seed)
        validators = validating_clients(config.clients.num, config.eval.select_clients, config.seed)
        if not any(len(holdout[k]) for k in validators):
            raise RaysimError(
                f"eval.client_holdout={config.eval.client_holdout} holds out no example of the validating "
                "clients (they hold too few): raise eval.client_holdout or eval.select_clients"
            )
    spec = ModelSpec(config, dataset.channels, dataset.num_classes, dataset.image_size)
    check_models(spec)
    mean, std = normalisation(config, dataset)
    algorithm = algorithm_class(config.algorithm.name)
    digest = data_digest(dataset, parts) if algorithm.needs_data_digest else None
    counts = class_counts(dataset.train_y, parts, dataset.num_classes)
    return Experiment(config, algorithm, dataset, parts, counts, spec, mean, std, identity, digest, holdout)


def read_data(config: Config) -> tuple[ArrayDataset, DataIdentity]:
    """The config's dataset, checked against what its name promises (unless dataset.verify is
    false), and its identity."""
    d = config.dataset
    dataset = load_dataset(d.name, d.root, d.image_size, verify=d.verify)
    return dataset, identity_of(dataset, d.name)


def normalisation(config: Config, dataset: ArrayDataset) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std: the config's fixed constants, else the training split's own."""
    d = config.dataset
    if d.mean is None:
        return dataset.mean_std()
    for key, values in (("mean", d.mean), ("std", d.std)):
        if len(values) != dataset.channels:
            raise RaysimError(
                f"dataset.{key} has {len(values)} values but {d.name} has {dataset.channels} channel(s): "
                "give one per channel"
            )
    return np.asarray(d.mean, dtype=np.float32), np.asarray(d.std, dtype=np.float32)


def data_digest(dataset: ArrayDataset, parts: list[np.ndarray]) -> str:
    """A hash of exactly what the clients train on: the training arrays and each client's indices."""
    return array_digest(dataset.train_x, dataset.train_y, *parts)


def check_models(spec: ModelSpec) -> None:
    """Every architecture of the run builds for this data, and the algorithm can use them: before Ray starts."""
    for arch in {a.describe(): a for a in [spec.config.model, *spec.architectures]}.values():
        spec.build("cpu", arch)
    cls = algorithm_class(spec.config.algorithm.name)
    if spec.heterogeneous and not cls.supports_client_models:
        raise RaysimError(
            f"algorithm '{spec.config.algorithm.name}' needs every client to have the server's "
            "model (it combines their weights): remove clients.models or choose an algorithm "
            "for heterogeneous models"
        )
    cls.check_models(spec)
    cls.check_inputs(spec.config)


# Fresh run directories this process made: (resolved path) -> what was there before (folder, data.json,
# .lock), so that a run refused before its first round removes only what it added.
_fresh: dict[Path, tuple[bool, bool, bool]] = {}


def new_run_dir(config: Config, out: str | None) -> RunDir:
    """The run's folder, created and locked: --out, or a new one under output.dir named after the run.
    A folder holding what a run writes is refused before anything is created in it
    (raysim.outputs.received.check_fresh_out)."""

    if out:
        path = Path(out)
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(config.output.dir) / f"{config.algorithm.name}-{config.dataset.name}-s{config.seed}-{stamp}"
    run_dir = RunDir(path)
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            raise RaysimError(
                f"--out '{run_dir}': '{parent}' is a file, not a folder: give a new or existing folder for the run"
            )
    check_fresh_out(path)
    before = (path.is_dir(), run_dir.data_file.exists(), run_dir.lock_file.exists())
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RaysimError(
            f"cannot create the run directory '{run_dir}' ({exc.strerror}): choose another --out"
        ) from None
    lock_run_dir(run_dir)  # held until this process ends: a second run with the same --out is refused
    if run_dir.config_file.exists():
        unlock_run_dir(run_dir)
        raise RaysimError(
            f"'{run_dir}' already holds a run: continue it with 'raysim run --resume {run_dir}' or choose another --out"
        )
    _fresh[path.resolve()] = before
    return run_dir


def discard_unstarted_run(run_dir: RunDir) -> None:
    """Remove what this process added to a fresh run directory in which no round ran (its config,
    data record and lock; the folder if it made it), so that the same --out works again and a folder
    that was there is left as it was."""

    before = _fresh.pop(run_dir.path.resolve(), None)
    if before is None or any(os.path.lexists(run_dir.path / name) for name in WRITTEN_BY_A_RUN):
        return
    had_folder, had_data, had_lock = before
    unlock_run_dir(run_dir)
    run_dir.config_file.unlink(missing_ok=True)
    if not had_data:
        run_dir.data_file.unlink(missing_ok=True)
    if not had_lock:
        run_dir.lock_file.unlink(missing_ok=True)
    if not had_folder:
        try:
            run_dir.path.rmdir()
        except OSError:
            pass


def run_experiment(
    config: Config,
    run_dir: Path | RunDir,
    address: str | None = None,
    callbacks: list[Callback] = (),
    experiment: Experiment | None = None,
    accept_data: bool = False,
) -> dict[str, Any]:
    """Run (or continue) the experiment in `run_dir` and return its summary: the round loop.
    `accept_data`: a resume of a run that records no data.json goes on with the data at hand even
    where its checkpoint names another dataset (--accept-data).

    The run directory's outputs are the server's callbacks; `callbacks` run here, on the driver,
    with the same results (progress bars, Tune reports, benchmarks, fault tests). Their
    `on_run_start` gets the client actors once they are up.
    """
    exp = experiment or prepare(config)
    run_dir = RunDir(run_dir)
    with owning(run_dir):
        record_data(run_dir, exp.data, config.dataset.root, accept_data)  # before Ray starts: a refusal is one line
        return _drive(config, exp, run_dir, address, callbacks)


def _drive(
    config: Config, exp: Experiment, run_dir: RunDir, address: str | None, callbacks: list[Callback]
) -> dict[str, Any]:
    """The round loop on Ray (or in process), with run_dir's lock held."""
    check_resumable(run_dir)  # before the engine starts: a refusal is one line, not an actor's traceback
    # in process, the run's actors set this process's precision and compile setting: given back afterwards
    with precision.kept(), compiled.kept(), running_engine(config, exp, run_dir, address) as engine:
        server, actors, get = engine.server, engine.actors, engine.store.get
        run_dir.write_actors(get([a.info.remote() for a in actors]), exp.spec.heterogeneous)
        start = RunStart(get(server.completed_rounds.remote()), config.rounds, actors)
        # Only now: a resume whose checkpoint cannot be read leaves the run's config as it was.
        run_dir.write_config(dump_config(config))
        for callback in callbacks:
            callback.on_run_start(start)
        for round_index in range(start.completed_rounds + 1, config.rounds + 1):
            result = get(server.run_round.remote(round_index))
            for callback in callbacks:
                callback.on_round_end(result)
        summary = get(server.finish.remote())
        for callback in callbacks:
            callback.on_run_end(summary)
        return summary


def failure_message(exc: Exception, run_dir) -> tuple[str | None, bool]:
    """One line for a run that failed outside raysim's own checks (a full disk, Ray itself), and
    whether the run was refused while starting (nothing ran); (None, False) for anything else."""
    full = disk_full(exc)
    if full is not None:
        return (
            f"no space left on device ({full}): finished rounds are kept; free some space (or move the run "
            f"directory to a larger disk) and continue with 'raysim run --resume {run_dir}'"
        ), False
    if not is_ray_error(exc):
        return None, False
    raised = str(exc).rsplit("RaysimError: ", 1)
    if getattr(exc, "actor_init_failed", False) and len(raised) == 2:
        # the server refused the run while starting (e.g. an algorithm's data are missing): Ray keeps
        # only the creation task's traceback as text, whose last RaysimError line is the message
        return raised[1].strip().splitlines()[0], True
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not is_ray_error(cause):
        # code in an actor raised: name its error (Ray's own first line only names the actor's
        # method) and keep the whole remote traceback beside the run
        log = Path(run_dir) / "error.log"
        try:
            write_text(log, str(exc) + "\n")  # never through a link planted in the run directory
            where = f"; traceback in {log}"
        except OSError:
            where = ""
        return (
            f"an actor failed during the run ({type(cause).__name__}: {first_line(cause)}){where}; finished "
            f"rounds are kept: continue with 'raysim run --resume {run_dir}'"
        ), False
    return (
        f"Ray failed during the run ({type(exc).__name__}: {first_line(exc)}); finished rounds are kept: "
        f"continue with 'raysim run --resume {run_dir}'"
    ), False


def is_ray_error(exc: BaseException) -> bool:
    """Whether Ray raised `exc` (without importing Ray: where it was never imported, it raised nothing)."""
    exceptions = sys.modules.get("ray.exceptions")
    return exceptions is not None and isinstance(exc, exceptions.RayError)


def one_line_summary(summary: dict[str, Any], run_dir: Path) -> str:
    def mb(x: float) -> str:
        return f"{x / 1e6:.1f} MB"

    best = summary["best_accuracy"]
    return (
        f"{summary['algorithm']} on {summary['dataset']} (seed {summary['seed']}): "
        f"final {'validation ' if summary.get('evaluated_on') == 'validation' else ''}"
        f"accuracy {summary['final_accuracy']:.4f}, best {best:.4f} (round {summary['best_round']}), "
        f"{summary['rounds']} rounds, up {mb(summary['bytes_up'])}, down {mb(summary['bytes_down'])}, "
        f"{summary['wall_time_s']:.1f} s -> {run_dir}"
    )


def run_with_progress(
    config: Config,
    run_dir: Path | RunDir,
    address: str | None = None,
    experiment: Experiment | None = None,
    accept_data: bool = False,
) -> dict[str, Any]:
    """run_experiment with a progress bar on stderr and the one-line summary on stdout."""
    exp = experiment or prepare(config)
    bar = ProgressBar(run_dir.name, run_dir)
    try:
        summary = run_experiment(config, run_dir, address, callbacks=[bar], experiment=exp, accept_data=accept_data)
    finally:
        bar.close()
    print(one_line_summary(summary, run_dir))
    return summary


class ProgressBar(Callback):
    """A bar on stderr: rounds, accuracy, bytes moved. It appears once the actors are up, so that a
    run refused for its resources prints only the error. Given the run directory, a resumed run's
    bar counts the bytes its finished rounds moved and does not say again that its model diverged
    before the resume."""

    def __init__(self, name: str, run_dir: str | Path | RunDir | None = None):
        self.name, self.run_dir, self.bar, self.moved, self.diverged = name, run_dir, None, 0.0, False

    def on_run_start(self, start: RunStart) -> None:

        if start.completed_rounds and self.run_dir is not None:
            self._carry_on(start.completed_rounds)

        self.bar = tqdm(
            total=start.rounds,
            initial=start.completed_rounds,
            desc=self.name,
            unit="round",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def on_round_end(self, result: RoundResult) -> None:
        values = result.values
        self.moved += values["bytes_up"] + values["bytes_down"]
        postfix = {"acc": f"{values['accuracy']:.4f}"} if "accuracy" in values else {}
        postfix["moved"] = f"{self.moved / 1e6:.1f}MB"
        restarts = int(values.get("actor_restarts", 0))
        if restarts:
            self.bar.write(
                f"round {result.round}: {restarts} client actor restart(s) (Ray restarted a crashed "
                "actor; its clients' steps re-ran from their saved state, with the same numbers)",
                file=sys.stderr,
            )
        loss = values.get("loss")
        if loss is not None and not math.isfinite(loss) and not self.diverged:
            self.diverged = True  # said once: every later round's loss is the same
            self.bar.write(
                f"round {result.round}: the global model's test loss is {loss}: the model diverged (its weights "
                "overflowed) and its accuracy is a constant guess from here; the run goes on to its last round",
                file=sys.stderr,
            )
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def _carry_on(self, completed: int) -> None:
        """The bytes moved and the divergence of a resumed run's finished rounds, from its metrics
        (rows past the checkpoint's round were written by a round that runs again: not counted)."""

        curves = read_curves(self.run_dir)
        self.moved = (at_round(curves["mb_moved"], completed) or 0.0) * 1e6
        rounds, losses = curves["loss"]
        self.diverged = first_nonfinite_round((rounds[rounds <= completed], losses[rounds <= completed])) is not None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
