"""Configs shipped in the package (raysim/configs/): found by name from any folder, listed by
`raysim configs`, and all declared as package data so a non-editable install carries them."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from raysim.config.files import ROOT as SHIPPED
from raysim.config.files import list_configs, resolve
from raysim.errors import RaysimError

REPO = Path(__file__).resolve().parents[1]


def test_configs_folder_at_the_repo_root_is_the_packaged_one():
    assert (REPO / "configs").resolve() == SHIPPED == (REPO / "raysim" / "configs").resolve()


@pytest.mark.parametrize(
    "name, file",
    [
        ("quickstart", "quickstart.yaml"),
        ("quickstart.yaml", "quickstart.yaml"),
        ("fedhydra/mnist_2cc_cpu", "fedhydra/mnist_2cc_cpu.yaml"),
        ("fedhydra/mnist_2cc_cpu.yaml", "fedhydra/mnist_2cc_cpu.yaml"),
        ("sweeps/cpu", "sweeps/cpu.yaml"),
    ],
)
def test_resolve_a_shipped_name_from_any_folder(tmp_path, monkeypatch, name, file):
    monkeypatch.chdir(tmp_path)
    assert resolve(name) == SHIPPED / file


def test_an_existing_path_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart.yaml").write_text("rounds: 1\n")
    assert resolve("quickstart.yaml") == Path("quickstart.yaml")  # the local file, not the shipped one
    assert resolve("quickstart") == SHIPPED / "quickstart.yaml"  # no file named 'quickstart' here
    assert resolve(tmp_path / "quickstart.yaml") == tmp_path / "quickstart.yaml"


@pytest.mark.parametrize("name", ["nosuch", "fedhydra/nosuch.yaml", "../pyproject", "", "fedhydra"])
def test_unknown_name_is_one_error(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RaysimError, match="raysim configs"):
        resolve(name)


def test_unknown_name_through_the_cli_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from raysim.cli import main

    monkeypatch.chdir(tmp_path)
    for argv in (
        ["run", "nosuch", "--out", str(tmp_path / "run")],
        ["partition", "nosuch"],
        ["tune", "nosuch", "--out", str(tmp_path / "sweep")],
    ):
        code = main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (argv, lines)
        assert "'nosuch'" in lines[0] and "raysim configs" in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_a_shipped_sweep_by_name_finds_its_base(tmp_path, monkeypatch):
    from raysim.sweep import load_sweep

    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(resolve("sweeps/cpu"))
    assert sweep.base_path.resolve() == SHIPPED / "quickstart.yaml"


def test_raysim_configs_lists_names_and_first_comment_lines(capsys):
    from raysim.cli import main

    assert main(["configs"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in out}
    assert "quickstart" in rows and "fedhydra/mnist_2cc_cpu" in rows and "sweeps/cpu" in rows
    listed = dict(list_configs())
    # every shipped YAML but the papers' tables (those are `raysim reproduce --list`'s)
    assert len(out) == len(listed) == len([p for p in SHIPPED.rglob("*.yaml") if p.parent.name != "tables"])
    first = (SHIPPED / "quickstart.yaml").read_text().splitlines()[0].lstrip("#").strip()
    assert listed["quickstart"] == first and first in rows["quickstart"]


def test_raysim_configs_piped_into_head_ends_quietly():
    """`raysim configs | head -1`: the reader leaves early. Here it has left before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "raysim.cli", "configs"],
            stdout=write_end,
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # no BrokenPipeError traceback


