"""`raysim tune`: sweep files are checked before Ray starts; a sweep runs, ranks and resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from raysim.config import ResourcesConfig
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.sweep import load_sweep
from raysim.tuning import trial_bundles
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "configs/quickstart.yaml")
TINY_BASE = {
    "rounds": 2,
    "clients": {"num": 4, "per_round": 4},
    "model": {"name": "mlp"},  # the quickest model: the rules are the sweep's
    "output": {"tensorboard": False},
    "resources": {"actors": 1, "cpus_per_actor": 1},
}


def write_sweep(tmp_path: Path, **fields) -> Path:
    data = {"base": QUICK, "overrides": TINY_BASE, "space": {"local.lr": {"grid": [0.01, 0.05]}}, "concurrency": 2}
    data.update(fields)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"space": {"local.epocs": {"grid": [1, 2]}}}, "unknown config key 'local.epocs'"),
        ({"space": {"local.lr": {"normal": [0, 1]}}}, "must be one of"),
        ({"space": {"local.lr": {"loguniform": [0, 1]}}}, "needs low > 0"),
        ({"space": {"local.lr": {"uniform": [1, 0.5]}}}, "low < high"),
        ({"space": {"partition.alpha": {"grid": [0]}}}, "partition.alpha must be > 0"),
        ({"metric": "loss"}, "key 'metric' must be one of best_accuracy, final_accuracy, last5_accuracy"),
        ({"base": "/no/such.yaml"}, "does not exist"),
        ({"scheduler": {"kind": "hyperband"}}, "key 'scheduler.kind' must be one of asha, got 'hyperband'"),
        ({"trials": 3}, "unknown key 'trials'"),
        # issue 45 item 6: every value of a grid and both ends of a range are checked, not only the first
        ({"space": {"local.momentum": {"grid": [0.5, 1.5]}}}, "with local.momentum=1.5: config key 'local.momentum'"),
        ({"space": {"local.momentum": {"choice": [0.9, -1]}}}, "with local.momentum=-1"),
        ({"space": {"local.momentum": {"uniform": [0.5, 1.5]}}}, "with local.momentum=1.5"),
        ({"space": {"local.epochs": {"uniform": [1, 3]}}}, "use grid or choice if it takes whole numbers"),
        # issue 45 item 7: fields of the wrong type are one line, not a traceback
        ({"samples": "abc"}, "key 'samples' must be an integer, got 'abc'"),
        ({"concurrency": 1.5}, "key 'concurrency' must be an integer, got 1.5"),
        ({"seed": -1}, "seed must be a whole number >= 0"),
        ({"base": 5}, "config file"),
        ({"metric": ["best_accuracy"]}, "key 'metric' must be one of"),
        ({"scheduler": {"grace_period": "x"}}, "key 'scheduler.grace_period' must be an integer, got 'x'"),
        ({"scheduler": {"reduction_factor": 1}}, "scheduler.reduction_factor must be a number > 1"),
    ],
)
def test_bad_sweeps_fail_with_one_clear_message(tmp_path, fields, words):
    with pytest.raises(RaysimError) as err:
        load_sweep(write_sweep(tmp_path, **fields))
    assert words in str(err.value)


def test_shipped_sweeps_load_and_cover_the_issue_grid():
    sweeps = {p.stem: load_sweep(p) for p in (ROOT / "configs/sweeps").glob("*.yaml")}
    assert set(sweeps) >= {"cpu", "fedaf_cifar10", "fedaf_lambdas", "fedprox_mu"}
    assert sweeps["cpu"].grid_size() * sweeps["cpu"].samples == 4
    fedaf = sweeps["fedaf_cifar10"].space
    assert fedaf["partition.alpha"]["grid"] == [0.02, 0.05, 0.1]
    assert fedaf["algorithm.ipc"]["grid"] == [10, 20, 50]
    assert fedaf["algorithm.gamma"]["grid"] == [0.5, 0.8, 0.9, 1.0]
    assert set(sweeps["fedaf_lambdas"].space["algorithm.lambda_loc"]) == {"loguniform"}
    assert "algorithm.mu" in sweeps["fedprox_mu"].space


def test_a_trial_reserves_one_bundle_per_client_actor_and_an_empty_head():
    bundles = trial_bundles(ResourcesConfig(actors=3, cpus_per_actor=1, gpus_per_actor=0.25))
    assert bundles == [{}] + [{"CPU": 1, "GPU": 0.25}] * 3


def test_an_in_process_trial_reserves_the_cpus_its_own_process_trains_with():
    bundles = trial_bundles(ResourcesConfig(actors=3, cpus_per_actor=2, in_process=True))
    assert bundles == [{"CPU": 2}]


def test_an_interrupted_sweep_resumes_ranks_its_trials_and_writes_a_runnable_best_config(ray_session, tmp_path, capsys):
    """Interrupt `raysim tune` during its first trial, then `--resume DIR` completes every trial,
    ranks them and writes the best config; resuming the finished sweep reruns nothing."""
    from raysim.tuning import resume_sweep

    # each trial trains in its own process (no actors to start): the rule is the sweep's, not the engine's
    in_process = {**TINY_BASE["resources"], "in_process": True}
    sweep = write_sweep(tmp_path, overrides={**TINY_BASE, "rounds": 2, "resources": in_process}, concurrency=1)
    out = tmp_path / "out"
    env = {**os.environ, "RAY_DEDUP_LOGS": "1"}
    cmd = [sys.executable, "-m", "raysim.cli", "tune"]
    first = subprocess.Popen(
        [*cmd, str(sweep), "resources.num_cpus=2", "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline and not list((out / "runs").glob("*/checkpoints/last.pt")):
        time.sleep(0.2)
    assert list((out / "runs").glob("*/checkpoints/last.pt")), first.communicate()[0].decode()[-2000:]
    first.send_signal(signal.SIGINT)  # Ctrl-C mid-sweep
    try:
        said = first.communicate(timeout=90)[0].decode()
    except subprocess.TimeoutExpired:
        os.killpg(first.pid, signal.SIGKILL)
        raise
    assert "raysim tune --resume" in said, said[-2000:]
    # the resume in this process, on this session's Ray (a Ray already started is the one a sweep uses)
    from raysim.cli import main

    assert main(["tune", "--resume", str(out)]) == 0
    said = capsys.readouterr().out
    table = pq.read_table(out / "trials.parquet").to_pylist()
    assert len(table) == 2 and all(r["status"] == "finished" and r["rounds"] == 2 for r in table), table
    assert "best config" in said
    assert sorted(r["local.lr"] for r in table) == [0.01, 0.05]
    assert table[0]["best_accuracy"] >= table[1]["best_accuracy"] > 0.2  # chance is 0.1
    for row in table:  # every trial keeps the usual outputs
        assert {"summary.json", "metrics.parquet", "config.yaml", "actors.yaml"} <= {
            p.name for p in Path(row["run_dir"]).iterdir()
        }
    best = load_config(out / "best.yaml")
    assert best.local.lr == table[0]["local.lr"] and best.rounds == 2
    again = resume_sweep(out)
    assert [(r["trial_id"], r["best_accuracy"]) for r in again] == [(r["trial_id"], r["best_accuracy"]) for r in table]


def test_a_failing_trial_is_recorded_with_its_error_and_the_sweep_goes_on(ray_session, tmp_path):
    """Issue 45 item 6: one trial raising mid-run leaves the others finished, trials.parquet with the
    failed row and its error, and best.yaml from the trials that finished."""
    from raysim.tuning import run_sweep

    base = {
        **TINY_BASE,
        "algorithm": {"name": "tests.engine_algorithms:FailsWhenAsked"},
        "resources": {**TINY_BASE["resources"], "in_process": True},
    }
    sweep = load_sweep(write_sweep(tmp_path, overrides=base, space={"algorithm.fail": {"grid": [True, False]}}))
    rows = run_sweep(sweep, tmp_path / "out")
    by_fail = {r["algorithm.fail"]: r for r in rows}
    assert by_fail[True]["status"] == "error" and "this trial was asked to fail" in by_fail[True]["error"]
    assert "\n" not in by_fail[True]["error"]
    assert by_fail[False]["status"] == "finished" and by_fail[False]["best_accuracy"] > 0.2
    assert pq.read_table(tmp_path / "out" / "trials.parquet").num_rows == 2
    assert load_config(tmp_path / "out" / "best.yaml").algorithm.fail is False


def test_a_sweep_refused_while_starting_can_be_started_again_on_the_same_out(tmp_path, capsys):
    """Issue 45 item 6: a sweep that never started (here: one trial needs more CPUs than Ray has)
    leaves no dead end: the same --out is accepted again, and --resume says to start it."""
    out = tmp_path / "out"
    big = {**TINY_BASE, "resources": {"actors": 3, "cpus_per_actor": 1, "num_cpus": 2}}
    sweep = write_sweep(tmp_path, overrides=big)
    first = cli_in_process(capsys, "tune", sweep, "--out", out)
    assert first.returncode == 2 and "needs 3 CPUs" in first.stderr, first.stderr
    assert (out / "sweep.yaml").exists() and not (out / "tune").exists()
    with pytest.raises(RaysimError, match="never started"):
        from raysim.tuning import resume_sweep

        resume_sweep(out)
    # the second start gets past the "already holds a sweep" refusal and is refused for the same reason
    second = cli_in_process(capsys, "tune", sweep, "--out", out)
    assert second.returncode == 2 and "needs 3 CPUs" in second.stderr, second.stderr


def test_auto_actors_follow_the_cluster(ray_session):
    from raysim.engine.ray_actors import plan_actors

    assert plan_actors(ResourcesConfig(actors=3), 10) == (3, None)
    count, line = plan_actors(ResourcesConfig(actors=None, cpus_per_actor=1), 10)
    assert count == 2 and "2 client actors" in line  # the session's Ray has 2 CPUs
    assert plan_actors(ResourcesConfig(actors=None, cpus_per_actor=0.5), 10)[0] == 4
    assert plan_actors(ResourcesConfig(actors=None, cpus_per_actor=0.5), 3)[0] == 3  # at most one per client
    assert plan_actors(ResourcesConfig(actors=None, cpus_per_actor=0.1, gpus_per_actor=0.5), 10)[0] == 2
    with pytest.raises(RaysimError, match="cannot hold one actor"):
        plan_actors(ResourcesConfig(actors=None, gpus_per_actor=2), 10)
    # the session's one logical GPU all taken by the server: the line names the server's share
    with pytest.raises(RaysimError, match="lower the per-actor share or resources.server_gpus=1$"):
        plan_actors(ResourcesConfig(actors=None, gpus_per_actor=0.25, server_gpus=1), 10)


def test_auto_is_accepted_in_yaml():
    assert load_config(QUICK, ["resources.actors=auto"]).resources.actors is None
    with pytest.raises(RaysimError, match="resources.actors must be"):
        load_config(QUICK, ["resources.actors=0"])
