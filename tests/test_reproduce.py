"""`raysim reproduce` end to end on the embedded data: the smoke table is written with the paper's
column and mean +- std; run again, from the runs' records alone, it skips every finished run without
starting Ray and writes the same table; killed in the middle of a run it resumes and ends with the
numbers of an uninterrupted reproduction; runs side by side give the numbers of runs one after
another."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysim.outputs.run_dir import RECORD, RunDir
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]
IN_PROCESS = "resources.in_process=true"


def reproduce(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raysim.cli", "reproduce", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def measured(out: Path) -> dict[tuple[str, str], str]:
    """(cell, method) -> the per-seed figures in table.csv (the numbers; wall times left out)."""
    with open(out / "table.csv") as f:
        return {(r["cell"], r["method"]): r["per_seed"] for r in csv.DictReader(f) if r["kind"] == "method"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "table"
    started = time.perf_counter()
    # in process (no actors to start): a setting of this machine's, which changes no number
    done = reproduce("smoke", "--out", str(out), IN_PROCESS)
    return out, done, time.perf_counter() - started


def test_smoke_table_is_written_beside_the_papers_figures(smoke):
    out, done, seconds = smoke
    assert done.returncode == 0, done.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert "| cell | method | paper | final | last-5 | best (test-selected) | selected |" in table
    assert "| FMNIST sample, Dir(0.5) | FedAvg | 87.2 +- 0.3 |" in table
    assert "fedprox > fedavg | 87.58 vs 87.19 | yes |" in table and " of 2 seeds |" in table
    rounds = re.findall(r"^\| FMNIST sample, Dir\(0.5\) \| (\w+) \| 0.5 \|  \| (.+) \|$", table, re.M)
    assert [m for m, _ in rounds] == ["FedAvg", "FedProx"] and all(r != "-" for _, r in rounds), rounds
    for run in ("fedavg/s0", "fedavg/s1", "fedprox/s0", "fedprox/s1"):
        assert RunDir(out / "fmnist_dir0.5" / run).read_summary()["finished"]
    rows = measured(out)
    assert all(len(v.split()) == 2 for v in rows.values()), rows  # two seeds each
    for value in " ".join(rows.values()).split():
        assert float(value) > 30  # ten classes: far above chance after 3 rounds
    assert (out / "curves.png").stat().st_size > 10_000
    assert (out / "curves_mb.png").stat().st_size > 10_000  # the table's figures: [rounds, mb]
    assert f"raysim reproduce smoke --scale cpu {IN_PROCESS} --out DIR" in table  # what regenerates it
    assert re.search(r"^\| FMNIST sample, Dir\(0.5\) \| FedAvg \| \d+\.\d( \+- \d+\.\d)? \|$", table, re.M)  # extra
    assert "[4/4]" in done.stderr
    print(f"smoke table: {seconds:.0f} s")


def test_what_git_keeps_of_the_folder_writes_the_table_again_in_seconds(smoke, tmp_path):
    """The folder's .gitignore leaves each run's record to version control (what the experiment reports
    commit: no checkpoints, no events), and from those files alone the table is written again."""
    runs, _, _ = smoke
    repo = tmp_path / "repo"
    shutil.copytree(runs, repo)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"], cwd=repo, check=True, capture_output=True, text=True
    )
    kept = [Path(name) for name in listed.stdout.split()]
    run_files = [k for k in kept if len(k.parts) == 4]  # CELL/METHOD/sSEED/FILE
    assert sorted(k.name for k in run_files) == sorted(RECORD * 4)  # 4 runs, each its record only
    out = tmp_path / "records"
    for name in run_files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / name, out / name)
    before = (runs / "table.csv").read_text()
    started = time.perf_counter()
    again = reproduce("smoke", "--out", str(out))
    seconds = time.perf_counter() - started
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 of 4 runs finished already: skipped" in again.stderr
    assert "[1/" not in again.stderr  # nothing ran
    assert (out / "table.csv").read_text() == before
    assert seconds < 30, seconds  # no Ray started: the interpreter, torch and the table


def test_table_only_writes_the_table_from_the_finished_runs_and_runs_nothing(smoke, tmp_path, capsys):
    """A table part-way: FedAvg's two runs are there, FedProx's not; --table-only writes FedAvg's
    row as the whole table has it and leaves FedProx's empty, without starting Ray."""
    runs, _, _ = smoke
    out = tmp_path / "part"
    shutil.copytree(runs / "fmnist_dir0.5" / "fedavg", out / "fmnist_dir0.5" / "fedavg")
    done = cli_in_process(capsys, "reproduce", "smoke", "--out", out, "--table-only")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the table from 2 of 4 runs (finished); nothing run" in done.stderr and "[1/" not in done.stderr
    assert not (out / "fmnist_dir0.5" / "fedprox").exists()
    assert measured(out)[("fmnist_dir0.5", "fedavg")] == measured(runs)[("fmnist_dir0.5", "fedavg")]
    assert measured(out)[("fmnist_dir0.5", "fedprox")] == ""
    assert "raysim reproduce smoke --scale cpu --out DIR" in (out / "table.md").read_text()  # what runs it all


def test_table_only_refuses_a_cell_whose_runs_ran_on_different_data(smoke, tmp_path, capsys):
    """Records received without the data: the runs of a cell are checked against each other."""
    runs, _, _ = smoke
    out = tmp_path / "mixed"
    shutil.copytree(runs / "fmnist_dir0.5" / "fedavg", out / "fmnist_dir0.5" / "fedavg")
    edited = out / "fmnist_dir0.5" / "fedavg" / "s1" / "data.json"
    edited.write_text(edited.read_text().replace('"digest": "', '"digest": "0'))
    done = cli_in_process(capsys, "reproduce", "smoke", "--out", out, "--table-only")
    assert done.returncode == 2 and "the runs of cell fmnist_dir0.5 ran on different data" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (out / "table.md").exists()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["killed", "ctrl-c"])
