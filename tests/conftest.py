"""One Ray instance for the whole test session (starting Ray costs seconds), shut down at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data(name: str) -> Path:
    """Path to ../shared/data/NAME, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not (path / "train.parquet").is_file():
        pytest.skip(
            f"needs the real {name} Parquet files at {path} (present in CI, absent on a fresh clone without ../shared)"
        )
    return path


# Files start longest first (their seconds in the suite on 2 cores, largest first), so the two xdist
# workers finish together: each file runs on one worker (--dist loadfile), and a file of one long
# test started last would run alone at the end. Unlisted files follow in collection order. The
# sweeps' file goes first: a sweep stops the session's idle actors before its trials reserve the
# cluster, and actors kept from the tests before it would be started again after it.
# pyproject.toml's --no-loadscope-reorder keeps this order (xdist's own puts files of most tests first).
LONG_FIRST = (
    "test_tune.py",
    "test_oneshot.py",
    "test_algorithms.py",
    "test_engine_features.py",
    "test_real_data.py",
    "test_engine.py",
    "test_reproduce.py",
    "test_faults.py",
    "test_precision.py",
    "test_received_dirs_run_no_code.py",
    "test_compiled.py",
    "test_dcfl.py",
    "test_reference_numbers.py",
    "test_one_line_errors.py",
    "test_run_dir_safety.py",
    "test_data.py",
    "test_dynafed.py",
)


# The inner loop is `pytest -m "not slow"` (under 3 minutes on 2 cores): no Ray, no whole runs. A
# test is slow when it starts Ray (the `ray_session` fixture, also through `run_tiny`), uses a
# fixture that runs experiments, lives in one of these files of end-to-end runs in subprocesses
# (Tune, kill-and-resume, received directories, real data), or is marked `slow` itself.
SLOW_FIXTURES = {"ray_session", "six_methods", "dcfl_run"}  # the last two run whole experiments
SLOW_FILES = {
    "test_tune.py",
    "test_faults.py",
    "test_received_dirs_run_no_code.py",
    "test_real_data.py",
    "test_resume_refusals.py",
    "test_reproduce.py",
}


def pytest_configure(config):
    """Under xdist, each worker (and the Ray, actors and subprocesses it starts) keeps to its own
    share of the cores. Torch sizes its thread pools by the cores it may use (the server's by the
    process's affinity): unpinned, two workers each training with every core oversubscribe the
    machine, and spinning OpenMP threads made single tests up to 4x slower than alone."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % count :: count])


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in SLOW_FILES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: keeps the order within files


@pytest.fixture(scope="session", autouse=True)
def sweep_signing_key(tmp_path_factory):
    """Sweeps sign their Tune state with a per-user key (raysim.tune_state): the tests' own, not the
    key of whoever runs them. Subprocesses inherit it."""
    os.environ["RAYSIM_KEY_FILE"] = str(tmp_path_factory.mktemp("key") / "sweep.key")


@pytest.fixture(scope="session", autouse=True)
def empty_data_home(tmp_path_factory):
    """The data home (raysim.data.home) is the tests' own, empty, folder, not the user's: a test that
    needs a dataset there puts it there. Subprocesses inherit it."""
    os.environ["RAYSIM_DATA"] = str(tmp_path_factory.mktemp("data-home"))


@pytest.fixture(scope="session")
def ray_session():
    """Ray for the whole session, with client actors kept between the runs of the session's tests
    (raysim.engine.actor_pool: each new actor costs seconds of CPU to import torch)."""
    import ray

    from raysim.engine.actor_pool import reusing_actors

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # One logical GPU lets the tests schedule fractional-GPU actors on this CPU machine.
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        object_store_memory=400 * 2**20,
        logging_level="ERROR",
    )
    with reusing_actors():
        yield ray
    ray.shutdown()


def experiment_without_data():
    """What runner.prepare returns, for tests that stop at Ray's start: no data, only its record."""
    from types import SimpleNamespace

    from raysim.data.identity import DataIdentity

    return SimpleNamespace(data=DataIdentity("embedded", "0" * 32, 10, 2, 28, 1, 10))


