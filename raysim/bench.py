"""`raysim bench overhead`: the engine's FedAvg rounds against a plain single-process loop.

Both do the same client work (same clients, data, model, local epochs, seeds),
the same aggregation and the same test evaluation, with the same total number
of torch threads: the engine as `actors` actors x 1 thread, the plain loop as
one process with `actors` threads. Runs are interleaved (engine, plain, engine,
plain, ...) because timing on a shared machine drifts; the first round of each
engine run (actor start-up, data loading) is reported separately and the
ratio compares steady-state rounds. Peak memory is the summed PSS of the
driver and every process it started (Ray's workers, raylet, GCS), sampled
during the engine run (from /proc/PID/smaps_rollup, so sampling costs next to nothing).
"""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from raysim.config import Config, config_from_dict
from raysim.errors import RaysimError

DEFAULTS = {"clients": 100, "actors": 2, "rounds": 3, "repeats": 2, "epochs": 1, "model": "cnn2",
            "dataset": "mnist", "root": None}


def _bench_config(opts: dict) -> Config:
    root = opts["root"]
    if opts["dataset"] == "mnist" and root is None:
        candidate = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
        root = str(candidate) if candidate.is_dir() else None
        if root is None:
            opts["dataset"] = "embedded"
    return config_from_dict({
        "seed": 0, "rounds": int(opts["rounds"]),
        "dataset": {"name": opts["dataset"], "root": root},
        "partition": {"kind": "dirichlet", "alpha": 0.5},
        "clients": {"num": int(opts["clients"]), "per_round": int(opts["clients"])},
        "model": {"name": opts["model"]},
        "local": {"epochs": int(opts["epochs"]), "batch_size": 64, "lr": 0.01, "momentum": 0.9},
        "algorithm": {"name": "fedavg"},
        "resources": {"actors": int(opts["actors"]), "cpus_per_actor": 1, "num_cpus": int(opts["actors"])},
        "output": {"tensorboard": False},
    })


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
    import psutil

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


def engine_rounds(config: Config, experiment) -> tuple[list[float], float, list[float]]:
    """(seconds per round, peak memory bytes, accuracies) of a full engine run."""
    from raysim.runner import run_experiment

    times: list[float] = []
    accuracy: list[float] = []
    last = [time.perf_counter()]

    def on_start(start, actors):
        last[0] = time.perf_counter()

    def on_round(info):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        accuracy.append(info["accuracy"])

    with tempfile.TemporaryDirectory() as tmp, PeakMemory() as memory:
        run_experiment(config, Path(tmp), on_round=on_round, on_start=on_start, experiment=experiment)
    return times, memory.peak, accuracy


def plain_rounds(config: Config, experiment) -> tuple[list[float], list[float]]:
    """The same rounds in one process, no Ray: a loop over clients, average, evaluate."""
    import torch

    from algorithms import make_algorithm
    from raysim.algorithm import Reply
    from raysim.engine.client_actor import ClientRuntime, to_model_input
    from raysim.seeding import MODEL_INIT, derive_seed
    from raysim.tensors import load_weights
    from raysim.training import evaluate

    threads = int(config.resources.actors * config.resources.cpus_per_actor)
    runtime = ClientRuntime(config, experiment.spec, experiment.dataset.train_x, experiment.dataset.train_y,
                            dict(enumerate(experiment.parts)), experiment.mean, experiment.std, None)
    torch.set_num_threads(threads)  # after ClientRuntime, which sets the per-actor count
    algorithm = make_algorithm(config)
    torch.manual_seed(derive_seed(config.seed, MODEL_INIT))
    state = algorithm.server_init(experiment.spec.build("cpu"), runtime.ctx)
    test_x = to_model_input(experiment.dataset.test_x, experiment.mean, experiment.std, runtime.device)
    test_y = torch.from_numpy(np.asarray(experiment.dataset.test_y, dtype=np.int64))
    eval_model = experiment.spec.build("cpu")
    times, accuracy = [], []
    for round_index in range(1, config.rounds + 1):
        start = time.perf_counter()
        payload = algorithm.broadcast(state, round_index)
        replies = []
        for k in range(config.clients.num):
            out = runtime.run_client(payload, round_index, k)
            replies.append(Reply(k, out["num_samples"], out["message"]))
        state = algorithm.server_update(state, replies, round_index, runtime.ctx)
        load_weights(eval_model, algorithm.global_weights(state))
        accuracy.append(evaluate(eval_model, test_x, test_y, config.eval.batch_size)[0])
        times.append(time.perf_counter() - start)
    return times, accuracy


