"""Run directories that cannot be clobbered, checkpoints that cannot run code, and honest errors:
a planted pickle, two runs on one directory, a live run's resume, bad values, a full disk, a
damaged checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from raysim.cli import main
from raysim.outputs.run_dir import RunDir
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")


class _PlantedPayload:
    """Unpickling this creates a file: the proof that loading ran code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def copy_of(run_dir: Path, tmp_path: Path, name: str = "run") -> Path:
    target = tmp_path / name
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns(".lock"))
    return target


def rounds_in_metrics(run_dir: Path) -> list[int]:
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return sorted({r["round"] for r in rows if r["client"] is None and r["metric"] == "accuracy"})


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# ------------------------------------------------------------------ 1. checkpoints cannot run code
def test_resume_refuses_a_planted_checkpoint_pickle_without_running_it(run_tiny, tmp_path, capsys):
    _, finished = run_tiny(**{"algorithm.name": "scaffold"})
    run_dir = copy_of(finished, tmp_path)
    marker = tmp_path / "code_ran"
    torch.save({"round": 1, "state": _PlantedPayload(marker)}, run_dir / "checkpoints/last.pt")
    config_before = (run_dir / "config.yaml").read_text()

    assert main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "refuses to load it" in lines[0] and "last.pt" in lines[0], lines
    assert not marker.exists()
    assert (run_dir / "config.yaml").read_text() == config_before  # rounds=3 was not written


def test_a_planted_client_state_pickle_is_refused_inside_the_actor_in_one_line(run_tiny, tmp_path, capsys):
    _, finished = run_tiny(**{"algorithm.name": "scaffold"})
    run_dir = copy_of(finished, tmp_path)
    marker = tmp_path / "code_ran"
    torch.save({"control": _PlantedPayload(marker)}, run_dir / "client_state/client_00000/r000002.pt")

    assert main(["run", "--resume", str(run_dir), "rounds=3", "resources.in_process=false"]) == 2
    lines = error_lines(capsys)
    refusal = [line for line in lines if line.startswith("raysim: error:")]
    assert len(refusal) == 1 and "client_00000/r000002.pt" in refusal[0] and "refuses to load it" in refusal[0]
    assert "Traceback" not in capsys.readouterr().err
    assert not marker.exists()


def test_states_round_trip_through_the_safe_format(tmp_path):
    import numpy as np

    from raysim.outputs.state_files import load_state, save_state

    state = {
        "weights": {"fc.weight": torch.randn(3, 4)},
        "counts": np.arange(6, dtype=np.uint16).reshape(2, 3),
        3: [1, 2.5, "x", None, (np.float32(0.5), np.int64(7))],
        "empty": np.zeros((0, 4)),
        "batches_tracked": np.array(12, dtype=np.int64),
    }
    save_state(tmp_path / "s.pt", state)
    back = load_state(tmp_path / "s.pt", "")
    assert torch.equal(back["weights"]["fc.weight"], state["weights"]["fc.weight"])
    assert back["counts"].dtype == np.uint16 and np.array_equal(back["counts"], state["counts"])
    assert back[3] == [1, 2.5, "x", None, (0.5, 7)] and back["empty"].shape == (0, 4)
    # exact types and shapes: a resumed run pickles the same payload bytes as an uninterrupted one
    assert [type(v) for v in back[3][4]] == [np.float32, np.int64]
    assert back["batches_tracked"].shape == () and back["batches_tracked"] == 12
    with pytest.raises(TypeError, match="cannot hold safely"):
        save_state(tmp_path / "bad.pt", {"x": object()})


