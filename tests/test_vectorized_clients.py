"""resources.vectorize_clients: an actor's clients of a round trained together as one vectorised model
(raysim.vectorized) end where the sequential loop ends them, and the key is refused in one line
where it cannot run."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raysim.algorithm import ClientData, Context, ModelSpec
from raysim.algorithms.fedavg import FedAvg
from raysim.config import LocalConfig
from raysim.errors import RaysimError
from raysim.experiment import load_config
from raysim.outputs.state_files import load_state
from raysim.registry import make_algorithm
from raysim.runner import run_experiment
from raysim.training import local_train
from raysim.vectorized import BatchLoss, ClientRun, train_together
from tests.conftest import tiny_overrides

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
# One round of the MLP (its float32 gradients agree to the last bits however the clients are
# batched) on Dirichlet-0.5 clients of unequal sizes. A second round is not compared end to end:
# MOON's contrastive term can grow a rounding difference of its inputs a thousandfold (measured on
# the sequential path alone: inputs moved by 3e-8 moved a client's weights by 8e-4), so the rounds
# that read kept state are compared from the same inputs, in float64, below.
TINY = {"resources.in_process": True, "model.name": "mlp", "model.hidden": 32, "rounds": 1}
METHODS = ("fedavg", "fedprox", "scaffold", "fednova", "feddyn", "moon", "fedbn", "feddisco")
MLP = {"model.name": "mlp", "model.hidden": 16}
BATCHNORM_MLP = {"model.name": "tests.test_vectorized_clients:batchnorm_mlp"}
# Convolutions without batch norm: with it the two paths' float32 weights part by 8e-4 in a tiny round
# (measured on the CPU; each path's gradients are as far from float64's), so batch norm is compared in
# float64 below.
CONVNET = {"model.name": "convnet", "model.width": 8, "model.depth": 2, "model.norm": "none"}


class BatchNormMLP(torch.nn.Module):
    """An MLP with a batch-norm layer: batch statistics and running statistics, at the cost of an MLP."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        features = in_channels * image_size * image_size
        self.features = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(features, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU()
        )
        self.classifier = torch.nn.Linear(16, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


def batchnorm_mlp(in_channels: int, num_classes: int, image_size: int) -> BatchNormMLP:
    return BatchNormMLP(in_channels, num_classes, image_size)


def run(tmp_path: Path, **overrides) -> Path:
    run_dir = tmp_path / "-".join(f"{v}" for v in overrides.values())
    run_experiment(load_config(QUICKSTART, tiny_overrides(**{**TINY, **overrides})), run_dir)
    return run_dir


def rows(run_dir: Path, metric: str, clients: bool = False) -> list[tuple]:
    table = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return [
        (r["round"], r["client"], r["value"])
        for r in table
        if (r["client"] is not None) == clients and r["metric"] == metric
    ]


def checkpoint_state(run_dir: Path) -> dict:
    return load_state(run_dir / "checkpoints/last.pt", "")["state"]


def assert_close(a, b, atol: float) -> None:
    """Trees of arrays (a server state, a message, a client's state) equal to `atol`."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_close(a[key], b[key], atol)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_close(x, y, atol)
    else:
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=0, atol=atol)


@pytest.mark.parametrize("method, model", [(m, {}) for m in METHODS] + [("fedavg", CONVNET)])
def test_one_round_together_ends_as_one_round_in_turn(method, model, tmp_path):
    alone = run(tmp_path, **{"algorithm.name": method, **model})
    together = run(tmp_path, **{"algorithm.name": method, **model, "resources.vectorize_clients": True})
    assert_close(checkpoint_state(alone), checkpoint_state(together), atol=1e-5)  # weights, controls, h
    for metric in ("accuracy", "loss"):
        np.testing.assert_allclose(
            [v for *_, v in rows(alone, metric)], [v for *_, v in rows(together, metric)], atol=5e-4
        )
    assert rows(alone, "bytes_up") == rows(together, "bytes_up")
    steps = rows(alone, "local_steps", clients=True)
    assert steps == rows(together, "local_steps", clients=True)
    assert len({v for *_, v in steps}) > 1  # the clients take different numbers of steps
    losses = [v for *_, v in rows(alone, "train_loss", clients=True)]
    np.testing.assert_allclose(losses, [v for *_, v in rows(together, "train_loss", clients=True)], atol=1e-5)


@pytest.fixture
def float64():
    """Models and data in float64 while the test runs: no rounding to tell the two paths apart."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@pytest.mark.parametrize(
    "method, model",
    [("scaffold", MLP), ("feddyn", MLP), ("moon", BATCHNORM_MLP), ("fedprox", MLP), ("fedbn", BATCHNORM_MLP)],
)
def test_a_round_from_kept_state_together_equals_in_turn(method, model, float64):
    """Round 2 from the state round 1 left (SCAFFOLD's c_i, FedDyn's g_k, MOON's previous model,
    FedBN's own batch-norm layers; FedProx keeps none), on clients whose last batches are short,
    with weight decay: client_update_batch gives each client the message, metrics and state
    client_update gives it."""
    overrides = {"algorithm.name": method, "local.epochs": 2, "local.batch_size": 16, "local.weight_decay": 1e-3}
    config = load_config(QUICKSTART, tiny_overrides(**overrides, **model))
    spec = ModelSpec(config, in_channels=1, num_classes=10, image_size=12)
    algorithm, ctx = make_algorithm(config), Context(config, spec, torch.device("cpu"))
    torch.manual_seed(0)
    data = [(torch.randn(n, 1, 12, 12), torch.randint(0, 10, (n,))) for n in (40, 16, 23)]

    def clients(states: list[dict], round_index: int) -> list[ClientData]:
        def seeded(k: int) -> torch.Generator:
            return torch.Generator().manual_seed(10 * round_index + k)

        return [
            ClientData(k, round_index, x, y, np.bincount(y.numpy(), minlength=10), config.model, state, seeded(k))
            for k, ((x, y), state) in enumerate(zip(data, states))
        ]

    payload = algorithm.broadcast(algorithm.server_init(spec.build(), ctx), 1, [0, 1, 2])
    first = clients([{}, {}, {}], 1)
    replies = [algorithm.client_update(payload, client, ctx) for client in first]
    payload = {**payload, "weights": replies[0]["weights"]}  # a new global model for round 2
    if "control" in payload:
        payload["control"] = {n: np.full_like(c, 0.01) for n, c in payload["control"].items()}
    alone = clients([copy.deepcopy(c.state) for c in first], 2)
    together = clients([copy.deepcopy(c.state) for c in first], 2)
    messages = [algorithm.client_update(payload, client, ctx) for client in alone]
    assert_close(messages, algorithm.client_update_batch(payload, together, ctx), atol=1e-10)
    for a, b in zip(alone, together):
        assert a.metrics["local_steps"] == b.metrics["local_steps"]
        assert_close(a.metrics, b.metrics, atol=1e-10)
        assert_close(a.state, b.state, atol=1e-10)
    assert len({c.metrics["local_steps"] for c in alone}) > 1


