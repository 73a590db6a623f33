"""What FedDM and FedAF share: clients condense their data by distribution matching and upload the
condensed sets; the server trains the global model on the union of them.

Subclasses choose the model that each condensation step matches through
(`matching_model`), add loss terms (`extra_condensation_loss`, `server_extra_loss`)
and decide whether a client's set persists between rounds (`initial_set`).
When a subclass adds a condensation term, every GRAD_RATIO_EVERY steps the client measures
the norm of that term's gradient on the images against the DM term's, and logs the mean ratio
as `<extra_loss_name>_dm_grad_ratio` (metrics.parquet, per client and round): it tells whether
the term's weight gives it any say at all.

Bytes are what travels: the engine measures each reply serialised (raysim.tensors.serialized_nbytes),
so `quantize_uint8` (uint8 pixels, 1 byte per pixel and channel) or float32 images (4 bytes) decides
the images' bytes, for FedDM, FedAF and DCFL alike. (FedAF's Appendix C counts images at one byte per
pixel whatever is sent; raysim counted so until issue 76, also for float32 transport.)

The server's sets (`server_sets`, FedDM and FedAF): which condensed sets the server trains on in a round.
  seen   (default) the latest set of every client seen so far, kept in the server state: a client's
         newer set replaces its older one (FedAF's clients refine theirs; FedDM's re-condense);
  round  only the sets of the round's participants (raysim before issue 76; stored configs without
         the key read as `round`).
What the papers and code do: FedDM's paper trains the global model on the union of the synthetic sets
its clients uploaded; no official code exists, and the widely copied re-implementation
(m13891290332/fedDM, `server/fedDMserver.py`) concatenates the sets received in the round, with
join_ratio 1.0: every client takes part in every round, so the round's sets are every client's latest.
FedAF's eq. 14 trains on S = union_k S_k over the clients, in experiments with full participation
(10 clients; the author's NIID-Bench fork); its code is not released. So with full participation
`seen` and `round` coincide (tested to the digit). Under partial participation `round` trains the
global model, for server_epochs epochs from its current weights (nothing is aggregated), on the few
sets of the round alone, so it drifts towards the classes those clients hold and forgets the others
from round to round; `seen` keeps training on what every client ever sent, which the server already
holds and which costs no communication: the union of the papers' eq. 14 as near as partial
participation allows. FedAF's server knowledge (the class-wise means V and soft labels R of eq. 8 and 12,
CDC's target and LGKM's R) is averaged over the same clients whose sets the server trains on: each
client's latest V_k and R_k, kept with its set (`seen`), or the round's (`round`). The server logs
`server_images` and `server_clients`, the images and clients it trained on that round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from raysim.algorithm import Algorithm, ClientData, Context, NonNegativeInt, PositiveInt, Reply, added_param
from raysim.algorithms.condensed.dsa import DSA
from raysim.algorithms.condensed.matching import ClassMeans, class_means, distribution_distance, real_batch_indices
from raysim.algorithms.condensed.synthetic import (
    as_images,
    init_synthetic,
    quantize,
    set_labels,
    to_pixels,
    train_on_synthetic,
)
from raysim.bench.cell import bench_work
from raysim.seeding import SERVER, torch_generator
from raysim.tensors import load_weights, module_weights

PREVIEW_PER_CLASS = 10  # condensed images per class kept for the TensorBoard grid
GRAD_RATIO_EVERY = 10  # condensation steps between two measurements of the extra term's gradient share


Init = Literal["real", "average", "noise"]  # the condensed images' start: real images, class averages, noise


@dataclass(frozen=True)
class CondensationParams:
    ipc: PositiveInt = 50  # condensed images per class
    steps: PositiveInt = 1000  # condensation iterations per round
    image_lr: float = 1.0
    image_momentum: float = 0.9
    real_batch: PositiveInt = 256  # real images per class per step
    init: Init = "real"
    init_average_of: PositiveInt = 10  # images averaged per initial image (init=average)
    dsa: bool = True  # differentiable siamese augmentation while matching
    # All classes in one forward pass. false = DM's per-class loop (~1.7x faster on 2 CPU cores, see
    # `raysim bench condense`), which with batch norm normalises each class on its own and so removes
    # the class means DM matches: on CIFAR-10 it condensed worse sets (round-1 accuracy .33 vs .36).
    dm_batched: bool = True
    server_epochs: NonNegativeInt = 500
    server_batch: PositiveInt = 256
    server_lr: float = 0.001
    server_momentum: float = 0.9
    server_dsa: bool = True  # augment condensed images while the server trains on them
    # The images' transport width, and so their bytes (the engine measures what is sent): true sends
    # uint8 pixels (1 byte per pixel and channel), false float32 normalised images (4 bytes).
    quantize_uint8: bool = False


@dataclass(frozen=True)
class ServerSetsParams(CondensationParams):
    """FedDM's and FedAF's parameters: the condensation's and which sets the server trains on."""

    # seen: the latest set of every client seen so far; round: only the round's participants' sets
    # (module docstring; configs made before the key read as round)
    server_sets: Literal["seen", "round"] = added_param("seen", before="round", since=2)


