"""`raysim bench condense`: distribution-matching steps per second, all classes in one forward
pass against a loop over classes (the condensed family's hot loop)."""

from __future__ import annotations

import time

import numpy as np
import torch

from raysim.algorithms.condensed.dsa import DSA
from raysim.algorithms.condensed.matching import dm_loss
from raysim.models import build_model

BENCH = "condense"  # `raysim bench condense` (found by raysim.bench.benches)
DEFAULTS = {
    "classes": 10,
    "ipc": 10,
    "real": 64,
    "width": 32,
    "image_size": 32,
    "channels": 3,
    "steps": 20,
    "repeats": 3,
    "threads": 1,
}


def condense(opts: dict) -> None:
    """Distribution-matching steps per second: all classes in one forward pass vs a loop over classes."""

    o = {k: int(v) for k, v in opts.items()}
    torch.set_num_threads(o["threads"])
    torch.manual_seed(0)
    shape = (o["channels"], o["image_size"], o["image_size"])
    model = build_model(
        "convnet", in_channels=o["channels"], num_classes=o["classes"], image_size=o["image_size"], width=o["width"]
    ).train()
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

    print(
        f"DM condensation, ConvNet width {o['width']}, {o['classes']} classes x ({o['real']} real + "
        f"{o['ipc']} synthetic) images of {shape}, DSA, {o['threads']} thread(s)"
    )
    ratios = []
    for repeat in range(o["repeats"]):
        batched, looped = steps_per_second(True), steps_per_second(False)
        ratios.append(batched / looped)
        print(
            f"repeat {repeat + 1}: batched {batched:.2f} steps/s, per-class loop {looped:.2f} steps/s, "
            f"speed-up {ratios[-1]:.2f}x"
        )
    print(f"batched / per-class speed-up (mean of {len(ratios)}): {np.mean(ratios):.2f}x")
