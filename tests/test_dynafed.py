"""DynaFed: trajectory matching learns, the run records its diagnostics, results do not depend on actors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raysim.algorithms.dynafed.trajectory import (
    as_tensors,
    classifier_names,
    distance_after_training,
    normalised_distance,
    synthesize,
    trainable_names,
)
from raysim.errors import RaysimError
from raysim.models import build_model
from raysim.tensors import module_weights

TINY = {
    "algorithm.name": "dynafed",
    "rounds": 3,
    "algorithm.trajectory_rounds": 2,
    "algorithm.horizon": 1,
    "algorithm.inner_steps": 3,
    "algorithm.ipc": 2,
    "algorithm.iterations": 4,
    "algorithm.finetune_epochs": 2,
    "algorithm.diagnostic_segments": 2,
    "algorithm.syn_only_epochs": 5,
}


def toy_trajectory(steps=6):
    """An MLP trained by SGD on a separable two-class problem; a checkpoint after every step."""
    torch.manual_seed(0)
    model = build_model("mlp", in_channels=1, num_classes=2, image_size=4, hidden=16)
    x = torch.randn(256, 1, 4, 4)
    y = (x.mean((1, 2, 3)) > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    trajectory = [module_weights(model)]
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        trajectory.append(module_weights(model))
    return model, trajectory


def checkpoint(model, weights):
    """A trajectory checkpoint as the tensors an unrolled run starts from."""
    return as_tensors(weights, trainable_names(model), "cpu")


def test_trajectory_matching_reduces_the_distance_and_beats_noise():
    model, trajectory = toy_trajectory()
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(8, 1, 4, 4, generator=g), torch.zeros(8, 2)
    kwargs = dict(inner_steps=3, horizon=2, target_average=1, batch_size=8)
    x, y, step, losses = synthesize(
        model,
        trajectory,
        images,
        labels,
        iterations=60,
        image_lr=0.05,
        label_lr=0.05,
        step_size=0.1,
        step_size_lr=0.01,
        generator=g,
        **kwargs,
    )
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    assert step != pytest.approx(0.1, abs=1e-4)  # the step size is learned too
    measure = dict(step_size=step, segments=4, **kwargs)
    syn = distance_after_training(model, trajectory, x, y, generator=torch.Generator().manual_seed(1), **measure)
    noise = distance_after_training(
        model,
        trajectory,
        torch.randn(8, 1, 4, 4),
        torch.zeros(8, 2),
        generator=torch.Generator().manual_seed(1),
        **measure,
    )
    assert syn < noise


@pytest.mark.parametrize("recompute", [False, True])
def test_the_synthesis_counts_its_second_order_backward_once_per_iteration(recompute):
    """eval.count_macs: each iteration's MACs are what PyTorch's dispatcher counts in it (FLOPs / 2,
    the backward through the unrolled steps whole), the first counted and the rest added as it."""
    from torch.utils.flop_counter import FlopCounterMode

    from raysim.macs import counting

    model, trajectory = toy_trajectory()

    def run(iterations):
        g = torch.Generator().manual_seed(0)
        images, labels = torch.randn(8, 1, 4, 4, generator=g), torch.zeros(8, 2)
        kwargs = dict(inner_steps=3, horizon=2, target_average=1, batch_size=3, image_lr=0.05, label_lr=0.05)
        synthesize(model, trajectory, images, labels, iterations=iterations, step_size=0.1, step_size_lr=0.01,
                   generator=g, recompute=recompute, **kwargs)  # fmt: skip

    dispatched = {}
    for iterations in (1, 3):
        with FlopCounterMode(display=False) as dispatcher:
            run(iterations)
        dispatched[iterations] = dispatcher.get_total_flops() // 2
    with counting() as one:
        run(1)
    with counting() as three:
        run(3)
    assert dispatched[3] == 3 * dispatched[1]  # the iterations are the same work, as IdenticalWork assumes
    assert one.total == dispatched[1] > 0 and three.total == dispatched[3]


def test_the_shift_invariant_distance_ignores_what_sgd_cannot_move():
    model, trajectory = toy_trajectory()
    start, target = checkpoint(model, trajectory[0]), checkpoint(model, trajectory[-1])
    shift_free = classifier_names(model)
    assert shift_free == ("classifier.weight", "classifier.bias")
    # Adding one vector to every class row of the classifier changes no prediction ...
    shifted = dict(start)
    shifted["classifier.weight"] = start["classifier.weight"] + torch.randn(1, start["classifier.weight"].shape[1])
    shifted["classifier.bias"] = start["classifier.bias"] + 3.0
    assert normalised_distance(shifted, start, target, shift_free) == pytest.approx(1.0, rel=1e-5)
    assert normalised_distance(shifted, start, target) > 1.5  # ... but the Euclidean distance counts it
    # ... and no cross-entropy gradient has such a component: its class rows sum to zero.
    x = torch.randn(16, 1, 4, 4)
    loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 2, (16,)))
    grad = torch.autograd.grad(loss, [model.classifier.weight, model.classifier.bias])
    assert all(g.sum(0).abs().max() < 1e-6 for g in grad)


def test_the_plain_and_shift_invariant_losses_pull_the_synthetic_set_the_same_way():
    """SGD on D_syn cannot move the shared row shift, so in the plain distance (eq. 3) it is a constant:
    the two distances' gradients differ by one positive factor per segment (the ratio of denominators)."""
    from raysim.algorithms.dynafed.trajectory import _squared_gap, unrolled_training

    model, trajectory = toy_trajectory()
    for p in model.parameters():
        p.requires_grad_(False)
    start, target = checkpoint(model, trajectory[0]), checkpoint(model, trajectory[-1])
    # an Adam-like target: every class row moved by the same vector
    target["classifier.weight"] = target["classifier.weight"] + torch.randn(1, target["classifier.weight"].shape[1])
    target["classifier.bias"] = target["classifier.bias"] + 2.0
    x = torch.randn(8, 1, 4, 4, requires_grad=True)
    y = torch.randn(8, 2, requires_grad=True)
    step = torch.tensor(0.1, requires_grad=True)
    end = unrolled_training(model, start, x, y, step, 4, 0, torch.Generator().manual_seed(0))
    shift_free = classifier_names(model)
    plain = torch.autograd.grad(normalised_distance(end, start, target), [x, y, step], retain_graph=True)
    blind = torch.autograd.grad(normalised_distance(end, start, target, shift_free), [x, y, step])
    factor = float(_squared_gap(start, target, shift_free) / _squared_gap(start, target, ()))
    assert 0 < factor < 0.9  # the shift is a real part of this segment
    for a, b in zip(plain, blind):
        torch.testing.assert_close(a, factor * b, rtol=1e-4, atol=1e-9)