def one_client_runtime(config, state_dir: Path):
    """The experiment of `config` prepared in this process, and a client runtime holding its client 0."""
    from raysim.engine.client_runtime import ClientRuntime
    from raysim.runner import prepare

    exp = prepare(config)
    train = exp.dataset
    runtime = ClientRuntime(
        config,
        exp.algorithm,
        exp.spec,
        train.train_x,
        train.train_y,
        {0: exp.parts[0]},
        exp.mean,
        exp.std,
        str(state_dir),
    )
    return exp, runtime


TINY_DEFAULTS = {
    "rounds": 2,
    "clients.num": 6,
    "clients.per_round": 6,
    "model.name": "mlp",  # the quickest model (tests/test_algorithms.py); tests about convolutions or norms set theirs
    "model.width": 8,
    "local.epochs": 1,
    "local.batch_size": 64,
    "partition.alpha": 0.5,
    "resources.actors": 2,
    "output.tensorboard": False,
}


def tiny_overrides(**extra) -> list[str]:
    """A small, fast experiment on the embedded dataset, on 2 client actors."""
    base = dict(TINY_DEFAULTS)
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture(scope="session")
def _tiny_runs():
    return {}


@pytest.fixture
def run_tiny(ray_session, tmp_path_factory, _tiny_runs):
    """Run a tiny experiment on the shared Ray; returns (summary, run_dir). Treat the run as read-only.

    Runs are in process (`resources.in_process`: no actors, no object store round trips between
    processes) unless the test asks for `resources.in_process=False`; engine tests do, and one
    checks that both give the same numbers. Runs on actors take the actors kept by the session's
    earlier runs (the `ray_session` fixture). The other tests of equal numbers across actor counts
    compare two actors with an in-process run: the one client runtime a single actor would host,
    on the same code path (tests/test_engine.py also runs a single Ray actor). Runs are
    deterministic, so a run with the same overrides is done once per session and shared.
    """
    from raysim.experiment import load_config
    from raysim.runner import run_experiment

    def run(**overrides):
        overrides = {"resources.in_process": True, **overrides}
        # keyed by the whole set of overrides, defaults included: run_tiny() and run_tiny(rounds=2) share a run
        key = tuple(sorted((k, str(v)) for k, v in {**TINY_DEFAULTS, **overrides}.items()))
        if key not in _tiny_runs:
            config = load_config(
                Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml", tiny_overrides(**overrides)
            )
            run_dir = tmp_path_factory.mktemp("run")
            _tiny_runs[key] = run_experiment(config, run_dir), run_dir
        return _tiny_runs[key]

    return run


def cli_in_process(capsys, *args, cwd=None):
    """`raysim ARGS` answered by this process's `raysim.cli.main`: (returncode, stdout, stderr) as
    `subprocess.run` gives them. For tests whose claim is the command's answer, not a new
    interpreter's: it saves the interpreter's start (torch's import, seconds of CPU a command)."""
    import contextlib
    import subprocess

    from raysim.cli import main
    from raysim.outputs.run_lock import release_all

    capsys.readouterr()
    with contextlib.chdir(cwd or Path(__file__).resolve().parents[1]):
        try:
            code = main([str(a) for a in args])
        finally:
            release_all()
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["raysim", *args], code, said.out, said.err)


def run_and_kill_after_round(overrides: list[str], run_dir: Path, after_round: int, env: dict) -> int:
    """`raysim run` in a subprocess, SIGKILLed (with the Ray it started) once its checkpoint holds
    `after_round`; returns the round of the checkpoint it left."""
    import signal
    import subprocess
    import sys
    import time

    from raysim.outputs.run_dir import RunDir

    root = Path(__file__).resolve().parents[1]
    cmd = [
        sys.executable,
        "-m",
        "raysim.cli",
        "run",
        str(root / "configs/quickstart.yaml"),
        *overrides,
        "--out",
        str(run_dir),
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    checkpoint = run_dir / "checkpoints/last.pt"
    deadline = time.time() + 240
    while time.time() < deadline:
        if checkpoint.exists() and RunDir(run_dir).read_checkpoint()["round"] >= after_round:
            break
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return RunDir(run_dir).read_checkpoint()["round"]