def test_batchnorm_clients_of_unequal_steps_train_exactly_as_in_turn():
    """In float64 (no rounding to tell the paths apart), batch-norm clients - of sizes that leave
    short last batches, one client's whole data a short batch - with momentum and weight decay end
    with the weights, running statistics, steps and mean loss of local_train on each."""
    torch.manual_seed(0)
    model = batchnorm_mlp(1, 10, 12).double()
    local = LocalConfig(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-3)
    data = [(torch.randn(n, 1, 12, 12, dtype=torch.float64), torch.randint(0, 10, (n,))) for n in (40, 16, 7, 35)]
    starts = []
    for _ in data:  # each client starts from weights of its own (FedBN's local layers)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        starts.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    runs = [ClientRun(x, y, torch.Generator().manual_seed(i), s) for i, ((x, y), s) in enumerate(zip(data, starts))]
    together = train_together(copy.deepcopy(model), runs, local, BatchLoss())
    for i, (x, y) in enumerate(data):
        alone = copy.deepcopy(model)
        alone.load_state_dict(starts[i])
        steps, loss = local_train(alone, x, y, local, torch.Generator().manual_seed(i))
        assert (steps, loss) == (together[i].steps, pytest.approx(together[i].mean_loss, abs=1e-12))
        for key, value in alone.state_dict().items():  # num_batches_tracked and running statistics too
            torch.testing.assert_close(together[i].state[key], value, rtol=0, atol=1e-12, msg=key)


class OwnLoss(FedAvg):
    """A user's FedAvg with a loss of its own and no vectorised form of it."""

    name = "own_loss"

    def local_loss(self, payload, client, ctx):
        return lambda model, x, y: model(x).logsumexp(1).mean()


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"algorithm.name": "tests.test_vectorized_clients:OwnLoss"}, "changes local_loss in OwnLoss"),
        ({"eval.count_macs": True}, "set eval.count_macs=false"),
        ({"local.optimizer": "adam"}, "SGD only: set local.optimizer=sgd"),
        ({"local.keep_optimizer": True}, "set local.keep_optimizer=false"),
        ({"resources.precision": "bfloat16"}, "float32 only: set resources.precision=float32"),
    ],
)
def test_the_key_is_refused_in_one_line_when_the_config_is_read(overrides, named):
    with pytest.raises(RaysimError) as refused:
        load_config(QUICKSTART, tiny_overrides(**{"resources.vectorize_clients": True, **overrides}))
    message = str(refused.value)
    assert "\n" not in message and named in message and "resources.vectorize_clients=false" in message


def test_a_method_outside_the_fedavg_family_is_refused_before_a_client_trains():
    """A method without client_update_batch (FedDM: its clients condense data) is refused in one line
    when its config is read, before Ray starts."""
    with pytest.raises(RaysimError) as refused:
        load_config(QUICKSTART, tiny_overrides(**{"resources.vectorize_clients": True, "algorithm.name": "feddm"}))
    message = str(refused.value)
    assert "\n" not in message and "'feddm' has no vectorised client step" in message
    assert "resources.vectorize_clients=false" in message
