"""DynaFed (Pi et al., CVPR 2023, Algorithms 1-2).

FedAvg rounds, plus on the server:
  rounds 1..L:  keep the aggregated global models w_0 (the initialisation) .. w_L;
  round L:      synthesise D_syn = (X, soft labels) once by trajectory matching (Algorithm 1):
                from a random w_t, s' unrolled SGD steps on D_syn with a learnable step size
                should land near w_{t+s}; minimise the normalised distance (eq. 3-4);
  rounds > L:   fine-tune the aggregated model on D_syn (Algorithm 2, line 12).
Choices where the paper is silent, as in the authors' code: images start from noise, soft labels
from zero logits (equal probabilities); the target is the mean of `target_average` checkpoints drawn
with replacement from w_{t+1..t+s} (the paper: 2 sampled between w_t and w_{t+s}; the code draws 2-3,
`target_average_max: 3`); every unrolled step trains on the whole D_syn (`syn_batch: 0`) with DSA
parameters drawn per image; the inner loss is the soft cross-entropy averaged over batch *and*
classes (their `kd_loss`), the units of their step size 0.04; Adam for images, labels and the step
size itself; fine-tuning with Adam, DSA per image and the same loss. Clients keep their Adam state
between rounds (`local.keep_optimizer: true` in the configs). The ConvNet uses instance norm in the
configs, as theirs, and the configs normalise inputs with their fixed constants (`dataset.mean`,
`dataset.std`; FMNIST with MNIST's). FedAvg weighs clients by size where their code averages them
uniformly: on the balanced partition of their code (`dirichlet_balanced`) sizes differ by under 1%.
The trajectory holds w_0..w_L (L + 1 checkpoints).
The distance is eq. 3's plain Euclidean one, as in the paper and the authors' code. With
`shift_invariant: true` it ignores a shift shared by all classifier rows: such a shift changes no
prediction and no SGD step on a cross-entropy loss makes one, so in the plain distance it is a constant
that no synthetic set can reduce, and Adam clients move it steadily. That constant keeps the plain
matching loss and Figure 6 distances high; the pull on D_syn is the same up to one factor per segment
(tested), which under Adam reweights the segments.
One choice of ours, a parameter (false restores the authors' code):
- finetune_keeps_bn_statistics (batch-norm models only; the configs use instance norm, as the
  authors): fine-tuning leaves batch norm's running statistics as aggregated from the clients' real
  data instead of re-estimating them on D_syn, whose statistics are not the data's.
Diagnostics (Figure 6 left) are computed once, at round L, and written to summary.json: the
normalised distance reached after s' steps on D_syn, on a random real subset of the same size and on
noise of the same size, each at its best of a few step sizes (the server holds no training data, so
the real subset comes from the test split; real and noise images carry hard labels, ipc per class
for the noise), and the test accuracy of the initial model trained on D_syn alone, as the authors'
evaluate_synset does it (`syn_only_optimizer: sgd`: SGD at D_syn's learned step size, momentum 0.9,
weight decay 5e-4, a tenth of the step after half of 500 epochs, the mean of 3 trainings; `adam`:
Adam at 1e-3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch

from raysim.algorithm import PositiveInt
from raysim.algorithms.condensed.dsa import DSA
from raysim.algorithms.condensed.synthetic import to_pixels
from raysim.algorithms.dynafed.trajectory import classifier_names, distance_after_training, synthesize
from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.bench.cell import bench_work
from raysim.config.parse import Bound
from raysim.errors import RaysimError
from raysim.macs import paused
from raysim.seeding import SERVER, torch_generator
from raysim.tensors import load_weights, module_weights
from raysim.training import evaluate, even_batches, soft_label_loss, train, train_soft_labels

PREVIEW_PER_CLASS = 10
DIAGNOSTIC_STEP_FRACTIONS = (1.0, 0.5, 0.25, 0.125)  # of D_syn's learned step size
SYN_ONLY_OPTIMIZERS = ("sgd", "adam")
SYN_ONLY_ADAM_LR = 1e-3
HARD_LABEL_LOGIT = 10.0  # softmax of 10 x one-hot puts 0.9995 on the class: a hard label as soft-label logits


def augmentation(enabled: bool) -> DSA | None:
    """DSA with parameters drawn per image, as the authors' DiffAugment without a seed: one family per
    batch, a different transform for each image (a batch of D_syn is then not one picture moved alike)."""
    return DSA(per_image=True) if enabled else None


def sgd(model: torch.nn.Module, lr: float) -> torch.optim.SGD:
    """The authors' optimiser for training on D_syn alone (evaluate_synset)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)


