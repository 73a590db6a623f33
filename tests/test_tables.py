"""The papers' tables as data (configs/tables/*.yaml, raysim.reproduce): every shipped table parses,
every run it names (cell x method x scale) builds a valid config, and the table logic (seeds,
selections, orderings, refusals) works. No Ray: the end-to-end runs are in test_reproduce.py."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from raysim.config import dump_config
from raysim.errors import RaysimError
from raysim.outputs.run_dir import RunDir
from raysim.reproduce import list_tables, load_table, parse_seeds, selection
from raysim.reproduce.runs import PlannedRun, plan_runs, run_state
from raysim.reproduce.table_file import TABLES_DIR
from raysim.reproduce.table_output import LABEL, as_csv, collect, markdown, method_rows, ordering_rows, rounds_rows

DATA = "/nonexistent/data"  # configs are validated, never loaded
TABLES = sorted(p.stem for p in TABLES_DIR.glob("*.yaml"))
RUNS = [
    (name, cell, scale) for name in TABLES for cell, spec in load_table(name).cells.items() for scale in spec.config
]


@pytest.mark.slow  # builds about 500 configs: about 8 s
def test_every_run_of_every_shipped_table_builds_a_valid_config():
    """Each (table, cell, scale): every method's config validates with the seed and data folder asked
    for, and the methods of a cell share everything but the algorithm (and the resources it needs) and how
    their model is chosen (eval.selection and its keys: the benchmark's one-shot methods')."""
    failures = []
    for name, cell, scale in RUNS:
        table = load_table(name)
        try:
            configs = {m: table.config(cell, m, scale, 1, DATA) for m in table.methods}
        except RaysimError as exc:
            failures.append(f"{name}:{cell}:{scale}: {exc}")
            continue
        for config in configs.values():
            assert config.seed == 1
            if config.dataset.name != "embedded":
                assert config.dataset.root == f"{DATA}/{config.dataset.name}"
        selection = ("selection", "client_holdout", "select_every", "select_clients")
        shared = [
            {
                **{k: v for k, v in c.to_dict().items() if k not in ("algorithm", "resources", "eval")},
                "eval": {k: v for k, v in c.to_dict()["eval"].items() if k not in selection},
            }
            for c in configs.values()
        ]
        if any(s != shared[0] for s in shared):
            failures.append(f"{name}:{cell}:{scale}: its methods differ outside the algorithm")
    assert len(RUNS) > 90 and not failures, "\n".join(failures)


def test_the_tables_name_a_table_of_each_seed_paper():
    names = {t.name for t in list_tables()}
    for paper in ("smoke", "dcfl_", "fedaf_", "dynafed_", "fedhydra_"):
        assert any(n.startswith(paper) for n in names), (paper, names)


def test_paper_figures_are_percentages_and_orderings_name_methods_with_figures():
    for table in list_tables():
        for cell in table.cells.values():
            for mean, std in cell.paper.values():
                assert 0 < mean <= 100 and (std is None or 0 <= std < 50), (table.name, cell.name)
        assert table.report.startswith("experiments/") and (Path(__file__).parents[1] / table.report).is_file()


def test_every_target_the_paper_counts_rounds_to_is_one_the_runs_report():
    counted = [(t, c.name, s) for t in list_tables() for c in t.cells.values() if c.paper_rounds for s in c.config]
    assert counted
    for table, cell, scale in counted:
        wanted = {t for figures in table.cells[cell].paper_rounds.values() for t in figures}
        for method in table.methods:
            config = table.config(cell, method, scale, 0, DATA)
            assert wanted <= {str(float(t)) for t in config.eval.targets}, (table.name, cell, method)


def test_the_dcfl_table_iii_carries_its_rounds():
    cell = load_table("dcfl_table3").cells["svhn_dir0.1"]
    assert cell.paper_rounds["fedprox"] == {"0.66": 11, "0.8": 91} and cell.paper_rounds["fedavg"]["0.8"] is None
    assert cell.paper["dcfl_fednova"] == (86.31, None)


def test_the_dcfl_table_carries_table_ii():
    table = load_table("dcfl_table2")
    assert table.cells["fmnist_ck2"].paper["dcfl"] == (69.14, 2.39)
    assert table.cells["cifar10_dir0.5"].paper["fedavg"] == (49.15, 0.94)
    assert table.cells["svhn_ck2"].paper["dcfl_feddisco"] == (85.44, 1.48)
    assert [c for c, spec in table.cells.items() if "cpu" in spec.config] == [
        "fmnist_dir0.5",
        "fmnist_dir0.1",
        "fmnist_ck2",
        "cifar10_ck2",
    ]
    # a base method runs the DCFL config's setting with its own algorithm section only
    base = table.config("fmnist_ck2", "fedprox", "cpu", 0, DATA)
    assert base.algorithm.name == "fedprox" and base.rounds == 40 and base.local.epochs == 10


@pytest.mark.parametrize(
    "text, default, seeds",
    [(None, 3, [0, 1, 2]), ("2", 3, [0, 1]), ("0,2,5", 3, [0, 2, 5]), ("1-3", 3, [1, 2, 3])],
)
def test_seeds(text, default, seeds):
    assert parse_seeds(text, default) == seeds


@pytest.mark.parametrize("text", ["x", "0", "1,1", "-1", "3-1"])
def test_bad_seeds_are_one_line(text):
    with pytest.raises(RaysimError, match="--seeds"):
        parse_seeds(text, 3)


def test_selections_keep_the_tables_order_and_name_the_choices():
    table = load_table("dcfl_table2")
    assert selection(table, "dcfl,fedavg", table.methods, "method") == ["fedavg", "dcfl"]
    with pytest.raises(RaysimError, match="no method fedsgd: choose from fedavg, dcfl"):
        selection(table, "fedsgd", table.methods, "method")


def write_table(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


GOOD = """
title: t
cells:
  a: {config: {cpu: quickstart}, paper: {one: 50, two: [60, 1]}}