def test_finetuning_can_keep_the_aggregated_batchnorm_statistics():
    from raysim.training import train_soft_labels as finetune

    torch.manual_seed(0)
    model = build_model("convnet", in_channels=1, num_classes=2, image_size=8, width=4, depth=1, norm="batchnorm")
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    x, labels = torch.randn(8, 1, 8, 8) * 3 + 2, torch.zeros(8, 2)
    before, weight_before = bn.running_mean.clone(), bn.weight.detach().clone()
    finetune(model, x, labels, 2, 4, 0.1, torch.Generator().manual_seed(0), None, keep_bn_statistics=True)
    assert torch.equal(bn.running_mean, before) and bn.momentum == 0.1  # untouched, momentum restored
    assert not torch.equal(bn.weight.detach(), weight_before)  # while the weights did train
    finetune(model, x, labels, 2, 4, 0.1, torch.Generator().manual_seed(0), None)
    assert not torch.equal(bn.running_mean, before)  # the authors' behaviour: re-estimated on D_syn


def test_a_dynafed_run_records_diagnostics_and_is_the_same_in_process_or_on_two_actors(run_tiny):
    """In process (every client in one runtime, as on one actor; tests/test_engine.py shows that equals
    one actor) against two actors."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary_one, one = run_tiny(**{**TINY, "output.tensorboard": True})
    summary_two, _ = run_tiny(**{**TINY, "resources.actors": 2, "resources.in_process": False})
    for key in ("syn_distance", "real_distance", "noise_distance", "syn_only_accuracy"):
        assert key in summary_one and np.isfinite(summary_one[key])
        assert summary_one[key] == pytest.approx(summary_two[key], rel=1e-5)
    assert summary_one["final_accuracy"] == summary_two["final_accuracy"]
    saved = json.loads((one / "summary.json").read_text())
    assert saved["syn_only_accuracy"] == summary_one["syn_only_accuracy"]
    events = EventAccumulator(str(one / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert "dynafed/synthetic_images" in events.Tags()["images"]  # D_syn as an image grid


def test_a_synthesis_seed_redraws_d_syn_alone_on_the_same_trajectory(run_tiny):
    """synthesis_seed separates the spread the synthesis adds from the federation's: the same rounds up
    to L, another D_syn; the run's own seed is the default."""
    from raysim.outputs.run_dir import RunDir
    from tests.test_algorithms import final_weights, server_values

    # the run of the test above (its TensorBoard events change no number): shared, not run again
    base, base_dir = run_tiny(**{**TINY, "output.tensorboard": True})
    same, same_dir = run_tiny(**TINY, **{"algorithm.synthesis_seed": 0})  # the quickstart's seed
    other, other_dir = run_tiny(**TINY, **{"algorithm.synthesis_seed": 7})

    def d_syn(run_dir):
        return RunDir(run_dir).read_checkpoint()["state"]["syn_x"]

    assert np.array_equal(d_syn(same_dir), d_syn(base_dir)) and same["final_accuracy"] == base["final_accuracy"]
    assert not np.allclose(d_syn(other_dir), d_syn(base_dir))
    up_to_synthesis = TINY["algorithm.trajectory_rounds"]  # round L's model is the aggregate, before fine-tuning
    assert server_values(other_dir)[:up_to_synthesis] == server_values(base_dir)[:up_to_synthesis]
    other_weights, base_weights = final_weights(other_dir), final_weights(base_dir)
    assert any(not np.array_equal(other_weights[k], base_weights[k]) for k in base_weights)


