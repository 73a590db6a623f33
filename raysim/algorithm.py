"""What an algorithm is: a client step and a server step, plus the objects they receive.

An algorithm never touches Ray, files or logging. Each round the engine asks it for the
round's participants (`select_clients`; an empty list is a server-only round), puts what
`broadcast` returns into the object store (each shared or addressed part once), runs
`client_update` inside each participant's actor, measures the bytes of what it returns, and
hands the replies, sorted by client id, to `server_update`. What the server wants to show -
scalars, per-client values, figures, images - it records on `ctx.log`; the engine's output
callbacks write them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar

import numpy as np
import torch

from raysim.config import Config, ModelConfig, client_architectures
from raysim.config.parse import Bound
from raysim.data.home import check_extra_dataset
from raysim.errors import RaysimError
from raysim.models import build_model
from raysim.seeding import MODEL_INIT, derive_seed

# Params fields' ranges, checked when a config is read (raysim.config.parse.Bound): a subclass that
# overrides such a field's default repeats the annotation.
PositiveInt = Annotated[int, Bound(ge=1)]
NonNegativeInt = Annotated[int, Bound(ge=0)]
PositiveFloat = Annotated[float, Bound(gt=0)]
NonNegativeFloat = Annotated[float, Bound(ge=0)]

OWN = "own"  # dataclasses.field metadata: a shared parameter whose value is each method's own (own_default)


BEFORE, SINCE = "before", "since"  # dataclasses.field metadata of added_param


def added_param(default: Any, before: Any, since: int) -> Any:
    """A parameter added with a default that changes what earlier versions ran (a reading made to
    follow a paper or its authors' code): `before` is the value that reproduces runs made before it
    existed, `since` the run format (raysim.run_format.RUN_FORMAT) that first wrote it. A stored
    config of an earlier format reads as its run ran (raysim.run_format.config_as_made), not as the
    new default."""
    return field(default=default, metadata={BEFORE: before, SINCE: since})


def own_default(value: Any) -> Any:
    """A parameter that a family's methods share by name but each sets as its authors did (the
    distillation optimiser and learning rate, say): a config that switches methods cannot carry one
    method's value of it into another's run by accident (Algorithm.own_params)."""
    return field(default=value, metadata={OWN: True})


@dataclass
class ModelSpec:
    """Everything needed to build the experiment's models anywhere (server or actor): the server's
    `model:` and, with `clients.models`, each client's own architecture."""

    config: Config
    in_channels: int
    num_classes: int
    image_size: int

    def __post_init__(self):
        self.architectures: list[ModelConfig] = client_architectures(self.config)

    @property
    def heterogeneous(self) -> bool:
        return any(a != self.config.model for a in self.architectures)

    def client_architecture(self, client: int) -> ModelConfig:
        return self.architectures[client]

    def build(self, device: torch.device | str = "cpu", arch: ModelConfig | None = None) -> torch.nn.Module:
        m = arch or self.config.model
        model = build_model(
            m.name,
            in_channels=self.in_channels,
            num_classes=self.num_classes,
            image_size=self.image_size,
            width=m.width,
            depth=m.depth,
            norm=m.norm,
            hidden=m.hidden,
            width_multiplier=m.width_multiplier,
        )
        return model.to(device)

    def initial_model(self, arch: ModelConfig | None = None, device: torch.device | str = "cpu") -> torch.nn.Module:
        """`arch` with its run's initial weights, a function of (seed, architecture) only: every
        client of one architecture starts from the same weights. The server's architecture keeps
        the seed the engine has always used for the global model. The caller's torch random
        stream is left untouched."""
        arch = arch or self.config.model
        seed = self.config.seed
        init = (
            derive_seed(seed, MODEL_INIT)
            if arch == self.config.model
            else derive_seed(seed, MODEL_INIT, arch.describe())
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init)
            return self.build(device, arch)


