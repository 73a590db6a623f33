"""`raysim bench NAME [key=value ...]`: benchmarks that print ratios (never timed tests).

overhead     the engine's rounds against a hand-written two-process PyTorch loop (bench/overhead.py)
determinism  the same run twice, across actor counts and devices (bench/determinism.py)
condense     DM steps, batched vs per class (raysim.algorithms.condensed.bench)
trajectory   DynaFed's unrolled trajectory steps (raysim.algorithms.dynafed.bench)
cell         a whole cell's projected time, dominant phase and memory, from two short runs (bench/cell.py)

Each module has `DEFAULTS` (its options) and a function named after the bench. The two
algorithm benches live in their families and are found here by name, as the registry finds
algorithms: the engine side imports nothing from raysim.algorithms.
"""

from __future__ import annotations

import importlib

from raysim.errors import RaysimError

BENCHES = {
    "overhead": "raysim.bench.overhead",
    "determinism": "raysim.bench.determinism",
    "condense": "raysim.algorithms.condensed.bench",
    "trajectory": "raysim.algorithms.dynafed.bench",
    "cell": "raysim.bench.cell",
}


def main(which: str, extra: list[str]) -> int:
    module = importlib.import_module(BENCHES[which])
    opts = dict(module.DEFAULTS)
    if getattr(module, "TAKES_CONFIG", False):  # NAME [key.sub=value ...]: a config and its overrides
        opts["overrides"] = []
        if extra and "=" not in extra[0]:
            opts["config"], extra = extra[0], extra[1:]
    for text in extra:
        key, _, value = text.partition("=")
        if "overrides" in opts and key not in opts and value:
            opts["overrides"].append(text)
            continue
        if key not in opts or not value:
            raise RaysimError(f"bench option '{text}' unknown: use key=value with key in {', '.join(opts)}")
        opts[key] = value
    getattr(module, which)(opts)
    return 0