# ------------------------------------------------------------------ 3. one process per run directory
def hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process that owns `run_dir` (as a running `raysim run` does) until it is killed."""
    code = (
        "import sys; from raysim.outputs.run_lock import lock_run_dir; lock_run_dir(sys.argv[1]); "
        "print('locked', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout.readline().strip() == b"locked"
    return proc


def test_a_live_run_directory_is_refused_and_freed_when_its_owner_is_killed(run_tiny, tmp_path, capsys):
    _, finished = run_tiny()
    run_dir = copy_of(finished, tmp_path)
    owner = hold_lock(run_dir)
    try:
        assert main(["run", "--resume", str(run_dir)]) == 2
        lines = error_lines(capsys)
        assert len(lines) == 1 and f"in use by another raysim process (pid {owner.pid})" in lines[0], lines
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        second = hold_lock(fresh)
        assert main(["run", QUICKSTART, *tiny_overrides(), "--out", str(fresh)]) == 2
        assert "in use by another raysim process" in error_lines(capsys)[0]
        second.kill()
        second.wait()
    finally:
        owner.send_signal(signal.SIGKILL)  # the kernel drops the lock with its process
        owner.wait()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "finished all 2 rounds: nothing to run" in capsys.readouterr().out


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_two_runs_started_together_on_one_directory_one_wins(tmp_path):
    out = tmp_path / "same"
    cmd = [
        sys.executable,
        "-m",
        "raysim.cli",
        "run",
        QUICKSTART,
        *tiny_overrides(**{"rounds": 1, "resources.in_process": True, "resources.num_cpus": 1}),
        "--out",
        str(out),
    ]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read().decode()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "in use by another raysim process" in loser or "already holds a run" in loser
    assert yaml.safe_load((out / "config.yaml").read_text())["rounds"] == 1
    assert rounds_in_metrics(out) == [1]


# ------------------------------------------------------------------ 4. resume writes nothing it did not run
def test_resuming_a_finished_run_says_so_without_starting_ray(run_tiny, tmp_path, capsys, monkeypatch):
    import raysim.engine.ray_session as session

    _, finished = run_tiny()
    run_dir = copy_of(finished, tmp_path)

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(session, "ray_session", no_ray)
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert f"'{run_dir}' has finished all 2 rounds: nothing to run" in capsys.readouterr().out


# ------------------------------------------------------------------ 5. values that cannot be right
@pytest.mark.parametrize(
    "override, words",
    [
        ("local.lr=.nan", "'local.lr' must be a finite number"),
        ("local.lr=.inf", "'local.lr' must be a finite number"),
        ("local.lr=-0.01", "'local.lr' is a learning rate and must be >= 0"),
        ("local.momentum=1.0", "'local.momentum' is a momentum and must be in [0, 1)"),
        ("local.momentum=-0.5", "'local.momentum' is a momentum and must be in [0, 1)"),
        ("local.weight_decay=-1e-4", "'local.weight_decay' is a weight decay and must be >= 0"),
        ("clients.per_round=2.5", "clients.per_round must be a count >= 1 or a fraction in (0, 1], got 2.5"),
        ("algorithm.server_lr=-1", "'algorithm.server_lr' is a learning rate"),
    ],
)
def test_values_that_cannot_be_right_are_refused_in_one_line(override, words, tmp_path, capsys):
    extra = ["algorithm.name=feddm"] if override.startswith("algorithm.") else []
    assert main(["run", QUICKSTART, *extra, override, "--out", str(tmp_path / "r")]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ 6. honest errors
def test_out_pointing_at_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("not a folder")
    assert main(["run", QUICKSTART, "--out", str(target)]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "is a file, not a folder" in lines[0], lines
    assert main(["run", QUICKSTART, "--out", str(target / "below")]) == 2
    assert "is a file, not a folder" in error_lines(capsys)[0]


def test_a_damaged_checkpoint_names_the_file_and_the_way_back(run_tiny, tmp_path, capsys):
    _, finished = run_tiny()
    run_dir = copy_of(finished, tmp_path)
    last, previous = run_dir / "checkpoints/last.pt", run_dir / "checkpoints/previous.pt"
    assert RunDir(run_dir).read_checkpoint()["round"] == 2 and torch.load(previous, weights_only=True)["round"] == 1
    last.write_bytes(last.read_bytes()[:200])  # truncated, as by a crash of the disk, not of raysim

    assert main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and f"{last} is damaged or truncated" in lines[0], lines
    assert f"mv {previous} {last}" in lines[0]
    os.replace(previous, last)  # the way back the message gives
    assert main(["run", "--resume", str(run_dir), "rounds=3"]) == 0
    assert rounds_in_metrics(run_dir) == [1, 2, 3]
    assert RunDir(run_dir).read_checkpoint()["round"] == 3


@pytest.mark.parametrize(
    "planted, lacking",
    [({"state": {}, "wall_time_s": 1.0}, "round"), ({"round": 2, "wall_time_s": 1.0}, "state"), ([1, 2], "a list")],
)
def test_a_checkpoint_that_loads_but_lacks_its_fields_is_one_line(run_tiny, tmp_path, capsys, planted, lacking):
    """Issue 45 item 10: tensors and containers only, so it loads; but it is not a checkpoint."""
    _, finished = run_tiny()
    run_dir = copy_of(finished, tmp_path)
    last = run_dir / "checkpoints/last.pt"
    torch.save(planted, last)
    assert main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and f"{last} is not a raysim checkpoint" in lines[0] and lacking in lines[0], lines


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs (root only: mounting needs it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_keeps_the_finished_rounds_and_says_what_to_do(ray_session, small_disk, capsys):
    run_dir = small_disk / "run"
    tiny = tiny_overrides(**{"rounds": 1, "resources.in_process": True})
    assert main(["run", QUICKSTART, *tiny, "--out", str(run_dir)]) == 0
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # take every free byte
        block = b"\0" * 2**16
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
    capsys.readouterr()

    assert main(["run", "--resume", str(run_dir), "rounds=2", "resources.in_process=false"]) == 2
    lines = [line for line in error_lines(capsys) if line.startswith("raysim: error:")]
    assert len(lines) == 1 and "no space left on device" in lines[0], lines
    assert f"raysim run --resume {run_dir}" in lines[0] and "\x1b[" not in lines[0]
    assert rounds_in_metrics(run_dir) == [1] and RunDir(run_dir).read_checkpoint()["round"] == 1

    filler.unlink()
    assert main(["run", "--resume", str(run_dir), "rounds=2"]) == 0
    assert rounds_in_metrics(run_dir) == [1, 2]


def test_an_error_raised_in_an_actor_is_named_and_its_traceback_kept(tmp_path):
    """Ray's own first line names only the actor's method; the message names the error and where
    the remote traceback went."""
    import traceback

    from ray.exceptions import RayTaskError

    from raysim.runner import failure_message

    try:
        raise RuntimeError("This backward function was compiled with donated buffers\nsecond line")
    except RuntimeError as cause:
        exc = RayTaskError("run_round", traceback.format_exc(), cause, proctitle="ray::ServerActor.run_round()")
    message, refused_at_start = failure_message(exc.as_instanceof_cause(), tmp_path)
    assert not refused_at_start and "\n" not in message
    assert "(RuntimeError: This backward function was compiled with donated buffers)" in message
    assert f"traceback in {tmp_path / 'error.log'}" in message and f"raysim run --resume {tmp_path}" in message
    assert "second line" in (tmp_path / "error.log").read_text()
