"""The engine's general features: a model per client, algorithm-chosen participants and
server-only rounds, per-recipient payloads, server records, user code by `module:name`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysim.outputs.metrics import is_timing
from raysim.outputs.run_dir import RunDir
from tests.conftest import run_and_kill_after_round, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
HETEROGENEOUS = {
    "algorithm.name": "tests.engine_algorithms:OneShotDistill",
    "rounds": 2,
    "clients.models": "[lenet, cnn2, {name: resnet18, width_multiplier: 0.125}]",
    "model.name": "resnet18",
    "model.width_multiplier": 0.125,
    "algorithm.distill_steps": 5,  # round 2's distillation: recorded, not judged
}


def rows(run_dir):
    return [
        (r["round"], r["client"], r["metric"], r["value"])
        for r in pq.read_table(run_dir / "metrics.parquet").to_pylist()
        if not is_timing(r["metric"])
    ]


def test_clients_with_three_architectures_give_the_same_numbers_on_two_actors_and_in_process(run_tiny):
    summary, two = run_tiny(**HETEROGENEOUS, **{"resources.in_process": False, "resources.actors": 2})
    _, here = run_tiny(**HETEROGENEOUS)
    assert rows(two) == rows(here)

    # entries take their sizes from `model:` unless they set them: width_multiplier 0.125 for both
    # scalable models (cnn2 has no multiplier)
    lenet, cnn2, resnet = "lenet(x0.125)", "cnn2", "resnet18(x0.125)"
    models = {}
    for actor in yaml.safe_load((two / "actors.yaml").read_text()):
        models.update(actor["models"])
    assert models == {0: lenet, 1: cnn2, 2: resnet, 3: lenet, 4: cnn2, 5: resnet}
    assert summary["client_models"] == {lenet: [0, 3], cnn2: [1, 4], resnet: [2, 5]}

    # each upload carries that client's own architecture and weights
    clients = RunDir(two).read_checkpoint()["state"]["clients"]
    assert {k: m["arch"] for k, m in clients.items()} == models
    assert clients[0]["weights"].keys() != clients[1]["weights"].keys() != clients[2]["weights"].keys()
    assert clients[2]["weights"]["features.0.weight"].shape == (8, 1, 3, 3)  # 64 x 0.125 stem channels

    # server records: per-client values and a scalar that also lands in summary.json
    own = {c: v for r, c, m, v in rows(two) if m == "own_accuracy"}
    assert sorted(own) == [0, 1, 2, 3, 4, 5] and max(own.values()) > 0.3  # chance is 0.1
    assert summary["ensemble_accuracy"] > 0.3
    # round 2 is server-only: no participants, no bytes, still evaluated
    participants = {r: v for r, c, m, v in rows(two) if c is None and m == "participants"}
    assert participants == {1: 6, 2: 0}
    assert [r for r, c, m, _ in rows(two) if c is None and m == "distill_loss"] == [2]


def test_a_model_that_the_algorithm_cannot_use_is_refused_before_ray_starts():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config
    from raysim.runner import prepare

    config = load_config(ROOT / "configs/quickstart.yaml", tiny_overrides(**{"clients.models": "[lenet, cnn2]"}))
    with pytest.raises(RaysimError, match="algorithm 'fedavg' needs every client to have the server's model"):
        prepare(config)
    with pytest.raises(RaysimError, match="names no model for client"):
        load_config(ROOT / "configs/quickstart.yaml", tiny_overrides(**{"clients.models": "{0: lenet}"}))


def test_server_only_rounds_resume_after_sigkill_to_the_same_numbers(run_tiny, tmp_path, monkeypatch):
    extra = {
        **HETEROGENEOUS,
        "clients.models": "[lenet, cnn2]",
        "model.name": "cnn2",
        "algorithm.distill_steps": 60,
        "rounds": 4,
    }
    _, uninterrupted = run_tiny(**extra)
    run_dir = tmp_path / "killed"
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    # in process, as the uninterrupted run (no actors to start: the rounds killed are the server's)
    in_process = tiny_overrides(**extra, **{"resources.in_process": True})
    done = run_and_kill_after_round(in_process, run_dir, 2, env)  # in a server-only round
    assert 2 <= done < 4
    # resumed by the command in this process (the killed one was another): the run names user code
    # (tests.engine_algorithms), which a resume imports only when allowed
    from raysim.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["run", "--resume", str(run_dir), "--allow-code"]) == 0
    server = [(r, m, v) for r, c, m, v in rows(run_dir) if c is None]
    assert server == [(r, m, v) for r, c, m, v in rows(uninterrupted) if c is None]
    assert json.loads((run_dir / "summary.json").read_text())["ensemble_accuracy"] > 0.1


def test_each_part_is_put_once_and_each_client_is_charged_what_it_receives():
    from raysim.algorithm import Broadcast
    from raysim.engine.delivery import Delivery
    from raysim.engine.store import LocalStore
    from raysim.errors import RaysimError
    from raysim.tensors import serialized_nbytes

    shared = {"weights": {"w": np.ones(1000, np.float32)}}
    mine = {k: {"data": np.zeros(50 * (k + 1), np.uint8)} for k in (0, 1, 2)}
    group = {"relay": np.zeros(300, np.uint8)}
    payload = Broadcast(shared=shared).to(0, mine[0]).to(1, mine[1]).to(2, mine[2]).to([1, 2], group)
    delivery = Delivery(payload, [0, 1, 2], round_index=1, store=LocalStore())
    base = serialized_nbytes(shared)
    assert delivery.bytes_down == {
        0: base + serialized_nbytes(mine[0]),
        1: base + serialized_nbytes(mine[1]) + serialized_nbytes(group),
        2: base + serialized_nbytes(mine[2]) + serialized_nbytes(group),
    }
    assert len(delivery.arguments(0)) == 2 and len(delivery.arguments(1)) == 3
    assert delivery.arguments(1)[2] == delivery.arguments(2)[2]  # the group part: one object for both
    with pytest.raises(RaysimError, match=r"addresses a part to client\(s\) \[7\]"):
        Delivery(Broadcast(shared=shared).to(7, mine[0]), [0, 1], round_index=3, store=LocalStore())
    with pytest.raises(RaysimError, match=r"client 0 would receive key\(s\) \['weights'\] twice"):
        Delivery(Broadcast(shared=shared).to(0, {"weights": 1}), [0, 1], round_index=3, store=LocalStore())


def test_addressed_parts_reach_only_their_clients_and_bytes_down_follows(run_tiny):
    _, run_dir = run_tiny(
        **{
            "algorithm.name": "tests.engine_algorithms:AddressedFedAvg",
            "resources.in_process": False,
            "clients.per_round": 4,
        }
    )
    table = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    for round_index in (1, 2):
        down = {
            r["client"]: r["value"]
            for r in table
            if r["round"] == round_index and r["client"] is not None and r["metric"] == "bytes_down"
        }
        group = {
            r["client"]: r["value"]
            for r in table
            if r["round"] == round_index and r["client"] is not None and r["metric"] == "got_group"
        }
        first, second, *rest = sorted(down)
        assert group == {first: 1.0, second: 1.0, **{k: 0.0 for k in rest}}
        # a note of 100 (k + 1) bytes each; the first two also get the 1000-byte group part
        extra = {k: down[k] - 100 * (k + 1) - (1000 if k in (first, second) else 0) for k in down}
        assert max(extra.values()) - min(extra.values()) < 200  # pickle headers of the parts only
        total = [
            r["value"]
            for r in table
            if r["round"] == round_index and r["client"] is None and r["metric"] == "bytes_down"
        ]
        assert total == [sum(down.values())]


def test_select_clients_that_returns_a_stranger_is_one_clear_error(run_tiny):
    from raysim.errors import RaysimError

    with pytest.raises(RaysimError, match=r"select_clients returned client ids outside 0..5: \[99\]"):
        run_tiny(**{"algorithm.name": "tests.engine_algorithms:ChoosesAStranger"})


def readme_example() -> list[str]:
    """The command of the README's "Write your own algorithm", which runs examples/my_fl.py."""
    text = (ROOT / "README.md").read_text().split("### Write your own algorithm", 1)[1].split("\n## ", 1)[0]
    assert "examples/my_fl.py" in text
    return text.split("```bash\n", 1)[1].split("```", 1)[0].split()


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_the_readme_example_algorithm_and_model_run_from_the_cli_as_user_code(tmp_path, monkeypatch, capsys):
    prefix, *command = readme_example()
    assert prefix == "PYTHONPATH=examples" and (ROOT / "examples/my_fl.py").is_file()
    assert command[:3] == ["raysim", "run", "configs/quickstart.yaml"]
    # the command's PYTHONPATH, from the repository's root; raysim itself from ROOT
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": os.pathsep.join([str(ROOT / "examples"), str(ROOT)])}
    tiny = tiny_overrides(**{"resources.actors": 1})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raysim.cli",
            "run",
            str(ROOT / command[2]),
            *tiny,
            *command[3:],  # after the tiny settings: the README's model and algorithm are what runs
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # restartable actors (resources.max_restarts defaults to 3) and still no error-level line from
    # Ray, such as core_worker.cc's about constructor arguments in the object store
    assert not re.search(r"\[[\d\- :,]+ E \d+ \d+\]", done.stderr), done.stderr[-2000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["final_accuracy"] > 0.3, summary  # chance is 0.1
    assert summary["algorithm"] == "my_fl:FedAvgM"
    norms = [
        r["value"] for r in pq.read_table(tmp_path / "run/metrics.parquet").to_pylist() if r["metric"] == "update_norm"
    ]
    assert len(norms) == 2 and all(n > 0 for n in norms)

    # a wrong path is one line and exit 2, before Ray starts (in this process: the subprocess above
    # already covers the command's own start)
    from raysim.cli import main

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "")
    for key, value, said in (
        ("algorithm.name", "my_fl:Nope", "module 'my_fl'"),
        ("algorithm.name", "nosuch_module:Algo", "no module 'nosuch_module'"),
        ("model.name", "my_fl:nope", "has no model factory named 'nope'"),
        ("algorithm.name", "my_fl:small_cnn", "not a subclass of raysim.algorithm.Algorithm"),
    ):
        code = main(["run", str(ROOT / command[2]), f"{key}={value}", "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err
        assert code == 2, err[-2000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0] and key in lines[0], err
