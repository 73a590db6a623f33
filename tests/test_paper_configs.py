"""The shipped experiment configs: every file validates and says how to run it; the full-scale FedAF/FedDM
ones carry the FedAF paper's numbers (Wang et al., CVPR 2024), the DynaFed ones its Sec. 6.1 setting.

Config validation only: no Ray, no data (dataset.root is overridden with a dummy path).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raysim.config_loading import load_config
from raysim.data.loading import DATASET_NAMES
from raysim.models import MODEL_NAMES
from raysim.partition import PARTITION_KINDS

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("fedaf", "feddm")
ALL = sorted(p for algo in ALGOS for p in (ROOT / "configs" / algo).glob("*.yaml"))

DATASETS = {"fmnist": "fashion_mnist", "cifar10": "cifar10", "cifar100": "cifar100"}
ALPHAS = ("0.02", "0.05", "0.1")
MAIN = [(algo, key, alpha) for algo in ALGOS for key in DATASETS for alpha in ALPHAS]
# FedAF's (lambda_loc, lambda_glob) and image lr per dataset (paper Sec. 5.1 and App. A)
LAMBDAS = {"fashion_mnist": (1e-3, 2.0), "cifar10": (1e-4, 1e-2), "cifar100": (1e-4, 1e-2), "domainnet": (1e-2, 0.1)}
IMAGE_LR = {"fashion_mnist": 0.2, "cifar10": 1.0, "cifar100": 0.1, "domainnet": 1.0}
PAPER_SCALE = dict(
    steps=1000, real_batch=256, server_epochs=500, server_batch=256, server_lr=0.001, server_momentum=0.9
)


def load(path: Path):
    return load_config(path, ["dataset.root=/tmp"])


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def paper_scale_files() -> list[Path]:
    return [p for p in ALL if not p.name.endswith("_cpu.yaml")]


def test_the_expected_files_exist():
    names = {rel(p) for p in ALL}
    expected = {f"configs/{algo}/{key}_alpha{alpha}.yaml" for algo, key, alpha in MAIN}
    expected |= {f"configs/fedaf/cifar10_ipc{n}.yaml" for n in (10, 20, 50, 80, 100)}
    expected |= {f"configs/fedaf/cifar10_gamma{g}.yaml" for g in ("0.2", "0.5", "0.8", "0.9", "1.0")}
    expected |= {f"configs/{algo}/{name}.yaml" for algo in ALGOS for name in ("cifar10_resnet18", "domainnet")}
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_config_validates(path):
    config = load(path)
    assert config.algorithm["name"] == path.parent.name
    assert config.dataset.name in DATASET_NAMES
    assert config.model.name in MODEL_NAMES
    assert config.partition.kind in PARTITION_KINDS
    assert config.clients_per_round() == config.clients.num  # the papers use every client every round


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_header_says_how_to_run_it(path):
    text = path.read_text()
    assert text.startswith("#"), "start with a comment saying what the file reproduces"
    assert f"raysim run {rel(path)}" in text


@pytest.mark.parametrize("path", paper_scale_files(), ids=rel)
def test_paper_scale_settings(path):
    raw = yaml.safe_load(path.read_text())
    assert raw["dataset"]["root"] is None, "ship dataset.root: null (the user sets it)"
    config = load(path)
    alg = config.algorithm
    for key, value in PAPER_SCALE.items():
        assert alg[key] == pytest.approx(value), key
    assert alg["init"] == "average"
    if config.model.name == "convnet":
        assert (config.model.width, config.model.depth, config.model.norm) == (128, 3, "batchnorm")
    res = config.resources
    assert (res.actors, res.cpus_per_actor, res.gpus_per_actor, res.server_gpus) == (4, 1, 0.2, 0.2)
    if alg["name"] == "fedaf":
        assert (alg["lambda_loc"], alg["lambda_glob"]) == pytest.approx(LAMBDAS[config.dataset.name])
        assert alg["image_lr"] == pytest.approx(IMAGE_LR[config.dataset.name])
        assert alg["image_momentum"] == pytest.approx(0.9)
    else:
        assert (alg["rho"], alg["clip_grad"], alg["image_lr"]) == pytest.approx((5.0, 2.0, 1.0))


@pytest.mark.parametrize("algo, key, alpha", MAIN)
def test_main_grid_carries_table_1_numbers(algo, key, alpha):
    config = load(ROOT / "configs" / algo / f"{key}_alpha{alpha}.yaml")
    assert config.dataset.name == DATASETS[key]
    assert (config.partition.kind, config.partition.alpha) == ("dirichlet", pytest.approx(float(alpha)))
    assert (config.clients.num, config.clients_per_round()) == (10, 10)
    assert config.rounds == 20
    assert config.model.name == "convnet"
    assert config.algorithm["ipc"] == 50
    assert config.algorithm["steps"] == 1000
    assert config.algorithm["server_epochs"] == 500
    if algo == "fedaf":
        assert config.algorithm["gamma"] == pytest.approx(0.9)


def test_ipc_study():
    for path in (ROOT / "configs/fedaf").glob("cifar10_ipc*.yaml"):
        config = load(path)
        assert config.algorithm["ipc"] == int(re.search(r"ipc(\d+)", path.name).group(1))
        assert (config.dataset.name, config.partition.alpha, config.rounds) == ("cifar10", 0.1, 20)


def test_gamma_study_follows_table_5():
    paths = sorted((ROOT / "configs/fedaf").glob("cifar10_gamma*.yaml"))
    gammas = sorted(float(re.search(r"gamma([\d.]+)\.yaml", p.name).group(1)) for p in paths)
    assert gammas == [0.2, 0.5, 0.8, 0.9, 1.0]
    for path in paths:
        config = load(path)
        assert config.algorithm["gamma"] == pytest.approx(float(re.search(r"gamma([\d.]+)\.yaml", path.name).group(1)))
        # "ten rounds of FedAF on CIFAR10 with alpha=0.1"
        assert (config.dataset.name, config.partition.alpha, config.rounds) == ("cifar10", 0.1, 10)
        assert config.algorithm["ipc"] == 50


@pytest.mark.parametrize("algo", ALGOS)
def test_resnet18(algo):
    config = load(ROOT / "configs" / algo / "cifar10_resnet18.yaml")
    assert (config.model.name, config.dataset.name, config.rounds, config.clients.num) == (
        "resnet18",
        "cifar10",
        20,
        10,
    )
    assert config.algorithm["ipc"] == 50


@pytest.mark.parametrize("algo", ALGOS)
def test_domainnet(algo):
    config = load(ROOT / "configs" / algo / "domainnet.yaml")
    assert (config.dataset.name, config.dataset.image_size, config.partition.kind) == ("domainnet", 64, "domain")
    assert (config.clients.num, config.clients_per_round(), config.rounds) == (6, 6, 10)
    assert config.algorithm["ipc"] == 20
    assert config.algorithm["image_lr"] == pytest.approx(1.0)


OTHERS = sorted(
    p for folder in ("configs", "configs/dynafed", "configs/fedavg") for p in (ROOT / folder).glob("*.yaml")
)


@pytest.mark.parametrize("name", ["cifar10_cpu", "fmnist_cpu", "cifar100_cpu"])
def test_cpu_comparisons_share_partition_model_and_rounds(name):
    """The issue's comparison: FedAvg, FedDM and FedAF CPU configs share seed, data, partition,
    clients, model and rounds; FedDM and FedAF also share the condensation and server budget."""
    configs = {algo: load(ROOT / "configs" / algo / f"{name}.yaml") for algo in ("fedavg", "feddm", "fedaf")}
    shared = [(c.seed, c.rounds, c.dataset, c.partition, c.clients, c.model) for c in configs.values()]
    assert shared[0] == shared[1] == shared[2]
    budget = ("ipc", "steps", "real_batch", "server_epochs", "server_batch", "server_lr")  # image lr: per paper
    assert {k: configs["feddm"].algorithm[k] for k in budget} == {k: configs["fedaf"].algorithm[k] for k in budget}


@pytest.mark.parametrize("path", OTHERS, ids=rel)
def test_every_other_shipped_config_validates_and_says_how_to_run_it(path):
    config = load(path)
    assert path.parent.name in ("configs", config.algorithm["name"])
    text = path.read_text()
    assert text.startswith("#") and f"raysim run {rel(path)}" in text


@pytest.mark.parametrize(
    "path", [p for p in OTHERS if p.parent.name == "dynafed" and not p.name.endswith("_cpu.yaml")], ids=rel
)
def test_dynafed_paper_scale_settings(path):
    """DynaFed's Sec. 6.1 setting: 80 clients, 40% a round, L = 20, 1 local epoch and 200 rounds (the
    local-epoch study: 100 rounds of 5 epochs, 50 of 10)."""
    config = load(path)
    alg = config.algorithm
    assert (config.clients.num, config.clients.per_round, alg["trajectory_rounds"]) == (80, 0.4, 20)
    assert (config.local.epochs, config.rounds) in {(1, 200), (5, 100), (10, 50)}
    assert (alg["iterations"], alg["inner_steps"]) == (3000, 20)
    # the authors' code: instance-norm ConvNet, one Adam per client kept across rounds, the whole D_syn
    # in every unrolled step, and their scripts' fine-tuning per dataset
    if config.model.name == "convnet":
        assert config.model.norm == "instancenorm"
    assert config.local.optimizer == "adam" and config.local.keep_optimizer and alg["syn_batch"] == 0
    # CIFAR-100's whole-set steps fit an 80 GB card only with one unrolled step's graph held at a time
    assert alg.get("recompute_steps", False) == (config.dataset.name == "cifar100")
    epochs, lr = {"cifar100": (8, 1e-4), "cinic10": (20, 2.5e-4)}.get(
        config.dataset.name, (15 if config.partition.alpha == 0.16 else 20, 1e-4)
    )
    assert (alg["finetune_epochs"], alg["finetune_lr"]) == (epochs, lr)


# The authors' data.py normalises with fixed constants: FMNIST with MNIST's, CIFAR-100 with CIFAR-10's.
DYNAFED_NORMALISATION = {
    "fashion_mnist": ([0.1307], [0.3081]),
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
    "cifar100": ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
    "cinic10": ([0.47889522, 0.47227842, 0.43047404], [0.24205776, 0.23828046, 0.25874835]),
}


@pytest.mark.parametrize("path", sorted((ROOT / "configs/dynafed").glob("*.yaml")), ids=rel)
def test_dynafed_configs_normalise_inputs_with_the_authors_constants(path):
    config = load(path)
    assert (config.dataset.mean, config.dataset.std) == DYNAFED_NORMALISATION[config.dataset.name]


@pytest.mark.parametrize(
    "pair", [("dynafed/cifar10_cpu", "fedavg/cifar10_80c_cpu"), ("dynafed/fmnist_mlp_cpu", "fedavg/fmnist_mlp_80c_cpu")]
)
def test_dynafed_cpu_comparisons_share_clients_partition_model_local_training_and_rounds(pair):
    a, b = (load(ROOT / "configs" / f"{name}.yaml") for name in pair)
    assert (a.seed, a.rounds, a.eval, a.dataset, a.partition, a.clients, a.model, a.local) == (
        b.seed,
        b.rounds,
        b.eval,
        b.dataset,
        b.partition,
        b.clients,
        b.model,
        b.local,
    )
    assert a.local.keep_optimizer and a.model.norm in ("instancenorm", "batchnorm")
