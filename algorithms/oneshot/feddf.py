"""FedDF (Lin et al., NeurIPS 2020) as a one-shot method: ensemble distillation on unlabelled data.

After the one-shot client stage (algorithms/oneshot/_common.py), the server model starts from the clients'
size-weighted average (FedDF's fusion starts from FedAvg; `student_init`) and each distillation
epoch takes one pass over an unlabelled pool on KL(softmax(A/T) || softmax(S/T)) against the
average of the client models' logits A (FedDF's AVGLOGITS, T = 1).

The unlabelled data (`distill_source`):
- `dataset` (default): real images of *another* dataset, as FedDF distils on (its code's commands:
  CIFAR-100 for CIFAR-10, downsampled ImageNet for CIFAR-100): `distill_dataset` (`auto`: the
  choice of algorithms/oneshot/transfer.py, e.g. MNIST for Fashion-MNIST) in `distill_root` (empty: beside
  `dataset.root`), at the run's size and channels. The pool grows by `synthesis_batch` of them
  each epoch, drawn without replacement in a seeded order, so that FedDF distils on as many
  images per epoch as the generator methods (FedDF's own code instead runs a fixed number of
  steps with early stopping on a validation split it holds out of the training data; here every
  method reports best, final and last-5 the same way).
- `generator`: images of a freshly initialised, untrained DENSE generator (`synthesis_batch` a
  epoch). They carry no information about the classes, so the server model stays near chance: a
  data-free lower bound.

As the authors' code runs the distillation (epfml/federated-learning-public-code, FedDF-code,
`noise_knowledge_transfer.py`): Adam at lr 1e-3 with a cosine schedule (here annealed over the
distillation epochs, there over its steps), gradient norms clipped at 5, T = 1, no T^2 factor
(equal at T = 1), KL averaged over the batch; the transfer images with the training augmentation
(crop + flip).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms.oneshot._common import DataFreeDistillation, OneShotParams
from raysim.algorithms.oneshot.datafree import SynthesisResult, add_to_pool
from raysim.algorithms.oneshot.generator import reset_generator
from raysim.algorithms.oneshot.losses import distillation_loss
from raysim.algorithms.oneshot.transfer import load_transfer_images, transfer_source
from raysim.errors import RaysimError
from raysim.seeding import SERVER, derive_seed, numpy_rng
from raysim.tensors import weighted_average

KEYS = "algorithm.distill_dataset/distill_root"


class FedDF(DataFreeDistillation):
    name = "feddf"
    summary = "FedDF: distil the average ensemble into the server model on unlabelled data"

    @dataclass
    class Params(OneShotParams):
        distill_source: str = "dataset"  # dataset | generator
        distill_dataset: str = "auto"  # with distill_source=dataset: its name (e.g. mnist), or auto ...
        distill_root: str = ""  # ... and folder ("" = beside dataset.root)
        student_init: str = "auto"  # average | initial | auto (average when every client has the server's model)
        temperature: float = 1.0
        kd_optimizer: str = "adam"
        kd_lr: float = 1e-3
        kd_schedule: str = "cosine"
        kd_grad_clip: float = 5.0

        def validate(self) -> None:
            super().validate()
            if self.distill_source not in ("generator", "dataset"):
                raise RaysimError(f"algorithm.distill_source must be dataset or generator, got '{self.distill_source}'")
            if self.student_init not in ("auto", "average", "initial"):
                raise RaysimError(f"algorithm.student_init must be auto, average or initial, got '{self.student_init}'")

    def __init__(self, params, config):
        super().__init__(params, config)
        self._transfer: np.ndarray | None = None  # the transfer set's images, at the run's shape

    @classmethod
    def check_config(cls, config, params) -> None:
        super().check_config(config, params)
        from raysim.config import client_architectures

        if params.student_init == "average" and any(a != config.model for a in client_architectures(config)):
            raise RaysimError(
                "algorithm.student_init=average needs every client to have the server's model: "
                "use student_init=initial (or auto) with clients.models"
            )
        if params.distill_source == "dataset":
            cls.transfer_source(config, params)  # one clear line now, not after the client stage

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

    def new_images(self, state, teachers, student, ctx, round_index):
        p = self.params
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

    def transfer_images(self, ctx) -> np.ndarray:
        if self._transfer is None:
            name, root = self.transfer_source(self.config, self.params)
            self._transfer = load_transfer_images(name, root, ctx.spec.image_size, ctx.spec.in_channels, KEYS)
        return self._transfer
