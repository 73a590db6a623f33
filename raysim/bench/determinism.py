"""`raysim bench determinism`: does each algorithm give the same numbers on 1 and on 2 actors, here?

On a CPU the test suite answers this. On a GPU it is worth asking again, of the hardware and driver
at hand: CUDA kernels that add with atomics change the last bits of a sum from run to run, and
condensation and generator training pass thousands of such gradients on. Each algorithm runs a
small but complete experiment on the embedded Fashion-MNIST sample (its full client and server
loops: condensation with DSA, trajectory matching, generator training and distillation), once on
one actor and once on two, with `gpus` of a GPU per actor and for the server; the two runs'
metrics (every value except timings) are compared bit for bit. `deterministic=false` runs with
`resources.deterministic: false` (the fast CUDA kernels), to see what the setting buys.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from raysim.config.files import ROOT
from raysim.engine.ray_session import ray_session
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.outputs.metrics import is_timing
from raysim.outputs.run_dir import RunDir
from raysim.runner import run_experiment

DEFAULTS = {
    "algorithms": "fedavg,feddm,fedaf,dcfl,dynafed,dense,fedhydra",
    "gpus": "0",
    "deterministic": "true",
    "out": "",
}

# Small versions of each family's experiment on the quickstart setting (embedded data, ConvNet of
# width 32, 10 clients); `dense` runs with heterogeneous clients and a ResNet-18 server model.
SETTINGS: dict[str, dict[str, object]] = {
    "fedavg": {"rounds": 3},
    "feddm": {
        "algorithm.name": "feddm",
        "rounds": 2,
        "algorithm.ipc": 5,
        "algorithm.steps": 50,
        "algorithm.real_batch": 32,
        "algorithm.server_epochs": 20,
    },
    "fedaf": {
        "algorithm.name": "fedaf",
        "rounds": 2,
        "algorithm.ipc": 5,
        "algorithm.steps": 50,
        "algorithm.real_batch": 32,
        "algorithm.server_epochs": 20,
    },
    "dcfl": {
        "algorithm.name": "dcfl",
        "rounds": 3,
        "clients.per_round": 5,
        "algorithm.ipc": 5,
        "algorithm.steps": 50,
        "algorithm.real_batch": 32,
        "algorithm.pretrain_rounds": 1,
        "algorithm.pretrain_fraction": 0.5,
        "algorithm.server_epochs": 20,
    },
    "dynafed": {
        "algorithm.name": "dynafed",
        "rounds": 4,
        "algorithm.trajectory_rounds": 2,
        "algorithm.horizon": 1,
        "algorithm.inner_steps": 5,
        "algorithm.ipc": 3,
        "algorithm.iterations": 30,
        "algorithm.finetune_epochs": 2,
        "algorithm.diagnostic_segments": 2,
        "algorithm.syn_only_epochs": 5,
    },
    "dense": {
        "algorithm.name": "dense",
        "rounds": 4,
        "clients.num": 4,
        "clients.per_round": 4,
        "clients.models": "[cnn2, lenet]",
        "model.name": "resnet18",
        "model.width_multiplier": 0.25,
        "local.epochs": 2,
        "algorithm.ngf": 16,
        "algorithm.generator_steps": 5,
        "algorithm.synthesis_batch": 64,
        "algorithm.kd_batch": 64,
        "algorithm.cache_client_stage": False,
    },
    "fedhydra": {
        "algorithm.name": "fedhydra",
        "rounds": 4,
        "clients.num": 5,
        "clients.per_round": 5,
        "partition.kind": "classes",
        "partition.classes_per_client": 2,
        "model.name": "cnn2",
        "local.epochs": 2,
        "algorithm.ngf": 16,
        "algorithm.generator_steps": 5,
        "algorithm.synthesis_batch": 64,
        "algorithm.kd_batch": 64,
        "algorithm.stratify_steps": 10,
        "algorithm.stratify_batch": 32,
        "algorithm.cache_client_stage": False,
    },
}


def _config(name: str, actors: int, gpus: float, deterministic: bool):

    overrides = {
        **SETTINGS[name],
        "resources.actors": actors,
        "resources.cpus_per_actor": 1,
        "resources.gpus_per_actor": gpus,
        "resources.server_gpus": gpus,
        "resources.deterministic": deterministic,
        "output.tensorboard": False,
    }
    return load_config(ROOT / "quickstart.yaml", [f"{k}={v}" for k, v in overrides.items()])


def _values(run_dir: Path) -> dict[tuple, float]:

    return {
        (r["round"], r["client"], r["metric"]): r["value"]
        for r in RunDir(run_dir).read_metrics_rows()
        if not is_timing(r["metric"])
    }


def _actor_devices(run_dir: Path) -> str:
    actors = RunDir(run_dir).read_actors()
    return ", ".join(sorted({str(a["device"]) for a in actors}))


def compare(one: dict[tuple, float], two: dict[tuple, float]) -> dict[str, object]:
    """How two runs' metrics differ: counts, the largest difference, the first differing key."""
    keys = sorted(set(one) | set(two), key=str)
    differing = [k for k in keys if one.get(k) != two.get(k)]
    gaps = [abs(one[k] - two[k]) for k in differing if k in one and k in two]
    return {
        "values": len(keys),
        "differing": len(differing),
        "largest_difference": max(gaps, default=0.0),
        "first_differing": None if not differing else str(differing[0]),
    }


def determinism(opts: dict) -> dict[str, dict]:

    names = [n for n in opts["algorithms"].split(",") if n]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise RaysimError(f"bench determinism: unknown algorithms {unknown}; choose from {', '.join(SETTINGS)}")
    try:
        gpus = float(opts["gpus"])
    except ValueError:
        gpus = -1.0
    if gpus < 0 or opts["deterministic"] not in ("true", "false"):
        raise RaysimError(
            f"bench determinism: gpus={opts['gpus']} deterministic={opts['deterministic']}: give gpus as a "
            "GPU share per actor >= 0 (0: CPU) and deterministic as true or false"
        )
    deterministic = opts["deterministic"] == "true"
    results = {}
    with tempfile.TemporaryDirectory() as tmp, ray_session(_config(names[0], 2, gpus, deterministic).resources):
        for name in names:
            runs = {}
            for actors in (1, 2):
                start = time.perf_counter()
                summary = run_experiment(_config(name, actors, gpus, deterministic), Path(tmp) / f"{name}-{actors}")
                runs[actors] = (summary, time.perf_counter() - start, _values(Path(tmp) / f"{name}-{actors}"))
            outcome = compare(runs[1][2], runs[2][2])
            device = _actor_devices(Path(tmp) / f"{name}-2")
            accuracy = runs[2][0]["final_accuracy"]
            results[name] = {
                **outcome,
                "device": device,
                "accuracy": accuracy,
                "seconds": [round(runs[1][1], 1), round(runs[2][1], 1)],
            }
            verdict = (
                "identical"
                if not outcome["differing"]
                else (
                    f"DIFFERENT in {outcome['differing']} values (largest gap {outcome['largest_difference']:.3g}, "
                    f"first {outcome['first_differing']})"
                )
            )
            print(
                f"{name}: client actors on {device}, 1 vs 2 actors: {verdict} over {outcome['values']} values; "
                f"accuracy {accuracy}; {runs[1][1]:.1f} s / {runs[2][1]:.1f} s",
                flush=True,
            )
            if opts["out"]:
                Path(opts["out"]).write_text(json.dumps(results, indent=1))
    return results
