"""The engine: determinism across actor counts, sampling, outputs, bytes, GPU placement."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from raysim.outputs.state_files import load_state


def server_metric(run_dir, metric):
    table = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return [(r["round"], r["value"]) for r in table if r["client"] is None and r["metric"] == metric]


ROOT = Path(__file__).resolve().parents[1]
ACTORS = {"resources.in_process": False}


def test_same_numbers_with_one_or_two_actors_or_in_process(run_tiny):
    _, one = run_tiny(**ACTORS, **{"resources.actors": 1})
    _, two = run_tiny(**ACTORS, **{"resources.actors": 2})
    _, here = run_tiny(**{"resources.in_process": True})
    for metric in ("accuracy", "loss", "bytes_up", "bytes_down"):
        assert server_metric(one, metric) == server_metric(two, metric) == server_metric(here, metric), metric
    assert len(server_metric(one, "accuracy")) == 2
    assert yaml.safe_load((here / "actors.yaml").read_text())[0]["device"] == "cpu (in process)"


def test_outputs_and_accounting(run_tiny):
    summary, run_dir = run_tiny(**ACTORS, **{"output.tensorboard": True, "clients.per_round": 3})
    for name in (
        "config.yaml",
        "metrics.parquet",
        "summary.json",
        "checkpoints/last.pt",
        "checkpoints/final_model.pt",
        "actors.yaml",
    ):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    table = pq.read_table(run_dir / "metrics.parquet")
    assert table.column_names == ["round", "client", "metric", "value"]
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_accuracy", "best_accuracy", "rounds", "bytes_up", "bytes_down", "wall_time_s"):
        assert key in on_disk and on_disk[key] == summary[key]
    assert summary["rounds"] == 2 and summary["finished"]
    # 3 of 6 clients per round; every participant downloads the same broadcast
    assert [v for _, v in server_metric(run_dir, "participants")] == [3, 3]
    rows = table.to_pylist()
    per_round_clients = {
        r for r, c, m in ((x["round"], x["client"], x["metric"]) for x in rows) if c is not None and m == "bytes_up"
    }
    assert per_round_clients == {1, 2}
    # FedAvg uploads what it downloads (the whole model), give or take pickle headers
    up, down = summary["bytes_up"], summary["bytes_down"]
    assert abs(up - down) / down < 0.01
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["clients"]["per_round"] == 3 and resolved["algorithm"]["name"] == "fedavg"


# Runs on the session's kept actors come before the tests that stop them (a failed run, a run that
# keeps none, another kind of actor): each stop makes the next run on actors start new ones.
def test_kept_actors_give_the_numbers_of_new_ones_whatever_they_ran_before(ray_session, tmp_path):
    """Within the session's reusing_actors (raysim.engine.actor_pool) a run's client actors are kept
    for the next run of the same resources: FedAvg on the actors kept from a FedProx run gives the
    numbers of FedAvg on new actors (resources.reuse_actors=false) and starts none; the actors of a
    run that fails are stopped, not kept."""
    from raysim.engine.actor_pool import idle_actors
    from raysim.experiment import load_config
    from raysim.outputs.callbacks import Callback
    from raysim.runner import run_experiment
    from tests.conftest import tiny_overrides

    def run(name, callbacks=(), **overrides):
        config = load_config(ROOT / "configs/quickstart.yaml", tiny_overrides(**ACTORS, seed=7, **overrides))
        run_experiment(config, tmp_path / name, callbacks=list(callbacks))
        return tmp_path / name

    class Interrupted(Exception):
        pass

    class FailAfterRound1(Callback):
        def on_round_end(self, result):
            raise Interrupted

    run("fedprox", **{"algorithm.name": "fedprox", "algorithm.mu": 0.1})
    after_fedprox = set(idle_actors())
    kept = run("kept")
    assert len(after_fedprox) >= 2 and set(idle_actors()) == after_fedprox  # none started, none lost
    with pytest.raises(Interrupted):
        run("failed", callbacks=[FailAfterRound1()])
    assert len(idle_actors()) == len(after_fedprox) - 2
    new = run("new", **{"resources.reuse_actors": False})
    for metric in ("accuracy", "loss", "bytes_up"):
        assert server_metric(kept, metric) == server_metric(new, metric), metric


def test_an_in_process_run_needs_no_ray(run_tiny, tmp_path):
    """resources.in_process imports no Ray: with Ray made unimportable, the command runs a tiny
    config to the same numbers as the in-process run of the test session."""
    import subprocess
    import sys

    from tests.conftest import tiny_overrides

    summary, _ = run_tiny(**{"resources.in_process": True})
    out = tmp_path / "no_ray"
    script = (
        "import sys; sys.modules['ray'] = None\n"  # import ray now raises ImportError
        "from raysim.cli import main\n"
        f"sys.exit(main(['run', {str(ROOT / 'configs/quickstart.yaml')!r}, '--out', {str(out)!r}, "
        f"*{tiny_overrides(**{'resources.in_process': True})!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    mine = json.loads((out / "summary.json").read_text())
    assert mine["final_accuracy"] == summary["final_accuracy"] and mine["bytes_up"] == summary["bytes_up"]


@pytest.mark.slow  # a subprocess: about 4 s
def test_without_ray_what_needs_it_is_one_line_and_makes_no_folder(tmp_path):
    """A run on actors, a sweep and a table's runs on actors, in a Python where Ray cannot be imported."""
    import subprocess
    import sys

    run_out, sweep_out, table_out = tmp_path / "run", tmp_path / "sweep", tmp_path / "table"
    script = (
        "import sys; sys.modules['ray'] = None\n"  # import ray now raises ModuleNotFoundError
        "from raysim.cli import main\n"
        f"print(main(['run', {str(ROOT / 'configs/quickstart.yaml')!r}, '--out', {str(run_out)!r}]), "
        f"main(['tune', {str(ROOT / 'configs/sweeps/cpu.yaml')!r}, '--out', {str(sweep_out)!r}]), "
        f"main(['reproduce', 'smoke', '--out', {str(table_out)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "2", "2"], done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("raysim: error: Ray is not installed") for line in lines), lines
    assert "resources.in_process=true" in lines[0]
    assert not run_out.exists() and not sweep_out.exists() and not table_out.exists()


def test_learns_above_chance(run_tiny):
    summary, _ = run_tiny(**{"rounds": 3, "model.width": 16})
    assert summary["final_accuracy"] > 0.4  # 10 classes: chance is 0.1


def test_fractional_gpus_place_four_actors_on_one_gpu(run_tiny):
    _, run_dir = run_tiny(
        **ACTORS,
        **{"resources.actors": 4, "resources.cpus_per_actor": 0.5, "resources.gpus_per_actor": 0.25, "rounds": 1},
    )
    actors = yaml.safe_load((run_dir / "actors.yaml").read_text())
    assert len(actors) == 4
    assert all(a["gpu_ids"] == ["0"] for a in actors)  # all four share the one logical GPU
    assert all(a["device"] == "cpu" for a in actors)  # torch sees no CUDA: CPU fallback


def test_asking_for_more_than_the_cluster_fails_clearly(run_tiny):
    from raysim.errors import RaysimError

    with pytest.raises(RaysimError, match="needs 8 GPUs .* has 1"):
        run_tiny(**ACTORS, **{"resources.actors": 1, "resources.gpus_per_actor": 8})


def test_summary_reports_the_mean_of_the_last_five_evaluations(run_tiny):
    summary, run_dir = run_tiny(**{"rounds": 6, "model.name": "mlp"})  # any model: the MLP is quickest
    accuracy = [v for _, v in server_metric(run_dir, "accuracy")]
    assert summary["last5_accuracy"] == pytest.approx(sum(accuracy[-5:]) / 5)
    assert json.loads((run_dir / "summary.json").read_text())["last5_accuracy"] == summary["last5_accuracy"]
    from raysim.report import report

    table = report([str(run_dir)])
    assert "last-5 acc" in table and f"{summary['last5_accuracy']:.4f}" in table


def test_rounds_to_accuracy_is_the_first_evaluated_round_reaching_each_target():
    from raysim.outputs.summary import rounds_to_accuracy

    history = [(2, 0.5), (4, 0.8), (6, 0.79), (8, 0.9)]  # eval.every=2
    assert rounds_to_accuracy(history, [0.8, 0.86, 0.95, 0.5, 1]) == {
        "0.8": 4,
        "0.86": 8,
        "0.95": None,
        "0.5": 2,
        "1.0": None,
    }
    assert rounds_to_accuracy([], [0.5]) == {"0.5": None}


def test_rounds_to_accuracy_counts_the_rounds_before_a_resume(ray_session, tmp_path):
    """eval.targets: summary.json's rounds_to_accuracy covers every round of a run extended by --resume."""
    from raysim.experiment import load_config
    from raysim.resume import resume_config
    from raysim.runner import run_experiment
    from tests.conftest import tiny_overrides

    overrides = tiny_overrides(**{"resources.in_process": True, "rounds": 1, "eval.targets": "[0.01,1]"})
    first = run_experiment(load_config(ROOT / "configs/quickstart.yaml", overrides), tmp_path)
    assert first["rounds_to_accuracy"] == {"0.01": 1, "1.0": None}
    resumed = run_experiment(resume_config(tmp_path, ["rounds=2"]), tmp_path)
    assert resumed["rounds"] == 2 and resumed["rounds_to_accuracy"] == {"0.01": 1, "1.0": None}  # round 1 kept
    assert json.loads((tmp_path / "summary.json").read_text())["rounds_to_accuracy"] == resumed["rounds_to_accuracy"]


def test_clients_can_keep_their_optimiser_state_between_rounds(run_tiny):
    """local.keep_optimizer: each client's Adam moments carry over to its next round (DynaFed's clients);
    the default, a fresh optimiser each round, is unchanged."""
    adam = {"local.optimizer": "adam", "local.lr": 0.001, "rounds": 3, "model.name": "mlp"}  # any model: the quickest
    _, fresh = run_tiny(**adam)
    _, kept = run_tiny(**adam, **{"local.keep_optimizer": True})
    assert server_metric(fresh, "loss")[0] == server_metric(kept, "loss")[0]  # round 1: nothing kept yet
    assert server_metric(fresh, "loss")[1:] != server_metric(kept, "loss")[1:]
    assert not list((fresh / "client_state").glob("*/*.pt"))  # no state without the option
    saved = sorted((kept / "client_state" / "client_00000").glob("r*.pt"))
    state = load_state(saved[-1], "")["optimizer"]
    assert state["state"] and all(t["exp_avg"].device.type == "cpu" for t in state["state"].values())
    assert all(int(t["step"]) > 0 for t in state["state"].values())


def test_domain_skew_runs_report_each_domains_accuracy_and_their_mean(ray_session, tmp_path, monkeypatch):
    """DomainNet-style data: the papers' figure is the mean of the per-domain test accuracies."""
    import numpy as np
    from PIL import Image

    from raysim.experiment import load_config
    from raysim.runner import run_experiment

    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    domains = ("clipart", "painting", "real")
    for d, domain in enumerate(domains):
        for label, cls in enumerate(("apple", "bus")):
            for split, count in (("train", 12), ("test", 4 + 2 * d)):
                for i in range(count):
                    pixels = rng.integers(0, 60, (16, 16, 3)) + 150 * label + 20 * d
                    folder = tmp_path / "dn" / domain / split / cls
                    folder.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i}.png")
    config = load_config(
        "configs/quickstart.yaml",
        [
            "dataset.name=domainnet",
            f"dataset.root={tmp_path / 'dn'}",
            "dataset.image_size=16",
            "partition.kind=domain",
            "clients.num=3",
            "clients.per_round=3",
            "model.width=8",
            "rounds=2",
            "resources.in_process=true",
            "output.tensorboard=false",
        ],
    )
    summary = run_experiment(config, tmp_path / "run")
    per_domain = summary["final_domain_accuracy"]
    assert sorted(per_domain) == sorted(domains)
    assert summary["final_domain_accuracy_mean"] == pytest.approx(np.mean(list(per_domain.values())))
    for domain in domains:
        assert len(server_metric(tmp_path / "run", f"domain_accuracy/{domain}")) == 2
    # the pooled accuracy weights domains by their test sizes (8, 12, 16 images): not the same figure
    pooled = server_metric(tmp_path / "run", "accuracy")[-1][1]
    sizes = np.array([8, 12, 16])
    assert pooled == pytest.approx(float(np.dot(sizes, [per_domain[d] for d in domains]) / sizes.sum()))
    from raysim.report import report

    table = report([str(tmp_path / "run")])
    assert "domain mean acc" in table and f"{summary['final_domain_accuracy_mean']:.4f}" in table
