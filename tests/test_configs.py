"""The shipped experiment configs (configs/, a link to raysim/configs/) are valid and carry their papers'
settings: FedAF/FedDM (Wang et al., CVPR 2024), DynaFed (Pi et al., CVPR 2023, Sec. 6.1), DCFL (paper
002: Table II grid, Table III targets) and FedHydra (Bai et al., KDD 2025, Sec. 4.1.5, Tables 1-10).

One test per rule: each loops over the configs the rule covers and names every one that breaks it.
The papers' settings below (of (configs, {dotted key: expected value})) are the oracle, read from the
papers and their authors' code; each setting itself is written once, in its cell or its family's base.
A config is named by its path under configs/ without .yaml ("fedaf/cifar10_alpha0.1").

Config validation only: no Ray, no data (dataset.root is overridden with a dummy path; the models are
built for the dataset's image shape, which needs no data).
"""

from __future__ import annotations

import functools
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import yaml
from pytest import approx

from raysim.algorithm import ModelSpec
from raysim.config import read_yaml
from raysim.data.loading import DATASET_NAMES
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.models import MODEL_NAMES
from raysim.partition import PARTITION_KINDS
from raysim.registry import algorithm_class
from raysim.runner import check_models
from raysim.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
CONFIGS_DIR = ROOT / "configs"
# every experiment config: configs/*.yaml and configs/<folder>/*.yaml (sweeps and tables are not configs)
CONFIGS = sorted(
    p.relative_to(CONFIGS_DIR).with_suffix("").as_posix()
    for p in [*CONFIGS_DIR.glob("*.yaml"), *CONFIGS_DIR.glob("*/*.yaml")]
    if p.parent.name not in ("sweeps", "tables")
)


def path(name: str) -> Path:
    return CONFIGS_DIR / f"{name}.yaml"


def files(*globs: str, cpu: bool | None = None, but: str | None = None) -> list[str]:
    """The configs matching a glob; cpu=False keeps the paper-scale ones, cpu=True the *_cpu ones; `but`
    a glob to leave out."""
    return [
        n
        for n in CONFIGS
        if any(fnmatchcase(n, g) for g in globs)
        and not is_base(n)
        and (cpu is None or n.endswith("_cpu") == cpu)
        and not (but and fnmatchcase(n, but))
    ]


@functools.cache
def load(name: str, overrides: tuple[str, ...] = ()):
    """The validated config (cached: do not mutate it)."""
    return load_config(path(name), ["dataset.root=/tmp", *overrides])


def is_base(name: str) -> bool:
    """A family's base config (base.yaml, base_cpu.yaml), which the cells extend."""
    return name.rpartition("/")[2] in ("base", "base_cpu")


@functools.cache
def shipped(name: str) -> dict:
    """The YAML as shipped with its `extends:` chain merged in, before defaults."""
    return read_yaml(path(name))


def get(source, key: str):
    """The value at a dotted key: 'model.width', 'algorithm.ipc', 'clients_per_round()'."""
    for part in key.split(".") if key else []:
        if part.endswith("()"):
            source = getattr(source, part[:-2])()
        elif isinstance(source, dict):
            source = source[part]
        else:
            source = getattr(source, part)
    return source


# ------------------------------------------------------------------ files that must exist

ALGOS = ("fedaf", "feddm")
DATASETS = {"fmnist": "fashion_mnist", "cifar10": "cifar10", "cifar100": "cifar100"}  # FedAF file prefixes
ALPHAS = ("0.02", "0.05", "0.1")
MAIN = [f"{algo}/{key}_alpha{alpha}" for algo in ALGOS for key in DATASETS for alpha in ALPHAS]  # Table 1
GAMMAS = ("0.2", "0.5", "0.8", "0.9", "1.0")  # Table 5
DCFL_PAPER = [f"dcfl/{d}_{p}" for d in ("mnist", "fmnist", "svhn", "cifar10") for p in ("dir0.5", "dir0.1", "ck2")]
HYDRA_DATASETS = {"mnist": "mnist", "fmnist": "fashion_mnist", "svhn": "svhn", "cifar10": "cifar10"}
HYDRA_ALPHAS = ("0.5", "0.3", "0.1", "0.01")
HYDRA_PAPER = [
    *(f"{d}_alpha{a}" for d in HYDRA_DATASETS for a in HYDRA_ALPHAS),  # Table 1
    *(f"{d}_2cc" for d in HYDRA_DATASETS),  # Table 2
    *(f"{d}_hetero_alpha{a}" for d in ("cifar10", "svhn") for a in HYDRA_ALPHAS),  # Tables 3, 9
    *(f"{d}_hetero_2cc" for d in ("cifar10", "svhn")),  # Table 10
    *(f"{d}_{k}c" for d in ("svhn", "cifar10") for k in (5, 10, 20, 50, 100)),  # Tables 4, 7
    *(f"{d}_rounds_T{t}" for d in ("cifar10", "svhn") for t in range(1, 6)),  # Tables 5, 8
]

