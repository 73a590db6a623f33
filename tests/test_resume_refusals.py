"""A resume that cannot give a true summary is refused with one line naming the file (issue 45, item 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raysim.errors import RaysimError
from raysim.experiment import load_config
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def two_rounds(tmp_path: Path, **extra) -> Path:
    from raysim.runner import run_experiment

    run_dir = tmp_path / "run"
    config = load_config(
        ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{"resources.in_process": True, **extra})
    )
    run_experiment(config, run_dir)
    return run_dir


def resume(run_dir: Path, *overrides: str):
    from raysim.resume import resume_config
    from raysim.runner import run_experiment

    return run_experiment(resume_config(run_dir, list(overrides)), run_dir)


def test_a_resume_without_metrics_parquet_is_refused_naming_it(tmp_path):
    run_dir = two_rounds(tmp_path)
    (run_dir / "metrics.parquet").unlink()
    with pytest.raises(RaysimError, match=r"metrics.parquet is missing but the run has a checkpoint"):
        resume(run_dir, "rounds=3")


def test_a_resume_with_metrics_parquet_short_of_the_checkpoint_is_refused(tmp_path):
    import pyarrow.parquet as pq

    run_dir = two_rounds(tmp_path)
    table = pq.read_table(run_dir / "metrics.parquet")
    pq.write_table(
        table.filter(pq.read_table(run_dir / "metrics.parquet")["round"].to_numpy() < 2), run_dir / "metrics.parquet"
    )
    with pytest.raises(RaysimError, match=r"ends at round 1 but the checkpoint is at round 2"):
        resume(run_dir, "rounds=3")


def test_a_truncated_metrics_parquet_is_one_line_naming_it_also_through_actors(tmp_path):
    run_dir = two_rounds(tmp_path)
    path = run_dir / "metrics.parquet"
    path.write_bytes(path.read_bytes()[:50])
    done = subprocess.run(
        [sys.executable, "-m", "raysim.cli", "run", "--resume", str(run_dir), "rounds=3", "resources.in_process=false"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("note:")]
    assert len(lines) == 1 and "metrics.parquet cannot be read" in lines[0], done.stderr


def test_files_that_are_not_raysims_in_client_state_are_ignored(tmp_path):
    """Issue 45 item 9: a stray r000001.backup.pt (or any other file) beside a client's state files
    is neither read nor deleted, and the newest real state before the round is the one loaded."""
    from raysim.engine.client_state import ClientStateStore

    store = ClientStateStore(tmp_path)
    store.save(0, 1, {"c": np.ones(2, np.float32)})
    store.save(0, 2, {"c": np.full(2, 2.0, np.float32)})
    folder = tmp_path / "client_00000"
    strays = ["r000001.backup.pt", "rnotes.pt", "README.txt", "r000009.pt.tmp"]
    for name in strays:
        (folder / name).write_text("not raysim's")
    fresh = ClientStateStore(tmp_path)  # as after a resume: nothing in memory
    np.testing.assert_array_equal(fresh.load(0, 3)["c"], [2.0, 2.0])
    fresh.save(0, 3, {"c": np.full(2, 3.0, np.float32)})
    fresh.save(0, 4, {"c": np.full(2, 4.0, np.float32)})
    assert sorted(p.name for p in folder.iterdir()) == sorted(strays + ["r000003.pt", "r000004.pt"])