def test_stopped_midway_it_resumes_with_the_same_numbers(smoke, tmp_path, capsys, sig):
    """SIGKILL (a lost machine) or Ctrl-C (SIGINT to the foreground process group, as a terminal sends
    it): the finished run stays, the same command skips it and resumes the interrupted one. One method
    of the smoke table (its two seeds) is enough for the rule; in process, as the smoke fixture (no
    actors to start: the resume's rules are the engine's either way)."""
    out = tmp_path / "table"
    command = ["smoke", "--methods", "fedavg", "--out", str(out), IN_PROCESS]
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "reproduce", *command],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # as from a terminal: a suite started in the background of a shell without job control
        # ignores SIGINT, and its children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # kill it once the second run has checkpointed a round (the first finished, the second half done)
    second = RunDir(out / "fmnist_dir0.5" / "fedavg" / "s1")
    deadline = time.time() + 300
    while time.time() < deadline:
        if second.checkpoint_file.exists() and not second.read_summary().get("finished"):
            break
        assert proc.poll() is None, "ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    code = proc.wait(timeout=60)
    if sig == signal.SIGINT:
        stderr = proc.stderr.read().decode()
        assert code == 130 and "interrupted: finished runs are kept" in stderr, stderr[-2000:]
    assert not second.read_summary().get("finished")
    again = cli_in_process(capsys, "reproduce", *command)  # the same command, here (the stopped one was another)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 2 runs finished already: skipped" in again.stderr
    assert "fmnist_dir0.5/fedavg/s1: resumed" in again.stderr
    rows = measured(out)
    assert len(rows) == 1 and rows.items() <= measured(smoke[0]).items(), rows  # an uninterrupted run's figures


def test_runs_side_by_side_give_the_numbers_of_runs_one_after_another(ray_session, tmp_path, monkeypatch, capsys):
    table = tmp_path / "pair.yaml"
    table.write_text(
        """
title: two runs that fit side by side on 2 cores
report: experiments/engine/README.md
seeds: 1
cells:
  a:
    config: {cpu: quickstart}
    overrides: {rounds: 1, model: {name: mlp}, resources: {actors: 1, cpus_per_actor: 1}}
    paper: {fedavg: 80, fedprox: 81}
methods:
  fedavg: {algorithm: {name: fedavg}}
  fedprox: {algorithm: {name: fedprox, mu: 0.01}}
"""
    )
    # both in this process: side by side on the session's Ray (2 CPUs: two runs of one actor fit), then
    # one after another in process (no actors: a setting that changes no number)
    from raysim.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["reproduce", str(table), "--out", str(tmp_path / "side")]) == 0
    assert "2 runs, 2 side by side" in capsys.readouterr().err
    assert main(["reproduce", str(table), "--out", str(tmp_path / "one"), "--parallel", "1", IN_PROCESS]) == 0
    assert "side by side" not in capsys.readouterr().err
    assert measured(tmp_path / "side") == measured(tmp_path / "one")


@pytest.mark.parametrize(
    "args, words",
    [
        (["smoke"], "needs --out DIR"),
        ([], "no table given"),
        (["nosuch", "--out", "x"], "no table 'nosuch'"),
        (["smoke", "--out", "x", "--seeds", "0"], "--seeds '0'"),
        (["smoke", "--out", "x", "--cells", "nosuch"], "has no cell nosuch"),
        (["dcfl_table2", "--out", "x", "--cells", "fmnist_ck2"], "give --data-root DIR"),
        (["smoke", "--out", "x", "--table-only"], "no run of the selection has finished in 'x'"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(args, words, capsys):
    done = cli_in_process(capsys, "reproduce", *args)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_list_names_the_tables_with_cells_methods_and_estimates(capsys):
    done = cli_in_process(capsys, "reproduce", "--list")
    assert done.returncode == 0, done.stderr
    assert "smoke: " in done.stdout and "dcfl_table2: " in done.stdout
    assert "cells:   fmnist_dir0.5" in done.stdout
    assert "1 cells x 2 methods x 2 seeds: " in done.stdout and "on this machine" in done.stdout


def test_time_left_is_estimated_from_whole_runs_only():
    """A resumed run ran only its last rounds: the time left is estimated from runs run whole, so a
    table resumed in a new session does not promise minutes for hours of runs."""
    import io
    from types import SimpleNamespace

    from raysim.reproduce.runs import TableProgress

    out = io.StringIO()
    progress = TableProgress(total=4, parallel=1, stream=out)
    progress.finished(SimpleNamespace(name="c/m/s0"), "resumed, 0.1 min", 6.0, resumed=True)
    assert "min left" not in out.getvalue()
    progress.finished(SimpleNamespace(name="c/m/s1"), "final accuracy 0.5, 2.0 min", 120.0)
    assert out.getvalue().splitlines()[-1].endswith("about 4.0 min left)")