methods:
  one: {algorithm: {name: fedavg}}
  two: {algorithm: {name: fedprox}}
"""


@pytest.mark.parametrize(
    "change, words",
    [
        (("title: t", "titel: t"), "unknown key 'titel'"),
        (("paper: {one: 50", "paper: {three: 50"), "paper figure for unknown method three"),
        (
            ("{cpu: quickstart}", "{gpu: quickstart}"),
            "the keys of key 'cells.a.config' must be one of cpu, paper, got 'gpu'",
        ),
        (
            ("two: {algorithm: {name: fedprox}}", "two: {algorithm: fedprox}"),
            "key 'methods.two.algorithm' must be a mapping",
        ),
        (("title: t", "title: t\norderings: ['one >> two']"), "must read 'method > method'"),
        (("title: t", "title: t\nmetric: accuracy"), "key 'metric' must be one of"),
        (("two: [60, 1]", "two: [60, a]"), "key 'cells.a.paper.two' must be a number"),
        (("title: t", "title: t\nminutes: {cpu: 5}"), "key 'minutes.cpu' must be a mapping"),
        (("paper: {one: 50", "paper_rounds: {one: {80: 3}}, paper: {one: 50"), "paper_rounds must map a method"),
        (("paper: {one: 50", "paper_rounds: {one: {0.8: 0}}, paper: {one: 50"), "paper_rounds must map a method"),
        (("a: {config:", "a: {overrides: {algorithm.mu: 0.1}, config:"), "cell a sets algorithm.mu for every method"),
        (("title: t", "title: t\nextra: {bytes_up: {unit: GB}}"), "key 'extra.bytes_up.unit' must be one of"),
        (("title: t", "title: t\nfigures: [rounds, rounds]"), "figures: each axis at most once"),
    ],
)
def test_a_bad_table_file_is_one_line_naming_what_is_wrong(tmp_path, change, words):
    path = write_table(tmp_path, GOOD.replace(*change))
    with pytest.raises(RaysimError) as info:
        load_table(path)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_cells_own_minutes_replace_the_tables_in_the_estimate(tmp_path):
    """A cell of a larger model takes longer: its own minutes, not the table's, plan its runs; a
    method it has no figure for counts as missing, not as the table's faster figure."""
    from raysim.reproduce.estimate import table_minutes

    text = GOOD.replace("a: {config: {cpu: quickstart}", "a: {config: {paper: quickstart}").replace(
        "methods:",
        "  b: {config: {paper: quickstart}, minutes: {paper: {one: 10}}}\nminutes: {paper: {one: 1, two: 2}}\nmethods:",
    )
    table = load_table(write_table(tmp_path, text))
    assert table_minutes(table, "paper", runs_per_method=1, speed=1.0) == (1 + 2 + 10, 1)