# (what, the configs found, "exactly" / "at least" these names, or "some")
FILE_SETS = [
    (
        "fedaf+feddm",
        files("fedaf/*", "feddm/*"),
        "at least",
        {
            *MAIN,
            *(f"fedaf/cifar10_ipc{n}" for n in (10, 20, 50, 80, 100)),
            *(f"fedaf/cifar10_gamma{g}" for g in GAMMAS),
            *(f"{algo}/{n}" for algo in ALGOS for n in ("cifar10_resnet18", "domainnet")),
        },
    ),
    ("fedaf_gamma_study", files("fedaf/cifar10_gamma*"), "exactly", {f"fedaf/cifar10_gamma{g}" for g in GAMMAS}),
    ("dcfl_paper_scale", files("dcfl/*", cpu=False), "exactly", set(DCFL_PAPER)),
    ("fedhydra_paper_scale", files("fedhydra/*", cpu=False), "exactly", {f"fedhydra/{n}" for n in HYDRA_PAPER}),
    ("fedhydra_cpu", files("fedhydra/*", cpu=True), "some", set()),  # CPU-sized ones beside the paper-scale ones
]


def test_the_expected_files_exist():
    for what, found, how, expected in FILE_SETS:
        if how == "exactly":
            assert set(found) == expected, (what, sorted(set(found) ^ expected))
        elif how == "at least":
            assert expected <= set(found), (what, sorted(expected - set(found)))
        else:
            assert found, what


def broken(checks) -> str:
    """The failures of (what, check) pairs, one a line ('' when every check holds): a rule's test
    names every config that breaks it, not only the first."""
    lines = []
    for what, check in checks:
        try:
            check()
        except (AssertionError, RaysimError, KeyError) as exc:
            lines.append(f"{what}: {type(exc).__name__} {exc}".strip())
    return "\n".join(lines)


# ------------------------------------------------------------------ every config

RUN_SUFFIX = {"fedhydra": " ", "benchmark": " "}  # these commands always go on (algorithm.name=<method>)


def test_every_config_validates():
    def check(name):
        config = load(name)
        assert config.dataset.name in DATASET_NAMES
        assert config.model.name in MODEL_NAMES
        assert config.partition.kind in PARTITION_KINDS

    assert not broken((name, lambda name=name: check(name)) for name in CONFIGS)


def test_every_header_says_how_to_run_it():
    def check(name):
        text = path(name).read_text()
        assert text.startswith("#"), "start with a comment saying what the file reproduces"
        folder = name.rpartition("/")[0]
        assert f"raysim run configs/{name}.yaml{RUN_SUFFIX.get(folder, '')}" in text, "no run line"

    assert not broken((name, lambda name=name: check(name)) for name in CONFIGS)


# ------------------------------------------------------------------ settings: (configs, {dotted key: expected})
# Expected values compare with ==, None and booleans with `is`; a function is called with the config
# (a per-dataset value, or another key's); a "yaml:" key reads the file as shipped.


def by_dataset(table: dict, i: int, close: bool = False):
    return lambda config: approx(table[config.dataset.name][i]) if close else table[config.dataset.name][i]


class OneOf:
    def __init__(self, *values):
        self.values = values

    def __eq__(self, other):
        return other in self.values

    def __repr__(self):
        return f"one of {self.values}"


# FedAF's (lambda_loc, lambda_glob, image lr) per dataset (paper Sec. 5.1 and App. A)
FEDAF_BY_DATASET = {
    "fashion_mnist": (1e-3, 2.0, 0.2),
    "cifar10": (1e-4, 1e-2, 1.0),
    "cifar100": (1e-4, 1e-2, 0.1),
    "domainnet": (1e-2, 0.1, 1.0),
}
# DynaFed: the authors' data.py normalises with fixed constants (FMNIST with MNIST's, CIFAR-100 with CIFAR-10's)
CIFAR10_NORM = ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010])
DYNAFED_NORMALISATION = {
    "fashion_mnist": ([0.1307], [0.3081]),
    "cifar10": CIFAR10_NORM,
    "cifar100": CIFAR10_NORM,
    "cinic10": ([0.47889522, 0.47227842, 0.43047404], [0.24205776, 0.23828046, 0.25874835]),
}


def dynafed_finetune(config) -> tuple[int, float]:
    """The authors' scripts' server fine-tuning (epochs, lr) per dataset (FMNIST/CIFAR-10: 15 epochs at 0.16)."""
    fallback = (15 if config.partition.alpha == 0.16 else 20, 1e-4)
    return {"cifar100": (8, 1e-4), "cinic10": (20, 2.5e-4)}.get(config.dataset.name, fallback)


