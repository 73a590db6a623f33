"""Issue 59, items 5 and 7: each bad input is one line on stderr naming the problem and the fix, exit
status 2, nothing left behind - never a traceback, a hang or memory without bound.

Every case is a command line refused before Ray starts. One case of each kind (and every case that
could once hang or grow without bound) runs `python -m raysim.cli` in a subprocess, with a timeout
and a cap on its address space; the other cases call `raysim.cli.main` in this process (the same
code, without a second start-up), with a stand-in for `ray.init` that fails the test if reached.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import experiment_without_data, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
MEMORY_CAP = 6 * 2**30  # bytes of address space a refused command may take (torch and Ray import within it)


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


class RayStarted(Exception):
    """The stand-in ray.init: the command got past its checks and would have started Ray."""


def _ray_must_not_start(monkeypatch) -> None:
    import ray

    def started(*args, **kwargs):
        raise RayStarted

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", started)


@pytest.fixture
def raysim(tmp_path, monkeypatch, capsys):
    """raysim(args, env=None, subprocess=False): run the command in tmp_path; assert exit 2, one
    stderr line, no traceback, nothing new in tmp_path; return that line."""

    def call(args: list, env: dict[str, str] | None = None, subprocess: bool = False, timeout: float = 90) -> str:
        args = [str(a) for a in args]
        before = files_under(tmp_path)
        if subprocess:
            code, err = _in_subprocess(args, tmp_path, env or {}, timeout)
        else:
            code, err = _in_process(args, tmp_path, env or {}, monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2, err[-3000:]
        assert len(lines) == 1 and lines[0].startswith("raysim: error: "), err[-3000:]
        assert files_under(tmp_path) == before, "left behind: " + ", ".join(sorted(files_under(tmp_path) - before))
        return lines[0]

    return call


def _in_subprocess(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "raysim.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_cap_memory,
    )
    return run.returncode, run.stderr


def _in_process(args: list[str], cwd: Path, env: dict[str, str], monkeypatch, capsys) -> tuple[int, str]:
    from raysim.cli import main
    from raysim.outputs.run_lock import release_all

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _ray_must_not_start(monkeypatch)
    capsys.readouterr()
    try:
        code = main(args)
    finally:
        release_all()
    return code, capsys.readouterr().err


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raysim: error: "), err
    return err[0]


def assert_says(line: str, *words: str) -> None:
    for word in words:
        assert word in line, f"{word!r} not in: {line}"


# ------------------------------------------------------------------ item 5: the sweep key
def _key(path: Path, content: bytes = None, mode: int = 0o600) -> Path:
    path.write_bytes(os.urandom(32) if content is None else content)
    path.chmod(mode)
    return path


KEYS = {
    # name: (make the key at this path (returns what RAYSIM_KEY_FILE names), words of the refusal)
    "group-readable": (lambda p: _key(p, mode=0o640), ("mode 0640", "chmod 600", "RAYSIM_KEY_FILE")),
    "world-readable": (lambda p: _key(p, mode=0o644), ("mode 0644", "chmod 600")),
    "group-writable": (lambda p: _key(p, mode=0o620), ("mode 0620",)),
    "/etc/passwd": (lambda p: Path("/etc/passwd"), ("/etc/passwd", "RAYSIM_KEY_FILE")),
    "a folder": (lambda p: (p.mkdir(), p)[1], ("is a folder", "RAYSIM_KEY_FILE")),
    "a dangling link": (lambda p: (p.symlink_to(p.parent / "nowhere"), p)[1], ("symbolic link",)),
    "a link to a good key": (lambda p: (p.symlink_to(_key(p.parent / "real.key")), p)[1], ("symbolic link",)),
    "a pipe": (lambda p: (os.mkfifo(p, 0o600), p)[1], ("not a regular file",)),
    "empty": (lambda p: _key(p, b""), ("0 bytes", "32 random bytes")),
    "too short": (lambda p: _key(p, os.urandom(8)), ("8 bytes",)),
    "too long": (lambda p: _key(p, os.urandom(1 << 20)), ("1048576 bytes",)),
    "no key at all": (lambda p: _key(p, b"\0" * 32), ("does not look like a key",)),
    "another user's": (lambda p: (_key(p), os.chown(p, 65534, -1), p)[2], ("belongs to another user",)),
}


@pytest.mark.parametrize("case", list(KEYS))
def test_a_sweep_key_is_a_regular_file_of_the_users_readable_by_them_alone(case, tmp_path, monkeypatch):
    from raysim.errors import RaysimError
    from raysim.tune_state import user_key

    make, words = KEYS[case]
    if case == "another user's" and os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    monkeypatch.setenv("RAYSIM_KEY_FILE", str(make(tmp_path / "sweep.key")))
    with pytest.raises(RaysimError) as refused:
        user_key()
    message = str(refused.value)
    assert "\n" not in message
    assert_says(message, "sweep-signing key", *words)


def test_the_default_key_is_made_owner_only_and_a_bad_one_is_named_with_rm(tmp_path, monkeypatch):
    from raysim.errors import RaysimError
    from raysim.tune_state import user_key

    monkeypatch.delenv("RAYSIM_KEY_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    key = user_key()
    path = tmp_path / "raysim" / "sweep.key"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert user_key() == key  # read back, accepted
    path.chmod(0o644)
    with pytest.raises(RaysimError) as refused:
        user_key()
    assert_says(str(refused.value), f"rm {path}", "chmod 600")


@pytest.mark.parametrize("case, subprocess", [("group-readable", False), ("/etc/passwd", False), ("a pipe", True)])
def test_tune_resume_refuses_a_bad_key_in_one_line(case, subprocess, tmp_path, raysim):
    """A forged signature under a key others can read must not pass; a pipe must not hang."""
    sweep = tmp_path / "sweep"
    (sweep / "tune").mkdir(parents=True)
    (sweep / "sweep.yaml").write_text("base: quickstart\n")
    (sweep / "tune" / "tuner.pkl").write_bytes(pickle.dumps("state"))
    (sweep / "tune_state.sig").write_text(json.dumps({"hmac_sha256": "0" * 64}))
    (tmp_path / "keys").mkdir()
    key = KEYS[case][0](tmp_path / "keys" / "sweep.key")
    line = raysim(["tune", "--resume", sweep], env={"RAYSIM_KEY_FILE": str(key)}, subprocess=subprocess, timeout=60)
    assert_says(line, "sweep-signing key", str(key), *KEYS[case][1])


def test_a_new_sweep_refuses_a_bad_key_before_ray_or_its_folder(tmp_path, raysim):
    key = KEYS["world-readable"][0](tmp_path / "sweep.key")
    line = raysim(["tune", ROOT / "configs" / "sweeps" / "cpu.yaml", "--out", "out"], env={"RAYSIM_KEY_FILE": str(key)})
    assert_says(line, "sweep-signing key", "mode 0644")


# ------------------------------------------------------------------ item 7: config files
NOT_UTF8 = b"seed: 0\n# caf\xe9\nrounds: 2\n"


def _run_dir_with_config(folder: Path, text: bytes) -> Path:
    run_dir = folder / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_bytes(text)
    return run_dir


@pytest.mark.parametrize(
    "command, subprocess",
    [
        (["configs", "bad.yaml"], True),
        (["run", "extends_bad.yaml", "--out", "out"], False),  # the bad file is the base of the one given
        (["run", "--resume", "run"], False),  # a run directory's own config.yaml
    ],
)
def test_a_config_file_that_is_not_utf8_is_one_line(command, subprocess, tmp_path, raysim):
    (tmp_path / "bad.yaml").write_bytes(NOT_UTF8)
    (tmp_path / "extends_bad.yaml").write_text("extends: bad.yaml\n")
    _run_dir_with_config(tmp_path, NOT_UTF8)
    line = raysim(command, subprocess=subprocess)
    assert_says(line, "is not UTF-8 text", "0xe9", "line 2", "save it as UTF-8")


def test_an_extends_chain_of_1500_files_is_one_line_and_a_chain_of_40_reads(tmp_path, raysim):
    from raysim.config.files import read_yaml

    for i in range(1500):
        (tmp_path / f"f{i}.yaml").write_text(f"extends: f{i + 1}.yaml\n" if i < 1499 else "rounds: 7\n")
    line = raysim(["configs", "f0.yaml"], subprocess=True)
    assert_says(line, "f0.yaml", "more than 64 files", "shorten its 'extends:' chain")
    assert read_yaml(tmp_path / "f1460.yaml") == {"rounds": 7}  # 40 files: merged as before


# ------------------------------------------------------------------ item 7: reproduce's --seeds and --out
@pytest.mark.parametrize("seeds, subprocess", [("1_000_000_000", True), ("0-999999999", True), ("1001", False)])
def test_reproduce_refuses_an_absurd_number_of_seeds_before_making_any(seeds, subprocess, raysim):
    line = raysim(["reproduce", "smoke", "--out", "table", "--seeds", seeds], subprocess=subprocess)
    assert_says(line, f"--seeds '{seeds}'", "give at most 1000")


@pytest.mark.parametrize("name, subprocess", [("table.md", True), ("table.csv", False), ("curves.png", False)])
def test_reproduce_refuses_an_out_whose_table_file_is_a_folder_before_any_run(name, subprocess, tmp_path, raysim):
    (tmp_path / "table" / name).mkdir(parents=True)
    line = raysim(["reproduce", "smoke", "--out", "table"], subprocess=subprocess)
    assert_says(line, f"folder named {name}", "another --out")


# ------------------------------------------------------------------ item 7: sizes
@pytest.mark.parametrize(
    "command, words, subprocess",
    [
        (["partition", QUICKSTART, "model.width=1000000"], ("'model.width'=1000000", "36 TB", "at most 4096"), True),
        (
            ["run", QUICKSTART, "model.name=resnet18", "model.width_multiplier=1000", "--out", "out"],
            ("'model.width_multiplier'=1000", "at most 8"),
            False,
        ),
        (
            ["partition", QUICKSTART, "model.name=mlp", "model.hidden=100000000"],
            ("'model.hidden'", "at most 16384"),
            False,
        ),
        # today's code decoded 10,000 images at 4096x4096 (168 GB) until memory ran out
        (["partition", QUICKSTART, "dataset.image_size=4096"], ("dataset.image_size=4096", "at most 1024"), True),
    ],
)
def test_a_model_or_image_size_no_machine_holds_is_refused_naming_the_key(command, words, subprocess, raysim):
    line = raysim(command, subprocess=subprocess)
    assert_says(line, *words)


def test_images_that_cannot_fit_in_memory_are_refused_before_decoding(monkeypatch):
    import io

    import psutil
    from PIL import Image

    from raysim.data.decode import decode_images
    from raysim.errors import RaysimError

    class Little:
        available = 10**6

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Little())
    buffer = io.BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="PNG")
    with pytest.raises(RaysimError) as refused:
        decode_images([buffer.getvalue()] * 100, 256, str, "mine train")
    assert_says(str(refused.value), "mine train: 100 images at dataset.image_size=256", "smaller dataset.image_size")
    assert decode_images([buffer.getvalue()] * 2, 16, str, "mine train").shape == (2, 16, 16, 1)


# ------------------------------------------------------------------ item 7: --address
@pytest.mark.parametrize(
    "command, env, subprocess",
    [
        (["run", QUICKSTART, "--out", "out", "--address", "not an address"], {}, True),
        (["run", QUICKSTART, "--out", "out", "--address", "ray://head"], {}, False),  # no port
        (["run", QUICKSTART, "--out", "out"], {"RAY_ADDRESS": "not an address"}, False),  # made, then removed
        (["tune", "sweep.yaml", "--out", "out", "--address", "host:99999"], {}, False),
        (["reproduce", "smoke", "--out", "out", "--address", "http://head:8265"], {}, False),
    ],
)
def test_an_address_that_is_not_one_is_refused_before_ray(command, env, subprocess, raysim):
    line = raysim(command, env=env, subprocess=subprocess)
    assert_says(line, "is not a Ray cluster address", "HOST:PORT", "ray://HOST:PORT")
    assert_says(line, "RAY_ADDRESS" if env else "--address")


@pytest.mark.parametrize(
    "address, words",
    [
        ("ray://203.0.113.7:10001", ("cannot connect to the Ray cluster at ray://203.0.113.7:10001", "ray status")),
        (None, ("Ray could not start on this machine", "timed out during startup", "ray start --head")),
    ],
    ids=["a cluster that does not answer", "a private Ray that does not start"],
)
def test_a_ray_that_cannot_be_reached_is_one_line_and_the_run_directory_goes(
    address, words, tmp_path, monkeypatch, capfd
):
    import ray

    import raysim.runner
    from raysim.cli import main

    def unreachable(*args, **kwargs):  # as Ray does: its core logs each retry on fd 2, its client warns
        os.write(2, b"[W gcs_client.cc:210] Failed to get cluster ID from GCS server\n")
        warnings.warn("Ray Client connection timed out. Ensure that the Ray Client port ...", UserWarning)
        raise ConnectionError("ray client connection timeout")

    def does_not_start(*args, **kwargs):  # Ray 2.60 on a machine too busy to start its processes in time
        raise Exception("The current node timed out during startup. This could happen because ...")  # noqa: TRY002

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", unreachable if address else does_not_start)
    monkeypatch.setattr(raysim.runner, "prepare", lambda config: experiment_without_data())  # Ray is next
    out = tmp_path / "out"
    assert main(["run", str(QUICKSTART), "--out", str(out), *(["--address", address] if address else [])]) == 2
    assert_says(one_line(capfd), *words)
    assert not out.exists()  # neither the folder nor its .lock


def test_what_ray_writes_while_it_connects_is_passed_on_once_the_cluster_answers(capfd):
    from raysim.engine.ray_session import _stderr_held

    with _stderr_held() as held:
        os.write(2, b"kept\n")
        held.passed_on = True
    with _stderr_held():
        os.write(2, b"dropped\n")
    assert capfd.readouterr().err == "kept\n"


# ------------------------------------------------------------------ item 7: a checkpoint not of this run
@pytest.mark.parametrize(
    "case, words",
    [
        ("no weights", ("no 'weights' in its state",)),
        ("wrong shape", ("'weights' entry 'features.0.weight' has shape [1, 1, 3, 3], the model's is [8, 1, 3, 3]",)),
        ("not a tensor", ("is a str, not an array",)),
        ("missing weight", ("its 'weights' lack 'classifier.bias'",)),
        ("weights not a mapping", ("'weights' is a list",)),
        ("no control", ("no 'control' in its state",)),  # SCAFFOLD's control variate, one per parameter
        ("wrong control", ("'control' entry 'features.0.weight' has shape [1, 1, 3, 3]",)),
    ],
)
def test_a_checkpoint_that_is_not_this_runs_model_is_refused_before_ray(case, words, tmp_path, raysim):
    """... and the refusal leaves the received directory as it was (no lock file added)."""
    from raysim.config import dump_config
    from raysim.experiment import load_config
    from raysim.outputs.run_dir import RunDir
    from raysim.runner import prepare
    from raysim.tensors import module_weights

    scaffold = case.endswith("control")
    convnet = {"model.name": "convnet"}  # the shapes named above
    config = load_config(QUICKSTART, tiny_overrides(**convnet, **({"algorithm.name": "scaffold"} if scaffold else {})))
    model = prepare(config).spec.build("cpu")
    weights = module_weights(model)
    control = {name: np.zeros(tuple(p.shape), np.float32) for name, p in model.named_parameters()}
    first = "features.0.weight"
    state = {
        "no weights": {},
        "wrong shape": {"weights": {**weights, first: weights[first][:1]}},
        "not a tensor": {"weights": {**weights, first: "weights"}},
        "missing weight": {"weights": {k: v for k, v in weights.items() if k != "classifier.bias"}},
        "weights not a mapping": {"weights": list(weights.values())},
        "no control": {"weights": weights},
        "wrong control": {"weights": weights, "control": {**control, first: control[first][:1]}},
    }[case]
    run_dir = RunDir(tmp_path / "run")  # as received: its config and checkpoint
    run_dir.path.mkdir()
    run_dir.write_config(dump_config(config))
    run_dir.write_checkpoint({"round": 1, "state": state, "wall_time_s": 1.0, "log_summary": {}})
    before = sorted(p.name for p in run_dir.path.rglob("*"))
    line = raysim(["run", "--resume", "run"])
    assert_says(line, "last.pt does not hold this run's model", *words, "start a fresh run")
    assert sorted(p.name for p in run_dir.path.rglob("*")) == before


# ------------------------------------------------------------------ item 7: the client-state refusal alone
def test_a_client_state_that_is_a_plain_pickle_is_refused_without_a_torch_warning(tmp_path):
    from raysim.engine.client_state import ClientStateStore
    from raysim.outputs.state_files import UnreadableStateError

    folder = tmp_path / "client_00000"
    folder.mkdir()
    (folder / "r000001.pt").write_bytes(pickle.dumps({"control": [1.0, 2.0]}, protocol=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UnreadableStateError) as refused:
            ClientStateStore(tmp_path).load(0, 2)
    assert "\n" not in str(refused.value)
    assert [str(w.message) for w in caught] == []


# ------------------------------------------------------------------ item 7: a table's cell at a scale it lacks
@pytest.mark.parametrize(
    "command, name, scale, subprocess",
    [
        ("run", "dcfl_table2:mnist_dir0.5:fedavg", "paper", True),
        ("bench cell", "dcfl_table2:mnist_dir0.5:fedavg", "paper", False),
        ("bench cell", "smoke:fmnist_dir0.5:fedavg:paper", "cpu", False),  # today: 'choose --scale cpu'
    ],
)
def test_a_cell_without_a_config_at_its_scale_names_the_scale_this_command_takes(
    command, name, scale, subprocess, raysim
):
    line = raysim([*command.split(), name], subprocess=subprocess)
    cell = ":".join(name.split(":")[:3])
    assert_says(line, "-scale config", f"'raysim {command} {cell}:{scale}'")
    assert "--scale" not in line