def test_horizon_longer_than_the_trajectory_is_one_clear_error():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config
    from tests.conftest import tiny_overrides

    with pytest.raises(RaysimError, match="algorithm.horizon"):
        load_config(
            "configs/quickstart.yaml",
            tiny_overrides(**{"algorithm.name": "dynafed", "algorithm.trajectory_rounds": 2, "algorithm.horizon": 3}),
        )


# ------------------------------------------------------------- fidelity to the authors' code
def test_inner_loss_is_the_soft_cross_entropy_averaged_over_batch_and_classes():
    """The authors' kd_loss: mean over batch *and* classes, so their step size 0.04 means what it says."""
    from raysim.training import soft_cross_entropy

    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g)
    expected = -(torch.softmax(targets, 1) * torch.log_softmax(logits, 1)).mean()
    assert float(soft_cross_entropy(logits, targets)) == pytest.approx(float(expected), rel=1e-6)
    per_sample = torch.nn.functional.cross_entropy(logits, torch.softmax(targets, 1))
    assert float(soft_cross_entropy(logits, targets)) == pytest.approx(float(per_sample) / 10, rel=1e-6)


def test_segment_targets_are_sampled_checkpoints_between_start_and_horizon():
    """The paper: the target averages 2 checkpoints *sampled* between w_t and w_{t+s}; so for a fixed
    start it varies between draws and sits about (s + 1) / 2 checkpoints ahead, not at t + s - 0.5."""
    from raysim.algorithms.dynafed.trajectory import segment

    trajectory = [{"w": np.array([float(i)], np.float32)} for i in range(12)]
    horizon, g = 5, torch.Generator().manual_seed(0)
    ahead, by_start = [], {}
    for _ in range(2000):
        start, target = segment(trajectory, horizon, 2, g, ["w"], "cpu")
        t, end = float(start["w"]), float(target["w"])
        assert t + 1 <= end <= t + horizon  # a mean of checkpoints in w_{t+1..t+s}
        assert (2 * end) == pytest.approx(round(2 * end))  # of exactly two of them
        ahead.append(end - t)
        by_start.setdefault(t, set()).add(end)
    assert np.mean(ahead) == pytest.approx((horizon + 1) / 2, abs=0.1)
    assert all(len(targets) > 3 for targets in by_start.values())  # random, not one fixed target per start
    # the authors' code averages 2 or 3: with target_average_max=3 some targets are thirds, not halves
    mixed = [float(segment(trajectory, horizon, 2, g, ["w"], "cpu", target_average_max=3)[1]["w"]) for _ in range(200)]
    assert any(2 * v != pytest.approx(round(2 * v)) for v in mixed)
    thirds = [float(segment(trajectory, horizon, 3, g, ["w"], "cpu")[1]["w"]) * 3 for _ in range(50)]
    assert all(v == pytest.approx(round(v)) for v in thirds)  # three checkpoints: multiples of 1/3