def test_unknown_table_names_the_shipped_ones():
    with pytest.raises(RaysimError, match="give a shipped table .*smoke"):
        load_table("nosuch")


def test_a_cell_without_the_scale_asked_for_is_refused(tmp_path):
    table = load_table("dcfl_table2")
    with pytest.raises(RaysimError, match="cell mnist_ck2 has no cpu-scale config"):
        table.config("mnist_ck2", "dcfl", "cpu", 0, DATA)


def test_a_cell_reading_real_data_without_a_data_root_is_refused_before_anything_runs(tmp_path):
    table = load_table("dcfl_table2")
    with pytest.raises(
        RaysimError, match=r"reads fashion_mnist and there is no .*/fashion_mnist: get it with 'raysim data get"
    ):
        plan_runs(table, "cpu", [0], ["fmnist_ck2"], ["fedavg"], tmp_path, None)  # not in the data home
    with pytest.raises(RaysimError, match="reads fashion_mnist and there is no /nonexistent/data/fashion_mnist"):
        plan_runs(table, "cpu", [0], ["fmnist_ck2"], ["fedavg"], tmp_path, DATA)


def fake_run(run: PlannedRun, accuracy: float, finished: bool = True) -> None:
    run.run_dir.path.mkdir(parents=True)
    run.run_dir.write_config(dump_config(run.config))
    summary = {
        "finished": finished,
        "rounds": run.config.rounds,
        "final_accuracy": accuracy,
        "best_accuracy": accuracy + 0.01,
        "last5_accuracy": accuracy - 0.01,
        "wall_time_s": 60.0,
        "bytes_up": 1e6,
        "bytes_down": 2e6,
    }
    run.run_dir.write_summary(summary)


def test_orderings_count_the_seeds_on_which_they_hold(tmp_path):
    table = load_table(write_table(tmp_path, GOOD))
    runs = plan_runs(table, "cpu", [0, 1, 2], ["a"], ["one", "two"], tmp_path / "out", None)
    accuracy = {("one", 0): 0.50, ("one", 1): 0.60, ("one", 2): 0.70, ("two", 0): 0.55, ("two", 1): 0.65}
    for run in runs:
        if (run.method, run.seed) in accuracy:
            fake_run(run, accuracy[(run.method, run.seed)])
        else:  # seed 2 of `two` did not finish: it counts nowhere
            fake_run(run, 0.99, finished=False)
    measured = collect(runs)
    (ordering,) = ordering_rows(table, measured, ["a"])  # default: the paper's best against the others
    assert ordering == {
        "cell": "a",
        "ordering": "two > one",
        "paper": "60 vs 50",
        "holds_in_paper": True,
        "holds": 2,
        "seeds": 2,
    }
    rows = {r["method"]: r for r in method_rows(table, measured, ["a"], ["one", "two"])}
    assert rows["one"]["seeds"] == 3 and rows["one"]["final_mean"] == pytest.approx(60.0)
    assert rows["one"]["final_std"] == pytest.approx(10.0)  # sample std of 50, 60, 70
    assert rows["two"]["seeds"] == 2 and rows["two"]["wall_min"] == pytest.approx(1.0)
    text = markdown(table, "cpu", list(rows.values()), [ordering])
    assert "| a | one | 50.0 | 59.0 +- 10.0 | 60.0 +- 10.0 | 61.0 +- 10.0 |" in text
    assert "| a | two > one | 60 vs 50 | yes | 2 of 2 seeds |" in text