def class_logits(num_classes: int, ipc: int, scale: float, device) -> torch.Tensor:
    """Label logits for ipc images per class in class order: scale x one-hot."""
    own_class = torch.arange(num_classes, device=device).repeat_interleave(ipc)
    return torch.nn.functional.one_hot(own_class, num_classes).float() * scale


@bench_work(keys={"local.epochs": "clients", "algorithm.iterations": "server", "algorithm.finetune_epochs": "server"})
class DynaFed(FedAvg):
    name = "dynafed"
    summary = "DynaFed: FedAvg + server-side data synthesised from the early global trajectory, then fine-tuning"

    @dataclass(frozen=True)
    class Params:
        trajectory_rounds: PositiveInt = 20  # L: rounds whose global models form the trajectory
        horizon: PositiveInt = 5  # s: checkpoints ahead of w_t that the target is taken from (paper: 5)
        inner_steps: PositiveInt = 20  # s': unrolled SGD steps on D_syn
        target_average: PositiveInt = 2  # checkpoints averaged into the target (paper: 2)
        target_average_max: int = 2  # draw their number from [target_average, this] (authors' code: 3)
        ipc: PositiveInt = 15  # synthetic images per class (|D_syn| = ipc x classes)
        iterations: PositiveInt = 3000  # N: synthesis iterations
        # images per unrolled step; 0: all of D_syn (authors' code)
        syn_batch: Annotated[int, Bound(ge=0, why="0: all of D_syn")] = 0
        # true: hold one unrolled step's graph at a time and rebuild each during the backward pass (same
        # gradients to float rounding, memory of 1 step instead of s', about one more pass per step);
        # the way to the authors' whole-set steps where they do not fit in GPU memory (CIFAR-100).
        recompute_steps: bool = False
        image_lr: float = 0.05  # Adam
        label_lr: float = 0.01  # Adam
        label_init: float = 0.0  # initial logit of each image's own class (0: equal probabilities)
        step_size: float = 0.04  # initial learnable inner step size
        step_size_lr: float = 1e-5  # Adam on the step size itself
        dsa: bool = True  # augment inner batches and fine-tuning batches
        # false: the plain distance of eq. 3, as the paper and the authors' code. true: blind to a shift
        # shared by all classifier rows, which changes no prediction and which SGD cannot produce (see
        # normalised_distance): the same pull on D_syn, rescaled per segment; loss and diagnostics without
        # the part no synthetic set can reach.
        shift_invariant: bool = False
        finetune_epochs: int = 20
        finetune_batch: PositiveInt = 256
        finetune_lr: float = 1e-4  # Adam
        # Fine-tuning leaves batch norm's running statistics as aggregated from the clients' real data:
        # D_syn's own statistics are not the data's (the authors' code re-estimates them on D_syn: false).
        finetune_keeps_bn_statistics: bool = True
        diagnostics: bool = True  # Figure 6 distances and the D_syn-only accuracy, once at round L
        diagnostic_segments: PositiveInt = 10
        # How syn_only_accuracy trains a fresh model on D_syn alone. "sgd": the authors' evaluate_synset,
        # SGD at D_syn's learned step size (momentum 0.9, weight decay 5e-4) and a tenth of it after
        # half the epochs; "adam": Adam at lr 1e-3 throughout.
        syn_only_optimizer: Literal[SYN_ONLY_OPTIMIZERS] = "sgd"
        syn_only_epochs: PositiveInt = 500
        syn_only_repeats: PositiveInt = 3  # trainings from the same initial model, averaged (authors' code: 3)
        # Seed of the synthesis alone (initial noise, segments, augmentations); None: the run's seed.
        # Another value keeps the federation and its trajectory and redraws only D_syn's randomness.
        synthesis_seed: int | None = None

        def __post_init__(self):
            self.check_trajectory()

        def check_trajectory(self) -> None:
            """The target's checkpoints (horizon, how many are averaged) within the trajectory."""
            if self.target_average_max < self.target_average:
                raise RaysimError(
                    f"algorithm.target_average_max ({self.target_average_max}) must be >= "
                    f"algorithm.target_average ({self.target_average})"
                )
            if self.horizon >= self.trajectory_rounds + 1:
                raise RaysimError(
                    f"algorithm.horizon (s={self.horizon}) must be smaller than the trajectory's "
                    f"{self.trajectory_rounds + 1} checkpoints: raise algorithm.trajectory_rounds"
                )

    # ------------------------------------------------------------- server
    def server_init(self, model, ctx):
        weights = module_weights(model)
        return {"weights": weights, "trajectory": [weights]}

    def server_update(self, state, replies, round_index, ctx):
        state = {**state, "weights": self.aggregate(state, replies, ctx)}
        p = self.params
        if round_index <= p.trajectory_rounds:
            state["trajectory"] = [*state["trajectory"], state["weights"]]
        if round_index == p.trajectory_rounds:
            state.update(self.synthesize(state["trajectory"], ctx))
            state["trajectory"] = []  # no longer needed: keep checkpoints small
        elif round_index > p.trajectory_rounds:
            model = ctx.model("server")
            load_weights(model, state["weights"])
            x, labels = self.synthetic(state, ctx)
            train_soft_labels(
                model,
                x,
                labels,
                p.finetune_epochs,
                p.finetune_batch,
                p.finetune_lr,
                torch_generator(self.config.seed, SERVER, round_index),
                augmentation(p.dsa),
                keep_bn_statistics=p.finetune_keeps_bn_statistics,
            )
            state["weights"] = module_weights(model)
        if "syn_x" in state:
            self.show_synthetic(state, ctx)
        return state

    def synthetic(self, state, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(state["syn_x"]).to(ctx.device), torch.from_numpy(state["syn_labels"]).to(ctx.device))

    def synthesize(self, trajectory, ctx) -> dict:
        p, c = self.params, ctx.num_classes
        seed = self.config.seed if p.synthesis_seed is None else p.synthesis_seed
        g = torch_generator(seed, SERVER, "dynafed-synthesis")
        shape = (c * p.ipc, ctx.spec.in_channels, ctx.spec.image_size, ctx.spec.image_size)
        images = torch.randn(shape, generator=g).to(ctx.device)
        # ipc images per class, in class order; their soft labels start at label_init x one-hot (the paper:
        # 0, equal probabilities; the authors' code exposes the scale as --label_init).
        labels = class_logits(c, p.ipc, p.label_init, ctx.device)
        augment = augmentation(p.dsa)
        started = time.perf_counter()
        x, y, step, losses = synthesize(
            ctx.model("synth"),
            trajectory,
            images,
            labels,
            iterations=p.iterations,
            inner_steps=p.inner_steps,
            horizon=p.horizon,
            target_average=p.target_average,
            batch_size=p.syn_batch,
            image_lr=p.image_lr,
            label_lr=p.label_lr,
            step_size=p.step_size,
            step_size_lr=p.step_size_lr,
            generator=g,
            augment=augment,
            shift_free=self.shift_free(ctx),
            target_average_max=p.target_average_max,
            recompute=p.recompute_steps,
        )
        out = {
            "syn_x": x.cpu().numpy(),
            "syn_labels": y.cpu().numpy(),
            "syn_step_size": step,
            "syn_loss_first": float(np.mean(losses[:10])),
            "syn_loss_last": float(np.mean(losses[-10:])),
            "syn_time_s": time.perf_counter() - started,
        }
        if p.diagnostics:
            with paused():  # readings, not the method's work (raysim.macs)
                out["diagnostics"] = self.diagnose(trajectory, x, y, step, ctx)
        return out

    def shift_free(self, ctx) -> tuple[str, ...]:
        return classifier_names(ctx.model("synth")) if self.params.shift_invariant else ()

    def diagnose(self, trajectory, x, y, step, ctx) -> dict[str, float]:
        """DynaFed's Figure 6 (left) distances and the accuracy of a model trained on D_syn alone."""
        p = self.params
        augment = augmentation(p.dsa)
        g = torch_generator(self.config.seed, SERVER, "dynafed-diagnostics")
        pick = torch.randperm(len(ctx.test_y), generator=g)[: len(x)].to(ctx.device)
        real_x = ctx.test_x[pick]
        real_labels = torch.nn.functional.one_hot(ctx.test_y[pick], ctx.num_classes).float() * HARD_LABEL_LOGIT
        # Noise pixels carry labels like the real subset's (hard, ipc per class), so the two differ in
        # their pixels only; noise with equal-probability labels would barely move the model (d = 1).
        noise_x = torch.randn(x.shape, generator=g).to(ctx.device)
        noise_labels = class_logits(ctx.num_classes, p.ipc, HARD_LABEL_LOGIT, ctx.device)

        def distance(images, labels):
            # Each set at the step size that serves it best (same segments for every set and step):
            # hard-labelled real images overshoot at D_syn's learned step, which would flatter D_syn.
            return min(
                distance_after_training(
                    ctx.model("synth"),
                    trajectory,
                    images,
                    labels,
                    inner_steps=p.inner_steps,
                    horizon=p.horizon,
                    target_average=p.target_average,
                    batch_size=p.syn_batch,
                    step_size=step * fraction,
                    segments=p.diagnostic_segments,
                    generator=torch_generator(self.config.seed, SERVER, "dynafed-segments"),
                    augment=augment,
                    shift_free=self.shift_free(ctx),
                    target_average_max=p.target_average_max,
                )
                for fraction in DIAGNOSTIC_STEP_FRACTIONS
            )

        accuracies = [self.train_on_synthetic_alone(x, y, step, repeat, ctx) for repeat in range(p.syn_only_repeats)]
        return {
            "syn_distance": distance(x, y),
            "real_distance": distance(real_x, real_labels),
            "noise_distance": distance(noise_x, noise_labels),
            "syn_only_accuracy": float(np.mean(accuracies)),
            "syn_only_accuracy_std": float(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else 0.0,
        }

    def train_on_synthetic_alone(self, x, y, step, repeat, ctx) -> float:
        """Test accuracy of the initial model trained on D_syn alone (soft labels, DSA per image)."""
        p = self.params
        model = ctx.spec.initial_model(device=ctx.device)
        g = torch_generator(self.config.seed, SERVER, "dynafed-syn-only", repeat)
        if p.syn_only_optimizer == "adam":
            phases = [(torch.optim.Adam(model.parameters(), lr=SYN_ONLY_ADAM_LR), p.syn_only_epochs)]
        else:
            # evaluate_synset: lr x 0.1 after the first half, with a fresh optimiser (momentum restarts).
            first = p.syn_only_epochs // 2 + 1
            phases = [
                (sgd(model, lr), epochs)
                for lr, epochs in ((step, first), (step / 10, p.syn_only_epochs - first))
                if epochs > 0
            ]
        for optimizer, epochs in phases:
            train(
                model,
                x,
                y,
                epochs=epochs,
                batch_size=p.finetune_batch,
                optimizer=optimizer,
                generator=g,
                loss_fn=soft_label_loss,
                augment=augmentation(p.dsa),
                split=even_batches,
            )
        with torch.no_grad():
            accuracy, _ = evaluate(model, ctx.test_x, ctx.test_y)
        return accuracy

    def summary_extras(self, state):
        extras = dict(state.get("diagnostics", {}))
        if "syn_step_size" in state:
            extras.update({k: state[k] for k in ("syn_step_size", "syn_loss_first", "syn_loss_last", "syn_time_s")})
        return extras

    def show_synthetic(self, state, ctx) -> None:
        c, ipc = ctx.num_classes, self.params.ipc
        per_row = min(ipc, PREVIEW_PER_CLASS)
        x = (
            state["syn_x"]
            .reshape(c, ipc, *state["syn_x"].shape[1:])[:, :per_row]
            .reshape(-1, *state["syn_x"].shape[1:])
        )
        ctx.log.image_grid("dynafed/synthetic_images", to_pixels(torch.from_numpy(x), ctx.mean, ctx.std), per_row)
