"""Faults: a killed actor restarts and its lost client tasks re-run; a killed run resumes exactly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import run_and_kill_after_round, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def server_rows(run_dir, metrics=("accuracy", "loss", "bytes_up", "bytes_down")):
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return [(r["round"], r["metric"], r["value"]) for r in rows if r["client"] is None and r["metric"] in metrics]


# SCAFFOLD with clients that keep their optimiser (local.keep_optimizer): its clients carry state
# between rounds (control variates, momentum buffers), which a restart or a resume must not lose.
# The uninterrupted reference runs in process (the same numbers as on actors, tested in test_engine).
FAULTY = {"rounds": 3, "algorithm.name": "scaffold", "local.keep_optimizer": True, "output.tensorboard": True}


def test_killed_actor_restarts_and_its_tasks_rerun(run_tiny, tmp_path, capsys):
    import ray

    from raysim.experiment import load_config
    from raysim.outputs.callbacks import Callback
    from raysim.runner import ProgressBar, run_experiment

    config = load_config(ROOT / "configs/quickstart.yaml", tiny_overrides(**FAULTY))
    assert not config.resources.in_process
    _, clean = run_tiny(**FAULTY)

    state = {"actors": None, "killed": 0, "thread": None}

    def kill_first_actor_soon():
        time.sleep(0.3)
        ray.kill(state["actors"][0], no_restart=False)  # dies mid-task; Ray restarts it
        state["killed"] += 1

    class KillAfterRoundOne(Callback):
        def on_run_start(self, start):
            state["actors"] = start.actors

        def on_round_end(self, result):
            if result.round == 1:  # round 2 is being submitted right after this returns
                state["thread"] = threading.Thread(target=kill_first_actor_soon)
                state["thread"].start()

    faulty = tmp_path / "faulty"
    bar = ProgressBar("faulty")
    run_experiment(config, faulty, callbacks=[KillAfterRoundOne(), bar])
    bar.close()
    state["thread"].join()
    assert state["killed"] == 1
    assert server_rows(faulty) == server_rows(clean)
    # the restart is visible: a per-round metric and one line on stderr
    restarts = dict((r, v) for r, _, v in server_rows(faulty, ("actor_restarts",)))
    assert sorted(restarts) == [1, 2, 3] and sum(restarts.values()) == 1 and restarts[1] == 0
    assert capsys.readouterr().err.count("client actor restart") == 1


def test_sigkilled_run_resumes_to_the_same_numbers(run_tiny, tmp_path, capsys):
    # in process, as the uninterrupted run (no Ray nor actors to start in the killed subprocess: the
    # clients' state is checkpointed and restored by the same client runtime an actor hosts)
    overrides = tiny_overrides(**FAULTY, **{"resources.in_process": True})
    _, uninterrupted = run_tiny(**FAULTY)

    run_dir = tmp_path / "killed"
    env = {**os.environ, "RAY_ADDRESS": ""}
    assert run_and_kill_after_round(overrides, run_dir, 2, env) == 2

    from raysim.cli import main  # the resume in this process: the killed run was another one

    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "3 rounds" in capsys.readouterr().out
    assert server_rows(run_dir) == server_rows(uninterrupted)


def test_a_sigkilled_driver_leaves_no_ray_processes_behind(tmp_path):
    """Issue 45 item 12: only the driver is killed (as by the OOM killer), once its client actor is
    training; the private Ray it started, agents included (Ray 2.60 leaves them for about a minute),
    is gone within seconds."""
    import signal

    import psutil

    run_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "raysim.cli", "run", str(ROOT / "configs/quickstart.yaml")]
    proc = subprocess.Popen(
        [*cmd, *tiny_overrides(rounds=50, **{"resources.num_cpus": 2, "resources.actors": 1}), "--out", str(run_dir)],
        env={**os.environ, "RAY_ADDRESS": ""},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    ray_processes = []
    try:
        deadline = time.time() + 240
        names = ""
        while "ClientActor.run_clients" not in names:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
            ray_processes = psutil.Process(proc.pid).children(recursive=True)
            names = " ".join(process_names(ray_processes))
        assert "raylet" in names and "DashboardAgent" in names, names
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone
        proc.wait()
        assert_gone_within(ray_processes, 20)
    finally:
        kill_all(proc, ray_processes)


def test_a_driver_killed_as_rays_agents_start_leaves_none_of_them_behind():
    """Issue 59 item 6: the driver kills itself the moment Ray's agents appear (inside ray.init, or
    just after it); the watcher, started before Ray, stops them within seconds (Ray 2.60 leaves
    them for about 80 s)."""
    import json
    import signal

    script = """
import json, os, signal, threading, time
import psutil
from raysim.config import ResourcesConfig
from raysim.engine.ray_session import ray_session

def kill_when_agents_start():
    me = psutil.Process()
    while True:
        found = []
        for child in me.children(recursive=True):
            try:  # an agent: its title, or its script before it sets one (the raylet's arguments name them too)
                name, command = child.name(), child.cmdline()
                agent = "Agent" in name or any(arg.endswith(("agent.py", "agent/main.py")) for arg in command[:3])
                found.append((child.pid, child.create_time(), " ".join([name, *command]), agent))
            except psutil.Error:
                pass
        if any(agent for *_, agent in found):
            print(json.dumps([entry for entry in found if "reaper" not in entry[2]]), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)

threading.Thread(target=kill_when_agents_start, daemon=True).start()
with ray_session(ResourcesConfig(num_cpus=1, object_store_mb=80)):
    time.sleep(120)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "RAY_ADDRESS": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    processes = []
    try:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, out
        started = json.loads(out)  # Ray's processes when the driver was killed: [pid, start time, command, agent]
        assert any(agent for *_, agent in started), started
        processes = [p for p in (_process(pid, created) for pid, created, *_ in started) if p is not None]
        assert_gone_within(processes, 20)
    finally:
        kill_all(proc, processes)


def _process(pid: int, created: float):
    """The process `pid` if it is still the one started at `created` (else None: it ended)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return process if abs(process.create_time() - created) < 1e-3 else None
    except psutil.Error:
        return None


def process_names(processes: list) -> list[str]:
    """The names of those of `processes` (psutil) still there."""
    import psutil

    names = []
    for p in processes:
        try:
            names.append(p.name())
        except psutil.Error:
            pass
    return names


def assert_gone_within(processes: list, seconds: float) -> None:
    """Every one of `processes` (psutil) ends within `seconds` of the driver's death."""
    import psutil

    def left() -> list[str]:
        alive = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.name())
            except psutil.NoSuchProcess:
                pass
        return alive

    deadline = time.time() + seconds
    while left() and time.time() < deadline:
        time.sleep(0.5)
    assert not left(), f"still running {seconds} s after the driver was killed: {left()}"


def kill_all(driver: subprocess.Popen, processes: list) -> None:
    """The test's leftovers, whatever it asserted: the driver's process group and `processes`."""
    import signal

    import psutil

    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
    for p in processes:
        try:
            p.kill()
        except psutil.Error:
            pass
