"""A received run directory chooses nothing about where its run executes, and no cache serves a
number the same run would not compute (issue 59, items 2 and 4).

None of these start Ray: `ray.init` is replaced by a stand-in that records where it was asked to go.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import ray
import yaml

from raysim.experiment import load_config
from tests.conftest import experiment_without_data, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
STORED = "ray://203.0.113.7:10001"  # TEST-NET-3: nothing answers there


class RayAsked(BaseException):  # not an Exception: nothing on the way may take it for Ray's failure
    """Raised by the stand-in ray.init: the session got as far as choosing its cluster."""

    def __init__(self, address):
        super().__init__(address)
        self.address = address


@pytest.fixture
def no_ray(monkeypatch):
    """ray.init records the address it was given and stops the run there; no Ray is running."""

    def init(*args, address=None, **kwargs):
        raise RayAsked(address)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def received_run(tmp_path: Path, address: str | None = STORED) -> Path:
    """A run directory as received: its config names a Ray cluster, no round ran yet; its clients run
    in actors (an in-process run starts no Ray, so it asks for no cluster)."""
    extra = {"resources.in_process": False} | ({"resources.address": address} if address else {})
    config = load_config(QUICKSTART, tiny_overrides(**extra))
    assert config.resources.address == address
    run_dir = tmp_path / "received"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    return run_dir


# ------------------------------------------------------------------ item 2: resources.address
@pytest.mark.parametrize(
    "command_line, env, expected, told",
    [
        ([], None, "local", True),  # a private local Ray, never the directory's cluster
        (["--address", "ray://mine:10001"], None, "ray://mine:10001", True),
        ([], "ray://from-env:10001", "ray://from-env:10001", True),
        (["resources.address=ray://mine:10001"], None, "ray://mine:10001", False),  # the user's own override
    ],
)
def test_a_resume_goes_where_the_command_says_never_where_the_stored_config_says(
    command_line, env, expected, told, tmp_path, monkeypatch, capsys, no_ray
):
    import raysim.runner
    from raysim.cli import main

    if env:
        monkeypatch.setenv("RAY_ADDRESS", env)
    monkeypatch.setattr(raysim.runner, "prepare", lambda config: experiment_without_data())  # Ray is next
    run_dir = received_run(tmp_path)
    with pytest.raises(RayAsked) as asked:
        main(["run", "--resume", str(run_dir), *command_line])
    assert asked.value.address == expected
    notes = [line for line in capsys.readouterr().err.splitlines() if "not used" in line]
    if told:
        assert len(notes) == 1, notes
        assert f"resources.address='{STORED}': not used" in notes[0]
        assert f"--address {STORED}" in notes[0]  # how to run there after all
    else:
        assert notes == []


def test_resume_config_drops_the_stored_address_and_keeps_one_given_on_the_command_line(tmp_path, capsys):
    from raysim.resume import resume_config

    run_dir = received_run(tmp_path)
    assert resume_config(run_dir).resources.address is None
    assert capsys.readouterr().err.count("\n") == 1
    assert resume_config(run_dir, ["resources.address=ray://mine:1"]).resources.address == "ray://mine:1"
    assert capsys.readouterr().err == ""
    # a stored address that is not text, or that would move the terminal, is shown escaped
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["resources"]["address"] = "ray://x\x1b[2J:1"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    assert resume_config(run_dir).resources.address is None
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J" in err and err.count("\n") == 1


def test_reproduce_of_a_received_table_directory_uses_the_tables_config_not_the_stored_address(
    tmp_path, capsys, no_ray
):
    """raysim reproduce rebuilds each run's config from the table (resources.address is a neutral key
    there): an unfinished run whose stored config names a cluster is continued where the command says."""
    from raysim.outputs.run_dir import RunDir
    from raysim.reproduce.runs import PlannedRun, execute, run_state

    run_dir = received_run(tmp_path)
    table_config = load_config(QUICKSTART, tiny_overrides(**{"resources.in_process": False}))
    run = PlannedRun("cell", "fedavg", 0, table_config, RunDir(run_dir))
    assert run_state(run) == "unfinished"  # the stored address does not make it another config
    with pytest.raises(RayAsked) as asked:
        execute([run], None, None, bars=False)
    assert asked.value.address == "local"


# ------------------------------------------------------------------ item 4: cache keys
def test_the_client_stage_key_holds_the_clients_thread_count():
    from tests.test_client_cache import key

    base = key()  # resources.cpus_per_actor=1: one thread
    assert key("resources.cpus_per_actor=2") != base
    assert key("resources.cpus_per_actor=4") != key("resources.cpus_per_actor=2")
    assert key("resources.cpus_per_actor=1.5") == base  # still one thread: the same numbers
    assert key("resources.cpus_per_actor=0.5") == base


def test_the_key_counts_threads_as_the_clients_do():
    """client_threads is the count configure_torch gives a client actor (and in_process each call)."""
    import torch

    from raysim import compiled, precision
    from raysim.algorithms.oneshot import client_cache
    from raysim.engine.devices import configure_torch

    before = torch.get_num_threads()
    try:
        with precision.kept(), compiled.kept():
            for cpus in (0.25, 1, 1.5, 2, 3):
                config = load_config(QUICKSTART, [f"resources.cpus_per_actor={cpus}"])
                given = configure_torch(cpus, torch.device("cpu"), config.resources)
                assert client_cache.client_threads(config) == given
    finally:
        torch.set_num_threads(before)


def test_the_data_cache_serves_new_content_after_a_same_size_same_mtime_rewrite(tmp_path, monkeypatch):
    from raysim.data import clear_memory_cache, load_dataset
    from tests.test_oneshot_as_authors_ran import write_parquet_dataset

    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    clear_memory_cache()
    root = tmp_path / "cifar10"
    images = np.random.default_rng(0).integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    before = np.arange(40) % 10
    after = before.copy()
    after[1] = 2  # one image of class 1 relabelled: other class counts, the same file size
    write_parquet_dataset(root, images, before)
    labels = root / "train.parquet"
    stat = labels.stat()
    try:
        first = load_dataset("cifar10", str(root), verify=False)
        assert np.bincount(first.train_y, minlength=10)[1] == 4
        clear_memory_cache()  # another process: only the disk cache is left

        def rewrite(labels_now):
            write_parquet_dataset(root, images, labels_now)
            assert labels.stat().st_size == stat.st_size  # the case the issue found
            for path in root.iterdir():
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

        rewrite(after)
        served = load_dataset("cifar10", str(root), verify=False)  # today's code: the disk entry of the old files
        assert np.bincount(served.train_y, minlength=10)[[1, 2]].tolist() == [3, 5]
        rewrite(before)
        served = load_dataset("cifar10", str(root), verify=False)  # and in the same process (the memo)
        assert np.bincount(served.train_y, minlength=10)[[1, 2]].tolist() == [4, 4]
        assert load_dataset("cifar10", str(root), verify=False) is served  # unchanged files: the memo's arrays
    finally:
        clear_memory_cache()


def test_a_resumed_sweep_does_not_go_to_the_cluster_its_base_names(tmp_path, no_ray, capsys):
    from raysim.tuning import resume_sweep
    from tests.test_received_dirs_run_no_code import signed_sweep_dir

    sweep_dir = signed_sweep_dir(tmp_path)
    base = yaml.safe_load((sweep_dir / "base.yaml").read_text())
    base.setdefault("resources", {})["address"] = STORED
    (sweep_dir / "base.yaml").write_text(yaml.safe_dump(base))
    with pytest.raises(RayAsked) as asked:
        resume_sweep(sweep_dir, allow_code=True)
    assert asked.value.address in (None, "local")
    (line,) = [x for x in capsys.readouterr().err.splitlines() if STORED in x]
    assert "not used" in line
