"""The experiment's schema: one dataclass per config section, the resolved Config, and the value
checks that need no data (those that do live in the data and partition code).

Every key is declared here (the algorithm's own keys in its `Params` dataclass), so a misspelt or
unknown key is an error before Ray starts, never silently ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import yaml

from raysim.config.parse import build_dataclass
from raysim.errors import RaysimError, need


@dataclass(frozen=True)
class DatasetConfig:
    name: str = "embedded"
    root: str | None = None  # folder in Parquet, torchvision or image-folder layout
    image_size: int | None = None  # resize image folders (DomainNet: 64)
    # Per-channel input normalisation, (x / 255 - mean) / std. null: computed from the training split.
    # Set both to reproduce a paper's fixed constants (DynaFed's code: FMNIST with MNIST's 0.1307/0.3081).
    mean: list[float] | None = None
    std: list[float] | None = None
    # Refuse data that are not what dataset.name promises (channels, size, classes, image counts,
    # pixel mean: raysim.data.known); false for a known dataset altered on purpose.
    verify: bool = True


@dataclass(frozen=True)
class PartitionConfig:
    kind: str = "dirichlet"
    alpha: float = 0.5
    min_size: int = 10
    max_tries: int = 1000
    classes_per_client: int = 2
    seed: int | None = None  # partition seed; None: the run's seed (fix it to vary only training over seeds)


@dataclass(frozen=True)
class ClientsConfig:
    num: int = 10
    # Clients sampled per round: an int count, or a fraction in (0, 1] (0.4 = 40%).
    per_round: float = 1.0
    # Each client's own architecture (heterogeneous-model FL); None: every client has `model:`.
    # A list is assigned round-robin (client k gets entry k mod len), a mapping names every client id.
    # An entry is a model name (or package.module:factory) that takes its sizes from `model:`, or a
    # mapping of `model:` keys, e.g. {name: resnet18, width_multiplier: 0.25}.
    models: Any = None


# the built-in models that take model.width_multiplier (raysim.models builds them)
SCALABLE: tuple[str, ...] = ("cnn3", "lenet", "resnet18", "googlenet")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "convnet"
    width: int = 128
    depth: int = 3
    norm: str = "batchnorm"
    hidden: int = 128
    width_multiplier: float = 1.0  # channel counts of resnet18, googlenet, cnn3, lenet (1.0: as published)

    def describe(self) -> str:
        """A short name of the architecture (actors.yaml, seeds of per-architecture initial weights)."""
        if self.name == "convnet":
            return f"convnet(width={self.width},depth={self.depth},norm={self.norm})"
        if self.name == "mlp":
            return f"mlp(hidden={self.hidden})"
        if self.name in SCALABLE and self.width_multiplier != 1.0:
            return f"{self.name}(x{self.width_multiplier:g})"
        return self.name


@dataclass(frozen=True)
class LocalConfig:
    """Clients' local training (the FedAvg family and algorithms built on it)."""

    epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"  # sgd | adam
    # Each client keeps its optimiser state (momentum buffers, Adam moments) from its previous round
    # instead of starting a fresh optimiser every round. It is client state: checkpointed with it, so
    # it survives actor restarts and --resume. DynaFed's authors' clients do this (one Adam per client).
    keep_optimizer: bool = False