def test_every_unrolled_step_sees_the_whole_synthetic_set_with_per_image_augmentation():
    """Authors' code: batch = C x ipc (CIFAR-100: all 1500 images, not 256) and DSA drawn per image."""
    from raysim.algorithms.dynafed.dynafed import DynaFed, augmentation
    from raysim.algorithms.dynafed.trajectory import unrolled_training

    assert DynaFed.Params().syn_batch == 0  # 0: all of D_syn
    assert augmentation(True).per_image and augmentation(False) is None
    model, trajectory = toy_trajectory()
    for p in model.parameters():
        p.requires_grad_(False)
    start = checkpoint(model, trajectory[0])
    x = torch.randn(300, 1, 4, 4, requires_grad=True)
    labels = torch.zeros(300, 2, requires_grad=True)
    end = unrolled_training(
        model, start, x, labels, torch.tensor(0.1), steps=1, batch_size=0, generator=torch.Generator().manual_seed(0)
    )
    (grad,) = torch.autograd.grad(sum((w**2).sum() for w in end.values()), x)
    assert bool((grad.flatten(1).abs().sum(1) > 0).all())  # one step moved by every one of the 300 images


@pytest.mark.parametrize(
    "optimizer, expected",
    [
        # evaluate_synset: SGD at D_syn's learned step, momentum 0.9, weight decay 5e-4, a tenth after half
        ("sgd", [("SGD", 0.07, 251, 0.9, 5e-4), ("SGD", 0.007, 249, 0.9, 5e-4)]),
        ("adam", [("Adam", 1e-3, 500, None, 0)]),
    ],
)
def test_training_on_synthetic_data_alone_follows_the_authors_evaluation(monkeypatch, optimizer, expected):
    """syn_only_accuracy as the authors' evaluate_synset measures it, the mean over 3 trainings of the
    same initial model; `adam` keeps raysim's earlier protocol."""
    import types

    import raysim.algorithms.dynafed.dynafed as dynafed
    from raysim.experiment import load_config
    from raysim.registry import make_algorithm
    from tests.conftest import tiny_overrides

    config = load_config(
        "configs/quickstart.yaml",
        tiny_overrides(**{"algorithm.name": "dynafed", "algorithm.syn_only_optimizer": optimizer}),
    )
    algorithm = make_algorithm(config)
    phases, initial_models = [], []

    def record(model, x, y, *, epochs, optimizer, generator, **_):
        group = optimizer.param_groups[0]
        phases.append((type(optimizer).__name__, group["lr"], epochs, group.get("momentum"), group["weight_decay"]))

    def initial_model(device):
        initial_models.append(device)
        return build_model("mlp", in_channels=1, num_classes=2, image_size=4, hidden=8)

    monkeypatch.setattr(dynafed, "train", record)
    ctx = types.SimpleNamespace(
        spec=types.SimpleNamespace(initial_model=initial_model),
        device="cpu",
        test_x=torch.randn(10, 1, 4, 4),
        test_y=torch.randint(0, 2, (10,)),
    )
    accuracies = [algorithm.train_on_synthetic_alone(None, None, 0.07, r, ctx) for r in range(3)]
    assert len(initial_models) == 3 and all(0 <= a <= 1 for a in accuracies)
    assert phases[: len(expected)] == [pytest.approx(e) if e[3] is not None else e for e in expected]