def overhead(opts: dict) -> None:
    from raysim.engine.ray_session import ray_session
    from raysim.runner import prepare

    config = _bench_config(opts)
    experiment = prepare(config)
    print(f"FedAvg, {config.dataset.name}, {config.clients.num} clients, model {config.model.name}, "
          f"{config.rounds} rounds x {config.local.epochs} local epoch(s); engine: {config.resources.actors} "
          f"actors x 1 thread; plain loop: 1 process x {config.resources.actors} threads")
    engine_steady, plain_steady, peaks = [], [], []
    # One Ray for all repeats (idle while the plain loop runs), so no repeat overlaps the
    # previous one's shutdown.
    with ray_session(config.resources):
        for repeat in range(int(opts["repeats"])):
            times, peak, engine_acc = engine_rounds(config, experiment)
            plain, plain_acc = plain_rounds(config, experiment)
            engine_steady.append(float(np.mean(times[1:] or times)))
            plain_steady.append(float(np.mean(plain[1:] or plain)))
            peaks.append(peak)
            print(f"repeat {repeat + 1}: engine round 1 {times[0]:.2f} s (warm-up), later rounds "
                  f"{engine_steady[-1]:.2f} s; plain loop rounds {plain_steady[-1]:.2f} s; "
                  f"ratio {engine_steady[-1] / plain_steady[-1]:.3f}; peak memory {peak / 2**30:.2f} GiB; "
                  f"accuracy engine {engine_acc[-1]:.4f} plain {plain_acc[-1]:.4f}")
    ratio = float(np.mean(engine_steady) / np.mean(plain_steady))
    print(f"overhead ratio (engine / plain, steady-state rounds, mean of {len(peaks)}): {ratio:.3f} "
          f"(target <= 1.0); peak memory {max(peaks) / 2**30:.2f} GiB (target <= 4 GiB)")


CONDENSE_DEFAULTS = {"classes": 10, "ipc": 10, "real": 64, "width": 32, "image_size": 32, "channels": 3,
                     "steps": 20, "repeats": 3, "threads": 1}


def condense(opts: dict) -> None:
    """Distribution-matching steps per second: all classes in one forward pass vs a loop over classes."""
    import torch

    from raysim.condense.augment import DSA
    from raysim.condense.matching import dm_loss
    from raysim.models import build_model

    o = {k: int(v) for k, v in opts.items()}
    torch.set_num_threads(o["threads"])
    torch.manual_seed(0)
    shape = (o["channels"], o["image_size"], o["image_size"])
    model = build_model("convnet", in_channels=o["channels"], num_classes=o["classes"],
                        image_size=o["image_size"], width=o["width"]).train()
    for p in model.parameters():
        p.requires_grad_(False)
    real = [torch.randn(o["real"], *shape) for _ in range(o["classes"])]
    syn = torch.randn(o["classes"], o["ipc"], *shape, requires_grad=True)
    optimizer = torch.optim.SGD([syn], lr=1.0, momentum=0.5)
    augment = DSA()

    def steps_per_second(batched: bool) -> float:
        start = time.perf_counter()
        for step in range(o["steps"]):
            loss = dm_loss(model, real, list(syn), augment, step, batched=batched)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return o["steps"] / (time.perf_counter() - start)

    print(f"DM condensation, ConvNet width {o['width']}, {o['classes']} classes x ({o['real']} real + "
          f"{o['ipc']} synthetic) images of {shape}, DSA, {o['threads']} thread(s)")
    ratios = []
    for repeat in range(o["repeats"]):
        batched, looped = steps_per_second(True), steps_per_second(False)
        ratios.append(batched / looped)
        print(f"repeat {repeat + 1}: batched {batched:.2f} steps/s, per-class loop {looped:.2f} steps/s, "
              f"speed-up {ratios[-1]:.2f}x")
    print(f"batched / per-class speed-up (mean of {len(ratios)}): {np.mean(ratios):.2f}x")


def main(which: str, extra: list[str]) -> int:
    opts = dict(CONDENSE_DEFAULTS if which == "condense" else DEFAULTS)
    for text in extra:
        key, _, value = text.partition("=")
        if key not in opts or not value:
            raise RaysimError(f"bench option '{text}' unknown: use key=value with key in {', '.join(opts)}")
        opts[key] = value
    if which == "overhead":
        overhead(opts)
    elif which == "condense":
        condense(opts)
    return 0
