"""OT model fusion (Singh and Jaggi, NeurIPS 2020) as a one-shot method: align, then average.

After the one-shot client stage (algorithms/_oneshot.py), the server aligns every client model's
neurons, layer by layer, to an anchor model by optimal transport on their weights (data-free; with
equal widths and uniform marginals the transport plan is a permutation, raysim.fusion), and
takes the size-weighted average of the aligned models. The anchor is a parameter: by default the
client with the most data (the paper leaves it open; any client is a valid choice). It needs one
architecture made of plain conv/linear chains (cnn2, cnn3, lenet, mlp, convnet) and refuses
others with one line. Distillation rounds leave the fused model as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms._oneshot import OneShot, OneShotParams
from raysim.errors import RaysimError
from raysim.fusion import align_to, ot_fuse


class OTFusion(OneShot):
    name = "ot_fusion"
    summary = "OT fusion: align neurons to an anchor model by optimal transport, then average"
    supports_client_models = False

    @dataclass
    class Params(OneShotParams):
        anchor: int = -1  # client whose neurons the others are aligned to; -1: the client with the most data

    @classmethod
    def check_config(cls, config, params) -> None:
        super().check_config(config, params)
        if not -1 <= params.anchor < config.clients.num:
            raise RaysimError(
                f"algorithm.anchor={params.anchor} is not a client id (0..{config.clients.num - 1}): "
                "choose one, or -1 for the client with the most data"
            )

    @classmethod
    def check_models(cls, spec) -> None:
        model = spec.build("cpu")
        align_to(model, model)  # a model that is not a plain chain is refused here, before the client stage

    def after_client_stage(self, state, round_index, ctx):
        clients = sorted(state["clients"])
        anchor = self.params.anchor
        if anchor == -1:
            anchor = max(clients, key=lambda k: (state["num_samples"][k], -k))
        models = self.teachers(state, ctx)
        weights = ot_fuse(models, [state["num_samples"][k] for k in clients], anchor=clients.index(anchor))
        return {**state, "weights": weights, "report": {**state["report"], "ot_anchor": anchor}}
