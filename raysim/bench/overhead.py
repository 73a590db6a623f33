"""`raysim bench overhead`: the engine's FedAvg rounds against a hand-written two-process loop.

Both do the same client work (same clients, data, model, local epochs, seeds), the same
aggregation and the same test evaluation, with the same number of single-threaded workers: the
engine as `actors` Ray actors x 1 thread, running its one round loop (`raysim.runner`) with a
timing callback; the plain loop as `actors` worker processes x 1 thread, each training its share
of the clients with a few lines of PyTorch, the parent averaging and evaluating. Runs are
interleaved (engine, plain, engine, plain, ...) because timing on a shared machine drifts; the
first round of each run (actor start-up, data loading) is reported separately and the ratio
compares steady-state rounds.

Per sampled client, each side also reports the cost beyond the clients' own compute: the
training phase (broadcast sent to last reply received) minus the clients' summed compute time
divided by the number of workers, over the clients of the round. That figure also holds the
imbalance between workers (one finishing before the other), which on a shared machine is mostly
the two cores running at different speeds; so both sides also report the phase minus the
busiest worker's compute, the cost of the machinery alone. Peak memory is the summed PSS of
the driver and every process it started (Ray's workers, raylet, GCS), sampled during the engine
run (from /proc/PID/smaps_rollup, so sampling costs next to nothing).
"""

from __future__ import annotations

import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from raysim.config import Config
from raysim.data.home import dataset_folder
from raysim.engine.client_runtime import to_model_input
from raysim.engine.placement import assign_clients
from raysim.engine.ray_session import ray_session
from raysim.experiment import config_from_dict
from raysim.outputs.callbacks import Callback, RoundResult, RunStart
from raysim.runner import prepare, run_experiment
from raysim.seeding import CLIENT_TRAIN, derive_seed, torch_generator
from raysim.tensors import load_weights, module_weights, weighted_average
from raysim.training import evaluate

DEFAULTS = {
    "clients": 100,
    "actors": 2,
    "rounds": 3,
    "repeats": 2,
    "epochs": 1,
    "model": "cnn2",
    "dataset": "mnist",
    "root": None,
}


def _bench_config(opts: dict) -> Config:
    root = opts["root"]
    if opts["dataset"] == "mnist" and root is None:  # the data home's MNIST, else the shared copy, else embedded
        for candidate in (
            dataset_folder("mnist", None),
            Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist",
        ):
            if candidate.is_dir():
                root = str(candidate)
                break
        if root is None:
            opts["dataset"] = "embedded"
    return config_from_dict(
        {
            "seed": 0,
            "rounds": int(opts["rounds"]),
            "dataset": {"name": opts["dataset"], "root": root},
            "partition": {"kind": "dirichlet", "alpha": 0.5},
            "clients": {"num": int(opts["clients"]), "per_round": int(opts["clients"])},
            "model": {"name": opts["model"]},
            "local": {"epochs": int(opts["epochs"]), "batch_size": 64, "lr": 0.01, "momentum": 0.9},
            "algorithm": {"name": "fedavg"},
            "resources": {"actors": int(opts["actors"]), "cpus_per_actor": 1, "num_cpus": int(opts["actors"])},
            "output": {"tensorboard": False},
        }
    )


def _pss_bytes(pid: int) -> int:
    """Proportional set size of one process from /proc/PID/smaps_rollup (cheap: summed by the kernel)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _process_tree_pss() -> int:
    """PSS of this process and every process it started (Ray's workers, raylet, GCS, ...)."""

    me = psutil.Process()
    return sum(_pss_bytes(p.pid) for p in [me, *me.children(recursive=True)])


class PeakMemory:
    def __init__(self, interval: float = 1.0):
        self.peak, self.interval, self._stop = 0, interval, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _process_tree_pss())
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def per_client_costs(
    phase: float, compute: dict[int, float], owner: dict[int, int], workers: int
) -> tuple[float, float]:
    """(phase - summed compute / workers, phase - the busiest worker's compute), per client."""
    per_worker = [0.0] * workers
    for client, seconds in compute.items():
        per_worker[owner[client]] += seconds
    clients = len(compute)
    return (phase - sum(per_worker) / workers) / clients, (phase - max(per_worker)) / clients


