"""The FedHydra configs (configs/fedhydra/, Bai et al., KDD 2025) and its lambda sweep: every file validates
with every method its header names, says how to run it, and the paper-scale ones carry the paper's
numbers (Sec. 4.1.5, Tables 1-10) and the setting their name says.

Config validation only: no Ray, no data (dataset.root is overridden with a dummy path; the models are
built for the dataset's image shape, which needs no data).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raysim.algorithm import ModelSpec
from raysim.config_loading import load_config
from raysim.errors import RaysimError
from raysim.registry import algorithm_class
from raysim.runner import check_models
from raysim.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
FOLDER = (ROOT / "configs" / "fedhydra").resolve()
ALL = sorted(FOLDER.glob("*.yaml"))
CPU = [p for p in ALL if p.name.endswith("_cpu.yaml")]
PAPER = [p for p in ALL if not p.name.endswith("_cpu.yaml")]

METHODS = ("fedavg_oneshot", "ot_fusion", "feddf", "dense", "coboosting", "fedhydra")
DISTILLATION = ("feddf", "dense", "coboosting", "fedhydra")  # the methods that take one model per client
DATASETS = {"mnist": "mnist", "fmnist": "fashion_mnist", "svhn": "svhn", "cifar10": "cifar10"}
MODELS = {"mnist": "cnn2", "fmnist": "cnn2", "svhn": "cnn3", "cifar10": "cnn3"}  # Sec. 4.1.3
# (channels, image size, classes) of the datasets, to build the models without the data
SHAPES = {
    "embedded": (1, 28, 10),
    "mnist": (1, 28, 10),
    "fashion_mnist": (1, 28, 10),
    "svhn": (3, 32, 10),
    "cifar10": (3, 32, 10),
    "cifar100": (3, 32, 100),
    "cinic10": (3, 32, 10),
}
ALPHAS = ("0.5", "0.3", "0.1", "0.01")
CLIENTS = (5, 10, 20, 50, 100)
HETERO = ["googlenet", "resnet18", "cnn3", "cnn2", "lenet"]  # M1..M5 of Tables 3, 9, 10
# Sec. 4.1.5 and the authors' code (DENSE / Fed-SA): the same for every paper-scale file
PAPER_ALGORITHM = dict(
    nz=256,
    ngf=64,
    generator_steps=30,
    generator_lr=0.001,
    synthesis_batch=256,
    stratify_steps=20,
    stratify_batch=256,
    kd_batch=256,
    kd_lr=0.01,
    lambda1=1.0,
    lambda2=1.0,
)
# Table 6's (lambda1, lambda2) pairs
TABLE_6 = [(1.0, 1.0), (0.5, 1.0), (0.0, 1.0), (1.0, 0.5), (1.0, 0.0), (0.0, 0.0)]


def load(path: Path, *overrides: str):
    return load_config(path, ["dataset.root=/tmp", *overrides])


def rel(path: Path) -> str:
    """The path a user types in the checkout: configs/ (a link to the shipped raysim/configs/)."""
    return "configs/" + path.relative_to(FOLDER.parent).as_posix()


def header_methods(path: Path) -> list[str]:
    """The methods the header's '#   methods: ...' line names ([] without one)."""
    found = re.search(r"^#\s*methods:\s*([a-z_ ]+)", path.read_text(), re.M)
    return found.group(1).split() if found else []


def heterogeneous(path: Path) -> bool:
    return (yaml.safe_load(path.read_text()).get("clients") or {}).get("models") is not None


def spec(config) -> ModelSpec:
    channels, size, classes = SHAPES[config.dataset.name]
    return ModelSpec(config, in_channels=channels, num_classes=classes, image_size=size)


def expected_paper_files() -> set[str]:
    names = {f"{d}_alpha{a}.yaml" for d in DATASETS for a in ALPHAS}  # Table 1
    names |= {f"{d}_2cc.yaml" for d in DATASETS}  # Table 2
    names |= {f"{d}_hetero_alpha{a}.yaml" for d in ("cifar10", "svhn") for a in ALPHAS}  # Tables 3, 9
    names |= {f"{d}_hetero_2cc.yaml" for d in ("cifar10", "svhn")}  # Table 10
    names |= {f"{d}_{k}c.yaml" for d in ("svhn", "cifar10") for k in CLIENTS}  # Tables 4, 7
    names |= {f"{d}_rounds_T{t}.yaml" for d in ("cifar10", "svhn") for t in range(1, 6)}  # Tables 5, 8
    return names


def test_the_expected_files_exist():
    assert {p.name for p in PAPER} == expected_paper_files()
    assert CPU, "the CPU-sized configs live beside the paper-scale ones"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_header_says_how_to_run_it_and_with_which_methods(path):
    text = path.read_text()
    assert text.startswith("#"), "start with a comment saying what the file reproduces"
    assert f"raysim run {rel(path)} " in text
    methods = header_methods(path)
    assert methods, "the header names the methods to run ('#   methods: ...')"
    # FedAvg one-shot and OT fusion combine weights: not with one architecture per client
    assert methods == list(DISTILLATION if heterogeneous(path) else METHODS)


@pytest.mark.parametrize(
    "path, method", [(p, m) for p in ALL for m in header_methods(p)], ids=lambda v: rel(v) if isinstance(v, Path) else v
)
def test_config_validates_with_every_method_its_header_names(path, method):
    config = load(path, f"algorithm.name={method}")
    assert config.algorithm["name"] == method
    assert config.clients_per_round() == config.clients.num  # one-shot: every client uploads
    assert config.rounds % config.algorithm["global_rounds"] == 0
    # the method takes one model per client where the file gives them (what check_models checks)
    assert algorithm_class(method).supports_client_models or not spec(config).heterogeneous


