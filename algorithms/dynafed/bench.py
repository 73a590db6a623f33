"""`raysim bench trajectory`: what one DynaFed synthesis iteration costs at the paper configs' sizes, here.

Trajectory matching (`raysim.algorithms.dynafed.trajectory`) differentiates through s' unrolled steps on the
whole synthetic set, so its time and memory grow with the set (classes x ipc), the model and s'. This
bench runs it as DynaFed does (DSA per image, soft labels, learnable step size) on a random-walk
trajectory of 21 checkpoints - the checkpoints' values do not change the cost, so it needs neither data
nor Ray - on the GPU when torch sees one, and prints for each case the seconds per iteration, the peak
GPU memory, and whether two runs from one seed give the same synthetic set bit for bit. A case that
does not fit in memory is reported, not raised; `recompute=true` (one unrolled step's graph at a time,
the same gradients) and `syn_batch` (fewer images per unrolled step, another algorithm) trade time
for memory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from raysim.algorithms.dynafed.dynafed import augmentation, class_logits
from raysim.algorithms.dynafed.trajectory import synthesize
from raysim.config import ResourcesConfig
from raysim.engine.devices import configure_torch
from raysim.errors import RaysimError
from raysim.models import build_model
from raysim.tensors import module_weights

BENCH = "trajectory"  # `raysim bench trajectory` (found by raysim.bench.benches)
DEFAULTS = {
    # cifar100_convnet is asked for by name: at the whole set (1500 images), without recompute, it needs
    # about 86 GiB, which on a CPU is the machine's memory (a crash, not an error) and on most GPUs more
    # than they have.
    "cases": "fmnist_mlp,cifar10_convnet",
    "ipc": "15",  # the authors' images per class
    "inner_steps": "20",  # s'
    "syn_batch": "0",  # 0: the whole synthetic set in every unrolled step (the authors' code)
    "width": "128",  # ConvNet channels (the paper's ConvNet-128)
    "iterations": "3",  # timed iterations per case, after one warm-up iteration
    "recompute": "false",  # true: one unrolled step's graph at a time (algorithm.recompute_steps)
    "deterministic": "true",  # on CUDA: deterministic kernels, as raysim's default
    "device": "auto",  # auto (CUDA when available), cuda or cpu
    "out": "",  # also write the results as JSON to this file
}

# The paper configs' synthesis sizes: (model, input channels, image size, classes).
CASES = {
    "fmnist_mlp": ("mlp", 1, 28, 10),
    "cifar10_convnet": ("convnet", 3, 32, 10),
    "cifar100_convnet": ("convnet", 3, 32, 100),
}
SWITCHES = ("recompute", "deterministic")
CHECKPOINTS = 21  # w_0..w_L with L = 20
HORIZON = 5


def _options(opts: dict) -> dict:
    names = [n for n in opts["cases"].split(",") if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown or not names:
        raise RaysimError(f"bench trajectory: unknown cases {unknown or names}; choose from {', '.join(CASES)}")
    try:
        numbers = {k: int(opts[k]) for k in ("ipc", "inner_steps", "syn_batch", "width", "iterations")}
    except ValueError as exc:
        raise RaysimError(f"bench trajectory: {exc}; ipc, inner_steps, syn_batch, width, iterations are integers")
    small = [k for k, v in numbers.items() if v < (0 if k == "syn_batch" else 1)]
    switches = [k for k in SWITCHES if opts[k] not in ("true", "false")]
    if small or switches or opts["device"] not in ("auto", "cuda", "cpu"):
        raise RaysimError(
            f"bench trajectory: {', '.join(f'{k}={opts[k]}' for k in small + switches) or 'options'} out of range: "
            "give ipc, inner_steps, width, iterations >= 1, syn_batch >= 0, recompute and deterministic true or "
            "false, device auto, cuda or cpu"
        )
    return {**numbers, "cases": names, "device": opts["device"], **{k: opts[k] == "true" for k in SWITCHES}}


def _device(choice: str):

    if choice == "cuda" and not torch.cuda.is_available():
        raise RaysimError("bench trajectory: device=cuda but torch sees no CUDA device: use device=auto or cpu")
    return torch.device("cuda" if choice != "cpu" and torch.cuda.is_available() else "cpu")


def _random_walk(model, steps: int) -> list[dict]:

    g = torch.Generator().manual_seed(0)
    weights = module_weights(model)
    walk = [weights]
    for _ in range(steps - 1):
        weights = {k: v + 0.01 * torch.randn(v.shape, generator=g).numpy() for k, v in weights.items()}
        walk.append(weights)
    return walk


def _case(name: str, o: dict, device) -> dict:

    arch, channels, size, classes = CASES[name]
    torch.manual_seed(0)
    model = build_model(
        arch, in_channels=channels, num_classes=classes, image_size=size, width=o["width"], norm="instancenorm"
    ).to(device)
    trajectory = _random_walk(model, CHECKPOINTS)

    def run(iterations: int):
        images = torch.randn(classes * o["ipc"], channels, size, size, generator=torch.Generator().manual_seed(1))
        return synthesize(
            model,
            trajectory,
            images.to(device),
            class_logits(classes, o["ipc"], 0.0, device),
            iterations=iterations,
            inner_steps=o["inner_steps"],
            horizon=HORIZON,
            target_average=2,
            batch_size=o["syn_batch"],
            image_lr=0.05,
            label_lr=0.01,
            step_size=0.04,
            step_size_lr=1e-5,
            generator=torch.Generator().manual_seed(2),
            augment=augmentation(True),
            recompute=o["recompute"],
        )

    def synchronise():
        if device.type == "cuda":
            torch.cuda.synchronize()

    result = {"images": classes * o["ipc"]}
    try:
        run(1)  # warm-up: kernels chosen, memory pools filled
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        synchronise()
        start = time.perf_counter()
        first = run(o["iterations"])
        synchronise()
        result["s_per_iteration"] = (time.perf_counter() - start) / o["iterations"]
        if device.type == "cuda":
            result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        second = run(o["iterations"])
        result["repeat_bit_equal"] = bool(
            torch.equal(first[0], second[0]) and torch.equal(first[1], second[1]) and first[2] == second[2]
        )
    except torch.OutOfMemoryError as exc:
        result["out_of_memory"] = str(exc).splitlines()[0]
    return result


def trajectory(opts: dict) -> dict[str, dict]:

    o = _options(opts)
    device = _device(o["device"])
    configure_torch(torch.get_num_threads(), device, ResourcesConfig(deterministic=o["deterministic"]))
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu, {torch.get_num_threads()} thread(s)"
    print(
        f"trajectory matching on {where} (torch {torch.__version__}, deterministic={str(o['deterministic']).lower()}): "
        f"s' = {o['inner_steps']}, ipc {o['ipc']}, syn_batch {o['syn_batch'] or 'all'}, "
        f"recompute={str(o['recompute']).lower()}, ConvNet width "
        f"{o['width']}, {o['iterations']} timed iterations",
        flush=True,
    )
    results = {}
    for name in o["cases"]:
        r = results[name] = _case(name, o, device)
        if "out_of_memory" in r:
            line = f"out of memory ({r['out_of_memory']}): set recompute=true or lower syn_batch"
        else:
            memory = f", peak GPU memory {r['peak_gib']:.2f} GiB" if "peak_gib" in r else ""
            line = (
                f"{r['s_per_iteration']:.3f} s per iteration{memory}; repeat bit-equal: "
                f"{'yes' if r['repeat_bit_equal'] else 'NO'}"
            )
        print(f"{name} ({r['images']} images): {line}", flush=True)
        if opts["out"]:
            Path(opts["out"]).write_text(json.dumps(results, indent=1))
    return results