class RoundTimer(Callback):
    """Round times, accuracies and the engine's cost per client beyond the clients' compute."""

    def __init__(self, workers: int, owner: dict[int, int]):
        self.workers, self.owner = workers, owner
        self.times: list[float] = []
        self.accuracy: list[float] = []
        self.per_client_cost: list[float] = []
        self.beyond_busiest: list[float] = []
        self.last = time.perf_counter()

    def on_run_start(self, start: RunStart) -> None:
        self.last = time.perf_counter()

    def on_round_end(self, result: RoundResult) -> None:
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now
        self.accuracy.append(result.values["accuracy"])
        compute = {client: v for client, name, v in result.client_values if name == "time_s"}
        mean, busiest = per_client_costs(result.values["time_clients_s"], compute, self.owner, self.workers)
        self.per_client_cost.append(mean)
        self.beyond_busiest.append(busiest)


def engine_rounds(config: Config, experiment) -> tuple[RoundTimer, float]:
    """The timings and peak memory (bytes) of a full engine run."""

    timer = RoundTimer(
        config.resources.actors, assign_clients([len(p) for p in experiment.parts], config.resources.actors)
    )
    with tempfile.TemporaryDirectory() as tmp, PeakMemory() as memory:
        run_experiment(config, Path(tmp), callbacks=[timer], experiment=experiment)
    return timer, memory.peak


def _plain_worker(connection, clients: dict, local: dict) -> None:
    """A worker process of the plain loop: one torch thread, its clients' tensors kept for the run.
    Each round: receive (round, weights, seed), train every client, send back their weights."""

    torch.set_num_threads(1)
    model = connection.recv()
    while True:
        order = connection.recv()
        if order is None:
            return
        round_index, weights, seed = order
        replies = []
        for k, (x, y) in clients.items():
            start = time.perf_counter()
            torch.manual_seed(derive_seed(seed, CLIENT_TRAIN, round_index, k))
            generator = torch_generator(seed, CLIENT_TRAIN, round_index, k)
            model.load_state_dict({n: torch.as_tensor(np.asarray(w)) for n, w in weights.items()})
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=local["lr"], momentum=local["momentum"])
            for _ in range(local["epochs"]):
                permutation = torch.randperm(len(y), generator=generator)
                for i in range(0, len(y), local["batch_size"]):
                    batch = permutation[i : i + local["batch_size"]]
                    optimizer.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x[batch]), y[batch]).backward()
                    optimizer.step()
            trained = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
            replies.append((k, len(y), trained, time.perf_counter() - start))
        connection.send(replies)


def plain_rounds(config: Config, experiment) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """The same rounds without Ray: `actors` worker processes (pipes), the parent averaging and
    evaluating. Returns (seconds per round, accuracies, per_client_costs of each round)."""

    workers = int(config.resources.actors)
    owner = assign_clients([len(idx) for idx in experiment.parts], workers)
    data = experiment.dataset
    local = {
        "lr": config.local.lr,
        "momentum": config.local.momentum,
        "epochs": config.local.epochs,
        "batch_size": config.local.batch_size,
    }
    model = experiment.spec.initial_model()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing inherited from Ray
    pipes, processes = [], []
    for w in range(workers):
        clients = {
            k: (
                to_model_input(data.train_x[idx], experiment.mean, experiment.std, "cpu"),
                torch.from_numpy(np.asarray(data.train_y[idx], dtype=np.int64)),
            )
            for k, idx in enumerate(experiment.parts)
            if owner[k] == w
        }
        parent, child = context.Pipe()
        process = context.Process(target=_plain_worker, args=(child, clients, local), daemon=True)
        process.start()
        parent.send(experiment.spec.build("cpu"))
        pipes.append(parent)
        processes.append(process)
    threads = torch.get_num_threads()
    torch.set_num_threads(workers)  # the parent evaluates with every core, as the engine's server does
    test_x = to_model_input(data.test_x, experiment.mean, experiment.std, "cpu")
    test_y = torch.from_numpy(np.asarray(data.test_y, dtype=np.int64))
    weights = module_weights(model)
    times, accuracy, cost = [], [], []
    try:
        for round_index in range(1, config.rounds + 1):
            start = time.perf_counter()
            for pipe in pipes:
                pipe.send((round_index, weights, config.seed))
            replies = sorted((reply for pipe in pipes for reply in pipe.recv()), key=lambda r: r[0])
            trained = time.perf_counter()
            weights = weighted_average([r[2] for r in replies], [r[1] for r in replies])
            load_weights(model, weights)
            accuracy.append(evaluate(model, test_x, test_y, config.eval.batch_size)[0])
            times.append(time.perf_counter() - start)
            cost.append(per_client_costs(trained - start, {r[0]: r[3] for r in replies}, owner, workers))
    finally:
        for pipe in pipes:
            pipe.send(None)
        for process in processes:
            process.join(timeout=30)
        torch.set_num_threads(threads)
    return times, accuracy, cost