def _glob_match(path: str, pattern: str) -> bool:
    """Whether setuptools' glob would match: '*' stays within one folder, '**' spans folders."""

    def match(parts: list[str], pats: list[str]) -> bool:
        if not pats:
            return not parts
        if pats[0] == "**":
            return any(match(parts[i:], pats[1:]) for i in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and match(parts[1:], pats[1:])

    return match(path.split("/"), pattern.split("/"))


def test_every_shipped_config_is_package_data():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["raysim"]
    assert "raysim" in pyproject["tool"]["setuptools"]["packages"]
    files = [p.relative_to(REPO / "raysim").as_posix() for p in (REPO / "raysim" / "configs").rglob("*") if p.is_file()]
    assert len(files) > 100 and "configs/fedhydra/mnist_2cc_cpu.yaml" in files
    assert "configs/sweeps/cpu.yaml" in files
    missing = [f for f in files if not any(_glob_match(f, pattern) for pattern in patterns)]
    assert not missing, f"not declared in pyproject.toml's package-data: {missing}"
    assert not _glob_match("configs/a/b.yaml", "configs/*.yaml")  # the matcher is not fnmatch's '*'


# ------------------------------------------------------------------ extends: a config over another


def test_a_users_file_extends_a_shipped_cell_and_changes_one_key(tmp_path, monkeypatch):
    from raysim.experiment import load_config

    monkeypatch.chdir(tmp_path)
    Path("mine.yaml").write_text("extends: fedaf/cifar10_cpu\nrounds: 2\nalgorithm: {ipc: 5}\n")
    mine, shipped = load_config("mine.yaml").to_dict(), load_config(resolve("fedaf/cifar10_cpu")).to_dict()
    assert mine["rounds"] == 2 and mine["algorithm"]["ipc"] == 5
    mine.update(rounds=shipped["rounds"]), mine["algorithm"].update(ipc=shipped["algorithm"]["ipc"])
    assert mine == shipped  # every other key as the shipped cell's, through its base_cpu.yaml and base.yaml


def test_extends_another_algorithm_replaces_the_algorithm_section(tmp_path):
    from raysim.experiment import load_config

    (tmp_path / "fedavg_here.yaml").write_text("extends: fedaf/cifar10_cpu\nalgorithm: {name: fedavg}\n")
    config = load_config(tmp_path / "fedavg_here.yaml")
    assert config.algorithm.name == "fedavg" and config.dataset.name == "cifar10"  # FedAF's keys did not follow


def test_extends_a_file_beside_it_first_and_merges_section_by_section(tmp_path):
    from raysim.config import read_yaml

    (tmp_path / "quickstart.yaml").write_text("rounds: 7\nlocal: {epochs: 3, lr: 0.1}\nclients: {models: [lenet]}\n")
    (tmp_path / "child.yaml").write_text("extends: quickstart.yaml\nlocal: {lr: 0.5}\nclients: {models: [mlp]}\n")
    tree = read_yaml(tmp_path / "child.yaml")
    assert tree == {"rounds": 7, "local": {"epochs": 3, "lr": 0.5}, "clients": {"models": ["mlp"]}}


@pytest.mark.parametrize(
    "files, message",
    [
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: a.yaml\n"}, "extends itself through"),
        ({"a.yaml": "extends: a.yaml\n"}, "extends itself through"),
        ({"a.yaml": "extends: nosuch.yaml\n"}, "neither a file beside it nor a shipped config"),
        ({"a.yaml": "extends: [base.yaml]\n"}, "'extends' must name a config file"),
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "rounds: [\n"}, "not valid YAML"),
    ],
)
def test_a_broken_extends_is_one_error_naming_the_fix(tmp_path, files, message):
    from raysim.config import read_yaml

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(RaysimError, match=message) as raised:
        read_yaml(tmp_path / "a.yaml")
    assert "\n" not in str(raised.value)


def test_a_broken_extends_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    from raysim.cli import main

    (tmp_path / "a.yaml").write_text("extends: nosuch\n")
    assert main(["run", str(tmp_path / "a.yaml"), "--out", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "'extends: nosuch' is neither" in lines[0]
    assert not (tmp_path / "run").exists()


def test_raysim_configs_name_prints_the_whole_config_a_run_would_use(capsys):
    import yaml

    from raysim.cli import main

    assert main(["configs", "fedaf/cifar10_cpu", "rounds=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rounds"] == 3 and printed["dataset"]["name"] == "cifar10"  # the file and the override
    assert printed["model"]["width"] == 32 and printed["algorithm"]["server_batch"] == 256  # base_cpu, base
    assert printed["eval"]["every"] == 1  # a default no file sets
