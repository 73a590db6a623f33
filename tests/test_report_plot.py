"""`raysim report RUN... --plot FILE`: per-round curves, one line per experiment with a band over its
seeds; and the one text-table printer (raysim.text_table) behind report, tune and partition."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysim.cli import main
from raysim.text_table import text_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def two_experiments(run_tiny):
    """2 configs (partition.alpha 0.5 and 0.1) x 2 seeds of tiny in-process runs, 3 rounds each."""
    return [
        str(run_tiny(rounds=3, seed=seed, **{"partition.alpha": alpha})[1]) for alpha in (0.5, 0.1) for seed in (0, 1)
    ]


def test_report_plot_draws_one_line_per_experiment_with_a_band_over_seeds(two_experiments, tmp_path, capsys):
    png = tmp_path / "plots" / "curves.png"
    code = main(["report", *two_experiments, "--plot", str(png)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[-1] == f"plot written to {png}"
    assert "partition.alpha=0.1" in out and "partition.alpha=0.5" in out  # the table came first
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000

    from raysim.report import report_figure

    fig = report_figure(two_experiments)
    panels = [ax for ax in fig.axes if ax.get_ylabel()]
    assert [ax.get_ylabel() for ax in panels] == ["test accuracy", "test loss", "cumulative MB moved (up + down)"]
    for ax in panels:
        assert len(ax.lines) == 2  # one per experiment, not per run
        assert len(ax.collections) == 2  # the min..max bands over the 2 seeds
        for line in ax.lines:
            assert list(line.get_xdata()) == [1, 2, 3]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert sorted(labels) == [
        "fedavg embedded partition.alpha=0.1 (2 seeds)",
        "fedavg embedded partition.alpha=0.5 (2 seeds)",
    ]
    # the accuracy line is the mean of the seeds' accuracies, its band their min..max

    per_seed = [
        [
            r["value"]
            for r in pq.read_table(Path(d) / "metrics.parquet").to_pylist()
            if r["client"] is None and r["metric"] == "accuracy"
        ]
        for d in two_experiments[:2]
    ]
    line = next(ln for ln in panels[0].lines if "alpha=0.5" in ln.get_label())
    np.testing.assert_allclose(line.get_ydata(), np.mean(per_seed, axis=0))
    band = panels[0].collections[[ln.get_label() for ln in panels[0].lines].index(line.get_label())]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(np.min(per_seed)) and ys.max() == pytest.approx(np.max(per_seed))
    # MB moved grows: the cumulative bytes of the summary at the last round
    summary = json.loads((Path(two_experiments[0]) / "summary.json").read_text())
    mb = next(ln for ln in panels[2].lines if "alpha=0.5" in ln.get_label()).get_ydata()
    assert np.all(np.diff(mb) > 0)
    assert mb[-1] == pytest.approx((summary["bytes_up"] + summary["bytes_down"]) / 1e6)  # same for both seeds


def test_report_plot_writes_svg_and_pdf(two_experiments, tmp_path, capsys):
    for name, magic in (("c.svg", b"<?xml"), ("c.pdf", b"%PDF")):
        assert main(["report", *two_experiments[:2], "--plot", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes().startswith(magic)
    capsys.readouterr()


def fake_run(run, seed: int = 0):
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump({"seed": seed, "rounds": 2, "dataset": {"name": "embedded"}, "algorithm": {"name": "fedavg"}})
    )
    (run / "summary.json").write_text(
        json.dumps(
            {
                "final_accuracy": 0.5,
                "best_accuracy": 0.5,
                "rounds": 2,
                "bytes_up": 1e6,
                "bytes_down": 1e6,
                "wall_time_s": 1.0,
            }
        )
    )
    return str(run)


@pytest.mark.parametrize(
    "plot, words",
    [
        ("curves.jpg", "must end in .png, .pdf, .svg"),
        ("curves", "must end in .png, .pdf, .svg"),
        ("curves.png", "has no metrics.parquet"),
    ],
)
def test_report_plot_bad_input_gives_one_line_and_exit_code_2(tmp_path, capsys, plot, words):
    run = fake_run(tmp_path / "run")  # config.yaml and summary.json but no metrics.parquet
    code = main(["report", run, "--plot", str(tmp_path / plot)])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert out == ""  # no table either
    assert not (tmp_path / plot).exists()


def test_report_plot_unreadable_metrics(two_experiments, tmp_path, capsys):
    run = tmp_path / "broken"
    shutil.copytree(two_experiments[0], run)
    (run / "metrics.parquet").write_bytes(b"not parquet")
    assert main(["report", str(run), "--plot", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read" in err[0] and "metrics.parquet" in err[0]


def test_text_table_aligns_numbers_right_and_text_left():
    text = text_table(
        ["name", "n", "acc", "note"],
        [["fedavg", 3, "0.4000 +- 0.0141", "x"], ["fedprox long name", 12, "-", "longer note"]],
        footer=[["total", 15, "0.5", ""]],
    )
    assert text.splitlines() == [
        "name                n               acc  note",
        "-----------------  --  ----------------  -----------",
        "fedavg              3  0.4000 +- 0.0141  x",
        "fedprox long name  12                 -  longer note",
        "-----------------  --  ----------------  -----------",
        "total              15               0.5",
    ]
    # a column with any text is text; "-" and "" say nothing; align overrides
    assert text_table(["a", "b"], [["1", "-"], ["x", ""]]).splitlines()[2:] == ["1  -", "x"]
    assert text_table(["a", "b"], [["1", "2"]], align="lr").splitlines() == ["a  b", "-  -", "1  2"]
    assert text_table(["count"], [["5"]]).splitlines() == ["count", "-----", "    5"]
    with pytest.raises(ValueError):
        text_table(["a", "b"], [["1"]])


def test_the_three_tables_use_the_shared_printer():
    from raysim.partition import format_counts

    counts = np.array([[5, 0], [100, 7]])
    assert format_counts(counts, ["cat", "dog"]).splitlines() == [
        "client  cat  dog  total",
        "------  ---  ---  -----",
        "0         5    0      5",
        "1       100    7    107",
        "------  ---  ---  -----",
        "total   105    7    112",
    ]
    from types import SimpleNamespace

    from raysim.tuning import format_table

    rows = [
        {
            "trial_id": "ab_00000",
            "local.lr": 0.05,
            "best_accuracy": 0.61234,
            "final_accuracy": 0.6,
            "rounds": 3,
            "status": "finished",
        },
        {
            "trial_id": "ab_00001",
            "local.lr": 0.1,
            "best_accuracy": None,
            "final_accuracy": None,
            "rounds": 1,
            "status": "error",
        },
    ]
    lines = format_table(rows, SimpleNamespace(space={"local.lr": None}, metric="best_accuracy")).splitlines()
    assert lines[0].split() == ["trial_id", "local.lr", "best_accuracy", "final_accuracy", "rounds", "status"]
    assert lines[2] == "ab_00000      0.05         0.6123             0.6       3  finished"
    assert lines[3] == "ab_00001       0.1           None            None       1  error"


def test_report_counts_each_seed_once_and_says_when_runs_repeat_one(tmp_path):
    """Issue 45, item 3: the same directory twice, or two runs of one seed, are not two seeds."""
    from raysim.report import report

    for name, seed in (("a", 0), ("copy", 0), ("b", 1)):
        fake_run(tmp_path / name, seed)
    same_twice = report([str(tmp_path / "a"), str(tmp_path / "a")])
    assert re.search(r"fedavg embedded\s+1\s", same_twice) and "note:" not in same_twice
    repeated = report([str(tmp_path / "a"), str(tmp_path / "copy"), str(tmp_path / "b")])
    assert re.search(r"fedavg embedded\s+2\s", repeated)  # seeds 0 and 1
    assert f"note: {tmp_path / 'copy'} repeats seed 0 of {tmp_path / 'a'}: counted once" in repeated


@pytest.mark.parametrize(
    "damage, words",
    [
        (
            lambda run: (run / "summary.json").write_text('{"final_accuracy": 0.5, "best'),
            "summary.json is not valid JSON",
        ),
        (lambda run: (run / "summary.json").write_text("[0.5, 0.6]"), "summary.json holds a list, not the mapping"),
        (
            lambda run: (run / "config.yaml").write_text("seed: !!python/object/apply:os.system ['true']\n"),
            "config.yaml is not a plain YAML config",
        ),
        (lambda run: (run / "config.yaml").write_text("just a string\n"), "config.yaml holds a str"),
        (lambda run: (run / "config.yaml").write_text("seed: 0\n"), "lacks the algorithm and dataset sections"),
    ],
)
def test_report_on_a_damaged_run_is_one_line_naming_the_file(tmp_path, capsys, damage, words):
    """Issue 45 item 10: truncated or non-object summary.json, a config.yaml with a Python tag."""
    run = tmp_path / "run"
    fake_run(run)
    damage(run)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and str(run) in err, err