@dataclass(frozen=True)
class ResourcesConfig:
    # Client actors; None ('auto' in YAML) = as many as the cluster's CPUs (and GPUs) hold at
    # cpus_per_actor (gpus_per_actor) each, at most one per client. Results never depend on it.
    actors: int | None = None
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    server_gpus: float = 0.0
    # torch threads of the server actor (evaluation, server-side training). It works while the
    # clients wait, so by default it uses every core of its node; the number never depends on
    # resources.actors, which keeps results equal across actor counts.
    server_threads: int | None = None
    # Local Ray only: CPUs and GPUs to start Ray with (None: all cores / the GPUs Ray detects).
    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_mb: int = 512
    max_restarts: int = 3
    max_task_retries: int = 3
    address: str | None = None  # Ray cluster to attach to (also RAY_ADDRESS)
    deterministic: bool = True  # CUDA: PyTorch's deterministic mode (raysim.engine.devices); CPU: always
    # CUDA convolutions in TF32 (PyTorch's default: faster); false: in float32, closer to the CPU's numbers
    tf32: bool = True
    # float32 | bfloat16: the dtype of the hot loops' forward passes (autocast; raysim.precision says where)
    precision: str = "float32"
    # torch.compile the models of local and server training and of distribution matching (raysim.compiled)
    compile: bool = False
    # Debug mode: the server and every client run serially in the driver process (breakpoints
    # and profilers work; no actor start-up). Payloads and replies still go through the object
    # store, and the numbers are the same as with actors.
    in_process: bool = False
    # Each actor's clients of a round train together as one vectorised model (raysim.vectorized)
    vectorize_clients: bool = False
    # Where a driver runs several runs (raysim reproduce), client and server actors are kept for its
    # next run of the same resources instead of being started again (raysim.engine.actor_pool);
    # false: a run's actors end with it. The numbers are the same either way.
    reuse_actors: bool = True


@dataclass(frozen=True)
class EvalConfig:
    every: int = 1
    # Images per forward pass when evaluating (no gradients; any size gives the same predictions up to
    # float rounding). 128 keeps a conv net's activations within a CPU core's cache, where 1000 spills
    # them (the time per model at each size: experiments/engine/README.md).
    batch_size: int = 128
    # Test accuracies in (0, 1]: summary.json's rounds_to_accuracy gives the first round reaching each.
    targets: list[float] = field(default_factory=list)
    # What the server evaluates on: `test` (the dataset's test split) or `validation`, a share
    # (`validation_fraction` of every class) held out of the training split before partitioning, so
    # that settings can be chosen without looking at the test set. The held-out images depend on the
    # dataset only (not on the run's seed): every seed and setting is tuned on the same images.
    split: str = "test"
    validation_fraction: float = 0.1
    # Count the multiply-accumulates of the clients' and the server's work (raysim/macs.py): `macs`
    # per client and `macs_server` per round in metrics.parquet. Off by default: the counting hook
    # slows every layer call a little; it changes no number.
    count_macs: bool = False
    # Which round's model summary.json calls the run's result (selected_round, selected_accuracy),
    # without the test set or server data: `final`, the last evaluated round; `federated`, the
    # candidate round whose global model scores the highest accuracy on the clients' held-out
    # shares (federated validation: `validation_accuracy` in metrics.parquet).
    selection: Literal["final", "federated"] = "final"
    # federated: the share of each client's data held out of its training for validation (seeded by
    # the partition seed and the client: the same whatever the actors; each client keeps >= 1 example)
    client_holdout: float = 0.1
    # federated: the candidates are every select_every-th evaluated round, and the last round
    select_every: int = 1
    # federated: how many clients validate (a seeded sample, the same each time); 0: every client
    select_clients: int = 0


@dataclass(frozen=True)
class OutputConfig:
    dir: str = "runs"  # parent of run directories when --out is not given
    tensorboard: bool = True
    checkpoint_every: int = 1


# The algorithm a config that names none runs (raysim.registry, raysim.experiment read it too).
DEFAULT_ALGORITHM = "fedavg"


# The settings that change no number of a run (tested: equal across actor counts, in process, kept
# actors, evaluation batches): where it ran, how its work was spread and what it wrote besides. A
# finished run made with other values of these counts as the table's (raysim.reproduce), and
# `raysim report` folds runs differing only in these (and the seed) as one experiment. Every other
# setting makes another experiment, resources.precision, compile, threads and devices included.
NEUTRAL_KEYS = frozenset(
    {
        "dataset.root",  # where the same data lie on this machine (the data themselves: data.json, checked)
        "dataset.verify",
        "eval.count_macs",
        "eval.batch_size",  # images per evaluation pass: any value gives the same predictions up to float rounding
        "resources.actors",
        "resources.in_process",
        "resources.reuse_actors",
        "resources.address",
        "resources.num_cpus",
        "resources.num_gpus",
        "resources.object_store_mb",
        "resources.max_restarts",
        "resources.max_task_retries",
        "output.dir",
        "output.tensorboard",
        "output.checkpoint_every",
    }
)