@dataclass
class ServerLog:
    """What the algorithm's server side records in a round; the engine's callbacks write it
    (metrics.parquet, TensorBoard, summary.json) and then clear it."""

    scalars: dict[str, float] = field(default_factory=dict)
    client_values: list[tuple[int, str, float]] = field(default_factory=list)
    images: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    replayed: dict[int, tuple[int, int]] = field(default_factory=dict)

    def scalar(self, name: str, value: float, summary: bool = False) -> None:
        """A server metric of this round (`summary=True`: its latest value also goes to summary.json)."""
        self.scalars[name] = float(value)
        if summary:
            self.summary[name] = float(value)

    def client_value(self, client: int, name: str, value: float) -> None:
        """A value about one client computed on the server (e.g. its own model's test accuracy)."""
        self.client_values.append((int(client), name, float(value)))

    def replayed_traffic(self, client: int, bytes_up: int, bytes_down: int) -> None:
        """The bytes a client's step moves, for a step the server replays (e.g. from a cache) instead of
        running it: the engine counts them as this round's traffic of that client, as if it had run, so
        that a run's bytes do not depend on whether the step was replayed."""
        self.replayed[int(client)] = (int(bytes_up), int(bytes_down))

    def image_grid(self, tag: str, images: np.ndarray, per_row: int) -> None:
        """Float [0, 1] images (N, C, H, W) shown as one grid in TensorBoard."""
        self.images[tag] = (images, per_row)

    def figure(self, tag: str, figure: Any) -> None:
        """A matplotlib figure for TensorBoard."""
        self.figures[tag] = figure

    def drain(self) -> ServerLog:
        """This round's records, leaving the log empty for the next round (summary values persist)."""
        out = ServerLog(self.scalars, self.client_values, self.images, self.figures, dict(self.summary), self.replayed)
        self.scalars, self.client_values, self.images, self.figures, self.replayed = {}, [], {}, {}, {}
        return out


class _ClientSideLog:
    def __getattr__(self, name: str):
        raise RaysimError("ctx.log records server-side values; on a client, put values in client.metrics")


@dataclass
class Context:
    """Where the code runs: the config, the model spec and the device."""

    config: Config
    spec: ModelSpec
    device: torch.device
    # The architecture `ctx.model()` builds: the server's `model:` on the server, the running
    # client's own on a client (they differ only with clients.models).
    arch: ModelConfig | None = None
    mean: np.ndarray | None = None  # per-channel normalisation of the data (to turn images into pixels)
    std: np.ndarray | None = None
    # The test split, on the server only (evaluation and diagnostics such as DynaFed's Figure 6).
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    log: ServerLog | _ClientSideLog = field(default_factory=_ClientSideLog)
    # On the server of an algorithm with `needs_data_digest`: a hash of every client's training
    # data (the dataset's arrays and the partition), for caches keyed by the data.
    data_digest: str | None = None
    # On the server: each client's label counts (clients x classes), for diagnostics that compare
    # what an algorithm infers with the truth (DCFL's cka_label_spearman). The server of a real
    # deployment does not know them: an algorithm must not decide anything from them.
    label_counts: np.ndarray | None = None
    _scratch: dict[tuple[str, str], torch.nn.Module] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def model(self, slot: str = "main", arch: ModelConfig | None = None) -> torch.nn.Module:
        """A model instance reused across clients and rounds (weights are overwritten by the caller),
        of `arch` (default: `ctx.arch`, the server's or the running client's architecture)."""
        arch = arch or self.arch or self.config.model
        key = (slot, arch.describe())
        if key not in self._scratch:
            self._scratch[key] = self.spec.build(self.device, arch)
        return self._scratch[key]


@dataclass
class ClientData:
    """One virtual client as its algorithm step sees it."""

    id: int
    round: int
    x: torch.Tensor  # normalised images (N, C, H, W) on the actor's device
    y: torch.Tensor  # labels (N,)
    label_counts: np.ndarray  # (num_classes,) int64
    arch: ModelConfig  # this client's architecture (clients.models), ctx.model() builds it
    state: dict[str, Any]  # persists between the rounds this client takes part in
    generator: torch.Generator  # seeded by (seed, round, client): the only source of randomness
    metrics: dict[str, float] = field(default_factory=dict)  # logged, not counted as communication

    @property
    def num_samples(self) -> int:
        return int(len(self.y))


@dataclass
class Broadcast:
    """A round's payload: a part every participant receives, plus parts addressed to some of them.

    Each part goes into the object store once; a client receives the shared part merged with the
    parts addressed to it (keys must not collide), and its `bytes_down` counts exactly those.
    `broadcast` may also return a plain dict: a shared part only.
    """

    shared: dict[str, Any] = field(default_factory=dict)
    addressed: list[tuple[tuple[int, ...], dict[str, Any]]] = field(default_factory=list)

    def to(self, clients: int | Iterable[int], part: dict[str, Any]) -> Broadcast:
        """Address `part` to one client or a group; returns self, so calls chain."""
        group = (int(clients),) if isinstance(clients, (int, np.integer)) else tuple(int(k) for k in clients)
        self.addressed.append((group, part))
        return self


@dataclass
class Reply:
    client: int
    num_samples: int
    message: dict[str, Any]


