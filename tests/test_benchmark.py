"""The benchmark's measures: multiply-accumulates counted as layers run (raysim.macs), what a run spent
to reach a target (raysim.results.cost_to), the accuracy-bytes front, the leaderboard, and the
benchmark table itself; end to end, `raysim reproduce` of a two-method table writes the leaderboard
and the four pictures with the bytes and MACs the runs counted."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from raysim.config import dump_config
from raysim.macs import counting, every_operation, paused
from raysim.outputs.metrics import MetricsTable
from raysim.reproduce import load_table
from raysim.reproduce.curves import method_styles, pareto_front
from raysim.reproduce.runs import plan_runs
from raysim.reproduce.table_output import collect, leaderboard_rows, markdown
from raysim.results import cost_to, read_run

ROOT = Path(__file__).resolve().parents[1]


def test_a_layers_macs_count_the_backward_passes_its_forward_is_run_for():
    layer, x = nn.Linear(4, 3), torch.randn(5, 4)
    forward = 5 * 3 * 4
    with counting() as counter, torch.no_grad():
        layer(x)
    assert counter.total == forward  # an evaluation: the forward alone
    with counting() as counter:
        layer(x).sum().backward()
    assert counter.total == 2 * forward  # weight gradients; the input needs none
    with counting() as counter:
        layer(x.requires_grad_()).sum().backward()
    assert counter.total == 3 * forward  # and the input's gradient (a layer inside a network)
    layer.requires_grad_(False)
    with counting() as counter:
        layer(x).sum().backward()
    assert counter.total == 2 * forward  # a frozen teacher behind a generator: the input's only
    conv = nn.Conv2d(6, 8, 3, groups=2).requires_grad_(False)
    with counting() as counter:
        conv(torch.randn(2, 6, 10, 10))
    assert counter.total == 2 * 8 * 8 * 8 * (6 // 2) * 9  # outputs x inputs per group x kernel
    with counting() as counter, paused():
        layer(x)
    assert counter.total == 0  # a reading (the one-shot teachers' test logits), not the method's work
    with counting(False) as counter:
        assert counter is None
    with counting() as counter:
        pass
    layer(x)  # outside the context: nothing is counted, the hook is gone
    assert counter.total == 0


def test_a_gradient_through_unrolled_training_is_counted_whole_by_the_dispatcher():
    """Where both apply (a training step) the layer hook and every_operation() agree to the MAC; an
    outer gradient through an unrolled step (DynaFed's synthesis) is a second-order backward, which
    the hook counts as one and the dispatcher counts whole."""
    from torch.func import functional_call

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    images, labels = torch.randn(32, 8, requires_grad=True), torch.randn(32, 4).softmax(1)
    target = {n: p.detach() + 0.01 for n, p in net.named_parameters()}

    def training_step():
        nn.functional.cross_entropy(net(images.detach()), labels).backward()

    def unrolled_step():  # one SGD step on the images, then the gap to a target, back to the images
        params = dict(net.named_parameters())
        loss = nn.functional.cross_entropy(functional_call(net, params, (images,)), labels)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        gap = sum(((p - 0.1 * g - target[n]) ** 2).sum() for (n, p), g in zip(params.items(), grads))
        gap.backward()

    counts = {}
    for name, work in (("training", training_step), ("unrolled", unrolled_step)):
        with counting() as hook:
            work()
        with counting() as dispatcher, every_operation():
            work()
        counts[name] = hook.total, dispatcher.total
    assert counts["training"][0] == counts["training"][1] > 0
    hook, dispatcher = counts["unrolled"]
    assert dispatcher > 1.5 * hook
    with counting() as counter, paused(), every_operation():
        unrolled_step()
    assert counter.total == 0  # a reading stays uncounted
    with every_operation():
        unrolled_step()  # no counter open: nothing to count into, and no error


def test_counting_macs_changes_no_number_and_records_each_clients_and_the_servers(run_tiny):
    from tests.test_algorithms import assert_same_weights, final_weights, server_values

    _, plain = run_tiny(**{"algorithm.name": "fedavg"})
    _, counted = run_tiny(**{"algorithm.name": "fedavg", "eval.count_macs": True})
    assert server_values(plain, "loss") == server_values(counted, "loss")
    assert_same_weights(final_weights(plain), final_weights(counted))
    curves = read_run(counted).curves()
    assert "macs" not in read_run(plain).curves()
    rounds, macs = curves["macs_clients"]
    assert list(rounds) == [1, 2] and macs[0] > 0 and macs[1] == pytest.approx(2 * macs[0], rel=0.01)
    assert curves["macs_server"][1][-1] == 0  # FedAvg's server only averages: no layer runs


def test_a_run_that_counts_macs_states_each_phases_achieved_gmacs_per_second(run_tiny):
    """summary.json's gmacs_per_s: each counted phase's MACs over its seconds (the clients' phase: all
    clients' MACs over the phase's wall time); a run that does not count states none."""
    import pyarrow.parquet as pq

    plain, _ = run_tiny(**{"algorithm.name": "fedavg"})
    summary, run_dir = run_tiny(**{"algorithm.name": "fedavg", "eval.count_macs": True})
    assert "gmacs_per_s" not in plain
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()

    def total(metric, clients):
        return sum(r["value"] for r in rows if r["metric"] == metric and (r["client"] is not None) == clients)

    rates = summary["gmacs_per_s"]
    assert rates["clients"] == pytest.approx(total("macs", True) / total("time_clients_s", False) / 1e9)
    assert rates["eval"] == pytest.approx(total("macs_eval", False) / total("time_eval_s", False) / 1e9)
    assert rates["clients"] > 0 and rates["eval"] > 0
    assert "server" not in rates  # FedAvg's server only averages: no MACs, no rate


def test_counting_macs_of_compiled_models_is_refused_in_one_line():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config

    with pytest.raises(RaysimError, match="set one of them to false") as info:
        load_config(ROOT / "configs" / "quickstart.yaml", ["eval.count_macs=true", "resources.compile=true"])
    assert "\n" not in str(info.value)


def fake_run(
    run_dir: Path, config, accuracy: list[float], mb: list[float], targets: dict[str, int | None], loss=()
) -> None:
    """A finished run with a curve: accuracy (and test loss, where given) and MB moved per round, 10 s
    and 1 GMAC of client work a round."""
    from raysim.outputs.run_dir import RunDir

    run_dir.mkdir(parents=True)
    rd = RunDir(run_dir)
    rd.write_config(dump_config(config))
    table = MetricsTable(rd.path / "metrics.parquet")
    for r, (a, m) in enumerate(zip(accuracy, mb), start=1):
        table.add(r, None, "accuracy", a)
        if loss:
            table.add(r, None, "loss", loss[r - 1])
        table.add(r, None, "bytes_up", m * 1e6)
        table.add(r, None, "time_server_update_s", 1.0)
        table.add(r, None, "macs_server", 0.0)
        table.add(r, 0, "time_s", 10.0)
        table.add(r, 0, "macs", 1e9)
    table.flush()
    rd.write_summary(
        {
            "finished": True,
            "rounds": len(accuracy),
            "final_accuracy": accuracy[-1],
            "best_accuracy": max(accuracy),
            "last5_accuracy": accuracy[-1],
            "wall_time_s": 60.0,
            "bytes_up": sum(mb) * 1e6,
            "bytes_down": 0.0,
            "rounds_to_accuracy": targets,
            "peak_memory_mb": {"clients": 500.0, "server": 700.0},
        }
    )


TABLE = """
title: t
leaderboard: true
figures: [rounds, mb, compute, pareto]
cells:
  a: {config: {cpu: quickstart}, overrides: {rounds: 4}}
methods:
  many: {algorithm: {name: fedavg}}
  once: {algorithm: {name: fedprox}}
"""


def test_what_a_method_spent_to_reach_a_target_and_in_all_leads_its_leaderboard_row(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TABLE)
    table = load_table(path)
    runs = plan_runs(table, "cpu", [0, 1], ["a"], ["many", "once"], tmp_path / "out", None)
    for run in runs:
        if run.method == "many":  # 2 MB a round; seed 0 reaches 0.6 at round 3, seed 1 never
            reach = {"0.6": 3 if run.seed == 0 else None}
            fake_run(run.run_dir.path, run.config, [0.3, 0.5, 0.6, 0.55], [2, 2, 2, 2], reach)
        else:  # everything moved in round 1, then the server alone
            fake_run(run.run_dir.path, run.config, [0.62, 0.64, 0.66, 0.7], [5, 0, 0, 0], {"0.6": 1})
    many = [read_run(r.run_dir.path) for r in runs if r.method == "many"]
    assert cost_to(many[:1], "0.6").mean == pytest.approx(6.0)  # by the end of round 3
    assert cost_to(many, "0.6") == ">8.0 (1/2)"  # a seed never reached it, after 8 MB in all
    assert cost_to(many[:1], "0.6", "compute_s").mean == pytest.approx(33.0)  # 3 x (10 + 1)
    assert cost_to(many, "0.9") == "-"  # not a target these runs were asked for
    board = leaderboard_rows(table, collect(runs), ["a"], ["many", "once"])
    assert [(r["rank"], r["method"]) for r in board] == [(1, "once"), (2, "many")]
    once = board[0]
    assert once["mb"] == pytest.approx(5.0) and once["client_s"] == pytest.approx(40.0)
    assert once["server_s"] == pytest.approx(4.0) and once["client_gmacs"] == pytest.approx(4.0)
    assert once["server_peak_mb"] == pytest.approx(700.0) and once["mb_to"]["0.6"].mean == pytest.approx(5.0)
    # last-5, best, final | MB up / down, in all, to 60% | seconds, GMACs (clients, server) | peaks | seeds
    row = "| 1 | once | 70.0 +- 0.0 | 70.0 | 70.0 | 5.0 / 0.0 | 5.0 | 5.0 +- 0.0 | 40.0 | 4.0 | 4.0 | 0.0 | 500 | 700 |"
    assert row in markdown(table, "cpu", [], [], [], "", board)
    assert "| 2 | many | 55.0 +- 0.0 |" in markdown(table, "cpu", [], [], [], "", board)


def test_a_model_that_diverged_is_named_where_its_run_is_reported(tmp_path, capsys):
    """A seed whose test loss turned NaN sits at a constant guess from then on, which a mean over seeds
    hides: the progress bar says so when it happens (once: a resumed run's bar knows), and the table
    and `raysim report` name the run and the round. A collapse with a finite loss is not called
    divergence."""
    from raysim.outputs.callbacks import RoundResult, RunStart
    from raysim.report import report
    from raysim.reproduce.table_output import method_rows
    from raysim.runner import ProgressBar

    path = tmp_path / "t.yaml"
    path.write_text(TABLE)
    table = load_table(path)
    runs = plan_runs(table, "cpu", [0, 1], ["a"], ["many"], tmp_path / "out", None)
    nan = float("nan")
    losses = {0: [2.0, 2.3, 9.0, 2.3], 1: [2.0, 1.5, nan, nan]}  # seed 0 at chance with a finite loss
    for run in runs:
        fake_run(run.run_dir.path, run.config, [0.3, 0.5, 0.1, 0.1], [2, 2, 2, 2], {}, losses[run.seed])
    assert [read_run(r.run_dir.path).diverged_at() for r in runs] == [None, 3]
    measured = collect(runs)
    text = markdown(
        table,
        "cpu",
        method_rows(table, measured, ["a"], ["many"]),
        [],
        [],
        "",
        leaderboard_rows(table, measured, ["a"], ["many"]),
    )
    assert text.count("Diverged (the test loss not finite from that round on): a / many: seed 1 at round 3.") == 2
    assert f"{runs[1].run_dir.path} diverged at round 3" in report([str(r.run_dir.path) for r in runs])
    assert str(runs[0].run_dir.path) + " diverged" not in report([str(r.run_dir.path) for r in runs])
    (runs[0].run_dir.path / "metrics.parquet").write_bytes(b"not parquet")  # the report needs only summaries
    assert "whether its model diverged is not known" in report([str(runs[0].run_dir.path)])

    bar = ProgressBar("x")
    bar.on_run_start(RunStart(completed_rounds=0, rounds=4))
    for r, loss in enumerate(losses[1], start=1):
        bar.on_round_end(RoundResult(r, {"loss": loss, "bytes_up": 0.0, "bytes_down": 0.0}, []))
    bar.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "diverged" in line]
    assert len(said) == 1 and said[0].startswith("round 3: the global model's test loss is nan")

    resumed = ProgressBar("x", runs[1].run_dir.path)  # resumed after round 3: said already, 6 MB moved
    resumed.on_run_start(RunStart(completed_rounds=3, rounds=4))
    resumed.on_round_end(RoundResult(4, {"loss": nan, "bytes_up": 2e6, "bytes_down": 0.0}, []))
    assert "moved=8.0MB" in resumed.bar.postfix
    resumed.close()
    assert "diverged" not in capsys.readouterr().err
    earlier = ProgressBar("x", runs[1].run_dir.path)  # resumed after round 2: round 3 runs again, and says it
    earlier.on_run_start(RunStart(completed_rounds=2, rounds=4))
    earlier.on_round_end(RoundResult(3, {"loss": nan, "bytes_up": 2e6, "bytes_down": 0.0}, []))
    earlier.close()
    assert "round 3: the global model's test loss is nan" in capsys.readouterr().err


def test_the_front_keeps_the_methods_no_other_beats_on_bytes_and_accuracy():
    points = [(10, 0.80), (1, 0.60), (5, 0.60), (5, 0.75), (20, 0.79), (1, 0.55)]
    assert pareto_front(points) == [(1, 0.60), (5, 0.75), (10, 0.80)]


def test_the_benchmark_runs_every_method_raysim_ships_on_shared_cells():
    from raysim.registry import builtin_names

    table = load_table("benchmark")
    assert set(builtin_names()) <= set(table.methods)
    assert {m.algorithm["name"] for m in table.methods.values()} == set(builtin_names())
    for cell in table.cells:
        configs = [table.config(cell, m, "cpu", 0, "/nonexistent") for m in table.methods]
        shared = {(c.rounds, str(c.partition), str(c.model), str(c.local), c.clients.num) for c in configs}
        assert len(shared) == 1, shared  # one setting, every method
        assert all(c.eval.count_macs for c in configs)
        oneshot = [c for c in configs if hasattr(c.algorithm, "cache_client_stage")]
        assert len(oneshot) == 7 and not any(c.algorithm.cache_client_stage for c in oneshot)
        # one selection protocol for every one-shot method: a model chosen without the test set
        assert all(c.eval.selection == "federated" for c in oneshot)
        assert all(table.metric_of(m) == "selected_accuracy" for m, c in zip(table.methods, configs) if c in oneshot)


@pytest.mark.slow  # two methods, one seed, three rounds on the embedded data
def test_reproduce_writes_the_leaderboard_and_the_four_pictures_from_the_runs_counts(tmp_path, monkeypatch):
    from raysim.cli import main

    path = tmp_path / "bench.yaml"
    path.write_text(
        # LeNet: uploads of a quarter of a megabyte at a tenth of the quickstart convnet's MACs
        TABLE.replace("{rounds: 4}", "{rounds: 3, eval: {count_macs: true}, model: {name: lenet}}")
        .replace("{name: fedprox}", "{name: fedavg_oneshot, cache_client_stage: false}")
        .replace("title: t", "title: t\nseeds: 1")
    )
    out = tmp_path / "out"
    monkeypatch.chdir(ROOT)
    # in process (no actors to start): the clients' work is counted the same
    assert main(["reproduce", str(path), "--out", str(out), "resources.in_process=true"]) == 0
    assert "Leaderboard, a (ranked by last-5" in (out / "table.md").read_text()
    with open(out / "table.csv") as f:
        board = {r["method"]: r for r in csv.DictReader(f) if r["kind"] == "leaderboard"}
    assert set(board) == {"many", "once"}
    for row in board.values():  # every client's upload counted, and the MACs of their training
        assert float(row["mb"]) > 0.5 and float(row["client_gmacs"]) > 0.1 and float(row["client_s"]) > 0
    assert float(board["once"]["mb"]) < float(board["many"]["mb"])  # one upload against three rounds
    assert 0 < float(board["once"]["best"]) <= 100 and float(board["once"]["server_gmacs"]) > 0
    for name in ("curves.png", "curves_mb.png", "curves_compute.png", "pareto.png"):
        assert (out / name).stat().st_size > 10_000, name


def test_no_two_of_the_benchmarks_methods_look_alike_in_its_pictures():
    """21 methods in one panel: each has its own colour and line style, the same in every picture."""
    table = load_table("benchmark")
    styles = method_styles(table)
    looks = {(tuple(style["color"]), style["linestyle"]) for style in styles.values()}
    assert len(styles) == len(table.methods) == len(looks) > 20


def test_a_pareto_panel_whose_methods_move_the_same_bytes_is_drawn_with_its_labels_in_it():
    """Seven one-shot methods that move the same megabytes to a few bytes (the 5-client cell): the
    axis spans a decade around them and the picture is written."""
    import io

    from raysim.plots import new_figure
    from raysim.reproduce.curves import _labels_apart, _labels_of, _span_a_decade

    fig = new_figure(figsize=(5, 3.6), dpi=100)
    ax = fig.add_subplot(xscale="log")
    points = [(21.32388 + 1e-5 * i, 25.0 + 5 * i) for i in range(7)]
    ax.plot(*zip(*points), "o")
    _span_a_decade(ax, points)
    _labels_apart(ax, points, [f"method {i}" for i in range(7)])
    low, high = ax.get_xlim()
    assert low < 21.3 / 3 and high > 21.3 * 3
    assert all(low < text.xyann[0] < high for text in _labels_of(ax))
    fig.savefig(io.BytesIO(), format="png")


def test_no_label_of_the_pareto_panel_covers_another():
    """Eight methods at FedAvg's bytes within 10 points of each other, and one at twice the bytes
    whose label would fall among theirs (SCAFFOLD beside FedAvg's column): no two labels' boxes
    meet, labels in one column are at least the gap apart (a twentieth of the axis, more on a short
    panel), and each still names its own point; and they still do not meet after the figure's layout
    resizes the panel."""
    from collections import defaultdict

    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from raysim.reproduce.curves import _labels_apart, _labels_meet, _lay_out

    ax = Figure(figsize=(5, 3.6)).add_subplot()
    ax.set_xscale("log")
    points = [(189.5, 72.0 + 0.5 * i) for i in range(8)] + [(9.5, 40.0), (400.0, 73.6)]
    ax.plot(*zip(*points), "o")
    _labels_apart(ax, points, [f"method number {i}" for i in range(10)])
    for text in ax.texts:
        text.get_window_extent()  # places the annotation for the figure's renderer
    boxes = [Text.get_window_extent(text) for text in ax.texts]  # the words, not the lines to the points
    assert len(boxes) == 10 and not [(a, b) for a in range(10) for b in range(a) if boxes[a].overlaps(boxes[b])]
    columns = defaultdict(list)
    for text in ax.texts:
        columns[text.get_position()[0]].append(text.get_position()[1])
    low, high = ax.get_ylim()
    apart = [b - a for ys in columns.values() for a, b in zip(sorted(ys), sorted(ys)[1:])]
    assert max(map(len, columns.values())) >= 8 and min(apart) >= (high - low) * 0.05 - 1e-9
    assert {text.get_text(): text.xy for text in ax.texts}["method number 3"] == points[3]
    short = Figure(figsize=(5, 1.6)).add_subplot(xscale="log")  # a twentieth of it is less than a label
    short.plot(*zip(*points), "o")
    _labels_apart(short, points, [f"method number {i}" for i in range(10)])
    assert not _labels_meet(short)

    # the figure's layout narrows a panel with a tall y label and long labels: placed again after it
    fig = Figure(figsize=(5, 3.6))
    ax = fig.add_subplot(ylabel="y\n" * 6, xscale="log")
    points, labels = [(10.0, 50.0), (22.0, 51.0), (48.4, 50.0)], ["x" * 30] * 3  # wide labels
    ax.plot(*zip(*points), "o")
    _labels_apart(ax, points, labels)
    with warnings.catch_warnings():  # "tight layout not applied": the figure is narrow for its words
        warnings.simplefilter("ignore")
        fig.tight_layout()
        assert _labels_meet(ax)  # the layout alone makes them meet
        _lay_out(fig, {ax: (points, labels)})
    assert len(ax.texts) == 3 and not _labels_meet(ax)
