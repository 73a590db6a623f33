"""Received directories, third pass (issue 77): a run folder received from someone else, given to any
command, runs no code, writes nowhere outside it, and decides neither where nor on what a run goes;
the CLI's other gaps the same review found answer in one line.

Every run here is in process (resources.in_process=true) on the embedded dataset: no Ray starts.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import ray
import yaml

from raysim.outputs.run_dir import RunDir
from tests.conftest import cli_in_process, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PLANTED = 'import pathlib\npathlib.Path(__file__).with_name("IMPORTED").write_text("code ran")\n'


@pytest.fixture(autouse=True)
def no_ray(request, monkeypatch):
    if request.node.get_closest_marker("slow"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError("Ray must not start in these tests")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished two-round run's folder as raysim leaves it (config, data.json, summary, checkpoint of
    its model), written without Ray: each test copies it."""
    from raysim.config import dump_config
    from raysim.experiment import load_config
    from raysim.outputs.run_dir import RunDir
    from raysim.runner import prepare
    from raysim.tensors import module_weights

    config = load_config(QUICKSTART, tiny_overrides(**{"resources.in_process": True}))
    experiment = prepare(config)
    run_dir = RunDir(tmp_path_factory.mktemp("made") / "run")
    run_dir.path.mkdir()
    run_dir.write_config(dump_config(config))
    run_dir.write_data(experiment.data)
    weights = module_weights(experiment.spec.build("cpu"))
    run_dir.write_checkpoint(
        {"round": 2, "state": {"weights": weights}, "wall_time_s": 1.0, "log_summary": {}, "dataset": "embedded"}
    )
    figures = {"final_accuracy": 0.5, "best_accuracy": 0.5, "best_round": 2, "last5_accuracy": 0.45}
    run_dir.write_summary(
        {
            **{"algorithm": "fedavg", "dataset": "embedded", "seed": 0, "rounds": 2, "rounds_planned": 2},
            **{"finished": True, **figures, "bytes_up": 1000, "bytes_down": 1000, "wall_time_s": 1.0},
        }
    )
    return run_dir.path


def real_run(tmp_path: Path) -> Path:
    """A finished two-round run, made in process (starts Ray: for slow tests)."""
    from raysim.experiment import load_config
    from raysim.outputs.run_lock import release_all
    from raysim.runner import run_experiment

    run_dir = tmp_path / "made"
    run_experiment(load_config(QUICKSTART, tiny_overrides(**{"resources.in_process": True})), run_dir)
    release_all()
    (run_dir / ".lock").unlink()
    return run_dir


