"""`resources.precision: bfloat16`: the hot loops' forward passes run under autocast, their losses,
gradients and parameters stay float32, results stay equal across actor counts, and an in-process run
gives this process its precision back."""

from __future__ import annotations

import pytest
import torch

from raysim.precision import autocast, kept, set_precision


@pytest.fixture
def bfloat16():
    with kept():
        set_precision("bfloat16")
        yield


def forward_dtypes(model: torch.nn.Module) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            module.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    return seen


def test_float32_is_no_autocast():
    with autocast("cpu"):
        assert torch.nn.Linear(3, 2)(torch.ones(1, 3)).dtype == torch.float32


def test_local_training_runs_its_forward_passes_in_bfloat16_and_keeps_float32_weights(bfloat16):
    from raysim.training import cross_entropy_loss, train

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    seen = forward_dtypes(model)
    losses = []

    def loss_fn(m, x, y):
        loss = cross_entropy_loss(m, x, y)
        losses.append(loss)
        return loss

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 4, 4, generator=g), torch.randint(3, (32,), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = train(model, x, y, epochs=2, batch_size=8, optimizer=optimizer, generator=g, loss_fn=loss_fn)
    assert stats.steps == 8 and set(seen) == {torch.bfloat16}
    assert all(loss.dtype == torch.float32 for loss in losses)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())


def test_condensation_embeddings_and_trajectory_steps_compute_in_bfloat16_and_return_float32(bfloat16):
    from raysim.algorithms.condensed.matching import _embed_and_logits
    from raysim.algorithms.dynafed.trajectory import _sgd_step
    from raysim.models import build_model

    model = build_model("convnet", in_channels=1, num_classes=4, image_size=16, width=8, depth=2)
    seen = forward_dtypes(model)
    x = torch.randn(6, 1, 16, 16, requires_grad=True)
    features, logits = _embed_and_logits(model, x, with_logits=True)
    assert features.dtype == logits.dtype == torch.float32 and torch.bfloat16 in seen
    features.sum().backward()
    assert x.grad.dtype == torch.float32

    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    stepped = _sgd_step(model, params, list(params), x.detach(), torch.randn(6, 4), 0.01, create_graph=True)
    assert all(p.dtype == torch.float32 for p in stepped.values())


def test_a_bad_precision_is_one_line():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config

    with pytest.raises(RaysimError, match="resources.precision must be float32 or bfloat16, got 'float16'"):
        load_config("configs/quickstart.yaml", ["resources.precision=float16"])


def test_bfloat16_runs_give_the_same_numbers_on_two_actors_or_in_process(run_tiny):
    from raysim import precision

    # one round of the MLP: CPU autocast makes the tiny CNN's convolutions slow (27.6 s a 2-round run
    # here, 7.3 s in float32; the condensation test above runs them), and the rule is the same
    one_round = {"rounds": 1, "model.name": "mlp"}
    bf16 = {"resources.precision": "bfloat16", **one_round}
    two, _ = run_tiny(**bf16, **{"resources.in_process": False, "resources.actors": 2})
    here, _ = run_tiny(**bf16)
    assert precision._dtype is None  # the in-process run gave this process its float32 back
    full, _ = run_tiny(**one_round)
    keys = ("final_accuracy", "best_accuracy", "final_loss")
    assert [two[k] for k in keys] == [here[k] for k in keys]
    assert two["final_loss"] != full["final_loss"]  # autocast did run
    assert two["final_accuracy"] > 0.3  # ten classes: far above chance


@pytest.mark.slow
@pytest.mark.parametrize("name", __import__("raysim.registry", fromlist=["builtin_names"]).builtin_names())
def test_every_algorithm_runs_in_bfloat16(run_tiny, name):
    """Each algorithm's own losses meet bfloat16 model outputs somewhere (FedAF's class sums, the
    one-shot methods' ensembles, DynaFed's unrolled steps): two rounds of each, in process, on the
    MLP: bfloat16 convolutions run on this CPU at a fraction of float32's speed (the test above and
    the condensation test run them), and what is checked here is the algorithms' own arithmetic."""
    from tests.test_algorithms import LEARNS_WITH

    settings = {"partition.alpha": 0.1, **LEARNS_WITH.get(name, {}), "rounds": 2, "algorithm.name": name}
    settings["model.name"] = "mlp"
    if "algorithm.generator_steps" in settings:  # the one-shot methods: less of each step, every step kept
        settings.update({"local.epochs": 1, "algorithm.generator_steps": 5, "algorithm.stratify_steps": 2})
    summary, _ = run_tiny(**settings, **{"resources.precision": "bfloat16"})
    assert summary["finished"], summary
    # chance is 0.1; a one-shot method's server model has had one distillation epoch, its clients all
    # their local training: the clients' best model says whether bfloat16 training works
    assert max(summary["best_accuracy"], summary.get("best_client_accuracy", 0)) > 0.25, summary