def test_a_wall_time_without_the_cached_client_stage_is_marked(tmp_path):
    """A one-shot run whose client stage came from the cache did not spend its minutes: the table says so."""
    table = load_table(write_table(tmp_path, GOOD))
    runs = plan_runs(table, "cpu", [0], ["a"], ["one", "two"], tmp_path / "out", None)
    for run in runs:
        fake_run(run, 0.5)
        if run.method == "two":
            run.run_dir.write_summary({**run.run_dir.read_summary(), "client_stage_cached": True})
    rows = method_rows(table, collect(runs), ["a"], ["one", "two"])
    text = markdown(table, "cpu", rows, [])
    assert "| 1 | 1.0 | 3.0 |" in text and "| 1 | 1.0* | 3.0 |" in text  # one, then two
    assert "Minutes marked * leave out a client stage read from the cache" in text


def test_a_cell_without_paper_figures_checks_every_ordering_the_table_names(tmp_path):
    text = GOOD.replace(", paper: {one: 50, two: [60, 1]}", "").replace(
        "title: t", "title: t\norderings: ['one > two']"
    )
    table = load_table(write_table(tmp_path, text))
    runs = plan_runs(table, "cpu", [0, 1], ["a"], ["one", "two"], tmp_path / "out", None)
    for run in runs:
        fake_run(run, {"one": 0.7, "two": 0.6}[run.method])
    (ordering,) = ordering_rows(table, collect(runs), ["a"])
    assert (ordering["ordering"], ordering["holds"], ordering["holds_in_paper"]) == ("one > two", 2, None)
    assert "| a | one > two |  | - | 2 of 2 seeds |" in markdown(table, "cpu", [], [ordering])


def test_a_tables_extra_readings_are_shown_per_cell_and_method(tmp_path):
    text = GOOD.replace(
        "title: t", "title: t\nextra: {teacher: {label: teacher, unit: percent, digits: 1}, bytes_up: {unit: MB}}"
    )
    table = load_table(write_table(tmp_path, text))
    runs = plan_runs(table, "cpu", [0, 1], ["a"], ["one"], tmp_path / "out", None)
    for run, teacher in zip(runs, (0.5, 0.7)):
        fake_run(run, 0.6)
        run.run_dir.write_summary({**run.run_dir.read_summary(), "teacher": teacher})
    rows = method_rows(table, collect(runs), ["a"], ["one"])
    orderings = [{"cell": "a", "ordering": "one > two", "paper": "", "holds_in_paper": None, "holds": 0, "seeds": 0}]
    text = markdown(table, "cpu", rows, orderings)
    assert "| cell | method | teacher (%) | bytes_up |" in text
    assert f"Orderings ({LABEL[table.metric]}, seed by seed)" in text  # the metric's name, not a reading's
    assert "| a | one | 60.0 +- 14.1 | 1.00 +- 0.00 |" in text
    (row,) = csv.DictReader(io.StringIO(as_csv(table, "cpu", rows, [])))
    assert float(row["teacher_mean"]) == pytest.approx(60.0) and float(row["bytes_up_mean"]) == pytest.approx(1.0)