def cli(args: list, cwd: Path, capsys) -> tuple[int, str, str]:
    done = cli_in_process(capsys, *args, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def refused(args: list, cwd: Path, capsys, *words: str) -> str:
    code, _, err = cli(args, cwd, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("raysim: error: "), err
    for word in words:
        assert word in lines[0], f"{word!r} not in: {lines[0]}"
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its content's digest (folders: '/')."""
    return {
        str(p.relative_to(folder)): "/" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


def received(finished_run: Path, tmp_path: Path, edit=None) -> Path:
    """A copy of the finished run as received, its config edited by `edit(tree)`."""
    recv = tmp_path / "recv"
    shutil.copytree(finished_run, recv)
    if edit is not None:
        tree = yaml.safe_load((recv / "config.yaml").read_text())
        edit(tree)
        (recv / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    return recv


# ------------------------------------------------------------------ item 1: code from a received config
@pytest.mark.parametrize("key", ["algorithm", "model"])
def test_a_received_config_imports_no_code_from_its_folder(finished_run, tmp_path, capsys, key):
    recv = received(finished_run, tmp_path, lambda t: t[key].update(name="evilmod:Evil"))
    (recv / "evilmod.py").write_text(PLANTED)
    before = snapshot(recv)
    elsewhere = tmp_path / "elsewhere"
    refused(
        ["run", "config.yaml", "rounds=1", "--out", elsewhere],
        recv,
        capsys,
        f"{key}.name='evilmod:Evil' is user code",
        "--allow-code",
    )
    assert not (recv / "IMPORTED").exists(), "the planted module ran"
    assert not elsewhere.exists() and snapshot(recv) == before


def test_a_received_config_is_not_run_from_inside_its_folder(finished_run, tmp_path, capsys):
    recv = received(finished_run, tmp_path)
    before = snapshot(recv)
    refused(["run", "config.yaml", "--out", tmp_path / "elsewhere"], recv, capsys, "from outside it")
    assert snapshot(recv) == before and not (tmp_path / "elsewhere").exists()


# ------------------------------------------------------------------ item 4: output.dir of a received config
@pytest.mark.slow  # the run starts Ray (in process)
def test_a_received_configs_output_dir_decides_nothing(tmp_path, capsys):
    outside = tmp_path / "chosen-by-the-sender"
    recv = received(real_run(tmp_path), tmp_path, lambda t: t["output"].update(dir=str(outside)))
    work = tmp_path / "work"
    work.mkdir()
    code, _, err = cli(["run", recv / "config.yaml", "rounds=1"], work, capsys)
    assert code == 0, err
    assert not outside.exists(), "the received config chose where the run went"
    assert [p.parent.parent.name for p in work.glob("*/*/summary.json")] == ["runs"]  # output.dir's default, here
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "output.dir" in notes[0] and "not used" in notes[0], err


# ------------------------------------------------------------------ items 2, 3, 8: a fresh run's --out
@pytest.mark.parametrize(
    "files",
    [
        ["checkpoints/last.pt"],  # another run's checkpoint: adopted before
        ["summary.json", "metrics.parquet", "actors.yaml", "checkpoints/final_model.pt"],  # the user's own files
        ["client_state/0/state.pt"],
    ],
)
def test_a_fresh_run_refuses_an_out_holding_what_a_run_writes(finished_run, tmp_path, capsys, files):
    out = tmp_path / "thatfolder"
    for name in files:
        source = finished_run / name
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(source.read_bytes() if source.is_file() else b"the user's own")
    before = snapshot(out)
    refused(
        ["run", QUICKSTART, "seed=7", "rounds=3", "resources.in_process=true", "--out", out],
        tmp_path,
        capsys,
        "--resume",
        "new or empty --out",
        files[0].split("/")[0],
    )
    assert snapshot(out) == before, "the refused folder changed (a .lock or data.json left behind?)"


def test_a_fresh_run_refused_for_a_run_already_there_creates_no_lock(finished_run, tmp_path, capsys):
    recv = received(finished_run, tmp_path)
    before = snapshot(recv)
    refused(["run", QUICKSTART, "--out", recv], tmp_path, capsys, "already holds a run", "--resume")
    assert snapshot(recv) == before


# ------------------------------------------------------------------ item 5: a resume on other data
def _without_data_json(finished_run: Path, tmp_path: Path, trained_on: str | None) -> Path:
    """The run as received with its data.json removed, its checkpoint saying it trained on `trained_on`."""
    recv = received(finished_run, tmp_path)
    (recv / "data.json").unlink()
    run_dir = RunDir(recv)
    checkpoint = run_dir.read_checkpoint()
    checkpoint.pop("dataset", None)
    if trained_on is not None:
        checkpoint["dataset"] = trained_on
    (recv / "checkpoints" / "previous.pt").unlink(missing_ok=True)
    run_dir.write_checkpoint(checkpoint)
    (recv / "checkpoints" / "previous.pt").unlink(missing_ok=True)
    return recv


@pytest.mark.parametrize("trained_on", ["fashion_mnist", None])
def test_a_resume_without_data_json_on_another_dataset_is_refused(finished_run, tmp_path, capsys, trained_on):
    recv = _without_data_json(finished_run, tmp_path, trained_on)
    before = snapshot(recv)
    refused(
        ["run", "--resume", recv, "rounds=3"],
        tmp_path,
        capsys,
        "records no data",
        "--accept-data",
        "data.json",
    )
    assert snapshot(recv) == before, "a refused resume left files behind"


@pytest.mark.slow  # the resumed round starts Ray (in process)
def test_a_resume_without_data_json_goes_on_where_the_checkpoint_agrees_or_with_accept_data(tmp_path, capsys):
    finished_run = real_run(tmp_path)
    assert RunDir(finished_run).read_checkpoint()["dataset"] == "embedded"  # written by the run
    recv = _without_data_json(finished_run, tmp_path, "embedded")
    code, _, err = cli(["run", "--resume", recv, "rounds=3"], tmp_path, capsys)
    assert code == 0, err
    assert json.loads((recv / "summary.json").read_text())["rounds"] == 3
    assert json.loads((recv / "data.json").read_text())["name"] == "embedded"

    other = tmp_path / "other"
    other.mkdir()
    recv = _without_data_json(finished_run, other, "fashion_mnist")
    code, _, err = cli(["run", "--resume", recv, "rounds=3", "--accept-data"], tmp_path, capsys)
    assert code == 0, err
    assert json.loads((recv / "summary.json").read_text())["rounds"] == 3


# ------------------------------------------------------------------ item 6: tracebacks
def test_partition_plot_to_a_folder_is_one_line(tmp_path, capsys):
    refused(["partition", QUICKSTART, "--plot", tmp_path], tmp_path, capsys, "is a folder")


@pytest.mark.parametrize("key", ["final_accuracy", "best_accuracy", "rounds", "bytes_up", "bytes_down", "wall_time_s"])
def test_report_on_a_summary_missing_a_figure_is_one_line(finished_run, tmp_path, capsys, key):
    recv = received(finished_run, tmp_path)
    summary = json.loads((recv / "summary.json").read_text())
    del summary[key]
    (recv / "summary.json").write_text(json.dumps(summary))
    refused(["report", recv], tmp_path, capsys, key, "summary.json")


def test_report_marks_an_unfinished_run(finished_run, tmp_path, capsys):
    recv = received(finished_run, tmp_path)
    summary = json.loads((recv / "summary.json").read_text())
    (recv / "summary.json").write_text(json.dumps({**summary, "finished": False, "rounds_planned": 5}))
    code, out, err = cli(["report", recv], tmp_path, capsys)
    assert code == 0, err
    assert "[1 unfinished]" in out and "is unfinished (2 of 5 rounds)" in out, out


# ------------------------------------------------------------------ item 7: configs that mean nothing
@pytest.mark.parametrize("text", ["", "# only a comment\n", "null\n", "~\n"])
def test_an_empty_config_file_is_refused(tmp_path, capsys, text):
    (tmp_path / "empty.yaml").write_text(text)
    refused(["run", "empty.yaml", "--out", "out"], tmp_path, capsys, "config file 'empty.yaml' is empty")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, key, line",
    [("rounds: 1\nseed: 3\nrounds: 2\n", "rounds", 3), ("local:\n  epochs: 1\n  epochs: 2\n", "epochs", 3)],
)
def test_a_key_given_twice_is_refused(tmp_path, capsys, text, key, line):
    (tmp_path / "twice.yaml").write_text(text)
    refused(["run", "twice.yaml", "--out", "out"], tmp_path, capsys, f"key '{key}'", f"line {line}")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ item 9: a junk data record
def test_data_list_and_get_check_the_record_against_the_files(tmp_path, capsys):
    from raysim.data.catalogue import entry
    from raysim.data.get import RECORD, _record

    home = tmp_path / "home"
    folder = home / "mnist"
    folder.mkdir(parents=True)
    (folder / RECORD).write_text('{"junk": true}')

    def listed() -> str:
        code, out, err = cli(["data", "list", "--root", home], tmp_path, capsys)
        assert code == 0, err
        return next(line for line in out.splitlines() if line.startswith("mnist "))

    assert "got by raysim" not in listed() and "bad record" in listed()
    refused(["data", "get", "mnist", "--root", home], tmp_path, capsys, RECORD, "move")

    (folder / "raw.bin").write_bytes(b"12345")
    (folder / RECORD).write_text(json.dumps({**_record(entry("mnist")), "files": {"raw.bin": 5}}))
    assert "got by raysim" in listed()
    code, out, err = cli(["data", "get", "mnist", "--root", home], tmp_path, capsys)
    assert code == 0 and "already in" in out, err
    (folder / "raw.bin").unlink()
    assert "bad record" in listed()
    refused(["data", "get", "mnist", "--root", home], tmp_path, capsys, "raw.bin is missing")


# ------------------------------------------------------------------ item 10: small ones
def test_version(tmp_path, capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        cli(["--version"], tmp_path, capsys)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"raysim {version('raysim')}"


def test_a_resume_asking_fewer_rounds_than_done_says_so(finished_run, tmp_path, capsys):
    recv = received(finished_run, tmp_path)
    before = snapshot(recv)
    code, out, err = cli(["run", "--resume", recv, "rounds=1"], tmp_path, capsys)
    assert code == 0, err
    assert "has 2 rounds done, more than the 1 asked" in out and "rounds=12" in out, out
    assert snapshot(recv) == before


def test_a_download_past_its_total_deadline_is_one_line(tmp_path):
    from raysim.data.download import DeadlineReached, fetch

    source = tmp_path / "archive.bin"
    source.write_bytes(b"x" * 10)
    with pytest.raises(DeadlineReached, match="total timeout"):
        fetch([source.as_uri()], tmp_path / "got.bin", "md5:0", "archive", bar=False, deadline=time.monotonic() - 1)
    assert not (tmp_path / "got.bin").exists()


def test_data_get_refuses_a_timeout_that_is_not_positive(tmp_path, capsys):
    refused(["data", "get", "mnist", "--timeout", "0", "--root", tmp_path / "h"], tmp_path, capsys, "--timeout")
    assert not (tmp_path / "h").exists()
