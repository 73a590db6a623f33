"""A run or sweep directory received from someone else cannot run code (issue 45, items 4 and 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from raysim.experiment import load_config
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]

# A module that leaves a mark when imported: the stand-in for code a stranger ships in a run directory.
PLANTED = """
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("code ran")
from raysim.algorithms.fedavg.fedavg import FedAvg


class Plain(FedAvg):
    name = "plain-received"
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # `python -m` puts the working directory on the import path: the case the issue found
    return subprocess.run(
        [sys.executable, "-m", "raysim.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


PLANTED_FACTORY = """
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("code ran")
from raysim.models import build_model


def factory(in_channels, num_classes, image_size):
    raise SystemExit("the planted factory was called")
"""


def received_run(tmp_path: Path, key: str = "algorithm", planted: str = PLANTED, name: str = "Plain") -> Path:
    """A finished two-round run whose config names `received_helpers:<name>` under `key`, shipped beside it."""
    from raysim.runner import run_experiment

    run_dir = tmp_path / "received"
    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{"resources.in_process": True}))
    run_experiment(config, run_dir)
    tree = yaml.safe_load((run_dir / "config.yaml").read_text())
    tree[key]["name"] = f"received_helpers:{name}"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    (run_dir / "received_helpers.py").write_text(planted)
    return run_dir


def test_resume_of_a_received_run_imports_none_of_its_code_unless_allowed(tmp_path):
    run_dir = received_run(tmp_path)
    refused = cli("run", "--resume", ".", cwd=run_dir)
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert "algorithm.name='received_helpers:Plain' is user code" in line and "--allow-code" in line, line
    assert not (run_dir / "IMPORTED").exists(), "the planted module ran on --resume"

    allowed = cli("run", "--resume", ".", "--allow-code", cwd=run_dir)
    assert allowed.returncode == 0, allowed.stderr
    assert "has finished all 2 rounds" in allowed.stdout
    assert (run_dir / "IMPORTED").exists(), "--allow-code should import the config's module"


def test_a_resumed_model_factory_is_not_imported_either(tmp_path):
    """The model factory is imported when the model is built (not while the config is read): it is
    refused up front, from any working directory."""
    run_dir = received_run(tmp_path, key="model", planted=PLANTED_FACTORY, name="factory")
    refused = cli("run", "--resume", str(run_dir), "rounds=3", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "model.name='received_helpers:factory' is user code" in refused.stderr and "--allow-code" in refused.stderr
    assert not (run_dir / "IMPORTED").exists()


def test_resume_from_inside_the_run_directory_needs_allow_code(tmp_path):
    """Ray puts the driver's working directory on every worker's import path: a received directory
    holding e.g. a `raysim/` or `numpy/` folder would shadow the real ones in the actors."""
    from raysim.runner import run_experiment

    run_dir = tmp_path / "received"
    run_experiment(
        load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{"resources.in_process": True})), run_dir
    )
    inside = cli("run", "--resume", ".", cwd=run_dir)
    assert inside.returncode == 2 and "from outside it" in inside.stderr and "--allow-code" in inside.stderr, (
        inside.stderr
    )
    outside = cli("run", "--resume", "received", cwd=tmp_path)
    assert outside.returncode == 0 and "has finished all 2 rounds" in outside.stdout, outside.stderr


def test_a_tables_folder_whose_run_names_other_code_imports_none_of_it(tmp_path, capsys):
    """`raysim reproduce` reads the runs it finds in --out to skip or resume them. Run from inside a
    received table folder (on the import path), a run there naming code the table does not name is
    refused in one line, the code not imported."""
    from tests.conftest import cli_in_process

    table = tmp_path / "table"
    run = table / "fmnist_dir0.5" / "fedavg" / "s0"
    run.mkdir(parents=True)
    (table / "table_helpers.py").write_text(PLANTED)
    config = {"seed": 0, "rounds": 3, "dataset": {"name": "embedded"}, "algorithm": {"name": "table_helpers:Plain"}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "summary.json").write_text('{"finished": true, "rounds": 3}')
    done = cli_in_process(
        capsys, "reproduce", "smoke", "--methods", "fedavg", "--out", ".", "resources.in_process=true", cwd=table
    )
    assert done.returncode == 2 and "table_helpers:Plain' is user code" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (table / "IMPORTED").exists()