def test_report_and_reproduce_give_the_same_mean_and_std_of_the_same_runs(tmp_path):
    from raysim.report import report

    table = load_table(write_table(tmp_path, GOOD))
    runs = plan_runs(table, "cpu", [0, 1, 2], ["a"], ["one"], tmp_path / "out", None)
    for run, accuracy in zip(runs, (0.512, 0.498, 0.471)):
        fake_run(run, accuracy)
    (row,) = method_rows(table, collect(runs), ["a"], ["one"])
    mean, std = row["final_mean"], row["final_std"]
    line = report([str(run.run_dir.path) for run in runs]).splitlines()[2]
    assert line.split()[2] == "3" and f"{mean / 100:.4f} +- {std / 100:.4f}" in line
    assert std == pytest.approx(2.0841, abs=1e-4)  # the sample std (ddof 1), not the population's 1.70


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("final_accuracy", "x", "final_accuracy 'x', not an accuracy in [0, 1]"),
        ("best_accuracy", 5.0, "best_accuracy 5.0, not an accuracy in [0, 1]"),
        ("rounds", "abc", "rounds 'abc', not a count of rounds"),
        ("rounds", None, "rounds None, not a count of rounds"),
        ("finished", "no", "finished 'no', not true or false"),
        ("rounds_to_accuracy", {"0.5": "x"}, "not a mapping of target accuracies to rounds or null"),
    ],
)
def test_an_edited_summary_is_one_line_in_report_and_reproduce(tmp_path, key, value, words):
    from raysim.report import report

    table = load_table(write_table(tmp_path, GOOD))
    (run,) = plan_runs(table, "cpu", [0], ["a"], ["one"], tmp_path / "out", None)
    fake_run(run, 0.5)
    run.run_dir.summary_file.write_text(json.dumps({**run.run_dir.read_summary(), key: value}))
    for read in (lambda: report([str(run.run_dir.path)]), lambda: collect([run])):
        with pytest.raises(RaysimError) as info:
            read()
        assert words in str(info.value) and "\n" not in str(info.value)


def test_rounds_to_a_target_sit_beside_the_papers(tmp_path):
    text = GOOD.replace("paper: {one: 50", "paper_rounds: {one: {0.5: 4, 0.9: null}}, paper: {one: 50")
    table = load_table(write_table(tmp_path, text))
    runs = plan_runs(table, "cpu", [0, 1, 2], ["a"], ["one"], tmp_path / "out", None)
    reached = [{"0.5": 3, "0.9": None}, {"0.5": 5, "0.9": None}, {"0.5": 4, "0.9": 5}]
    for run, rounds in zip(runs, reached):
        fake_run(run, 0.6)
        run.run_dir.write_summary({**run.run_dir.read_summary(), "rounds_to_accuracy": rounds})
    measured = collect(runs)
    rows = rounds_rows(table, measured, ["a"], ["one"])
    assert [(r["target"], r["paper_rounds"], r["rounds"], r["reached"]) for r in rows] == [
        ("0.5", "4", "4.0 +- 1.0", 3),
        ("0.9", "-", f">{runs[0].config.rounds} (1/3)", 1),
    ]
    text = markdown(table, "cpu", method_rows(table, measured, ["a"], ["one"]), [], rows)
    assert "| a | one | 0.5 | 4 | 4.0 +- 1.0 |" in text
    csv_rows = list(
        csv.DictReader(io.StringIO(as_csv(table, "cpu", method_rows(table, measured, ["a"], ["one"]), [], rows)))
    )
    assert [r["rounds"] for r in csv_rows if r["kind"] == "rounds"] == ["4.0 +- 1.0", f">{runs[0].config.rounds} (1/3)"]


def test_a_run_directory_of_another_config_is_refused_unless_it_only_needs_more_rounds(tmp_path):
    table = load_table(write_table(tmp_path, GOOD))
    (run,) = plan_runs(table, "cpu", [0], ["a"], ["one"], tmp_path / "out", None)
    assert run_state(run) == "new"
    fake_run(run, 0.5)
    assert run_state(run) == "finished"
    stored = yaml.safe_load(run.run_dir.config_file.read_text())
    # settings that change no number (where the data lie, the actors, evaluation's batch size) do not count
    stored["dataset"]["root"], stored["resources"]["actors"], stored["eval"]["batch_size"] = "/elsewhere", 7, 1000
    run.run_dir.config_file.write_text(yaml.safe_dump(stored))
    assert run_state(run) == "finished"
    # a run made before a parameter existed is the same config where today's default is what it ran
    del stored["local"]["momentum"], stored["eval"]["every"]
    run.run_dir.config_file.write_text(yaml.safe_dump(stored))
    assert run_state(run) == "finished"
    # a run of fewer rounds than the table's is extended (resumed), not refused nor counted as finished
    stored["rounds"] = run.config.rounds - 2
    run.run_dir.config_file.write_text(yaml.safe_dump(stored))
    run.run_dir.write_summary({**run.run_dir.read_summary(), "rounds": run.config.rounds - 2})
    assert run_state(run) == "unfinished"
    stored["rounds"], stored["local"]["lr"] = 99, 0.5
    run.run_dir.config_file.write_text(yaml.safe_dump(stored))
    with pytest.raises(
        RaysimError, match=r"another config than the table's \(local.lr: 0.5 there, 0.01 here, rounds: 99"
    ):
        run_state(run)
    stored["local"]["lr"], stored["algorithm"]["removed_key"] = 0.01, 1
    run.run_dir.config_file.write_text(yaml.safe_dump(stored))
    with pytest.raises(RaysimError, match="holds a run of a config this raysim cannot read"):
        run_state(run)
    run.run_dir.summary_file.write_text("{not json")
    with pytest.raises(RaysimError, match="summary.json is not valid JSON"):
        run.run_dir.read_summary()