class Algorithm:
    """Base class; the FedAvg family overrides the pieces it changes."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # True when clients may have architectures of their own (clients.models); an algorithm that
    # averages weights needs one architecture and says so before Ray starts.
    supports_client_models: ClassVar[bool] = False
    # Server-state entries holding one array per model parameter (SCAFFOLD's control variate): a
    # resumed checkpoint's are checked against the model before Ray starts, as its weights are.
    per_parameter_state: ClassVar[tuple[str, ...]] = ()
    # True when the server needs ctx.data_digest (hashing the training data costs ~0.2 s on CIFAR-10).
    needs_data_digest: ClassVar[bool] = False

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params: Any, config: Config):
        self.params = params
        self.config = config

    @classmethod
    def own_params(cls) -> set[str]:
        """The parameters whose values are this method's own: those its Params class declares itself
        (a parameter of its own, or a shared one with its own default) and the shared ones marked with
        own_default; none where it takes its family's Params as they are. A config section written for
        another method may not set them (the keys a family shares by a base class, such as a
        generator's width or a batch, are the cell's to set)."""
        inherited = any(cls.Params is getattr(base, "Params", None) for base in cls.__mro__[1:])
        declared = set() if inherited else set(cls.Params.__dict__.get("__annotations__", {}))
        return declared | {f.name for f in fields(cls.Params) if f.metadata.get(OWN)}

    @classmethod
    def check_config(cls, config: Config, params: Any) -> None:
        """Checks that involve the rest of the config (rounds, clients, model), before Ray starts;
        raise RaysimError naming the problem and the fix."""

    @classmethod
    def check_models(cls, spec: ModelSpec) -> None:
        """Checks of the built models (they know the data's image size and channels), before Ray starts."""

    @classmethod
    def extra_datasets(cls, config: Config) -> list[tuple[str, str, str]]:
        """Datasets a run reads besides its own (a transfer set): (name, folder, the config keys
        that choose them, as "algorithm.x_dataset/x_root"). `raysim data list` and the checks use it."""
        return []

    @classmethod
    def check_inputs(cls, config: Config) -> None:
        """The datasets a run reads besides its own are there, before Ray starts (config checks
        cannot: a config is valid on a machine without the data)."""

        for name, folder, keys in cls.extra_datasets(config):
            check_extra_dataset(name, folder, keys)

    # ------------------------------------------------------------- server side
    def server_init(self, model: torch.nn.Module, ctx: Context) -> dict[str, Any]:
        """The server state; must be picklable (it is checkpointed each round)."""
        raise NotImplementedError

    def select_clients(
        self, state: dict[str, Any], round_index: int, rng: np.random.Generator, ctx: Context
    ) -> list[int]:
        """This round's participants; [] runs a server-only round (server_update gets no replies).

        `rng` is seeded by (seed, round). The default is the uniform sample of clients.per_round.
        """
        num, per_round = self.config.clients.num, self.config.clients_per_round()
        if per_round >= num:
            return list(range(num))
        return sorted(int(k) for k in rng.choice(num, size=per_round, replace=False))

    def broadcast(self, state: dict[str, Any], round_index: int, participants: list[int]) -> dict[str, Any] | Broadcast:
        """What this round's participants receive: a dict every one of them gets, or a Broadcast with
        parts addressed to some (numpy arrays: zero-copy in the object store)."""
        raise NotImplementedError

    def server_update(
        self, state: dict[str, Any], replies: list[Reply], round_index: int, ctx: Context
    ) -> dict[str, Any]:
        raise NotImplementedError

    def global_weights(self, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The weights evaluated on the test split."""
        return state["weights"]

    def summary_extras(self, state: dict[str, Any]) -> dict[str, Any]:
        """Algorithm-specific entries of summary.json (diagnostics)."""
        return {}

    def own_model(self, state: dict[str, Any], round_index: int) -> bool:
        """Whether the model evaluated after `round_index` is this method's own result, so that it
        counts for summary.json's best_accuracy (final and last-5 take every evaluation). A method
        whose server holds a model it did not make yet (a one-shot distiller before its first
        epoch) says no for those rounds."""
        return True

    def upload_bytes(self, message: dict[str, Any]) -> int | None:
        """Bytes a client's message costs, when the paper fixes the accounting (None: measure the
        serialised message, which is what crosses the object store)."""
        return None

    # ------------------------------------------------------------- client side
    def client_update(self, payload: dict[str, Any], client: ClientData, ctx: Context) -> dict[str, Any]:
        raise NotImplementedError
