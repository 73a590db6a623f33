"""The code's layout: the engine side never imports the algorithms, no import circle among raysim's
modules (function-level imports included), every package folder installs, each family names exactly
the algorithms it defines, and a config's way into the engine enters no file more than twice."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def module_files() -> dict[str, Path]:
    """Every module of the installed package, by its import name (algorithms/ is raysim.algorithms)."""
    found = {}
    for base, prefix in ((ROOT / "raysim", "raysim"), (ROOT / "algorithms", "raysim.algorithms")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The raysim modules `path` imports anywhere in it (inside functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def test_the_engine_side_imports_nothing_from_the_algorithms():
    files = module_files()
    known = set(files)
    engine = {n: p for n, p in files.items() if not n.startswith("raysim.algorithms")}
    offenders = {
        name: sorted(i for i in imports_of(path, name, known) if i.startswith("raysim.algorithms"))
        for name, path in engine.items()
    }
    assert not {n: i for n, i in offenders.items() if i}, offenders


def test_no_import_circle_among_raysims_modules():
    files = module_files()
    known = set(files)
    graph = {name: imports_of(path, name, known) for name, path in files.items()}
    # a package's __init__ is imported with each of its modules: not an edge of a circle by itself
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_every_package_folder_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {n for n, p in module_files().items() if p.name == "__init__.py"}
    assert folders == listed, f"pyproject.toml [tool.setuptools] packages differs: {folders ^ listed}"


def test_each_family_names_exactly_the_algorithms_it_defines():
    from raysim.algorithm import Algorithm

    package = importlib.import_module("raysim.algorithms")
    seen = []
    for family in pkgutil.iter_modules(package.__path__):
        names = importlib.import_module(f"raysim.algorithms.{family.name}").ALGORITHMS
        defined = {}
        for module in pkgutil.iter_modules(importlib.import_module(f"raysim.algorithms.{family.name}").__path__):
            full = importlib.import_module(f"raysim.algorithms.{family.name}.{module.name}")
            for obj in vars(full).values():
                if isinstance(obj, type) and issubclass(obj, Algorithm) and obj.__module__ == full.__name__:
                    if getattr(obj, "name", None):
                        defined[obj.name] = module.name
        assert {n: n for n in names} == defined, (family.name, names, defined)
        seen += names
    assert len(seen) == len(set(seen)) == 18


def test_only_the_run_dir_module_names_the_run_directorys_files():
    """The run directory has one owner (raysim.outputs.run_dir): no other module spells its file names."""
    names = {"config.yaml", "metrics.parquet", "summary.json", "actors.yaml", "client_state"}
    offenders = {}
    for name, path in module_files().items():
        if name == "raysim.outputs.run_dir":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in names or (node.value.startswith("checkpoints/") and " " not in node.value):
                    offenders.setdefault(name, []).append(node.value)
    assert not offenders, offenders


def test_the_server_is_built_from_a_handful_of_objects():
    import inspect

    from raysim.engine.ray_actors import ServerActor
    from raysim.engine.server import ServerRuntime

    for cls in (ServerRuntime, ServerActor.__ray_metadata__.modified_class):
        parameters = [p for p in inspect.signature(cls.__init__).parameters if not p.startswith("_")]
        assert len(parameters) - 1 <= 5, (cls, parameters)


# Modules of raysim outside raysim.config that import nothing of raysim but each other: what the
# config package may import beside itself.
CONFIG_MAY_IMPORT = {"raysim.errors"}


def test_the_config_package_imports_nothing_of_raysim_above_it():
    """raysim.config is the bottom layer (schema, parsing, files): resolving an algorithm's Params
    (raysim.experiment) and a table's cell by name (raysim.reproduce.named) are above it."""
    files = module_files()
    known = set(files)
    leaves = {n: imports_of(files[n], n, known) for n in CONFIG_MAY_IMPORT}
    assert not {n: i for n, i in leaves.items() if i}, f"not leaf utilities: {leaves}"
    config = sorted(n for n in files if n == "raysim.config" or n.startswith("raysim.config."))
    assert {"raysim.config.files", "raysim.config.parse", "raysim.config.schema"} <= set(config)
    upward = {}
    for name in config:
        up = {
            t
            for t in imports_of(files[name], name, known)
            if t != "raysim.config" and not t.startswith("raysim.config.") and t not in CONFIG_MAY_IMPORT
        }
        if up:
            upward[name] = sorted(up)
    assert not upward, f"raysim.config imports upward: {upward}"


def test_imports_inside_functions_are_the_lazy_few_each_with_its_reason():
    """Every import sits at the top of its module, except the few that load something slow or absent
    only where it is needed (Ray, torchvision, matplotlib, TensorBoard): each of those names its reason
    in a `# lazy:` comment on the line above it (or above the block of imports it starts)."""
    found = {}
    for name, path in module_files().items():
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    target = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    above = [line.strip() for line in lines[: node.lineno - 1] if line.strip()]
                    reasoned = any(line.startswith("# lazy:") for line in above[-6:])
                    found.setdefault(name, set()).add((target.split(".")[0], reasoned))
    assert all(reasoned for imports in found.values() for _, reasoned in imports), found
    allowed = {"ray", "raysim", "torchvision", "matplotlib", "torch"}  # raysim: its Ray side; torch: TensorBoard's
    assert {target for imports in found.values() for target, _ in imports} <= allowed, found
    assert len(found) <= 8, sorted(found)


def test_a_config_on_its_way_from_the_command_line_into_the_engine_enters_no_file_more_than_twice(tmp_path):
    """The config's path through the code: every call into a raysim function that takes the Config
    and hands it on to another file (a stop, not a lookup such as a helper reading one key), from
    `raysim run` to the engine's end, counted per file. A file entered three times is the layering
    bending back on itself."""
    import collections
    import sys
    import threading

    from raysim.cli import main
    from raysim.config.schema import Config
    from tests.conftest import tiny_overrides

    calls: list[str] = []
    stack: list[tuple[int, int]] = []  # (frame, index in calls) of the config-carrying calls now running
    onward: set[int] = set()

    def ours(path: str) -> bool:
        return path.startswith((str(ROOT / "raysim"), str(ROOT / "algorithms")))

    def trace(frame, event, arg):
        if event == "return" and stack and stack[-1][0] == id(frame):
            stack.pop()
        if event != "call" or not ours(frame.f_code.co_filename):
            return
        code = frame.f_code
        if not any(isinstance(frame.f_locals.get(n), Config) for n in code.co_varnames[: code.co_argcount]):
            return
        if frame.f_back is not None and frame.f_back.f_code.co_filename == code.co_filename:
            return  # within one file
        if stack:
            onward.add(stack[-1][1])
        calls.append(str(Path(code.co_filename).relative_to(ROOT)))
        stack.append((id(frame), len(calls) - 1))

    config = ROOT / "raysim" / "configs" / "quickstart.yaml"
    args = ["run", str(config), *tiny_overrides(rounds=1, **{"resources.in_process": True}), "--out", str(tmp_path)]
    sys.setprofile(trace)
    threading.setprofile(trace)
    try:
        assert main(args) == 0
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    stops = collections.Counter(calls[i] for i in onward)
    assert "raysim/engine/server.py" in stops, calls  # the path was followed into the engine
    assert max(stops.values()) <= 2, stops