def test_an_unknown_syn_only_optimizer_is_one_clear_error():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config
    from tests.conftest import tiny_overrides

    with pytest.raises(RaysimError, match="'algorithm.syn_only_optimizer' must be one of sgd, adam"):
        load_config(
            "configs/quickstart.yaml",
            tiny_overrides(**{"algorithm.name": "dynafed", "algorithm.syn_only_optimizer": "lbfgs"}),
        )


def test_bench_trajectory_times_synthesis_and_repeats_it_bit_for_bit(capsys):
    from raysim.algorithms.dynafed.bench import DEFAULTS, trajectory
    from raysim.bench import main

    small = {"cases": "fmnist_mlp,cifar10_convnet", "ipc": "2", "inner_steps": "2", "width": "8", "iterations": "1"}
    results = trajectory({**DEFAULTS, **small, "device": "cpu"})
    assert {r["images"] for r in results.values()} == {20}
    assert all(r["repeat_bit_equal"] and r["s_per_iteration"] > 0 for r in results.values())
    assert "repeat bit-equal: yes" in capsys.readouterr().out
    with pytest.raises(RaysimError, match="unknown cases"):
        main("trajectory", ["cases=cifar10_resnet"])
    with pytest.raises(RaysimError, match="syn_batch=-1 out of range"):
        main("trajectory", ["syn_batch=-1"])
    with pytest.raises(RaysimError, match="recompute=yes out of range"):
        main("trajectory", ["recompute=yes"])


class SavedTensorBytes:
    """The bytes autograd holds for backward passes at any moment, and their peak: every saved tensor
    is counted from when a graph saves it until that graph is freed."""

    def __init__(self):
        self.live = self.peak = 0

    def pack(self, tensor):
        size = tensor.numel() * tensor.element_size()
        self.live += size
        self.peak = max(self.peak, self.live)
        return _Held(tensor, size, self)

    @staticmethod
    def unpack(held):
        return held.tensor


class _Held:
    def __init__(self, tensor, size, counter):
        self.tensor, self.size, self.counter = tensor, size, counter

    def __del__(self):
        self.counter.live -= self.size


@pytest.mark.parametrize("batch_size", [0, 5])
def test_recomputed_unrolled_steps_give_the_same_gradients_holding_one_steps_graph(batch_size):
    """recompute_steps: the same loss and gradients for images, labels and step size as differentiating
    through all s' steps at once (DSA per image, a batch-norm ConvNet, whole set or batches), with a
    fraction of the memory autograd holds."""
    from raysim.algorithms.dynafed.dynafed import augmentation
    from raysim.algorithms.dynafed.trajectory import MIN_STEP_SIZE, matching_gradients_recomputed, unrolled_training

    torch.manual_seed(0)
    model = build_model("convnet", in_channels=1, num_classes=3, image_size=8, width=4, depth=1, norm="batchnorm")
    for p in model.parameters():
        p.requires_grad_(False)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    target = {n: w + 0.05 * torch.randn_like(w) for n, w in start.items()}
    x = torch.randn(9, 1, 8, 8, requires_grad=True)
    labels = torch.randn(9, 3, requires_grad=True)
    step = torch.tensor(0.1, requires_grad=True)
    steps, augment = 6, augmentation(True)
    held = {}
    for recompute in (False, True):
        counter = SavedTensorBytes()
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            run = (steps, batch_size, torch.Generator().manual_seed(3), augment)
            if recompute:
                loss = matching_gradients_recomputed(model, start, target, x, labels, step, *run)
            else:
                end = unrolled_training(model, start, x, labels, step.clamp_min(MIN_STEP_SIZE), *run)
                loss = normalised_distance(end, start, target)
                loss.backward()
                loss = float(loss.detach())
        held[recompute] = (loss, [t.grad.clone() for t in (x, labels, step)], counter.peak)
        x.grad = labels.grad = step.grad = None
    (loss_all, grads_all, peak_all), (loss_one, grads_one, peak_one) = held[False], held[True]
    assert loss_one == pytest.approx(loss_all, rel=1e-6)
    for a, b in zip(grads_all, grads_one):
        assert a.abs().max() > 0
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6 * float(a.abs().max()))
    assert peak_one < peak_all / 3  # one step's graph at a time instead of six
