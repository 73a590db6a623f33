"""`raysim bench cell`: the work keys each family declares, the two bench runs' settings, the
projection's arithmetic, the refusals, the phases' GMAC/s against the machine's measured peak (a
tiny run in process), and (slow tier) the bench end to end on the embedded data."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raysim.bench.cell import WorkKey, phase_ratio, project, rate_rows, work_keys
from raysim.bench.peak import Peak, measure_peak
from raysim.errors import RaysimError
from raysim.reproduce.named import load_named_config

ROOT = Path(__file__).resolve().parents[1]


def keys_of(name: str, *overrides: str, fraction: float = 0.1) -> dict[str, tuple[str, int, int, int]]:
    config = load_named_config(name, ["dataset.root=/tmp", *overrides])
    return {k.key: (k.phase, k.first, k.second, k.full) for k in work_keys(config, fraction)}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("quickstart", {"local.epochs": ("clients", 1, 1, 1)}),
        (
            "fedaf/cifar10_cpu",
            {"algorithm.steps": ("clients", 12, 24, 120), "algorithm.server_epochs": ("server", 4, 8, 40)},
        ),
        (
            "dcfl/fmnist_ck2_cpu",
            {
                "local.epochs": ("clients", 1, 2, 10),
                "algorithm.steps": ("clients", 20, 40, 200),
                "algorithm.finetune_epochs": ("clients", 2, 4, 20),
                "algorithm.server_epochs": ("server", 20, 40, 200),
            },
        ),
        (
            "dynafed/cifar10_cpu",
            {
                "local.epochs": ("clients", 1, 1, 1),
                "algorithm.iterations": ("server", 30, 60, 300),
                "algorithm.finetune_epochs": ("server", 2, 4, 20),
            },
        ),
        (
            "fedhydra/mnist_2cc_cpu",
            {
                "local.epochs": ("clients", 1, 2, 10),
                "algorithm.generator_steps": ("server", 3, 6, 30),
                "algorithm.stratify_steps": ("server", 2, 4, 20),
            },
        ),
    ],
)
def test_each_family_declares_the_keys_that_count_its_work(name, expected):
    assert keys_of(name) == expected


def test_a_small_key_keeps_its_minimum_and_never_exceeds_its_full_value():
    keys = keys_of("fedhydra/mnist_2cc_cpu", "algorithm.stratify_steps=3", "local.epochs=3", fraction=0.05)
    assert keys["algorithm.stratify_steps"] == ("server", 2, 3, 3)  # >= 2 (eq. 2), then capped at 3
    assert keys["local.epochs"] == ("clients", 1, 2, 3)


def test_a_one_shot_bench_run_trains_its_own_client_stage():
    from raysim.bench.cell import work_of
    from raysim.registry import algorithm_class

    for name in ("fedhydra", "dense", "coboosting", "feddf", "fedavg_oneshot", "ot_fusion"):
        assert work_of(algorithm_class(name)).overrides == {"algorithm.cache_client_stage": False}, name


def test_the_projection_reads_each_phase_line_at_the_full_work():
    keys = [WorkKey("algorithm.steps", "clients", 120, 12, 24), WorkKey("algorithm.server_epochs", "server", 40, 4, 8)]
    first = {"broadcast": 1.0, "clients": 20.0, "server": 5.0, "eval": 2.0, "rest": 10.0}
    second = {"broadcast": 1.2, "clients": 30.0, "server": 7.0, "eval": 2.2, "rest": 12.0}
    projected = project(keys, first, second)
    assert projected["clients"] == pytest.approx(20 + 10 * (120 - 12) / 12)  # a + b * 120 through both runs
    assert projected["server"] == pytest.approx(5 + 2 * (40 - 4) / 4)
    assert projected["eval"] == pytest.approx(2.1) and projected["rest"] == pytest.approx(11.0)  # unscaled: mean
    second["server"] = 4.0  # the second run faster than the first: noise, no growth
    assert project(keys, first, second)["server"] == pytest.approx(4.0)


def test_a_phase_whose_keys_scale_differently_says_so():
    keys = [WorkKey("local.epochs", "clients", 3, 1, 2), WorkKey("algorithm.steps", "clients", 200, 20, 40)]
    ratio, differ = phase_ratio(keys, "clients")
    assert ratio == pytest.approx((2 + 9) / 2) and differ
    assert phase_ratio([WorkKey("local.epochs", "clients", 1, 1, 1)], "clients") == (None, False)


def test_the_peak_is_a_positive_finite_rate_and_leaves_the_thread_count_as_it_was():
    import torch

    threads = torch.get_num_threads()
    peak = measure_peak("cpu", 1)
    assert torch.get_num_threads() == threads
    assert (peak.device, peak.threads, peak.dtype) == ("cpu", 1, "float32")
    for rate in (peak.big_gmacs, peak.small_gmacs):
        assert math.isfinite(rate) and rate > 0.01  # GMAC/s: any CPU since 2000 does more
    if not torch.cuda.is_available():
        assert measure_peak("cuda", 1) is None  # a device this process cannot see is not measured


def test_the_clients_rate_is_compared_with_the_peak_of_all_their_actors():
    """The rates are the run's own (summary.json's gmacs_per_s: tests/test_benchmark.py), set beside
    the peaks; a phase that ran and counted nothing is at 0, one that did not run has none."""
    run = {
        "clients": 10.0,
        "server": 2.0,
        "eval": 0.0,
        "macs_clients": 40e9,
        "macs_server": None,
        "macs_eval": 0.0,
        "gmacs_per_s": {"clients": 4.0},  # 40 GMACs in 10 s of the phase's wall time
    }
    one_actor = Peak("cpu", 1, "float32", big_gmacs=20.0, small_gmacs=5.0)
    server = Peak("cpu", 2, "float32", big_gmacs=30.0, small_gmacs=4.0)
    peaks = {"clients": (one_actor, 2), "server": (server, 1), "eval": (server, 1)}
    rows = {r["phase"]: r for r in rate_rows(run, peaks)}
    assert rows["clients"]["gmacs_per_s"] == pytest.approx(4.0)
    assert rows["clients"]["peak_gmacs_per_s"] == pytest.approx(40.0)  # 2 actors at once
    assert rows["clients"]["share_of_peak_pct"] == pytest.approx(10.0)
    assert rows["server"]["gmacs_per_s"] == 0.0  # nothing counted (FedAvg averages)
    assert rows["eval"]["gmacs_per_s"] is None and rows["eval"]["share_of_peak_pct"] is None  # no seconds


@pytest.mark.slow  # two whole (tiny) runs, in process (no Ray): seconds, but whole runs
def test_bench_cell_reports_each_phases_rate_and_share_of_the_measured_peak(tmp_path, capsys):
    """A tiny config in process (no Ray): the MACs the runs count (clients, server, evaluation) over
    their seconds, beside the peak measured on this machine."""
    from raysim.cli import main

    out = tmp_path / "bench.json"
    tiny = ["rounds=1", "clients.num=2", "clients.per_round=2", "model.name=mlp", "model.hidden=32"]
    one_process = ["resources.in_process=true", "resources.actors=1", "resources.server_threads=1"]
    work = ["local.epochs=2", "local.batch_size=500", "output.tensorboard=false"]
    argv = ["bench", "cell", "quickstart", *tiny, *one_process, *work]
    assert main([*argv, f"out={out}"]) == 0
    printed = capsys.readouterr().out
    for label in ("clients (their steps, in parallel)", "server update", "evaluation"):
        row = [line for line in printed.splitlines() if line.startswith(label) and line.endswith(tuple("0123456789"))]
        rate, share = re.search(r"([\d.]+)\s+[\d.]+\s+([\d.]+)%\s+[\d.]+$", row[-1]).groups()
        assert float(rate) >= 0 and 0 <= float(share) <= 100, row[-1]
    assert "clients, server update, evaluation: 1 thread on cpu in float32" in printed
    rates = {r["phase"]: r for r in json.loads(out.read_text())["rates"]}
    for phase in ("clients", "eval"):  # both ran layers: a rate and a share above 0
        assert rates[phase]["gmacs"] > 0 and 0 < rates[phase]["share_of_peak_pct"] < 100
    assert rates["server"]["gmacs"] == 0  # FedAvg's server only averages


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bench", "cell"], "bench cell needs a config"),
        (["bench", "cell", "quickstart", "fraction=0.9"], "fraction=0.9 must be a number in (0, 0.5]"),
        (["bench", "cell", "quickstart", "fraction=x"], "fraction=x must be a number"),
        (["bench", "cell", "nosuch"], "config 'nosuch' does not exist"),
        (["bench", "cell", "quickstart", "rounds=0"], "rounds"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(capsys, argv, words):
    from raysim.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_other_benches_still_refuse_config_overrides(capsys):
    from raysim.cli import main

    assert main(["bench", "condense", "rounds=3"]) == 2
    assert "bench option 'rounds=3' unknown" in capsys.readouterr().err


@pytest.mark.slow  # two whole (tiny) runs
def test_bench_cell_end_to_end_projects_the_whole_run(tmp_path, capsys, monkeypatch):
    """The command's two real runs and its projection. In process (the runs' start-up of Ray and its
    actors would be most of the test's time, and the projection's arithmetic is the same), one round."""
    from raysim.cli import main

    temporary = tmp_path / "tmp"  # the runs' folders go here, apart from other processes' (tempfile.gettempdir)
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    out = tmp_path / "bench.json"
    args = ["bench", "cell", "quickstart", "rounds=1", "resources.in_process=true", "model.name=mlp", "local.epochs=4"]
    assert main([*args, f"out={out}"]) == 0
    said = capsys.readouterr().out
    assert "local.epochs (clients): 1, then 2, of 4" in said
    assert "projected wall time:" in said and "peak memory: the run's process" in said
    result = json.loads(out.read_text())
    first, second = result["runs"]
    assert first["clients"] > 0 and second["clients"] > 0
    # 4 epochs read off the line through the runs of 1 and 2: the run of 2 plus two more steps of the
    # runs' difference (the measured seconds themselves are the machine's: on a busy one the run of
    # 2 epochs can take less time than the run of 1, and the line is then flat)
    growth = max(0.0, second["clients"] - first["clients"])
    assert result["projected_s"]["clients"] == pytest.approx(second["clients"] + growth * (4 - 2))
    assert result["projected_wall_s"] == pytest.approx(sum(result["projected_s"].values()))
    assert 100 < first["peak_clients_mb"] < 16_000
    assert not list(temporary.glob("raysim-bench-cell-*"))  # the runs' folders are gone


def test_a_killed_bench_cells_run_folder_is_removed_by_the_next_and_a_running_ones_kept(tmp_path):
    """A cell killed with its process group exits from inside Ray and leaves its run's folder."""
    from raysim.bench.cell import RUN_FOLDER_PREFIX, remove_dead_runs_folders

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{RUN_FOLDER_PREFIX}{gone.pid}-abc"
    alive = tmp_path / f"{RUN_FOLDER_PREFIX}{os.getpid()}-def"
    for folder in (dead, alive):
        (folder / "run").mkdir(parents=True)
    remove_dead_runs_folders(tmp_path)
    assert not dead.exists() and alive.exists()


def test_config_loading_error_is_a_raysim_error():
    with pytest.raises(RaysimError):
        load_named_config("nosuch")
