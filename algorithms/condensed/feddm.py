"""FedDM (Xiong et al., CVPR 2023), the baseline FedAF improves on (FedAF paper, Sec. 5 and App. B).

Each round every client re-initialises its condensed set from real images and
matches, by distribution matching on features and logits, through models
sampled around the received global model: w = w_global + rho g / ||g||, a fresh
Gaussian direction g every step. The server trains the global model on the
union of the clients' condensed sets with cross-entropy: by default every client's latest set seen so
far (`server_sets: seen`; `round`: the round's participants' only; raysim.algorithms.condensed.condensation
says what the paper and the re-implementation do).
Defaults: FedAF's settings for FedDM (rho 5, image lr 1.0, image gradients clipped at
norm 2.0; 500 server epochs, batch 256, lr 0.001). FedAF's paper ran FedDM with its own
condensation code: SGD momentum 0.9 (App. A; DM's code uses 0.5) and initialisation from
class-wise averages of random real images (Sec. 5.1), so those are the defaults here (random weights
keep the averages distinct, see raysim.algorithms.condensed.synthetic.init_synthetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.algorithm import NonNegativeFloat
from raysim.algorithms.condensed.condensation import CondensedDataAlgorithm, Init, ServerSetsParams, frozen
from raysim.algorithms.condensed.match_models import perturb_model


class FedDM(CondensedDataAlgorithm):
    name = "feddm"
    summary = "FedDM: clients condense data by DM around the global model; server trains on the union"
    match_logits = True

    @dataclass(frozen=True)
    class Params(ServerSetsParams):
        image_momentum: float = 0.9
        init: Init = "average"
        rho: NonNegativeFloat = 5.0  # radius of the ball models are sampled on
        clip_grad: float = 2.0  # max norm of the image gradient (0: no clipping)

    def matching_model(self, payload, client, ctx, seed):
        net = frozen(ctx.model("match"))
        net.train()
        return perturb_model(net, payload["weights"], self.params.rho, torch.Generator().manual_seed(seed))

    def clip_image_grad(self, syn):
        if self.params.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_([syn], self.params.clip_grad)
