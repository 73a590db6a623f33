"""The DCFL configs (configs/dcfl/, paper 002): every file validates on each of the four bases and as
the plain base, each CPU file matches its comparison config in everything but the algorithm, and the
paper-scale files carry the paper's settings (Table II grid, Table III targets). Validation only."""

from __future__ import annotations

from pathlib import Path

import pytest

from raysim.config_loading import load_config

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "configs" / "dcfl"
BASES = ("fedavg", "fedprox", "fednova", "feddisco")
# each CPU DCFL config and the FedAvg-family config it is compared with
COMPARISONS = {
    "fmnist_ck2_cpu.yaml": "fedavg/fmnist_ck2_20c_cpu.yaml",
    "fmnist_dir0.1_cpu.yaml": "fedavg/fmnist_dir0.1_20c_cpu.yaml",
    "fmnist_dir0.5_cpu.yaml": "fedavg/fmnist_dir0.5_20c_cpu.yaml",
    "cifar10_ck2_cpu.yaml": "fedavg/cifar10_ck2_20c_cpu.yaml",
}
TABLE_III = {"dir0.5": [0.86, 0.87], "dir0.1": [0.66, 0.8], "ck2": [0.73, 0.78]}
PAPER = [f"{d}_{p}.yaml" for d in ("mnist", "fmnist", "svhn", "cifar10") for p in ("dir0.5", "dir0.1", "ck2")]


def load(path: Path, *overrides: str):
    return load_config(path, ["dataset.root=/tmp", *overrides])


@pytest.mark.parametrize("name", sorted(p.name for p in FOLDER.glob("*.yaml")))
def test_every_dcfl_config_validates_on_each_base_and_as_the_base_alone(name):
    for base in BASES:
        assert load(FOLDER / name, f"algorithm.base={base}").algorithm["base"] == base
    assert load(FOLDER / name, "algorithm={name: fedprox}").algorithm == {"name": "fedprox", "mu": 0.001}


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_each_cpu_config_matches_its_comparison_in_all_but_the_algorithm(name):
    dcfl, base = load(FOLDER / name).to_dict(), load(ROOT / "configs" / COMPARISONS[name]).to_dict()
    dcfl.pop("algorithm"), base.pop("algorithm")
    assert dcfl == base


def test_the_paper_grid_is_complete_and_carries_the_papers_settings():
    assert sorted(p.name for p in FOLDER.glob("*.yaml") if not p.name.endswith("_cpu.yaml")) == sorted(PAPER)
    for name in PAPER:
        config = load(FOLDER / name)
        assert (config.clients.num, config.clients.per_round, config.algorithm["ipc"]) == (20, 0.25, 10)
        assert config.model.name == ("mlp" if name.startswith(("mnist", "fmnist")) else "lenet")
        setting = name.split("_")[1].removesuffix(".yaml")
        assert config.eval.targets == (TABLE_III[setting] if name.startswith("svhn") else [])
