"""Issue 59, item 1: a received run, table or sweep directory never makes raysim write outside it.

Links planted at the names raysim used for its temporary files and lock (`.lock`, `config.yaml.tmp`,
`summary.json.tmp`, `checkpoints/last.pt.new`, `table.md.tmp`, ...) or at a final name are neither
followed nor written through; a run directory (or a folder in it raysim writes into) that is a link
is refused in one line before anything is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from raysim.errors import RaysimError
from raysim.outputs.run_dir import RunDir

PRECIOUS = "# someone's shell start-up file\nexport PATH=$HOME/bin:$PATH\n"


def plant(run_dir: Path, names: list[str], outside: Path) -> dict[Path, Path]:
    """A symbolic link at each name (relative to `run_dir`) to its own file outside, holding PRECIOUS."""
    outside.mkdir(parents=True, exist_ok=True)
    links = {}
    for i, name in enumerate(names):
        target = outside / f"target{i}"
        target.write_text(PRECIOUS)
        link = run_dir / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        links[link] = target
    return links


def assert_untouched(links: dict[Path, Path]) -> None:
    for link, target in links.items():
        assert target.read_text() == PRECIOUS, f"raysim wrote through the link planted at {link}"


def assert_one_line(message: str, *words: str) -> None:
    assert "\n" not in message.strip(), message
    for word in words:
        assert word in message, message


# ------------------------------------------------------------------ 1. no fixed name is followed
def _write_curves(path: Path) -> None:
    from raysim.reproduce.curves import write_curves

    table = SimpleNamespace(title="a table", cells={"c": SimpleNamespace(label="c")}, methods={})
    write_curves(table, {}, ["c"], [], path / "curves.png")


def _write_sweep(path: Path) -> None:
    from raysim.tuning import _write_sweep

    _write_sweep(SimpleNamespace(base_tree={"rounds": 1}, source={"metric": "accuracy"}), path)


WRITERS = {
    # name: (what raysim writes, the temporary names it used before, the files it writes)
    "config": (lambda d: RunDir(d).write_config("rounds: 3\n"), ["config.yaml.tmp"], ["config.yaml"]),
    "summary": (lambda d: RunDir(d).write_summary({"rounds": 3}), ["summary.json.tmp"], ["summary.json"]),
    "actors": (
        lambda d: RunDir(d).write_actors([{"node_id": "n", "device": "cpu", "gpu_ids": [], "clients": [0]}], False),
        ["actors.yaml.tmp"],
        ["actors.yaml"],
    ),
    "checkpoint": (
        lambda d: RunDir(d).write_checkpoint({"round": 3, "state": {}, "wall_time_s": 1.0}),
        ["checkpoints/last.pt.new", "checkpoints/last.pt.tmp"],
        ["checkpoints/last.pt"],
    ),
    "final model": (
        lambda d: RunDir(d).write_final_model({"w": torch.zeros(2)}),
        ["checkpoints/final_model.pt.tmp"],
        ["checkpoints/final_model.pt"],
    ),
    "metrics": (
        lambda d: _flush_metrics(d),
        ["metrics.parquet.tmp"],
        ["metrics.parquet"],
    ),
    "client state": (
        lambda d: _save_client_state(d),
        ["client_state/client_00000/r000001.pt.tmp"],
        ["client_state/client_00000/r000001.pt"],
    ),
    "table": (
        lambda d: _write_table(d),
        ["table.md.tmp", "table.csv.tmp", ".gitignore.tmp"],
        ["table.md", "table.csv", ".gitignore"],
    ),
    "curves": (_write_curves, ["curves.png.tmp"], ["curves.png"]),
    "sweep": (_write_sweep, ["base.yaml.tmp", "sweep.yaml.tmp"], ["base.yaml", "sweep.yaml"]),
}


def _flush_metrics(run_dir: Path) -> None:
    from raysim.outputs.metrics import MetricsTable

    table = MetricsTable(run_dir / "metrics.parquet")
    table.add(1, None, "accuracy", 0.5)
    table.flush()


def _save_client_state(run_dir: Path) -> None:
    from raysim.engine.client_state import ClientStateStore

    ClientStateStore(run_dir / "client_state").save(0, 1, {"c": torch.ones(3)})


def _write_table(out: Path) -> None:
    from raysim.outputs.safe_write import write_text

    write_text(out / "table.md", "| a |\n")  # as raysim.reproduce.table_output.write_outputs
    write_text(out / "table.csv", "a\n")
    write_text(out / ".gitignore", "checkpoints/\n")


@pytest.mark.parametrize("at_final_name", [False, True], ids=["temporary names", "final names"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_link_planted_at_a_name_raysim_writes_is_not_written_through(writer, at_final_name, tmp_path):
    write, temporary, final = WRITERS[writer]
    run_dir = tmp_path / "received"
    run_dir.mkdir()
    links = plant(run_dir, final if at_final_name else temporary, tmp_path / "outside")

    write(run_dir)

    assert_untouched(links)
    for name in final:  # raysim's file is there, a file of its own in the folder
        path = run_dir / name
        assert path.is_file() and not path.is_symlink(), name
    left = [p.name for p in run_dir.rglob("*") if p.name.endswith(".tmp") and p not in links]
    assert not left, f"temporary files left behind: {left}"


def test_temporary_names_are_fresh_each_time(tmp_path):
    """No fixed name to plant: two writes of one file use two different temporary names."""
    from raysim.outputs.safe_write import fresh_file

    names = {fresh_file(tmp_path, "summary.json").name for _ in range(20)}
    assert len(names) == 20 and all(n.startswith(".summary.json.") and n.endswith(".tmp") for n in names)


def test_a_checkpoint_keeps_the_one_before_it(tmp_path):
    run_dir = RunDir(tmp_path)
    for r in (1, 2):
        run_dir.write_checkpoint({"round": r, "state": {}, "wall_time_s": 1.0})
    assert torch.load(run_dir.checkpoint_file, weights_only=True)["round"] == 2
    assert torch.load(run_dir.previous_checkpoint_file, weights_only=True)["round"] == 1


# ------------------------------------------------------------------ 2. the lock is opened without following a link
def test_a_link_planted_as_the_lock_is_refused_in_one_line(tmp_path):
    from raysim.outputs.run_lock import lock_run_dir, release_all

    run_dir = tmp_path / "received"
    run_dir.mkdir()
    links = plant(run_dir, [".lock"], tmp_path / "outside")
    try:
        with pytest.raises(RaysimError) as refused:
            lock_run_dir(run_dir)
    finally:
        release_all()
    assert_one_line(str(refused.value), str(run_dir / ".lock"), "symbolic link", "remove it")
    assert_untouched(links)


def test_a_hard_link_planted_as_the_lock_is_refused(tmp_path):
    from raysim.outputs.run_lock import lock_run_dir, release_all

    run_dir = tmp_path / "received"
    run_dir.mkdir()
    target = tmp_path / "precious"
    target.write_text(PRECIOUS)
    (run_dir / ".lock").hardlink_to(target)
    try:
        with pytest.raises(RaysimError, match="hard link"):
            lock_run_dir(run_dir)
    finally:
        release_all()
    assert target.read_text() == PRECIOUS


# ------------------------------------------------------------------ 3. linked folders are refused
@pytest.mark.parametrize(
    "folder",
    [
        ".",
        "checkpoints",
        "client_state",
        "client_state/client_00003",
        "tensorboard",
        "tensorboard/events.out.tfevents.1",
    ],
)
def test_a_run_directory_or_a_folder_in_it_that_is_a_link_is_refused_in_one_line(folder, tmp_path):
    from raysim.outputs.run_lock import lock_run_dir, release_all

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "received"
    if folder == ".":
        run_dir.symlink_to(elsewhere)
    else:
        (run_dir / folder).parent.mkdir(parents=True)
        (run_dir / folder).symlink_to(elsewhere)
    try:
        with pytest.raises(RaysimError) as refused:
            lock_run_dir(run_dir)
    finally:
        release_all()
    assert_one_line(str(refused.value), str(run_dir / folder if folder != "." else run_dir), "symbolic link")
    assert list(elsewhere.iterdir()) == [], "raysim wrote into the linked folder"


def test_a_file_is_not_written_into_a_linked_folder(tmp_path):
    """Also when the folder became a link after the run's checks (each write checks its own folder)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "received"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(RaysimError, match="symbolic link"):
        RunDir(run_dir).write_checkpoint({"round": 1, "state": {}, "wall_time_s": 1.0})
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("level", ["cell", "cell/method"])
def test_a_linked_folder_between_a_table_and_its_runs_is_refused(level, tmp_path):
    """raysim reproduce --out OUT: runs lie in OUT/cell/method/sN (the run's writes go through both)."""
    from raysim.outputs.safe_write import real_folder

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / level).parent.mkdir(parents=True, exist_ok=True)
    (out / level).symlink_to(elsewhere)
    with pytest.raises(RaysimError) as refused:
        real_folder(out / "cell" / "method", below=out)
    assert_one_line(str(refused.value), str(out / level), "symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_a_linked_table_folder_is_refused_before_its_runs(tmp_path, monkeypatch):
    import raysim.reproduce as reproduce
    import raysim.reproduce.runs as runs

    def no_runs(*args, **kwargs):
        raise AssertionError("the runs started")

    monkeypatch.setattr(runs, "execute", no_runs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").symlink_to(elsewhere)
    with pytest.raises(RaysimError) as refused:
        reproduce.reproduce("smoke", tmp_path / "out", bars=False)
    assert_one_line(str(refused.value), str(tmp_path / "out"), "symbolic link")
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------------------------ 4. the probe's reproduction, end to end
def test_a_resume_of_a_received_run_with_planted_links_leaves_their_targets_unchanged(run_tiny, tmp_path, capsys):
    from raysim.cli import main

    _, finished = run_tiny()
    run_dir = tmp_path / "received"
    shutil.copytree(finished, run_dir, ignore=shutil.ignore_patterns(".lock"))
    summary = (run_dir / "summary.json").read_text()
    # the config gets a `$(...)` string: written through config.yaml.tmp into a shell start-up file
    # it would run; the summary's final name is a link to a file outside (replaced, not followed)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["output"]["dir"] = "$(touch pwned)"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = [
        "config.yaml.tmp",
        "summary.json.tmp",
        "actors.yaml.tmp",
        "metrics.parquet.tmp",
        "checkpoints/last.pt.new",
        "checkpoints/last.pt.tmp",
        "checkpoints/final_model.pt.tmp",
    ]
    links = plant(run_dir, names, tmp_path / "outside")
    (run_dir / "summary.json").unlink()
    kept_summary = tmp_path / "outside" / "summary.json"
    kept_summary.write_text(summary)
    (run_dir / "summary.json").symlink_to(kept_summary)

    # 1. a planted .lock: refused in one line before anything is written, its target unchanged
    lock_link = plant(run_dir, [".lock"], tmp_path / "outside_lock")
    assert main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and ".lock" in err[0] and "symbolic link" in err[0], err
    assert_untouched(lock_link)

    # 2. without it the resume runs to the end, and no link planted in the folder is written through
    (run_dir / ".lock").unlink()
    assert main(["run", "--resume", str(run_dir), "rounds=3"]) == 0
    assert_untouched(links)
    assert kept_summary.read_text() == summary
    assert not (run_dir / "summary.json").is_symlink()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rounds"] == 3
    assert RunDir(run_dir).completed_rounds() == 3
