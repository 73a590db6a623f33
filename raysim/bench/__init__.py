"""`raysim bench NAME [key=value ...]`: benchmarks that print ratios (never timed tests).

overhead     the engine's rounds against a hand-written two-process PyTorch loop (bench/overhead.py)
determinism  the same run twice, across actor counts and devices (bench/determinism.py)
condense     DM steps, batched vs per class (raysim.algorithms.condensed.bench)
trajectory   DynaFed's unrolled trajectory steps (raysim.algorithms.dynafed.bench)
cell         a whole cell's projected time, dominant phase and memory, from two short runs (bench/cell.py)

Each module has `DEFAULTS` (its options) and a function named after the bench. A family's bench
lives in the family, in its bench.py, and names itself there (`BENCH = "condense"`); it is found by
reading that line from the source, as the registry finds algorithms: the engine side imports nothing
from raysim.algorithms.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

from raysim.errors import RaysimError

ENGINE_BENCHES = {
    "overhead": "raysim.bench.overhead",
    "determinism": "raysim.bench.determinism",
    "cell": "raysim.bench.cell",
}
_BENCH_LINE = re.compile(r'^BENCH = "([a-z_]+)"\s*(#.*)?$', re.M)


@functools.cache
def benches() -> dict[str, str]:
    """bench name -> its module: the engine's and each family's (read from its bench.py)."""
    found = dict(ENGINE_BENCHES)
    package = "raysim.algorithms"  # found, not imported: the engine side imports nothing from it
    for family in pkgutil.iter_modules(importlib.util.find_spec(package).submodule_search_locations):
        source = Path(family.module_finder.path) / family.name / "bench.py"
        if family.ispkg and source.is_file() and (match := _BENCH_LINE.search(source.read_text())):
            found[match.group(1)] = f"{package}.{family.name}.bench"
    return found


def main(which: str, extra: list[str]) -> int:
    module = importlib.import_module(benches()[which])
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