def overhead(opts: dict) -> None:

    config = _bench_config(opts)
    experiment = prepare(config)
    workers = config.resources.actors
    print(
        f"FedAvg, {config.dataset.name}, {config.clients.num} clients a round, model {config.model.name}, "
        f"{config.rounds} rounds x {config.local.epochs} local epoch(s); engine: {workers} actors x 1 thread; "
        f"plain loop: {workers} processes x 1 thread"
    )
    engine_steady, plain_steady, engine_cost, plain_cost, peaks = [], [], [], [], []
    engine_busiest, plain_busiest = [], []

    def steady(values):  # rounds after the first
        return float(np.mean(values[1:] or values))

    # One Ray for all repeats (idle while the plain loop runs), so no repeat overlaps the
    # previous one's shutdown.
    with ray_session(config.resources):
        for repeat in range(int(opts["repeats"])):
            engine, peak = engine_rounds(config, experiment)
            plain, plain_acc, plain_per_client = plain_rounds(config, experiment)
            engine_steady.append(steady(engine.times))
            plain_steady.append(steady(plain))
            engine_cost.append(steady(engine.per_client_cost))
            engine_busiest.append(steady(engine.beyond_busiest))
            plain_cost.append(steady([mean for mean, _ in plain_per_client]))
            plain_busiest.append(steady([busiest for _, busiest in plain_per_client]))
            peaks.append(peak)
            print(
                f"repeat {repeat + 1}: engine round 1 {engine.times[0]:.2f} s (warm-up), later rounds "
                f"{engine_steady[-1]:.2f} s; plain loop rounds {plain_steady[-1]:.2f} s; "
                f"ratio {engine_steady[-1] / plain_steady[-1]:.3f}; cost per client beyond its compute (beyond "
                f"the busiest worker's): engine {engine_cost[-1] * 1e3:.2f} ms ({engine_busiest[-1] * 1e3:.2f}), "
                f"plain {plain_cost[-1] * 1e3:.2f} ms ({plain_busiest[-1] * 1e3:.2f}); peak memory "
                f"{peak / 2**30:.2f} GiB; accuracy engine {engine.accuracy[-1]:.4f} plain {plain_acc[-1]:.4f}"
            )
    ratio = float(np.mean(engine_steady) / np.mean(plain_steady))
    print(
        f"overhead ratio (engine / plain, steady-state rounds, mean of {len(peaks)}): {ratio:.3f} "
        f"(target <= 1.0); peak memory {max(peaks) / 2**30:.2f} GiB (target <= 4 GiB)"
    )
    print(
        f"cost per sampled client beyond its compute (mean of {len(peaks)}): engine "
        f"{np.mean(engine_cost) * 1e3:.2f} ms (target <= 2 ms), plain loop {np.mean(plain_cost) * 1e3:.2f} ms; "
        f"beyond the busiest worker's compute: engine {np.mean(engine_busiest) * 1e3:.2f} ms, "
        f"plain loop {np.mean(plain_busiest) * 1e3:.2f} ms"
    )