def test_the_watcher_of_a_private_ray_leaves_the_callers_other_children_alone(tmp_path):
    """raysim.engine.reaper watches only the processes Ray started: a child the caller had before
    (here `sleep`) survives a whole ray_session."""
    script = (
        "import subprocess\n"
        "from raysim.config import ResourcesConfig\n"
        "from raysim.engine.ray_session import ray_session\n"
        "sleeper = subprocess.Popen(['sleep', '120'])\n"
        "with ray_session(ResourcesConfig(num_cpus=1, object_store_mb=80)):\n"
        "    pass\n"
        "import time; time.sleep(3)\n"
        "print('sleep alive' if sleeper.poll() is None else f'sleep ended {sleeper.returncode}')\n"
        "sleeper.kill()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""},
    )
    assert "sleep alive" in done.stdout, done.stdout + done.stderr[-2000:]


PLANTED_PICKLE_MARK = "UNPICKLED"


class _Planted:
    """Unpickling this writes a file: what a stranger's tuner.pkl could do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path(self.marker).write_text, ("code ran",))


def signed_sweep_dir(tmp_path: Path) -> Path:
    """A sweep directory as `raysim tune` leaves it (configs, tune/ with a pickle), signed by this user."""
    from raysim.tune_state import sign

    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "tune" / "trainable_00000").mkdir(parents=True)
    (sweep_dir / "base.yaml").write_text((ROOT / "configs" / "quickstart.yaml").read_text())
    (sweep_dir / "sweep.yaml").write_text(
        yaml.safe_dump({"base": "base.yaml", "space": {"local.lr": {"grid": [0.01, 0.05]}}})
    )
    (sweep_dir / "tune" / "tuner.pkl").write_bytes(__import__("pickle").dumps({"honest": 1}))
    (sweep_dir / "tune" / "trainable_00000" / "result.json").write_text("{}\n")
    sign(sweep_dir, "tune")
    return sweep_dir


def test_tune_state_verifies_as_signed_and_is_refused_once_changed_or_under_another_key(tmp_path, monkeypatch):
    import pickle

    import pytest

    from raysim.errors import RaysimError
    from raysim.tune_state import verify

    sweep_dir = signed_sweep_dir(tmp_path)
    verify(sweep_dir, "tune")
    # Tune's plain result logs may grow after the last signature without breaking it
    (sweep_dir / "tune" / "trainable_00000" / "result.json").write_text('{"accuracy": 0.5}\n')
    verify(sweep_dir, "tune")
    (sweep_dir / "tune" / "tuner.pkl").write_bytes(pickle.dumps(_Planted(str(tmp_path / PLANTED_PICKLE_MARK))))
    with pytest.raises(RaysimError, match="does not match its signature"):
        verify(sweep_dir, "tune")
    other = signed_sweep_dir(tmp_path / "other")
    monkeypatch.setenv("RAYSIM_KEY_FILE", str(tmp_path / "someone_else.key"))
    with pytest.raises(RaysimError, match="does not match its signature"):
        verify(other, "tune")
    (other / "tune_state.sig").unlink()
    with pytest.raises(RaysimError, match="has no readable tune_state.sig"):
        verify(other, "tune")
    assert not (tmp_path / PLANTED_PICKLE_MARK).exists()


def test_resume_of_a_received_sweep_unpickles_nothing(tmp_path):
    """Issue 45 item 5: `raysim tune --resume DIR` on a directory whose tuner.pkl would run code
    is refused in one line before Tune (or the sweep's config) is read; nothing ran."""
    import pickle

    sweep_dir = signed_sweep_dir(tmp_path)
    marker = tmp_path / PLANTED_PICKLE_MARK
    (sweep_dir / "tune" / "tuner.pkl").write_bytes(pickle.dumps(_Planted(str(marker))))
    done = cli("tune", "--resume", str(sweep_dir), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "does not match its signature" in line and "--allow-code" in line, line
    assert not marker.exists(), "the planted tuner.pkl was unpickled"


def test_a_sweep_is_not_resumed_over_ray_client_without_allow_code(tmp_path):
    """Over ray:// Tune restores the state on the head node, not the copy raysim checked here."""
    import pytest

    from raysim.errors import RaysimError
    from raysim.tuning import resume_sweep

    sweep_dir = signed_sweep_dir(tmp_path)
    with pytest.raises(RaysimError, match="over Ray Client"):
        resume_sweep(sweep_dir, address="ray://head:10001")
