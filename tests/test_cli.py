"""The command line: bad input gets one line and exit code 2; the listing commands work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "configs/quickstart.yaml")


def raysim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.parametrize(
    "args, words",
    [
        ([QUICK, "dataset.name=imagenet"], "unknown dataset 'imagenet'"),
        ([QUICK, "dataset.name=mnist", "dataset.root=/no/such/folder"], "does not exist"),
        ([QUICK, "dataset.name=cifar10"], "raysim data get cifar10"),
        ([QUICK, "partition.alpha=0"], "partition.alpha must be > 0"),
        ([QUICK, "partition.alpha=-0.5"], "partition.alpha must be > 0"),
        ([QUICK, "clients.num=20000", "clients.per_round=1"], "exceeds the 10000 training samples"),
        ([QUICK, "algorithm.name=fedsgd"], "unknown algorithm 'fedsgd'"),
        ([QUICK, "model.name=vgg"], "unknown model 'vgg'"),
        ([QUICK, "modle.name=convnet"], "unknown config key 'modle'"),
        ([QUICK, "local.epocs=3"], "unknown config key 'local.epocs'"),
        ([QUICK, "algorithm.mu=0.1"], "unknown config key 'algorithm.mu'"),
        ([QUICK, "rounds=many"], "must be an integer"),
        ([QUICK, "eval.targets=[0.8,80]"], "eval.targets must be test accuracies in (0, 1], got [80]"),
        (["MALFORMED"], "not valid YAML"),
        (["/no/such/config.yaml"], "does not exist"),
    ],
)
def test_bad_input_gives_one_line_and_exit_code_2(tmp_path, capsys, args, words):
    from raysim.cli import main

    if args == ["MALFORMED"]:
        bad = tmp_path / "bad.yaml"
        bad.write_text("rounds: 5\ndataset: {name: mnist\n")
        args = [str(bad)]
    # In process: the entry point itself (python -m raysim.cli) is exercised by the tests that call raysim().
    code = main(["run", *args, "--out", str(tmp_path / "run")])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert words in lines[0] and "Traceback" not in stderr
    assert not (tmp_path / "run").exists()  # nothing half-made


@pytest.mark.slow  # a subprocess: about 4 s
def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    result = raysim("run", "--resume", str(tmp_path))
    assert result.returncode == 2 and "not a run directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_listings(capsys):
    algorithms = cli_in_process(capsys, "algorithms")
    assert algorithms.returncode == 0
    for name in ("fedavg", "fedprox", "scaffold", "fednova", "moon", "feddyn", "fedbn", "feddisco", "feddm", "fedaf"):
        assert name in algorithms.stdout
    datasets = cli_in_process(capsys, "datasets")
    assert datasets.returncode == 0
    for name in (
        "embedded",
        "mnist",
        "fashion_mnist",
        "cifar10",
        "cifar100",
        "svhn",
        "cinic10",
        "domainnet",
        "convnet",
        "resnet18",
    ):
        assert name in datasets.stdout


def test_partition_prints_counts_and_draws_the_bubble_chart(tmp_path, capsys):
    png = tmp_path / "partition.png"
    result = cli_in_process(capsys, "partition", QUICK, "partition.alpha=0.1", "--plot", png)
    assert result.returncode == 0, result.stderr
    assert "10000" in result.stdout.replace(",", "")
    assert png.stat().st_size > 1000


def test_report_folds_seeds(run_tiny, tmp_path, capsys):
    runs = [run_tiny(seed=s)[1] for s in (0, 1)]
    result = cli_in_process(capsys, "report", *runs)
    assert result.returncode == 0, result.stderr
    assert "+-" in result.stdout and "fedavg" in result.stdout
    assert result.stdout.splitlines()[2].split()[2] == "2"  # one row: 2 seeds


def fake_run(run: Path, algorithm: dict, seed: int, best: float, config: dict = (), **summary) -> str:
    """A run directory with only config.yaml and summary.json, for `raysim report`."""
    import json

    import yaml

    run.mkdir()
    config = {"seed": seed, "rounds": 10, "dataset": {"name": "cifar10"}, "algorithm": algorithm, **dict(config)}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "summary.json").write_text(
        json.dumps(
            {
                "final_accuracy": best,
                "best_accuracy": best,
                "rounds": 10,
                "bytes_up": 1e6,
                "bytes_down": 1e6,
                "wall_time_s": 60.0,
                **summary,
            }
        )
    )
    return str(run)


def test_report_compares_algorithms_with_different_parameters(tmp_path):
    """FedAvg beside FedDM and FedAF (each with its own algorithm.* keys), FedDM at two settings."""
    from raysim.report import report

    runs = [
        fake_run(tmp_path / "avg", {"name": "fedavg"}, 0, 0.40),
        fake_run(tmp_path / "dm10", {"name": "feddm", "rho": 5.0, "init_average_of": 10}, 0, 0.39),
        fake_run(tmp_path / "dm10b", {"name": "feddm", "rho": 5.0, "init_average_of": 10}, 1, 0.41),
        fake_run(tmp_path / "dm2", {"name": "feddm", "rho": 5.0, "init_average_of": 2}, 0, 0.51),
        fake_run(tmp_path / "af", {"name": "fedaf", "gamma": 0.5}, 0, 0.48),
    ]
    rows = report(runs).splitlines()[2:]
    assert [r.split("  ")[0] for r in rows] == [
        "fedavg cifar10",
        "feddm cifar10 algorithm.init_average_of=10",
        "feddm cifar10 algorithm.init_average_of=2",
        "fedaf cifar10",
    ]
    assert "0.4000 +- 0.0141" in rows[1]  # two seeds folded


def test_report_keeps_runs_apart_by_how_they_computed_and_folds_where_they_ran(tmp_path):
    """raysim.config.NEUTRAL_KEYS: the seed and where a run ran (its actors, in process or not) fold;
    bfloat16 changes the numbers, so its runs are an experiment of their own, labelled. A run whose
    config predates a resources key ran at its default and folds with the runs that state it."""
    from raysim.report import report

    fedavg = {"name": "fedavg"}
    runs = [
        fake_run(tmp_path / "a0", fedavg, 0, 0.40, {"resources": {"actors": 2, "precision": "float32"}}),
        fake_run(tmp_path / "a1", fedavg, 1, 0.42, {"resources": {"in_process": True, "precision": "float32"}}),
        fake_run(tmp_path / "old", fedavg, 2, 0.44, {"resources": {"actors": 4}}),  # written before `precision`
        fake_run(tmp_path / "b0", fedavg, 0, 0.30, {"resources": {"actors": 2, "precision": "bfloat16"}}),
    ]
    rows = report(runs).splitlines()[2:]
    assert [re.split(r"\s{2,}", r)[:2] for r in rows] == [
        ["fedavg cifar10 resources.precision=float32", "3"],
        ["fedavg cifar10 resources.precision=bfloat16", "1"],
    ]


def test_report_shows_the_rounds_to_each_target_accuracy_and_seeds_that_never_reached_it(tmp_path):
    from raysim.report import report

    def run(name, algorithm, seed, reached, targets=(0.5, 0.6), batch_size=128):
        return fake_run(
            tmp_path / name,
            {"name": algorithm},
            seed,
            0.6,
            {"eval": {"targets": list(targets), "batch_size": batch_size}},
            rounds_to_accuracy=reached,
        )

    runs = [
        run("avg0", "fedavg", 0, {"0.5": 4, "0.6": None}),
        run("avg1", "fedavg", 1, {"0.5": 6, "0.6": 9}, targets=[0.6, 0.5], batch_size=1000),
        run("prox0", "fedprox", 0, {"0.5": 3, "0.6": None}),
        run("prox1", "fedprox", 1, {"0.5": None, "0.6": None}),
        run("dm0", "feddm", 0, {"0.5": 2}, targets=[0.5]),
    ]
    text = report(runs)
    header, _, *rows = text.splitlines()
    assert header.split()[-2:] == ["rounds@0.5", "rounds@0.6"]
    cells = {r.split()[0]: re.split(r"\s{2,}", r)[-2:] for r in rows}  # cells are 2+ spaces apart
    assert cells["fedavg"] == ["5.0 +- 1.4", ">10 (1/2)"]
    assert cells["fedprox"] == [">10 (1/2)", ">10"]
    assert cells["feddm"] == ["2", "-"]  # never asked for 0.6
    # eval.targets only reads the history and eval.batch_size changes no prediction: runs differing
    # there are seeds of one experiment (fedavg's two rows fold), and neither labels a row
    assert "eval." not in text and [r.split()[2] for r in rows] == ["2", "2", "1"]


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_asking_for_more_gpus_than_the_machine_has_is_one_clear_line(tmp_path):
    result = raysim(
        "run",
        QUICK,
        "resources.actors=2",
        "resources.gpus_per_actor=8",
        "resources.num_cpus=2",
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]  # nothing else: no bar, no Ray notice
    assert len(errors) == 1 and errors[0].startswith("raysim: error: the run needs 16 GPUs"), result.stderr
    assert "has 0" in errors[0]
    assert not (tmp_path / "run").exists()  # nothing ran: the same --out can be used again


def test_a_root_given_for_the_embedded_dataset_is_noted_as_ignored(capsys):
    from raysim.experiment import load_config
    from raysim.runner import prepare

    prepare(load_config(QUICK, ["dataset.root=/some/data"]))
    err = capsys.readouterr().err
    assert "dataset.root=/some/data is ignored" in err and "dataset.name=" in err
    prepare(load_config(QUICK, []))
    assert "ignored" not in capsys.readouterr().err
