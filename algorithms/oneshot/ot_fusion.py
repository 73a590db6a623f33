"""OT model fusion (Singh and Jaggi, NeurIPS 2020) as a one-shot method: align, then average.

After the one-shot client stage (algorithms/oneshot/base.py), the server aligns every client model's
neurons, layer by layer, to an anchor model by optimal transport (with equal widths and uniform
marginals the transport plan is a permutation, raysim.algorithms.oneshot.fusion) and takes the size-weighted average
of the aligned models. `alignment` chooses what the transport compares:
- `activations` (default): each neuron's outputs on `activation_samples` (200) unlabelled images,
  as the authors' sample command for their MNIST models runs it (sidak/otfusion: `--geom-ensemble-
  type acts --act-num-samples 200 --prelu-acts --exact`). Their images come from the training set;
  a one-shot server holds none, so here they are another dataset's training images
  (`activation_dataset`, `activation_root`: as FedDF's transfer set, algorithms/oneshot/transfer.py).
- `weights`: the neurons' incoming weights (their `wts`, data-free). With the family's default
  `client_init: shared` every client starts from the same initial weights (their code's default for
  data-separated models too), and after local training the cheapest assignment is then the
  identity, so this variant is FedAvg one-shot to the digit; with activations the assignment can
  differ, and OT with it.
`client_init: independent` (algorithms/oneshot/base.py) starts each client from weights of its
own, as the paper's models are trained from different seeds (their code's `torch.manual_seed(i)`
per model; `--diff-init` for data-separated ones): averaging without alignment (FedAvg one-shot) is
then expected to fail, and alignment does the work: weight-based OT then permutes neurons (tested).
The default stays `shared`: on the two 2-core cells neither setting puts OT fusion on the paper's
side of FedAvg one-shot in both (experiments/oneshot/README.md), and one client stage serves every method.
The anchor is a parameter: by default the client with the most data (the paper leaves it open; any
client is a valid choice). It needs one architecture made of plain conv/linear chains (cnn2, cnn3,
lenet, mlp, convnet) and refuses others with one line. Distillation rounds leave the fused model
as it is; summary.json's `ot_identity_layers` says, per client, how many hidden layers kept their
order (the identity assignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from raysim.algorithm import PositiveInt
from raysim.algorithms.oneshot.base import OneShot, OneShotParams
from raysim.algorithms.oneshot.fusion import align_to, ot_fuse
from raysim.algorithms.oneshot.transfer import load_transfer_images, transfer_source
from raysim.errors import RaysimError
from raysim.seeding import SERVER, numpy_rng

KEYS = "algorithm.activation_dataset/activation_root"


class OTFusion(OneShot):
    name = "ot_fusion"
    summary = "OT fusion: align neurons to an anchor model by optimal transport, then average"
    supports_client_models = False

    @dataclass(frozen=True)
    class Params(OneShotParams):
        anchor: int = -1  # client whose neurons the others are aligned to; -1: the client with the most data
        alignment: Literal["activations", "weights"] = "activations"
        activation_samples: PositiveInt = 200
        activation_dataset: str = "auto"  # unlabelled images for the activations (algorithms/oneshot/transfer.py) ...
        activation_root: str = ""  # ... and their folder ("" = beside the dataset's folder)

    @classmethod
    def check_config(cls, config, params) -> None:
        super().check_config(config, params)
        if not -1 <= params.anchor < config.clients.num:
            raise RaysimError(
                f"algorithm.anchor={params.anchor} is not a client id (0..{config.clients.num - 1}): "
                "choose one, or -1 for the client with the most data"
            )
        if params.alignment == "activations":
            transfer_source(config, params.activation_dataset, params.activation_root, KEYS)

    @classmethod
    def extra_datasets(cls, config) -> list[tuple[str, str, str]]:
        p = config.algorithm.params
        if p.alignment != "activations":
            return []
        return [(*transfer_source(config, p.activation_dataset, p.activation_root, KEYS), KEYS)]

    @classmethod
    def check_models(cls, spec) -> None:
        model = spec.build("cpu")
        align_to(model, model)  # a model that is not a plain chain is refused here, before the client stage

    def server_init(self, model, ctx):
        if self.params.alignment == "activations":
            self.activation_inputs(ctx)  # missing images fail now, before the clients train
        return super().server_init(model, ctx)

    def activation_inputs(self, ctx) -> torch.Tensor:
        """`activation_samples` of the unlabelled images, drawn once (seeded), as model inputs."""
        p = self.params
        name, root = transfer_source(self.config, p.activation_dataset, p.activation_root, KEYS)
        images = load_transfer_images(
            name, root, ctx.spec.image_size, ctx.spec.in_channels, KEYS, self.config.dataset.verify
        )
        pick = numpy_rng(self.config.seed, SERVER, "ot_activations").permutation(len(images))[: p.activation_samples]
        pixels = torch.from_numpy(images[np.sort(pick)]).to(ctx.device).float() / 255.0
        mean = torch.as_tensor(ctx.mean, dtype=torch.float32, device=ctx.device).view(1, -1, 1, 1)
        std = torch.as_tensor(ctx.std, dtype=torch.float32, device=ctx.device).view(1, -1, 1, 1)
        return (pixels - mean) / std

    def after_client_stage(self, state, round_index, ctx):
        clients = sorted(state["clients"])
        anchor = self.params.anchor
        if anchor == -1:
            anchor = max(clients, key=lambda k: (state["num_samples"][k], -k))
        models = self.teachers(state, ctx)
        inputs = self.activation_inputs(ctx) if self.params.alignment == "activations" else None
        position = clients.index(anchor)
        weights = ot_fuse(models, [state["num_samples"][k] for k in clients], anchor=position, inputs=inputs)
        identity = {}
        for k, model in zip(clients, models):  # how many hidden layers kept their order
            aligned, own = align_to(model, models[position], inputs), model.state_dict()
            layers = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
            identity[str(k)] = sum(  # a hidden layer's bias moves with its own neurons only
                torch.equal(aligned[f"{n}.bias"], own[f"{n}.bias"]) for n in layers[:-1] if f"{n}.bias" in own
            )
        report = {**state["report"], "ot_anchor": anchor, "ot_identity_layers": identity}
        return {**state, "weights": weights, "report": report}
