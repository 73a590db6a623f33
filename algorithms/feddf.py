"""FedDF (Lin et al., NeurIPS 2020) as a one-shot method: ensemble distillation on unlabelled data.

After the one-shot client stage (algorithms/_oneshot.py), each distillation epoch the server model
takes one pass over the unlabelled pool on KL(softmax(A/T) || softmax(S/T)) T^2 against the
average of the client models' logits A (FedDF's AVGLOGITS, T = 1).

Which unlabelled data: FedDF used other datasets (CIFAR-100 for CIFAR-10) or a pretrained
generator; FedHydra's paper does not say which it gave FedDF. `distill_source` chooses:
- `generator` (default): each epoch adds `synthesis_batch` images of a freshly initialised,
  untrained DENSE generator to the pool. FedDF then stays data-free like the methods it is
  compared with, and differs from DENSE exactly by DENSE's training of the generator; no data
  set beyond the clients' is needed, so the shipped configs run on any dataset;
- `dataset`: the training images of another dataset, `distill_dataset` at `distill_root` (same image
  size and channels, e.g. MNIST for Fashion-MNIST), labels ignored; `pool_size` (if > 0) images
  drawn once, otherwise all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from algorithms._oneshot import DataFreeDistillation, OneShotParams
from raysim.errors import RaysimError
from raysim.seeding import SERVER, derive_seed, numpy_rng
from raysim.synthesis.datafree import SynthesisResult, add_to_pool
from raysim.synthesis.generator import reset_generator
from raysim.synthesis.losses import distillation_loss


class FedDF(DataFreeDistillation):
    name = "feddf"
    summary = "FedDF: distil the average ensemble into the server model on unlabelled data"

    @dataclass
    class Params(OneShotParams):
        distill_source: str = "generator"  # generator | dataset
        distill_dataset: str = ""  # with distill_source=dataset: its name (e.g. mnist) ...
        distill_root: str = ""  # ... and folder
        temperature: float = 1.0

        def validate(self) -> None:
            super().validate()
            if self.distill_source not in ("generator", "dataset"):
                raise RaysimError(f"algorithm.distill_source must be generator or dataset, got '{self.distill_source}'")
            if self.distill_source == "dataset" and not (self.distill_dataset and self.distill_root):
                raise RaysimError(
                    "algorithm.distill_source=dataset needs algorithm.distill_dataset (e.g. mnist) "
                    "and algorithm.distill_root (its folder)"
                )

    def distillation_loss(self, state):
        return lambda student, teacher, y: distillation_loss(student, teacher, self.params.temperature)

    def new_images(self, state, teachers, student, ctx, round_index):
        p = self.params
        if p.distill_source == "dataset":
            if state["pool_x"] is None:
                state["pool_x"] = self.dataset_images(ctx)
                state["pool_y"] = np.zeros(len(state["pool_x"]), dtype=np.int64)  # unused: FedDF has no labels
            return {}
        seed = derive_seed(self.config.seed, SERVER, round_index)
        generator = reset_generator(self.generator(ctx), seed).eval()
        z = torch.randn(p.synthesis_batch, p.nz, generator=torch.Generator().manual_seed(seed)).to(ctx.device)
        with torch.no_grad():
            pixels = generator(z)
        result = SynthesisResult(
            (pixels * 255).round().to(torch.uint8).cpu().numpy(), np.zeros(p.synthesis_batch, dtype=np.int64), 0.0, 0.0
        )
        state["pool_x"], state["pool_y"] = add_to_pool(state["pool_x"], state["pool_y"], result, p.pool_size)
        return {}

    def dataset_images(self, ctx) -> np.ndarray:
        from raysim.data import load_dataset

        p = self.params
        data = load_dataset(p.distill_dataset, p.distill_root, None)
        x = np.asarray(data.train_x)  # (N, H, W, C) uint8
        spec = ctx.spec
        if x.shape[1:] != (spec.image_size, spec.image_size, spec.in_channels):
            raise RaysimError(
                f"algorithm.distill_dataset={p.distill_dataset} has images of shape {x.shape[1:]}, "
                f"the run's are {(spec.image_size, spec.image_size, spec.in_channels)}: choose a dataset "
                "of the same size and channels"
            )
        if p.pool_size and p.pool_size < len(x):
            x = x[np.sort(numpy_rng(self.config.seed, SERVER, "feddf").choice(len(x), p.pool_size, replace=False))]
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
