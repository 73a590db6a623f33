"""What an algorithm is: a client step and a server step, plus the objects they receive.

An algorithm never touches Ray, files or logging: the engine broadcasts what
`broadcast` returns (one `ray.put` per round), runs `client_update` inside the
client's actor, measures the bytes of what it returns, and hands the replies,
sorted by client id, to `server_update`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from raysim.config import Config
from raysim.models import build_model


@dataclass
class ModelSpec:
    """Everything needed to build the experiment's model anywhere (server or actor)."""

    config: Config
    in_channels: int
    num_classes: int
    image_size: int

    def build(self, device: torch.device | str = "cpu") -> torch.nn.Module:
        m = self.config.model
        model = build_model(m.name, in_channels=self.in_channels, num_classes=self.num_classes,
                            image_size=self.image_size, width=m.width, depth=m.depth,
                            norm=m.norm, hidden=m.hidden)
        return model.to(device)


@dataclass
class Context:
    """Where the code runs: the config, the model spec and the device."""

    config: Config
    spec: ModelSpec
    device: torch.device
    mean: np.ndarray | None = None  # per-channel normalisation of the data (to turn images into pixels)
    std: np.ndarray | None = None
    # The test split, on the server only (evaluation and diagnostics such as DynaFed's Figure 6).
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    _scratch: dict[str, torch.nn.Module] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def model(self, slot: str = "main") -> torch.nn.Module:
        """A model instance reused across clients and rounds (weights are overwritten by the caller)."""
        if slot not in self._scratch:
            self._scratch[slot] = self.spec.build(self.device)
        return self._scratch[slot]


@dataclass
class ClientData:
    """One virtual client as its algorithm step sees it."""

    id: int
    round: int
    x: torch.Tensor                 # normalised images (N, C, H, W) on the actor's device
    y: torch.Tensor                 # labels (N,)
    label_counts: np.ndarray        # (num_classes,) int64
    state: dict[str, Any]           # persists between the rounds this client takes part in
    generator: torch.Generator      # seeded by (seed, round, client): the only source of randomness
    metrics: dict[str, float] = field(default_factory=dict)  # logged, not counted as communication

    @property
    def num_samples(self) -> int:
        return int(len(self.y))


@dataclass
class Reply:
    client: int
    num_samples: int
    message: dict[str, Any]


class Algorithm:
    """Base class; the FedAvg family overrides the pieces it changes."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    @dataclass
    class Params:
        pass

    def __init__(self, params: Any, config: Config):
        self.params = params
        self.config = config

    # ------------------------------------------------------------- server side
    def server_init(self, model: torch.nn.Module, ctx: Context) -> dict[str, Any]:
        """The server state; must be picklable (it is checkpointed each round)."""
        raise NotImplementedError

    def broadcast(self, state: dict[str, Any], round_index: int) -> dict[str, Any]:
        """What every sampled client receives this round (numpy arrays: zero-copy in the object store)."""
        raise NotImplementedError

    def server_update(self, state: dict[str, Any], replies: list[Reply], round_index: int,
                      ctx: Context) -> dict[str, Any]:
        raise NotImplementedError

    def global_weights(self, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The weights evaluated on the test split."""
        return state["weights"]

    def images(self, state: dict[str, Any], ctx: Context) -> dict[str, tuple[np.ndarray, int]]:
        """Pictures for TensorBoard this round: tag -> (float [0, 1] images (N, C, H, W), images per row)."""
        return {}

    def summary_extras(self, state: dict[str, Any]) -> dict[str, Any]:
        """Algorithm-specific entries of summary.json (diagnostics)."""
        return {}

    def upload_bytes(self, message: dict[str, Any]) -> int | None:
        """Bytes a client's message costs, when the paper fixes the accounting (None: measure the
        serialised message, which is what crosses the object store)."""
        return None

    # ------------------------------------------------------------- client side
    def client_update(self, payload: dict[str, Any], client: ClientData, ctx: Context) -> dict[str, Any]:
        raise NotImplementedError