@dataclass(frozen=True)
class AlgorithmSection:
    """`algorithm:` resolved: the algorithm's name and its Params (a dataclass instance, every value
    typed and checked). Its parameters read as attributes of the section too: `config.algorithm.ipc`."""

    name: str = DEFAULT_ALGORITHM
    params: Any = None

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key == "params":  # not during copying and unpickling
            raise AttributeError(key)
        return getattr(self.params, key)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **(asdict(self.params) if self.params is not None else {})}


@dataclass(frozen=True)
class Config:
    seed: int = 0
    rounds: int = 5
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    clients: ClientsConfig = field(default_factory=ClientsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    # the algorithm's name and its typed Params (filled in by raysim.experiment, through the registry)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def clients_per_round(self) -> int:
        per = self.clients.per_round
        if isinstance(per, float) and per <= 1.0:
            return max(1, round(per * self.clients.num))
        return int(per)

    def to_dict(self) -> dict[str, Any]:
        """The config as the YAML tree it reads back from (the algorithm section flat: name and params)."""
        tree = asdict(self)
        tree["algorithm"] = self.algorithm.to_dict()
        return tree


def client_architectures(config: Config) -> list[ModelConfig]:
    """The architecture of every client (index = client id), from `clients.models` and `model:`."""
    spec, num = config.clients.models, config.clients.num
    if spec is None:
        return [config.model] * num
    if isinstance(spec, dict):
        ids = {}
        for key, entry in spec.items():
            if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < num:
                raise RaysimError(
                    f"clients.models: key {key!r} is not a client id in 0..{num - 1}: "
                    "map client ids to models, or give a list to assign round-robin"
                )
            ids[key] = entry
        missing = [k for k in range(num) if k not in ids]
        if missing:
            raise RaysimError(
                f"clients.models names no model for client(s) {missing[:10]}: name every client "
                "or give a list to assign round-robin"
            )
        entries = [ids[k] for k in range(num)]
    elif isinstance(spec, list) and spec:
        entries = [spec[k % len(spec)] for k in range(num)]
    else:
        raise RaysimError(
            f"clients.models must be a non-empty list of models or a mapping client id -> model, got {spec!r}"
        )
    base = asdict(config.model)
    built: dict[str, ModelConfig] = {}
    out = []
    for k, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or "name" not in entry:
            raise RaysimError(
                f"clients.models: the entry for client {k} ({entry!r}) must be a model name or "
                "a mapping with at least 'name' (e.g. {name: resnet18, width_multiplier: 0.25})"
            )
        key = repr(sorted(entry.items()))
        if key not in built:
            built[key] = build_dataclass(ModelConfig, {**base, **entry}, "clients.models")
        out.append(built[key])
    return out


def validate(config: Config) -> None:
    """Value checks that do not need the data (those that do live in the data/partition code)."""

    need(config.rounds >= 1, f"rounds must be >= 1, got {config.rounds}")
    for name, seed in (("seed", config.seed), ("partition.seed", config.partition.seed)):
        need(
            seed is None or 0 <= seed < 2**32,
            f"{name} must be in [0, 2^32), got {seed}: every random draw is seeded from 32 bits, so a seed "
            "outside that range would silently repeat another",
        )
    # sizes that fail only once a round runs (and a resume cannot change): refused here
    for name, value in (
        ("eval.batch_size", config.eval.batch_size),
        ("partition.max_tries", config.partition.max_tries),
    ):
        need(value >= 1, f"{name} must be >= 1, got {value}")
    need(
        config.resources.object_store_mb >= 75,
        "resources.object_store_mb must be >= 75 (Ray's smallest object store), "
        f"got {config.resources.object_store_mb}",
    )
    need(config.clients.num >= 1, f"clients.num must be >= 1, got {config.clients.num}")
    per = config.clients.per_round
    need(
        per > 0 and (per <= 1 or float(per).is_integer()),
        f"clients.per_round must be a count >= 1 or a fraction in (0, 1], got {per}",
    )
    need(
        config.clients_per_round() <= config.clients.num,
        f"clients.per_round={per} exceeds clients.num={config.clients.num}: lower it or use a fraction like 0.4",
    )
    need(
        config.partition.alpha > 0,
        f"partition.alpha must be > 0, got {config.partition.alpha}: use e.g. 0.1 (skewed) to 100 (near IID)",
    )
    need(
        config.resources.actors is None or config.resources.actors >= 1,
        f"resources.actors must be >= 1 or auto, got {config.resources.actors}",
    )
    need(
        config.resources.cpus_per_actor > 0,
        f"resources.cpus_per_actor must be > 0, got {config.resources.cpus_per_actor}",
    )
    need(config.resources.gpus_per_actor >= 0, "resources.gpus_per_actor must be >= 0")
    need(
        not (config.eval.count_macs and config.resources.compile),
        "eval.count_macs counts layers as they run, which compiled models (resources.compile) do not do "
        "the same way: set one of them to false",
    )
    need(
        config.resources.precision in ("float32", "bfloat16"),
        f"resources.precision must be float32 or bfloat16, got {config.resources.precision!r}",
    )
    if config.resources.vectorize_clients:  # the algorithm's side: its check_config (raysim.vectorized.refusal)
        for refused, why, fix in (
            (config.resources.compile, "calls the models through torch.func, not compiled", "resources.compile=false"),
            (config.resources.precision != "float32", "trains in float32 only", "resources.precision=float32"),
            (config.eval.count_macs, "runs clients in shared layer calls, MACs not split", "eval.count_macs=false"),
            (config.local.optimizer != "sgd", "steps SGD only", "local.optimizer=sgd"),
            (config.local.keep_optimizer, "starts each client's optimiser afresh", "local.keep_optimizer=false"),
        ):
            need(not refused, f"resources.vectorize_clients {why}: set {fix} or resources.vectorize_clients=false")
    need(config.local.epochs >= 0, "local.epochs must be >= 0")
    need(config.local.batch_size >= 1, "local.batch_size must be >= 1")
    need(
        config.local.optimizer in ("sgd", "adam"),
        f"local.optimizer must be sgd or adam, got '{config.local.optimizer}'",
    )
    d = config.dataset
    need(
        (d.mean is None) == (d.std is None),
        "dataset.mean and dataset.std go together: set both (one value per channel) or neither",
    )
    need(
        d.std is None or all(s > 0 for s in d.std),
        f"dataset.std must be > 0 for every channel, got {d.std}",
    )
    need(config.eval.every >= 1, "eval.every must be >= 1")
    bad = [t for t in config.eval.targets if not 0 < t <= 1]
    need(
        not bad,
        f"eval.targets must be test accuracies in (0, 1], got {bad}: write fractions, "
        "e.g. eval.targets=[0.8,0.86] for 80% and 86%",
    )
    need(
        config.eval.split in ("test", "validation"),
        f"eval.split must be test or validation, got '{config.eval.split}'",
    )
    need(
        0 < config.eval.validation_fraction < 1,
        f"eval.validation_fraction must be in (0, 1), got {config.eval.validation_fraction}",
    )
    need(
        0 < config.eval.client_holdout < 1,
        f"eval.client_holdout must be in (0, 1), got {config.eval.client_holdout}: the share of each "
        "client's data held out for federated validation, e.g. 0.1",
    )
    need(config.eval.select_every >= 1, f"eval.select_every must be >= 1, got {config.eval.select_every}")
    need(
        0 <= config.eval.select_clients <= config.clients.num,
        f"eval.select_clients must be in 0..clients.num={config.clients.num} (0: every client validates), "
        f"got {config.eval.select_clients}",
    )
    need(config.output.checkpoint_every >= 1, "output.checkpoint_every must be >= 1")


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