def train_server_model(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    params: CondensationParams,
    generator: torch.Generator,
    extra_loss=None,
) -> float:
    """The server's training on received condensed sets, with `params`' server settings; DSA drawn per
    image (the DSA authors' seed=-1)."""
    return train_on_synthetic(
        model,
        x,
        y,
        params.server_epochs,
        params.server_batch,
        params.server_lr,
        params.server_momentum,
        generator,
        augment=DSA(per_image=True) if params.server_dsa else None,
        extra_loss=extra_loss,
    )


def gradient_ratio(extra: torch.Tensor, dm: torch.Tensor, syn: torch.Tensor) -> float:
    """||d extra / d syn|| / ||d dm / d syn||, leaving both graphs for the step's backward pass."""
    (g_extra,) = torch.autograd.grad(extra, syn, retain_graph=True)
    (g_dm,) = torch.autograd.grad(dm, syn, retain_graph=True)
    return float(g_extra.norm() / g_dm.norm().clamp_min(1e-12))


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@bench_work(keys={"algorithm.steps": "clients", "algorithm.server_epochs": "server"})
class CondensedDataAlgorithm(Algorithm):
    match_logits = False  # DM on logits too (FedDM)
    extra_loss_name = "extra"  # names the gradient-ratio metric of `extra_condensation_loss`

    # ------------------------------------------------------------- client
    def client_update(self, payload: dict[str, Any], client: ClientData, ctx: Context) -> dict[str, Any]:
        p = self.params
        started = time.perf_counter()
        classes = [c for c in range(ctx.num_classes) if client.label_counts[c] > 0]
        real = [client.x[client.y == c] for c in classes]
        message = self.before_condensation(payload, client, ctx, classes, real)
        syn = self.initial_set(client, classes, real, ctx).requires_grad_(True)
        optimizer = torch.optim.SGD([syn], lr=p.image_lr, momentum=p.image_momentum)
        augment = DSA() if p.dsa else None
        g = client.generator
        ratios = []
        for step in range(p.steps):
            seed = int(torch.randint(2**31 - 1, (1,), generator=g))
            net = self.matching_model(payload, client, ctx, seed)
            batch = [r[real_batch_indices(len(r), p.real_batch, g).to(r.device)] for r in real]
            means = class_means(net, batch, list(syn), augment, seed, logits=self.match_logits, batched=p.dm_batched)
            dm = distribution_distance(means, self.match_logits)
            extra = self.extra_condensation_loss(payload, means, syn, classes, seed, ctx)
            if step % GRAD_RATIO_EVERY == 0 and torch.is_tensor(extra) and extra.requires_grad:
                ratios.append(gradient_ratio(extra, dm, syn))
            loss = dm + extra
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.clip_image_grad(syn)
            optimizer.step()
        if ratios:
            client.metrics[f"{self.extra_loss_name}_dm_grad_ratio"] = float(np.mean(ratios))
        client.metrics["condense_loss"] = float(loss.detach())
        client.metrics["time_condense_s"] = time.perf_counter() - started
        self.after_condensation(syn.detach(), client, classes)
        flat = syn.detach().reshape(-1, *syn.shape[2:])
        images = quantize(flat, ctx.mean, ctx.std) if p.quantize_uint8 else flat.cpu().numpy().astype(np.float32)
        message.update({"classes": np.asarray(classes, dtype=np.int64), "images": images})
        return message

    def initial_set(self, client: ClientData, classes, real, ctx) -> torch.Tensor:
        """(len(classes), ipc, C, H, W) starting images."""
        p = self.params
        return torch.stack([init_synthetic(r, p.ipc, client.generator, p.init, p.init_average_of) for r in real])

    def before_condensation(self, payload, client, ctx, classes, real) -> dict[str, Any]:
        return {}

    def after_condensation(self, syn: torch.Tensor, client: ClientData, classes: list[int]) -> None:
        pass

    def matching_model(self, payload, client, ctx, seed: int) -> torch.nn.Module:
        raise NotImplementedError

    def extra_condensation_loss(
        self, payload, means: ClassMeans, syn: torch.Tensor, classes, seed: int, ctx: Context
    ) -> torch.Tensor | float:
        """Terms added to the DM loss of a step (`means`: that step's class means; `syn`: the images,
        (len(classes), ipc, C, H, W))."""
        return 0.0

    def clip_image_grad(self, syn: torch.Tensor) -> None:
        pass

    # ------------------------------------------------------------- server
    knowledge_keys: tuple[str, ...] = ()  # reply entries the server keeps with a client's set (FedAF: V_k, R_k)

    def server_init(self, model, ctx):
        state = {"weights": module_weights(model)}
        if self.params.server_sets == "seen":
            state["sets"] = {}  # client -> its latest set (and knowledge_keys)
        return state

    def broadcast(self, state, round_index, participants):
        return {"weights": state["weights"]}

    def training_sets(self, state: dict[str, Any], replies: list[Reply]) -> list[dict[str, Any]]:
        """The sets the server trains on this round, in client order (module docstring, `server_sets`):
        the replies' (`round`), or every seen client's latest, the replies' replacing older ones in
        state["sets"] (`seen`). Each: images, classes and `knowledge_keys`."""
        keys = ("images", "classes", *self.knowledge_keys)
        new = {r.client: {k: np.array(r.message[k]) for k in keys} for r in replies}  # copies, not store views
        if self.params.server_sets == "round":
            return [new[k] for k in sorted(new)]
        state["sets"] = {**state.get("sets", {}), **new}
        return [state["sets"][k] for k in sorted(state["sets"])]

    def gather(self, sets: list[dict[str, Any]], ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        """The union of the condensed sets as normalised images and labels, in the given order."""
        xs, ys = [], []
        for s in sets:
            x = as_images(s["images"], ctx.mean, ctx.std, ctx.device)
            xs.append(x)
            ys.append(torch.from_numpy(set_labels(s["classes"], len(x))).to(ctx.device))
        return torch.cat(xs), torch.cat(ys)

    def server_update(self, state, replies, round_index, ctx):
        state = dict(state)
        sets = self.training_sets(state, replies)
        state = self.aggregate_knowledge(state, sets, ctx)
        x, y = self.gather(sets, ctx)
        ctx.log.scalar("server_images", len(x))
        ctx.log.scalar("server_clients", len(sets))
        model = ctx.model("server")
        load_weights(model, state["weights"])
        train_server_model(
            model,
            x,
            y,
            self.params,
            torch_generator(self.config.seed, SERVER, round_index),
            extra_loss=self.server_extra_loss(state, ctx),
        )
        state["weights"] = module_weights(model)
        ctx.log.image_grid(
            "condensed/images_per_class", to_pixels(self.preview(x, y, ctx), ctx.mean, ctx.std), PREVIEW_PER_CLASS
        )
        return state

    def aggregate_knowledge(self, state, sets: list[dict[str, Any]], ctx):
        """The server's knowledge from the same sets it trains on (FedAF's V and R)."""
        return state

    def server_extra_loss(self, state, ctx):
        return None

    def preview(self, x: torch.Tensor, y: torch.Tensor, ctx: Context) -> np.ndarray:
        """Up to PREVIEW_PER_CLASS condensed images of every class present, as uint8, class by class."""
        rows = []
        for c in torch.unique(y).tolist():
            xc = x[y == c][:PREVIEW_PER_CLASS]
            pad = PREVIEW_PER_CLASS - len(xc)
            pixels = quantize(xc, ctx.mean, ctx.std)
            if pad:
                pixels = np.concatenate([pixels, np.zeros((pad, *pixels.shape[1:]), np.uint8)])
            rows.append(pixels)
        return np.concatenate(rows)
