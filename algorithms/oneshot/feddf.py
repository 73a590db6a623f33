"""FedDF (Lin et al., NeurIPS 2020) as a one-shot method: ensemble distillation on unlabelled data.

After the one-shot client stage (algorithms/oneshot/base.py), the server model starts from the clients'
size-weighted average (FedDF's fusion starts from FedAvg; `student_init`) and each distillation
epoch trains it on KL(softmax(A/T) || softmax(S/T)) against the average of the client models'
logits A (FedDF's AVGLOGITS, T = 1) on unlabelled images.

The unlabelled data (`distill_source`):
- `dataset` (default): real images of *another* dataset, as FedDF distils on (its code's commands:
  CIFAR-100 for CIFAR-10, downsampled ImageNet for CIFAR-100): `distill_dataset` (`auto`: the
  choice of algorithms/oneshot/transfer.py, e.g. MNIST for Fashion-MNIST) in `distill_root` (empty: beside
  `dataset.root`), at the run's size and channels. What the student sees of it (`transfer_pool`):
  - `whole` (default, FedDF's code): the whole transfer set, as a stream of batches that cycles
    over it in a new shuffled order at each pass; a global round takes `transfer_steps` batches of
    `kd_batch` from the stream, spread evenly over its distillation epochs (10,000 at 200 epochs:
    50 an epoch), or with `transfer_steps: 0` one pass over the whole set an epoch. The epoch's
    images are read again from the transfer set, not kept in the server state (`pool_size` does not
    apply). `transfer_passes` (metrics.parquet) counts the passes over the set so far in the round.
  - `growing`: a pool that grows by `synthesis_batch` transfer images an epoch (drawn without
    replacement in one seeded order), the student taking one pass over the pool, so that it sees
    as many images an epoch as the generator methods' pools hold: a scaled-down reading for 2-core
    runs (the 2-core configs set it).
- `generator`: images of a freshly initialised, untrained DENSE generator (`synthesis_batch` an
  epoch, a growing pool). They carry no information about the classes, so the server model stays
  near chance: a data-free lower bound.

As the authors' code runs the distillation (epfml/federated-learning-public-code@44dd555, FedDF-code:
`pcode/aggregation/noise_knowledge_transfer.py`, `pcode/create_aggregator.py`, the README's
commands): the transfer loader holds the whole training split of the other dataset
(`data_percentage=1.0`), shuffled at every pass (`shuffle=True`, `drop_last=False`), and is cycled
for `total_n_server_pseudo_batches=10000` steps at the clients' batch size (`--batch_size 64` in
its commands; here `kd_batch`); Adam at lr 1e-3 with a cosine schedule over those steps (here
annealed over the distillation epochs), gradient norms clipped at 5, T = 1, no T^2 factor (equal
at T = 1), KL averaged over the batch; the transfer images with the training augmentation (crop +
flip). It validates every 100 steps on a split held out of the training data, stops after 1,000 steps
without a better validation accuracy and keeps the best validated model; here there is no
validation split and every method reports best, final and last-5 over its epochs the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from raysim.algorithm import NonNegativeFloat, NonNegativeInt, PositiveFloat, added_param
from raysim.algorithms.oneshot.base import DataFreeDistillation, KDOptimizer, KDSchedule, OneShotParams
from raysim.algorithms.oneshot.datafree import SynthesisResult, add_to_pool
from raysim.algorithms.oneshot.generator import reset_generator
from raysim.algorithms.oneshot.losses import distillation_loss
from raysim.algorithms.oneshot.transfer import load_transfer_images, transfer_source
from raysim.config import client_architectures
from raysim.errors import RaysimError
from raysim.seeding import SERVER, derive_seed, numpy_rng
from raysim.tensors import weighted_average

KEYS = "algorithm.distill_dataset/distill_root"


class FedDF(DataFreeDistillation):
    name = "feddf"
    summary = "FedDF: distil the average ensemble into the server model on unlabelled data"

    @dataclass(frozen=True)
    class Params(OneShotParams):
        distill_source: Literal["dataset", "generator"] = "dataset"
        distill_dataset: str = "auto"  # with distill_source=dataset: its name (e.g. mnist), or auto ...
        distill_root: str = ""  # ... and folder ("" = beside the dataset's folder)
        # with distill_source=dataset: whole (a stream over the whole transfer set, FedDF's code) or
        # growing (a pool growing by synthesis_batch an epoch; the 2-core scaling)
        transfer_pool: Literal["whole", "growing"] = added_param("whole", before="growing", since=2)
        # whole: batches a global round takes from the stream, spread over its epochs (FedDF's
        # code: total_n_server_pseudo_batches=10000); 0 = one pass over the transfer set an epoch
        transfer_steps: NonNegativeInt = 10000
        # average | initial | auto (average when every client has the server's model)
        student_init: Literal["auto", "average", "initial"] = "auto"
        temperature: PositiveFloat = 1.0
        kd_optimizer: KDOptimizer = "adam"
        kd_lr: PositiveFloat = 1e-3
        kd_schedule: KDSchedule = "cosine"
        kd_grad_clip: NonNegativeFloat = 5.0

        def streams(self) -> bool:
            """Whether each epoch reads the whole transfer set's stream (not a growing pool)."""
            return self.distill_source == "dataset" and self.transfer_pool == "whole"

    def __init__(self, params, config):
        super().__init__(params, config)
        self._transfer: np.ndarray | None = None  # the transfer set's images, at the run's shape

    @classmethod
    def check_config(cls, config, params) -> None:
        super().check_config(config, params)

        if params.student_init == "average" and any(a != config.model for a in client_architectures(config)):
            raise RaysimError(
                "algorithm.student_init=average needs every client to have the server's model: "
                "use student_init=initial (or auto) with clients.models"
            )
        if params.distill_source == "dataset":
            cls.transfer_source(config, params)  # one clear line now, not after the client stage
        epochs = config.rounds // params.global_rounds - 1
        if params.streams() and 0 < params.transfer_steps < epochs:
            raise RaysimError(
                f"algorithm.transfer_steps={params.transfer_steps} gives some of the {epochs} distillation "
                f"epochs of a global round no step: set at least {epochs}, or 0 (one pass over the "
                "transfer set an epoch)"
            )

    @classmethod
    def extra_datasets(cls, config) -> list[tuple[str, str, str]]:
        if config.algorithm.params.distill_source != "dataset":
            return []
        return [(*cls.transfer_source(config, config.algorithm.params), KEYS)]

    @staticmethod
    def transfer_source(config, params) -> tuple[str, str]:
        return transfer_source(config, params.distill_dataset, params.distill_root, KEYS)

    def server_init(self, model, ctx):
        if self.params.distill_source == "dataset":
            self.transfer_images(ctx)  # a missing transfer set fails now, before the clients train
        return super().server_init(model, ctx)

    def after_client_stage(self, state, round_index, ctx):
        state = super().after_client_stage(state, round_index, ctx)
        homogeneous = not ctx.spec.heterogeneous
        if self.params.student_init == "average" or (self.params.student_init == "auto" and homogeneous):
            clients = sorted(state["clients"])
            state["weights"] = weighted_average(
                [state["clients"][k] for k in clients], [state["num_samples"][k] for k in clients]
            )
            state["kd_optimizer"] = None  # a new start: no optimiser state from an earlier round
        return {**state, "transfer_drawn": 0}

    def distillation_loss(self, state):
        return lambda student, teacher, y: distillation_loss(student, teacher, self.params.temperature)

    def epoch_steps(self, state, epoch: int) -> int:
        """With transfer_steps > 0: the batches of distillation epoch `epoch` (from 1), transfer_steps
        spread over the round's epochs (epochs added by extending a run get as many again)."""
        steps, epochs = self.params.transfer_steps, max(state["rounds_per_global"] - 1, 1)
        return steps * epoch // epochs - steps * (epoch - 1) // epochs

    def stream(self, start: int, count: int, size: int, global_round: int) -> np.ndarray:
        """Positions start .. start + count - 1 of the transfer stream: pass i // size is a shuffled
        order of the whole set of its own (seeded by the global round and the pass)."""
        positions = np.arange(start, start + count)
        passes = positions // size
        indices = np.empty(count, dtype=np.int64)
        for p in np.unique(passes):
            order = numpy_rng(self.config.seed, SERVER, "feddf", global_round, int(p)).permutation(size)
            here = passes == p
            indices[here] = order[positions[here] % size]
        return indices

    def new_images(self, state, teachers, student, ctx, round_index):
        p = self.params
        if p.streams():
            images = self.transfer_images(ctx)
            g, epoch = self.position(state, round_index)
            count = len(images) if p.transfer_steps == 0 else self.epoch_steps(state, epoch) * p.kd_batch
            drawn = state.get("transfer_drawn", 0)
            state["pool_x"] = images[self.stream(drawn, count, len(images), g)]
            state["pool_y"] = np.zeros(count, dtype=np.int64)  # unused: FedDF has no labels
            state["transfer_drawn"] = drawn + count
            state["pool_added"] = count
            return {"transfer_passes": state["transfer_drawn"] / len(images)}
        if p.distill_source == "dataset":
            images = self.transfer_images(ctx)
            drawn = state.get("transfer_drawn", 0)
            order = numpy_rng(self.config.seed, SERVER, "feddf").permutation(len(images))
            idx = order[np.arange(drawn, drawn + p.synthesis_batch) % len(images)]
            state["transfer_drawn"] = drawn + p.synthesis_batch
            result = SynthesisResult(images[idx], np.zeros(len(idx), dtype=np.int64), 0.0, 0.0)
        else:
            seed = derive_seed(self.config.seed, SERVER, round_index)
            generator = reset_generator(self.generator(ctx), seed).eval()
            z = torch.randn(p.synthesis_batch, p.nz, generator=torch.Generator().manual_seed(seed)).to(ctx.device)
            with torch.no_grad():
                pixels = generator(z)
            result = SynthesisResult(
                (pixels * 255).round().to(torch.uint8).cpu().numpy(),
                np.zeros(p.synthesis_batch, dtype=np.int64),  # unused: FedDF has no labels
                0.0,
                0.0,
            )
        state["pool_x"], state["pool_y"] = add_to_pool(state["pool_x"], state["pool_y"], result, p.pool_size)
        state["pool_added"] = len(result.targets)
        return {}

    def distill(self, state, round_index, epoch, ctx):
        state = super().distill(state, round_index, epoch, ctx)
        if self.params.streams():  # the next epoch reads the stream again: no images in the checkpoint
            state["pool_x"] = state["pool_y"] = None
        return state

    def transfer_images(self, ctx) -> np.ndarray:
        if self._transfer is None:
            name, root = self.transfer_source(self.config, self.params)
            self._transfer = load_transfer_images(
                name, root, ctx.spec.image_size, ctx.spec.in_channels, KEYS, self.config.dataset.verify
            )
        return self._transfer
