"""`resources.compile`: the training loop's forward and the DM embedding run through torch.compile,
give eager mode's numbers up to rounding, leave the model plain outside the loop, keep results equal
across actor counts, and an in-process run gives this process its setting back."""

from __future__ import annotations

import pytest
import torch

from raysim import compiled


@pytest.fixture
def compiling():
    with compiled.kept():
        compiled.set_compile(True)
        yield


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def small_model(name: str = "convnet") -> torch.nn.Module:
    """A seeded model of 8-px one-channel images and 4 classes: the ConvNet (width 4, depth 1) or the MLP."""
    from raysim.models import build_model

    sizes = {"convnet": {"width": 4, "depth": 1}, "mlp": {"hidden": 8}}[name]
    torch.manual_seed(0)
    return build_model(name, in_channels=1, num_classes=4, image_size=8, **sizes)


def train_twice(model: torch.nn.Module) -> tuple[float, list[torch.Tensor]]:
    from raysim.training import train

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 1, 8, 8, generator=g), torch.randint(4, (20,), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # batches of 8, 8 and 4: one dynamic graph serves both sizes
    stats = train(model, x, y, epochs=2, batch_size=8, optimizer=optimizer, generator=g)
    return stats.mean_loss, [p.detach().clone() for p in model.parameters()]


def test_off_the_training_loop_runs_the_plain_module():
    model = small_model()
    with compiled.forward(model) as same:
        assert same is model and "forward" not in vars(model)
    assert compiled.function(model.embed) == model.embed


@pytest.mark.slow  # compiles an MLP's training loop (the claim is the loop's, not the architecture's)
def test_on_the_training_loop_compiles_the_forward_for_the_loop_only(compiling):
    with compiled.kept():
        compiled.set_compile(False)
        eager_loss, eager_weights = train_twice(small_model("mlp"))
    before = graphs_compiled()
    model = small_model("mlp")
    keys = list(model.state_dict())
    loss, weights = train_twice(model)
    assert graphs_compiled() > before  # the loop went through torch.compile
    assert "forward" not in vars(model) and list(model.state_dict()) == keys  # a plain module again
    assert loss == pytest.approx(eager_loss, rel=1e-4)
    assert all(torch.allclose(w, e, atol=1e-4) for w, e in zip(weights, eager_weights))


@pytest.mark.slow  # compiles: about 6 s
def test_the_dm_embedding_is_compiled_and_its_image_gradients_match_eager(compiling):
    from raysim.algorithms.condensed.matching import _embed_and_logits

    model = small_model().requires_grad_(False)
    x = torch.randn(6, 1, 8, 8, requires_grad=True)
    before = graphs_compiled()
    features, logits = _embed_and_logits(model, x, with_logits=True)
    features.square().sum().backward()
    assert graphs_compiled() > before
    x_eager = x.detach().clone().requires_grad_(True)
    model.embed(x_eager).square().sum().backward()
    assert torch.allclose(x.grad, x_eager.grad, atol=1e-4)
    assert logits.shape == (6, 4)


@pytest.mark.slow  # compiles: about 4 s
def test_inputs_of_any_layout_share_one_graph(compiling):
    """DSA's flips and crops and slices of a batch hand the embedding other strides and offsets."""
    embed = compiled.function(small_model().requires_grad_(False).embed)
    x = torch.randn(12, 1, 8, 8)
    expected = embed(x[:10])
    before = graphs_compiled()
    for layout in (x[2:], x.transpose(2, 3), x.contiguous(memory_format=torch.channels_last), x[::2]):
        embed(layout)
    assert graphs_compiled() == before
    assert torch.allclose(embed(x[:10]), expected)


@pytest.mark.slow  # compiles forward and backward: about 7 s
def test_a_compiled_graph_can_be_walked_back_twice(compiling):
    """FedAF logs its terms' gradient ratio with two backward passes through one step's graph."""
    model = small_model().requires_grad_(False)
    x = torch.randn(6, 1, 8, 8, requires_grad=True)
    loss = compiled.function(model.embed)(x).square().sum()
    (first,) = torch.autograd.grad(loss, x, retain_graph=True)
    (second,) = torch.autograd.grad(loss, x)
    assert torch.equal(first, second)


def test_a_bad_compile_value_is_one_line():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config

    with pytest.raises(RaysimError, match="config key 'resources.compile' must be true or false, got 'maybe'"):
        load_config("configs/quickstart.yaml", ["resources.compile=maybe"])


@pytest.mark.slow
def test_compiled_runs_give_the_same_numbers_on_two_actors_or_in_process(run_tiny):
    """FedAF: local training, the DM embeddings and the server's training all compiled (the MLP:
    it compiles in seconds, and the question is the graphs' reuse, not their speed)."""
    from tests.test_algorithms import LEARNS_WITH

    settings = {**LEARNS_WITH["fedaf"], "algorithm.name": "fedaf", "model.name": "mlp", "resources.compile": True}
    two, _ = run_tiny(**settings, **{"resources.in_process": False, "resources.actors": 2})
    here, _ = run_tiny(**settings)
    assert not compiled.enabled()  # the in-process run gave this process its setting back
    keys = ("final_accuracy", "best_accuracy", "final_loss")
    assert [two[k] for k in keys] == [here[k] for k in keys]
    assert two["final_accuracy"] > 0.3  # ten classes: far above chance