_BUILT: set[tuple] = set()


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_every_architecture_builds_for_the_dataset(path):
    config = load(path)
    model_spec = spec(config)
    key = (config.dataset.name, *sorted({a.describe() for a in [config.model, *model_spec.architectures]}))
    if key not in _BUILT:  # building GoogLeNet and ResNet18 takes a second: once per set of models
        check_models(model_spec)
        _BUILT.add(key)


def test_weight_combining_methods_refuse_heterogeneous_configs():
    hetero = [p for p in ALL if heterogeneous(p)]
    assert hetero
    for method in ("fedavg_oneshot", "ot_fusion"):
        assert not algorithm_class(method).supports_client_models
        with pytest.raises(RaysimError, match="needs every client to have the server's model"):
            check_models(spec(load(hetero[0], f"algorithm.name={method}")))


@pytest.mark.parametrize("path", PAPER, ids=rel)
def test_paper_scale_settings(path):
    raw = yaml.safe_load(path.read_text())
    assert raw["dataset"]["root"] is None, "ship dataset.root: null (the user sets it)"
    assert raw["algorithm"]["name"] == "fedhydra"
    config = load(path)
    alg = config.algorithm
    for key, value in PAPER_ALGORITHM.items():
        assert alg[key] == pytest.approx(value), key
    local = config.local
    rounds_study = "_rounds_T" in path.name
    assert local.epochs == (50 if rounds_study else 200)  # Appendix C.2: E = 50 for the global-round study
    assert (local.batch_size, local.lr, local.momentum, local.optimizer) == (
        128,
        pytest.approx(0.01),
        pytest.approx(0.9),
        "sgd",
    )
    # each global round: one client round + 200 distillation epochs
    assert config.rounds == alg["global_rounds"] * 201
    assert alg["global_rounds"] == (int(re.search(r"_T(\d)", path.name).group(1)) if rounds_study else 1)
    assert alg["cache_client_stage"] is True
    assert config.seed == 0
    # GPU resources: actors sized to the cluster; five client actors and the server fit one GPU
    res = config.resources
    assert res.actors is None and res.gpus_per_actor > 0 and res.server_gpus > 0
    assert 5 * res.gpus_per_actor + res.server_gpus <= 1.0 + 1e-9
    assert not res.in_process


@pytest.mark.parametrize("path", PAPER, ids=rel)
def test_data_model_partition_and_clients_follow_the_file_name(path):
    config = load(path)
    name = path.stem
    key = name.split("_")[0]
    assert config.dataset.name == DATASETS[key]
    part = config.partition
    if name.endswith("2cc"):
        assert (part.kind, part.classes_per_client) == ("classes", 2)  # 2c/c: 5 clients x 2 disjoint classes
    else:
        alpha = re.search(r"alpha([\d.]+)$", name)
        alpha = float(alpha.group(1)) if alpha else (0.1 if "_rounds_T" in name else 0.5)  # default 0.5
        assert (part.kind, part.alpha, part.min_size) == ("dirichlet", pytest.approx(alpha), 10)
    clients = re.search(r"_(\d+)c$", name)
    assert config.clients.num == (int(clients.group(1)) if clients else 5)
    if "_hetero_" in name:
        assert config.model.name == "resnet18"  # the server
        assert config.clients.models == HETERO
        assert [a.name for a in spec(config).architectures] == HETERO
    else:
        assert config.model.name == MODELS[key]
        assert config.clients.models is None


def test_table_1_and_the_client_study_share_their_five_client_setting():
    for key in ("svhn", "cifar10"):
        assert load(FOLDER / f"{key}_alpha0.5.yaml") == load(FOLDER / f"{key}_5c.yaml")


def test_the_global_round_series_differs_only_in_t():
    for key in ("cifar10", "svhn"):
        configs = [load(FOLDER / f"{key}_rounds_T{t}.yaml") for t in range(1, 6)]
        for t, config in enumerate(configs, start=1):
            assert (config.rounds, config.algorithm["global_rounds"]) == (201 * t, t)
            config.rounds, config.algorithm["global_rounds"] = 201, 1
        assert all(c == configs[0] for c in configs)


@pytest.mark.parametrize("path", CPU, ids=rel)
def test_cpu_configs_run_on_cpus(path):
    config = load(path)
    assert config.resources.gpus_per_actor == 0 and config.resources.server_gpus == 0


def test_lambda_sweep_covers_table_6():
    sweep = load_sweep(ROOT / "configs/sweeps/fedhydra_lambdas.yaml")
    assert sweep.base.resolve() == FOLDER / "cifar10_alpha0.5.yaml"
    assert set(sweep.space) == {"algorithm.lambda1", "algorithm.lambda2"}
    grid1, grid2 = (sweep.space[k]["grid"] for k in ("algorithm.lambda1", "algorithm.lambda2"))
    assert {(a, b) for a in grid1 for b in grid2} >= set(TABLE_6)
    assert sweep.grid_size() == len(grid1) * len(grid2) == 9
    assert sweep.scheduler is None  # every pair runs its full 200 distillation epochs
    for l1, l2 in TABLE_6:
        config = sweep.trial_config({"algorithm.lambda1": l1, "algorithm.lambda2": l2})
        assert (config.algorithm["name"], config.algorithm["lambda1"], config.algorithm["lambda2"]) == (
            "fedhydra",
            l1,
            l2,
        )
        assert (config.dataset.name, config.partition.alpha, config.clients.num) == ("cifar10", 0.5, 5)
        res = config.resources
        assert res.actors * res.gpus_per_actor + res.server_gpus <= 1.0 + 1e-9  # one trial, one GPU
    text = (ROOT / "configs/sweeps/fedhydra_lambdas.yaml").read_text()
    assert "raysim tune configs/sweeps/fedhydra_lambdas.yaml" in text