DCFL_BASES = ("fedavg", "fedprox", "fednova", "feddisco")
DCFL_TABLE_III = {"dir0.5": [0.86, 0.87], "dir0.1": [0.66, 0.8], "ck2": [0.73, 0.78]}  # SVHN's eval.targets
HYDRA_MODELS = {"mnist": "cnn2", "fmnist": "cnn2", "svhn": "cnn3", "cifar10": "cnn3"}  # Sec. 4.1.3
HYDRA_HETERO = ["googlenet", "resnet18", "cnn3", "cnn2", "lenet"]  # M1..M5 of Tables 3, 9, 10
# Sec. 4.1.5 and the authors' code (DENSE / Fed-SA): the same for every paper-scale file
HYDRA_ALGORITHM = dict(
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


def hydra_file_name_settings(name: str) -> dict:
    """What a paper-scale FedHydra file's name says: dataset, partition, clients, models, global rounds."""
    stem = name.removeprefix("fedhydra/")
    prefix = stem.split("_")[0]
    t = int(re.search(r"_T(\d)$", stem).group(1)) if "_rounds_T" in stem else 1
    clients = re.search(r"_(\d+)c$", stem)
    settings = {
        "dataset.name": HYDRA_DATASETS[prefix],
        "clients.num": int(clients.group(1)) if clients else 5,
        "local.epochs": 50 if "_rounds_T" in stem else 200,  # Appendix C.2: E = 50 for the global-round study
        "algorithm.global_rounds": t,
        "rounds": 201 * t,  # each global round: one client round + 200 distillation epochs
    }
    if stem.endswith("2cc"):  # 2c/c: 5 clients x 2 disjoint classes
        settings |= {"partition.kind": "classes", "partition.classes_per_client": 2}
    else:
        alpha = re.search(r"alpha([\d.]+)$", stem)
        alpha = float(alpha.group(1)) if alpha else (0.1 if "_rounds_T" in stem else 0.5)  # default 0.5
        settings |= {"partition.kind": "dirichlet", "partition.alpha": approx(alpha), "partition.min_size": 10}
    if "_hetero_" in stem:  # a ResNet18 server
        return settings | {"model.name": "resnet18", "clients.models": HYDRA_HETERO}
    return settings | {"model.name": HYDRA_MODELS[prefix], "clients.models": None}


FEDAF_FEDDM_PAPER = files("fedaf/*", "feddm/*", cpu=False)
DYNAFED_PAPER = files("dynafed/*", cpu=False)
EXPECT: list[tuple[list[str], dict]] = [
    *((files(f"{a}/*"), {"algorithm.name": a}) for a in ("fedaf", "feddm", "dynafed", "fedavg")),
    # FedAF / FedDM: the papers use every client every round; paper scale (Sec. 5.1, App. A)
    (files("fedaf/*", "feddm/*"), {"clients_per_round()": lambda config: config.clients.num}),
    (
        FEDAF_FEDDM_PAPER,
        {
            "yaml:dataset.root": None,  # ship dataset.root: null (the user sets it)
            "algorithm.steps": approx(1000),
            "algorithm.real_batch": approx(256),
            "algorithm.server_epochs": approx(500),
            "algorithm.server_batch": approx(256),
            "algorithm.server_lr": approx(0.001),
            "algorithm.server_momentum": approx(0.9),
            "algorithm.init": "average",
            "resources.actors": 4,
            "resources.cpus_per_actor": 1,
            "resources.gpus_per_actor": 0.2,
            "resources.server_gpus": 0.2,
        },
    ),
    (
        files("fedaf/*", "feddm/*", cpu=False, but="*resnet18"),
        {"model.name": "convnet", "model.width": 128, "model.depth": 3, "model.norm": "batchnorm"},
    ),
    (
        files("fedaf/*", cpu=False),
        {
            "algorithm.lambda_loc": by_dataset(FEDAF_BY_DATASET, 0, close=True),
            "algorithm.lambda_glob": by_dataset(FEDAF_BY_DATASET, 1, close=True),
            "algorithm.image_lr": by_dataset(FEDAF_BY_DATASET, 2, close=True),
            "algorithm.image_momentum": approx(0.9),
        },
    ),
    (
        files("feddm/*", cpu=False),
        {"algorithm.rho": approx(5.0), "algorithm.clip_grad": approx(2.0), "algorithm.image_lr": approx(1.0)},
    ),
    # Table 1's grid; the IPC study; Table 5 ("ten rounds of FedAF on CIFAR10 with alpha=0.1")
    (
        MAIN,
        {
            "partition.kind": "dirichlet",
            "clients.num": 10,
            "clients_per_round()": 10,
            "rounds": 20,
            "model.name": "convnet",
            "algorithm.ipc": 50,
            "algorithm.steps": 1000,
            "algorithm.server_epochs": 500,
        },
    ),
    *(([n], {"dataset.name": DATASETS[n.split("/")[1].split("_")[0]]}) for n in MAIN),
    *(([n], {"partition.alpha": approx(float(n.rpartition("alpha")[2]))}) for n in MAIN),
    ([n for n in MAIN if n.startswith("fedaf/")], {"algorithm.gamma": approx(0.9)}),
    (files("fedaf/cifar10_ipc*", "fedaf/cifar10_gamma*"), {"dataset.name": "cifar10", "partition.alpha": 0.1}),
    (files("fedaf/cifar10_ipc*"), {"rounds": 20}),
    *(([n], {"algorithm.ipc": int(n.rpartition("ipc")[2])}) for n in files("fedaf/cifar10_ipc*")),
    (files("fedaf/cifar10_gamma*"), {"rounds": 10, "algorithm.ipc": 50}),
    *(([n], {"algorithm.gamma": approx(float(n.rpartition("gamma")[2]))}) for n in files("fedaf/cifar10_gamma*")),
    (
        files("fedaf/cifar10_resnet18", "feddm/cifar10_resnet18"),
        {"model.name": "resnet18", "dataset.name": "cifar10", "rounds": 20, "clients.num": 10, "algorithm.ipc": 50},
    ),
    (
        files("fedaf/domainnet", "feddm/domainnet"),
        {
            "dataset.name": "domainnet",
            "dataset.image_size": 64,
            "partition.kind": "domain",
            "clients.num": 6,
            "clients_per_round()": 6,
            "rounds": 10,
            "algorithm.ipc": 20,
            "algorithm.image_lr": approx(1.0),
        },
    ),
    # DynaFed Sec. 6.1: 80 clients, 40% a round, L = 20, 1 local epoch and 200 rounds (the local-epoch
    # study: 100 rounds of 5 epochs, 50 of 10); the authors' code: instance-norm ConvNet, one Adam per
    # client kept across rounds, the whole D_syn in every unrolled step, their scripts' fine-tuning
    (
        DYNAFED_PAPER,
        {
            "clients.num": 80,
            "clients.per_round": 0.4,
            "algorithm.trajectory_rounds": 20,
            "algorithm.iterations": 3000,
            "algorithm.inner_steps": 20,
            "local.optimizer": "adam",
            "local.keep_optimizer": True,
            "algorithm.syn_batch": 0,
            # CIFAR-100's whole-set steps fit an 80 GB card only with one unrolled step's graph held at a time
            "algorithm.recompute_steps": lambda config: config.dataset.name == "cifar100",
            "algorithm.finetune_epochs": lambda config: dynafed_finetune(config)[0],
            "algorithm.finetune_lr": lambda config: dynafed_finetune(config)[1],
        },
    ),
    (files("dynafed/*", cpu=False, but="*_epochs*"), {"local.epochs": 1, "rounds": 200}),
    (files("dynafed/*_epochs5"), {"local.epochs": 5, "rounds": 100}),
    (files("dynafed/*_epochs10"), {"local.epochs": 10, "rounds": 50}),
    (files("dynafed/*", cpu=False, but="*_mlp_*"), {"model.name": "convnet", "model.norm": "instancenorm"}),
    (files("dynafed/*_mlp_*", cpu=False), {"model.name": "mlp"}),
    (
        files("dynafed/*"),
        {"dataset.mean": by_dataset(DYNAFED_NORMALISATION, 0), "dataset.std": by_dataset(DYNAFED_NORMALISATION, 1)},
    ),
    (files("dynafed/*", cpu=True), {"local.keep_optimizer": True, "model.norm": OneOf("instancenorm", "batchnorm")}),
    # DCFL Table II grid: 20 clients, 25% a round, IPC 10, the MLP on (F)MNIST, LeNet else; Table III's targets
    *(
        (
            [n],
            {
                "clients.num": 20,
                "clients.per_round": 0.25,
                "algorithm.ipc": 10,
                "model.name": "mlp" if n.startswith(("dcfl/mnist", "dcfl/fmnist")) else "lenet",
                "eval.targets": DCFL_TABLE_III[n.rpartition("_")[2]] if n.startswith("dcfl/svhn") else [],
            },
        )
        for n in DCFL_PAPER
    ),
    # FedHydra, paper scale: Sec. 4.1.5 and the setting the file name says
    (
        files("fedhydra/*", cpu=False),
        {
            "yaml:dataset.root": None,
            "yaml:algorithm.name": "fedhydra",
            **{f"algorithm.{k}": approx(v) for k, v in HYDRA_ALGORITHM.items()},
            "local.batch_size": 128,
            "local.lr": approx(0.01),
            "local.momentum": approx(0.9),
            "local.optimizer": "sgd",
            "algorithm.cache_client_stage": True,
            "seed": 0,
            "resources.actors": None,  # sized to the cluster
            "resources.in_process": False,
        },
    ),
    *(([n], hydra_file_name_settings(n)) for n in files("fedhydra/*", cpu=False)),
    (files("fedhydra/*", cpu=True), {"resources.gpus_per_actor": 0, "resources.server_gpus": 0}),
]
# DCFL: every file validates on each of the four bases, and as the plain base alone
EXPECT_WITH_OVERRIDES: list[tuple[list[str], tuple[str, ...], dict]] = [
    *((files("dcfl/*"), (f"algorithm.base={b}",), {"algorithm.base": b}) for b in DCFL_BASES),
    (files("dcfl/*"), ("algorithm={name: fedprox}",), {"algorithm.to_dict()": {"name": "fedprox", "mu": 0.001}}),
]


def plain(expected):
    return getattr(expected, "expected", expected)  # the value inside approx()


def check_setting(name: str, overrides: tuple[str, ...], dotted: str, expected) -> None:
    if dotted.startswith("yaml:"):
        config, actual = None, get(shipped(name), dotted.removeprefix("yaml:"))
    else:
        config = load(name, overrides)
        actual = get(config, dotted)
    if callable(expected):
        expected = expected(config)
    if expected is None or isinstance(expected, bool):
        assert actual is expected, f"{dotted} is {actual!r}, expected {expected!r}"
    else:
        assert actual == expected, f"{dotted} is {actual!r}, expected {plain(expected)!r}"


def test_every_config_carries_its_papers_settings():
    """The rule: a config runs the setting its paper (and its file name) gives. Every (config, key)
    of EXPECT and EXPECT_WITH_OVERRIDES is checked on the resolved config; the failures are listed."""
    rows = [(n, (), c) for n, c in EXPECT] + EXPECT_WITH_OVERRIDES
    checks = [
        (f"{'+'.join([name, *overrides])}:{dotted}", lambda a=(name, overrides, dotted, e): check_setting(*a))
        for names, overrides, expected in rows
        for name in names
        for dotted, e in expected.items()
    ]
    assert len(checks) > 1000  # the oracle is not empty
    assert not broken(checks)


# ------------------------------------------------------------------ pairs that agree: (a, b, key or "*" but ...)

SAME: list[tuple[str, str, str, tuple[str, ...]]] = [
    # The FedAvg vs FedDM vs FedAF CPU comparisons share seed, data, partition, clients, model and rounds;
    # FedDM and FedAF also the condensation and server budget (the image lr is per paper)
    *(
        (f"fedavg/{n}", f"{algo}/{n}", k, ())
        for n in ("cifar10_cpu", "fmnist_cpu", "cifar100_cpu")
        for algo in ALGOS
        for k in ("seed", "rounds", "dataset", "partition", "clients", "model")
    ),
    *(
        (f"feddm/{n}", f"fedaf/{n}", f"algorithm.{k}", ())
        for n in ("cifar10_cpu", "fmnist_cpu", "cifar100_cpu")
        for k in ("ipc", "steps", "real_batch", "server_epochs", "server_batch", "server_lr")
    ),
    # DynaFed's CPU configs and their FedAvg comparisons: clients, partition, model, local training, rounds
    *(
        (a, b, k, ())
        for a, b in [
            ("dynafed/cifar10_cpu", "fedavg/cifar10_80c_cpu"),
            ("dynafed/fmnist_mlp_cpu", "fedavg/fmnist_mlp_80c_cpu"),
        ]
        for k in ("seed", "rounds", "eval", "dataset", "partition", "clients", "model", "local")
    ),
    # each CPU DCFL config and its FedAvg comparison: everything but the algorithm
    ("dcfl/fmnist_ck2_cpu", "fedavg/fmnist_ck2_20c_cpu", "*", ("algorithm",)),
    ("dcfl/fmnist_dir0.1_cpu", "fedavg/fmnist_dir0.1_20c_cpu", "*", ("algorithm",)),
    ("dcfl/fmnist_dir0.5_cpu", "fedavg/fmnist_dir0.5_20c_cpu", "*", ("algorithm",)),
    ("dcfl/cifar10_ck2_cpu", "fedavg/cifar10_ck2_20c_cpu", "*", ("algorithm",)),
    # FedHydra: Table 1 and the client study share their five-client setting; the global-round series
    # differs only in T
    *((f"fedhydra/{d}_alpha0.5", f"fedhydra/{d}_5c", "*", ()) for d in ("svhn", "cifar10")),
    *(
        (f"fedhydra/{d}_rounds_T1", f"fedhydra/{d}_rounds_T{t}", "*", ("rounds", "algorithm.global_rounds"))
        for d in ("cifar10", "svhn")
        for t in range(2, 6)
    ),
]


def without(tree: dict, dotted_keys) -> dict:
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        get(tree, ".".join(parents)).pop(last)
    return tree


def test_configs_compared_with_each_other_agree_on_what_they_share():
    def check(a, b, dotted, ignoring):
        if dotted == "*":
            assert without(load(a).to_dict(), ignoring) == without(load(b).to_dict(), ignoring)
        else:
            assert get(load(a), dotted) == get(load(b), dotted)

    assert not broken((f"{a}={b}:{dotted}", lambda row=row: check(*row)) for row in SAME for a, b, dotted, _ in [row])


# ------------------------------------------------------------------ FedHydra rules

HYDRA_METHODS = ("fedavg_oneshot", "ot_fusion", "feddf", "dense", "coboosting", "fedhydra")
DISTILLATION = ("feddf", "dense", "coboosting", "fedhydra")  # the methods that take one model per client
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
TABLE_6 = [(1.0, 1.0), (0.5, 1.0), (0.0, 1.0), (1.0, 0.5), (1.0, 0.0), (0.0, 0.0)]  # its (lambda1, lambda2)


def header_methods(name: str) -> list[str]:
    """The methods the header's '#   methods: ...' line names ([] without one)."""
    found = re.search(r"^#\s*methods:\s*([a-z_ ]+)", path(name).read_text(), re.M)
    return found.group(1).split() if found else []


def heterogeneous(name: str) -> bool:
    return (shipped(name).get("clients") or {}).get("models") is not None


def spec(config) -> ModelSpec:
    channels, size, classes = SHAPES[config.dataset.name]
    return ModelSpec(config, in_channels=channels, num_classes=classes, image_size=size)


def test_fedhydra_headers_name_the_methods_to_run():
    def check(name):
        methods = header_methods(name)
        assert methods, "the header names the methods to run ('#   methods: ...')"
        # FedAvg one-shot and OT fusion combine weights: not with one architecture per client
        assert methods == list(DISTILLATION if heterogeneous(name) else HYDRA_METHODS)

    assert not broken((name, lambda name=name: check(name)) for name in files("fedhydra/*"))


def test_fedhydra_configs_validate_with_every_method_their_headers_name():
    def check(name, method):
        config = load(name, (f"algorithm.name={method}",))
        assert config.algorithm.name == method
        assert config.clients_per_round() == config.clients.num  # one-shot: every client uploads
        assert config.rounds % config.algorithm.global_rounds == 0
        # the method takes one model per client where the file gives them (what check_models checks)
        assert algorithm_class(method).supports_client_models or not spec(config).heterogeneous

    pairs = [(n, m) for n in files("fedhydra/*") for m in header_methods(n)]
    assert not broken((f"{n}:{m}", lambda n=n, m=m: check(n, m)) for n, m in pairs)


def test_every_fedhydra_architecture_builds_for_its_dataset():
    """Each distinct (dataset, set of architectures) of the FedHydra configs is built and checked once."""
    distinct = {}
    for name in files("fedhydra/*"):
        model_spec = spec(load(name))
        key = (
            model_spec.config.dataset.name,
            *sorted({a.describe() for a in [model_spec.config.model, *model_spec.architectures]}),
        )
        distinct.setdefault(key, (name, model_spec))
    assert len(distinct) >= 4
    assert not broken((name, lambda s=s: check_models(s)) for name, s in distinct.values())


def test_fedhydra_heterogeneous_clients_are_m1_to_m5():
    hetero = files("fedhydra/*_hetero_*", cpu=False)
    assert hetero
    for name in hetero:
        assert [a.name for a in spec(load(name)).architectures] == HYDRA_HETERO, name


def test_weight_combining_methods_refuse_heterogeneous_configs():
    hetero = [n for n in files("fedhydra/*") if heterogeneous(n)]
    assert hetero
    for method in ("fedavg_oneshot", "ot_fusion"):
        assert not algorithm_class(method).supports_client_models
        with pytest.raises(RaysimError, match="needs every client to have the server's model"):
            check_models(spec(load(hetero[0], (f"algorithm.name={method}",))))


def test_fedhydra_paper_scale_fits_five_clients_and_the_server_on_one_gpu():
    for name in files("fedhydra/*", cpu=False):
        res = load(name).resources
        assert res.gpus_per_actor > 0 and res.server_gpus > 0, name
        assert 5 * res.gpus_per_actor + res.server_gpus <= 1.0 + 1e-9, name


def test_fedhydra_lambda_sweep_covers_table_6():
    sweep = load_sweep(CONFIGS_DIR / "sweeps/fedhydra_lambdas.yaml")
    assert sweep.base_path.resolve() == path("fedhydra/cifar10_alpha0.5").resolve()
    assert set(sweep.space) == {"algorithm.lambda1", "algorithm.lambda2"}
    grid1, grid2 = (sweep.space[k]["grid"] for k in ("algorithm.lambda1", "algorithm.lambda2"))
    assert {(a, b) for a in grid1 for b in grid2} >= set(TABLE_6)
    assert sweep.grid_size() == len(grid1) * len(grid2) == 9
    assert sweep.scheduler is None  # every pair runs its full 200 distillation epochs
    for l1, l2 in TABLE_6:
        config = sweep.trial_config({"algorithm.lambda1": l1, "algorithm.lambda2": l2})
        alg = config.algorithm
        assert (alg.name, alg.lambda1, alg.lambda2) == ("fedhydra", l1, l2)
        assert (config.dataset.name, config.partition.alpha, config.clients.num) == ("cifar10", 0.5, 5)
        res = config.resources
        assert res.actors * res.gpus_per_actor + res.server_gpus <= 1.0 + 1e-9  # one trial, one GPU
    text = (CONFIGS_DIR / "sweeps/fedhydra_lambdas.yaml").read_text()
    assert "raysim tune configs/sweeps/fedhydra_lambdas.yaml" in text


# ------------------------------------------------------------------ bases: a family's cells extend its base

FAMILIES_WITH_BASES = sorted({n.rpartition("/")[0] for n in CONFIGS if is_base(n)})


def own_keys(name: str) -> dict:
    """The file's own dotted keys and values (its `extends:` chain left out)."""
    tree = yaml.safe_load(path(name).read_text())
    tree.pop("extends", None)
    return {
        f"{top}.{key}" if isinstance(section, dict) else top: value
        for top, section in tree.items()
        for key, value in (section.items() if isinstance(section, dict) else [(None, section)])
    }


def test_every_cell_extends_its_family_base_and_repeats_none_of_it():
    """Every config of a family with a base extends base.yaml (paper scale) or base_cpu.yaml (2-core
    scale, itself over base.yaml where the family has one), and sets no key to the value it would get
    from there anyway: a setting shared by the family lives in one file."""

    def check(name):
        folder, _, stem = name.rpartition("/")
        text = yaml.safe_load(path(name).read_text())
        has_base = (CONFIGS_DIR / folder / "base.yaml").is_file()
        expected = {"base": None, "base_cpu": "base.yaml" if has_base else None}.get(
            stem, "base_cpu.yaml" if stem.endswith("_cpu") else "base.yaml"
        )
        assert text.get("extends") == expected, f"extends {text.get('extends')!r}, expected {expected!r}"
        if expected is None:
            return
        inherited = read_yaml(CONFIGS_DIR / folder / expected)
        repeated = [k for k, v in own_keys(name).items() if _inherited(inherited, k) == (v,)]
        assert not repeated, f"repeats {repeated} from {folder}/{expected}: drop them"

    cells = [n for n in CONFIGS if n.rpartition("/")[0] in FAMILIES_WITH_BASES]
    assert not broken((name, lambda name=name: check(name)) for name in cells)


def _inherited(tree: dict, dotted: str) -> tuple:
    """(value,) at a dotted key of a tree, () where it is not set."""
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return ()
        tree = tree[part]
    return (tree,)


# ------------------------------------------------------------------ a cell cannot change a method's own defaults


def test_a_shared_section_cannot_carry_one_methods_value_of_anothers_own_parameter(tmp_path):
    """A config written for FedHydra and run as FedDF or DENSE (algorithm.name on the command line, a
    table's method) keeps its shared keys, but one that is the new method's own parameter is refused in
    one line naming it and both ways of saying it is meant."""
    planted = tmp_path / "cell.yaml"
    planted.write_text("extends: fedhydra/cifar10_alpha0.1_cpu\nalgorithm: {kd_lr: 0.01, ngf: 8}\n")
    assert load_config(planted, ["algorithm.name=fedhydra"]).algorithm.kd_lr == 0.01  # its own method
    for method in ("feddf", "dense", "coboosting"):
        with pytest.raises(
            RaysimError, match=rf"algorithm.name={method} .* {method}'s own .*algorithm.kd_lr=0.01"
        ) as exc:
            load_config(planted, [f"algorithm.name={method}"])
        assert "\n" not in str(exc.value) and "per_method" in str(exc.value)


def test_a_method_gets_its_own_value_said_per_method_or_beside_the_switch(tmp_path):
    planted = tmp_path / "cell.yaml"
    planted.write_text(
        "extends: fedhydra/cifar10_alpha0.1_cpu\n"
        "algorithm: {kd_lr: 0.01, ngf: 8}\n"
        "per_method: {feddf: {kd_lr: 0.002}}\n"
    )
    root = f"algorithm.distill_root={tmp_path}"
    feddf = load_config(planted, ["algorithm.name=feddf", root])
    assert (feddf.algorithm.kd_lr, feddf.algorithm.ngf) == (0.002, 8)  # its own; the shared key carried
    assert "per_method" not in feddf.to_dict()  # the resolved config holds the effect, not the section
    dense = load_config(planted, ["algorithm.name=dense", "algorithm.kd_lr=0.02"])
    assert dense.algorithm.kd_lr == 0.02
    # a value set on the command line beats the config's per_method value of the method that runs
    assert load_config(planted, ["algorithm.name=feddf", "algorithm.kd_lr=0.03", root]).algorithm.kd_lr == 0.03
    planted.write_text("extends: fedhydra/cifar10_alpha0.1_cpu\nper_method: {feddf: {kd_lr: 0.01, nosuch: 1}}\n")
    with pytest.raises(RaysimError, match="unknown config key 'algorithm.nosuch' for algorithm 'feddf'"):
        load_config(planted)


def test_a_per_method_entry_takes_what_another_configs_own_file_writes_for_the_method(tmp_path):
    """`from:` takes the named file's algorithm keys and its entry for the method, not its base's (a
    family's 2-core scaling, not its paper-scale choices), under the entry's own keys; a method's own
    parameter is not taken from a section written for another method."""
    (tmp_path / "family").mkdir()
    (tmp_path / "family" / "base.yaml").write_text(
        "algorithm: {name: feddm, ipc: 50, image_momentum: 0.7}\nper_method: {feddm: {rho: 3.0}}\n"
    )
    (tmp_path / "family" / "base_cpu.yaml").write_text(
        "extends: base.yaml\nalgorithm: {ipc: 10, steps: 100}\nper_method: {feddm: {real_batch: 32}}\n"
    )
    cell = tmp_path / "cell.yaml"
    cell.write_text(
        "extends: quickstart\nper_method: {feddm: {from: family/base_cpu.yaml, steps: 7}}\n"  # quickstart: any cell
    )
    feddm = load_config(cell, ["algorithm.name=feddm"]).algorithm
    default = algorithm_class("feddm").Params()
    assert (feddm.ipc, feddm.steps, feddm.real_batch) == (10, 7, 32)  # the file's own keys, the entry's over them
    assert (feddm.image_momentum, feddm.rho) == (default.image_momentum, default.rho)  # not its base's
    assert default.image_momentum != 0.7 and default.rho != 3.0
    # the taken keys sit where the naming file's sit: a base's entry for the method does not beat them
    (tmp_path / "mid.yaml").write_text("extends: quickstart\nper_method: {feddm: {ipc: 99, steps: 99}}\n")
    cell.write_text("extends: mid.yaml\nper_method: {feddm: {from: family/base_cpu.yaml}}\n")
    assert load_config(cell, ["algorithm.name=feddm"]).algorithm.ipc == 10
    # a tree (not a file) names a shipped config
    tree = {**read_yaml(cell), "per_method": {"feddm": {"from": "feddm/base_cpu"}}}
    assert load_config(None, ["algorithm.name=feddm"], base=tree).algorithm.steps == 100
    # the shipped one-shot scaling, with Co-Boosting's own batches from that file's entry for it
    cell.write_text("extends: quickstart\nper_method: {coboosting: {from: fedhydra/base_cpu}}\n")
    coboosting = load_config(cell, ["algorithm.name=coboosting"]).algorithm
    assert (coboosting.ngf, coboosting.synthesis_batch, coboosting.kd_batch) == (16, 64, 128)
    (tmp_path / "family" / "hydra.yaml").write_text("algorithm: {name: fedhydra, kd_lr: 0.5}\n")
    cell.write_text("extends: quickstart\nper_method: {dense: {from: family/hydra.yaml}}\n")
    with pytest.raises(RaysimError, match="written for another method, sets dense's own parameter.*kd_lr") as exc:
        load_config(cell, ["algorithm.name=dense"])
    assert "\n" not in str(exc.value)
    cell.write_text("extends: quickstart\nper_method: {dense: {from: family/nosuch.yaml}}\n")
    with pytest.raises(RaysimError, match=r"'per_method.dense.from: family/nosuch.yaml' is neither a file"):
        load_config(cell, ["algorithm.name=dense"])


def test_every_method_of_a_shipped_cell_runs_with_its_own_defaults():
    """Through the tables and the command line, each one-shot method of the 2-core cells gets its
    authors' distillation settings, not those of the method the cell is written for."""
    own = {m: algorithm_class(m).Params() for m in ("feddf", "dense", "coboosting", "fedhydra")}
    for name in files("fedhydra/*"):
        for method in set(header_methods(name)) & set(own):
            config = load(name, (f"algorithm.name={method}",))
            for key in algorithm_class(method).own_params() & {"kd_lr", "kd_optimizer", "temperature", "kd_schedule"}:
                assert getattr(config.algorithm, key) == getattr(own[method], key), (name, method, key)
    assert own["feddf"].kd_lr == 0.001 and own["dense"].kd_lr == 0.005


def test_the_resolved_config_is_frozen_and_its_algorithm_section_is_the_algorithms_params():
    import dataclasses

    config = load_config(path("fedhydra/fmnist_alpha0.1_cpu"), ["dataset.root=/tmp"])
    for section, key in ((config, "rounds"), (config.resources, "actors"), (config.algorithm, "name")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(section, key, 1)
    assert type(config.algorithm.params) is algorithm_class("fedhydra").Params
    assert config.algorithm.kd_lr == config.algorithm.params.kd_lr  # its parameters read as attributes
    assert load_config(None, base=yaml.safe_load(yaml.safe_dump(config.to_dict()))) == config  # dumps and reads back