def test_a_run_of_a_table_cell_by_name(monkeypatch):
    from raysim.data.home import dataset_folder
    from raysim.reproduce.named import load_named_config

    monkeypatch.setenv("RAYSIM_DATA", DATA)
    config = load_named_config("dcfl_table2:fmnist_ck2:dcfl_fedprox", ["seed=2"])
    assert config.algorithm.name == "dcfl" and config.algorithm.base == "fedprox" and config.seed == 2
    assert config.dataset.root is None  # read from the data home, RAYSIM_DATA
    assert dataset_folder(config.dataset.name, config.dataset.root) == Path(DATA) / "fashion_mnist"
    paper = load_named_config("dcfl_table2:fmnist_ck2:fedavg:paper", [])
    assert paper.rounds == 100 and paper.algorithm.name == "fedavg"
    with pytest.raises(RaysimError, match="no cell nosuch"):
        load_named_config("dcfl_table2:nosuch:dcfl", [])
    with pytest.raises(RaysimError, match="takes one cell and one method"):
        load_named_config("dcfl_table2:fmnist_ck2,mnist_ck2:dcfl", [])


def test_summary_of_a_finished_run_is_read_through_the_run_directory(tmp_path):
    run_dir = RunDir(tmp_path)
    run_dir.write_summary({"finished": True})
    assert run_dir.read_summary() == json.loads((tmp_path / "summary.json").read_text())


def test_a_method_with_its_own_config_per_cell_and_overrides_per_scale():
    table = load_table("fedaf_table1")
    feddm_cpu = table.config("cifar10_alpha0.05", "feddm", "cpu", 0, DATA)
    feddm_paper = table.config("cifar10_alpha0.05", "feddm", "paper", 0, DATA)
    assert feddm_cpu.algorithm.ipc == 20 and feddm_paper.algorithm.ipc == 50  # feddm/cifar10_cpu, _alpha0.05
    assert table.config("cifar10_alpha0.05", "fedavg", "cpu", 0, DATA).local.epochs == 2  # the 2-core file's own
    assert table.config("cifar10_alpha0.05", "fedavg", "paper", 0, DATA).local.epochs == 10  # the paper's, set


def test_a_table_given_to_raysim_run_says_how_to_run_it_and_configs_does_not_list_tables():
    from raysim.config.files import list_configs
    from raysim.reproduce.named import load_named_config

    with pytest.raises(RaysimError, match="is a paper's table, not a config: run it with 'raysim reproduce smoke"):
        load_named_config("tables/smoke", [])
    assert not [name for name, _ in list_configs() if name.startswith("tables/")]


@pytest.mark.parametrize(
    "cluster, resources, fit",
    [
        ({"CPU": 8.0}, ["resources.actors=2", "resources.cpus_per_actor=1"], 4),
        ({"CPU": 2.0}, ["resources.actors=2", "resources.cpus_per_actor=1"], 1),
        ({"CPU": 2.0}, ["resources.actors=1", "resources.cpus_per_actor=1"], 2),
        (
            {"CPU": 16.0, "GPU": 1.0},
            ["resources.actors=4", "resources.gpus_per_actor=0.2", "resources.server_gpus=0.2"],
            1,
        ),
        (
            {"CPU": 16.0, "GPU": 2.0},
            ["resources.actors=4", "resources.gpus_per_actor=0.2", "resources.server_gpus=0.2"],
            2,
        ),
        ({"CPU": 64.0}, ["resources.actors=auto"], 1),  # auto takes what is there
        ({"CPU": 64.0}, ["resources.in_process=true"], 1),  # runs in this process
    ],
)
def test_runs_side_by_side_are_as_many_as_the_cluster_holds(tmp_path, monkeypatch, cluster, resources, fit):
    import ray

    from raysim.reproduce.runs import slots

    monkeypatch.setattr(ray, "cluster_resources", lambda: cluster)
    table = load_table(write_table(tmp_path, GOOD))
    runs = plan_runs(table, "cpu", [0, 1], ["a"], ["one", "two"], tmp_path / "out", None, resources)
    assert slots(runs) == fit


def test_a_cell_override_of_a_methods_own_parameter_is_refused_for_the_methods_it_is_not_meant_for(tmp_path):
    """A cell's overrides hold for every method: one that sets a method's own parameter (FedDF's and
    DENSE's distillation learning rate) is refused for the methods that switch to it by name; the same
    key in a method's own overrides is meant, and runs."""
    text = """
title: t
cells:
  a: {config: {cpu: fedhydra/fmnist_alpha0.1_cpu}, overrides: {algorithm.kd_lr: 0.02}}
methods:
  fedhydra: {overrides: {algorithm.name: fedhydra}}
  dense: {overrides: {algorithm.name: dense}}
  dense_meant: {overrides: {algorithm.name: dense, algorithm.kd_lr: 0.03}}
"""
    table = load_table(write_table(tmp_path, text))
    assert table.config("a", "fedhydra", "cpu", 0, DATA).algorithm.kd_lr == 0.02
    assert table.config("a", "dense_meant", "cpu", 0, DATA).algorithm.kd_lr == 0.03
    with pytest.raises(RaysimError, match="algorithm.name=dense .* dense's own parameter.*algorithm.kd_lr=0.02"):
        table.config("a", "dense", "cpu", 0, DATA)


def test_a_papers_ordering_is_set_beside_the_measured_one_pair_by_pair():
    """Every pair the paper's cell and the measurement both rank, in the paper's order, agreeing only
    where the measurement puts the same method above; equal means are a tie, not a disagreement."""
    from raysim.reproduce.paper_orderings import PaperOrdering, comparison_rows, paper_figures

    ordering = PaperOrdering(table="fedaf_table1", cell="cifar10_alpha0.1", beside="x", causes={"feddm > fedaf": "why"})
    paper = paper_figures(ordering, load_table("fedaf_table1").cells["cifar10_alpha0.1"].paper)
    assert paper["fedaf"] == pytest.approx(69.11)
    measured = {"fedaf": 28.4, "feddm": 32.5, "fedavg": 28.1, "fedbn": 28.1, "unmeasured_here": 1.0}
    rows = {r["ordering"]: r for r in comparison_rows(ordering, paper, measured)}
    assert set(rows) == {
        "fedaf > feddm",
        "fedaf > fedbn",
        "fedaf > fedavg",
        "feddm > fedbn",
        "feddm > fedavg",
        "fedbn > fedavg",
    }
    assert rows["fedaf > feddm"]["agrees"] is False and rows["fedaf > feddm"]["cause"] == "why"
    assert rows["feddm > fedavg"]["agrees"] is True
    assert rows["fedbn > fedavg"]["agrees"] is None  # FedBN runs as FedAvg without batch norm


def test_a_paper_ordering_naming_what_does_not_exist_is_one_line(tmp_path):
    raw = yaml.safe_load((TABLES_DIR / "benchmark.yaml").read_text())
    raw["paper_orderings"] = {"x": {"table": "fedaf_table1", "cell": "nowhere", "beside": "fmnist_dir0.1"}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(RaysimError, match="table fedaf_table1 has no cell nowhere"):
        load_table(path)
