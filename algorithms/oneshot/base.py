"""What the one-shot methods (FedAvg one-shot, OT fusion, FedDF, DENSE, Co-Boosting, FedHydra) share.

**Rounds.** A global round is one client round followed by server-only rounds, one per
distillation epoch, so the engine evaluates, checkpoints and resumes after every epoch and
metrics.parquet holds the server model's accuracy per distillation epoch. With
`global_rounds` = T (the paper's Table 5), `rounds` is split evenly: each global round has
rounds / T engine rounds, the first of them the client round (rounds: 201 with T = 1 is one
client stage and 200 distillation epochs). Methods without distillation (FedAvg one-shot, OT
fusion) leave the server-only rounds' model unchanged.

**Client stage.** Every client trains its own architecture for `local.epochs` epochs (the paper:
200, SGD lr 0.01, batch 128) from its first weights (`client_init`) and uploads the model once.
In later global rounds (T > 1) a client restarts from the server's model when it has the server's
architecture (the paper's multi-round variant, homogeneous models); a client with an architecture
of its own continues from its previous model (kept as client state); the paper does not say.
The first client stage does not depend on the method, so it is cached on disk
(`cache_client_stage`, raysim.algorithms.oneshot.client_cache) and reused by every method run on the same data,
partition, models, local settings and seed; the numbers are identical with and without the cache
(tested). A cache hit makes the client round server-only; its bytes are counted as the stage's
upload and broadcast (`ServerLog.replayed_traffic`), so a run's bytes do not depend on the cache
either, and summary.json says `client_stage_cached: true` (its seconds are the server's only).

**Initialisation** (`client_init`): `shared` (default) starts every client of an architecture from
that architecture's initial weights (ModelSpec.initial_model; the server's for the server's
architecture); `independent` starts each client from weights of its own, drawn from the run's seed
and the client id alone (`OneShot.initial_weights`: the same whatever actor trains it and however
many actors there are), for every architecture (clients.models included). `independent` is the
setting of OT fusion's paper (Singh and Jaggi, NeurIPS 2020), whose models are trained from
different seeds: there the neurons of two models need not correspond, so averaging their weights
(FedAvg one-shot) is expected to fail, and aligning the neurons first is what OT fusion is for.
With one shared initialisation the trained models' neurons still correspond (weight-based OT keeps
every neuron where it is, tested). It sets the first client stage only (later ones restart as
above) and is part of the cache key; it is a setting of the shared client stage, not of one method.

**Reports** (the client round): each client model's own test accuracy (`own_accuracy` per client in
metrics.parquet; `client_accuracy` and `best_client_accuracy` in summary.json) and the average-logit
ensemble's (`ensemble_accuracy`).

**Each method as its authors' code runs it.** The keys are shared, so one config runs all six, but
each method's defaults are its own code's where the code decides something: the distillation
optimiser and its learning rate, schedule and gradient clipping (`kd_*`), the augmentation in each
phase (`synthesis_augment`, `distill_augment`: `auto` is the method's code on the run's dataset),
the loss weights and reductions (each module's docstring says which, and what the paper says
where it differs). A config that sets one of these keys sets it for every method it runs.

**Choices where the papers are silent**, all parameters: the image pool is cleared at each client
round (new teachers label differently), `pool_size` 0 keeps every image as the authors' code does,
the optimiser's state is kept across the epochs of a global round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from raysim.algorithm import (
    Algorithm,
    ClientData,
    Context,
    ModelSpec,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Reply,
    own_default,
)
from raysim.algorithms.oneshot import client_cache
from raysim.algorithms.oneshot.augment import AUGMENTATIONS
from raysim.algorithms.oneshot.datafree import add_to_pool, distill_epoch, synthesize
from raysim.algorithms.oneshot.ensemble import mean_logits
from raysim.algorithms.oneshot.generator import Generator
from raysim.bench.cell import bench_work
from raysim.config import ModelConfig
from raysim.errors import RaysimError
from raysim.macs import paused
from raysim.seeding import MODEL_INIT, SERVER, derive_seed, torch_generator
from raysim.tensors import load_weights, module_weights, serialized_nbytes
from raysim.training import local_train, to_cpu

# what the ensemble and the student see of synthetic (or transfer) images: an augmentation, or auto
Augment = Literal[(*AUGMENTATIONS, "auto")]
KDOptimizer = Literal["sgd", "adam"]
KDSchedule = Literal["constant", "cosine"]  # cosine: annealed to 0 over a global round's epochs


@dataclass(frozen=True)
class OneShotParams:
    """Keys every one-shot method takes, so that one config runs all six by changing algorithm.name.
    A method with a distillation KL (DENSE, Co-Boosting, FedDF, FedHydra) adds its `temperature` (> 0)."""

    global_rounds: PositiveInt = 1  # T (Table 5): client rounds, each followed by its distillation epochs
    cache_client_stage: bool = True  # reuse the first client stage across methods (client_cache)
    # the clients' first weights: shared (one initialisation per architecture) or independent (each
    # client's own, from the seed and its id: the OT fusion paper's models); a key of the client stage
    client_init: Literal["shared", "independent"] = "shared"
    # the generator (DENSE, Co-Boosting, FedHydra; FedDF's `generator` source)
    nz: PositiveInt = 256
    ngf: PositiveInt = 64
    generator_steps: NonNegativeInt = 30  # T_G: generator steps per synthesis
    generator_lr: PositiveFloat = own_default(1e-3)
    synthesis_batch: PositiveInt = 256  # images per synthesis (one synthesis per distillation epoch)
    pool_size: NonNegativeInt = 0  # newest images kept in the pool; 0 keeps all (the authors)
    stratify_steps: int = 20  # FedHydra's model stratification: generator steps per (client, class) ...
    stratify_batch: int = 256  # ... and its batch (the authors' code)
    # augmentation of synthetic (or transfer) images: crop_flip | flip | none, or auto: as the
    # method's authors' code does on this dataset (each method's docstring); `augment: false` turns
    # every augmentation off (FedHydra's stratification included)
    augment: bool = True
    synthesis_augment: Augment = own_default("auto")  # what the ensemble and the student see while the generator trains
    distill_augment: Augment = own_default("auto")  # what they see of the pool during distillation
    generator_grad_clip: NonNegativeFloat = own_default(0.0)  # > 0: the generator's gradient norm is clipped to it
    # distillation into the server model
    kd_batch: PositiveInt = 256
    kd_optimizer: KDOptimizer = own_default("sgd")
    kd_lr: PositiveFloat = own_default(0.01)
    kd_momentum: float = own_default(0.9)  # sgd only
    kd_weight_decay: NonNegativeFloat = own_default(0.0)
    kd_schedule: KDSchedule = own_default("constant")
    kd_grad_clip: NonNegativeFloat = own_default(0.0)  # > 0: the student's gradient norm is clipped to it


# raysim bench cell: the client stage is the clients' work (each bench run trains its own, not the
# cached one); the distillation epochs are rounds, which the bench never cuts
@bench_work(overrides={"algorithm.cache_client_stage": False})
class OneShot(Algorithm):
    """The client stage, the round schedule and the reports; subclasses say what the server does
    with the uploaded models (`after_client_stage`) and in each distillation epoch (`distill`)."""

    supports_client_models = True
    needs_data_digest = True
    Params = OneShotParams

    def __init__(self, params, config):
        super().__init__(params, config)
        self._teachers: list[torch.nn.Module] | None = None  # built from the state on first use, per client round
        self._test_logits: torch.Tensor | None = None  # the teachers' test-set logits, likewise
        self._generator: Generator | None = None
        self._cached_clients = None  # the client stage read from the cache by select_clients, for server_update

    @classmethod
    def check_config(cls, config, params) -> None:
        if config.rounds % params.global_rounds:
            suggested = params.global_rounds * (config.rounds // params.global_rounds + 1)
            raise RaysimError(
                f"rounds={config.rounds} must be a multiple of algorithm.global_rounds="
                f"{params.global_rounds} (each global round is one client round plus its "
                f"distillation epochs): e.g. rounds={suggested}"
            )

    # ------------------------------------------------------------- schedule
    def position(self, state: dict[str, Any], round_index: int) -> tuple[int, int]:
        """(global round from 1, distillation epoch within it; 0 = the client round). Rounds added
        by extending a finished run (--resume rounds=...) are more epochs of the last global round."""
        per = state["rounds_per_global"]
        g = min((round_index - 1) // per, self.params.global_rounds - 1)
        return g + 1, round_index - 1 - g * per

    # ------------------------------------------------------------- server
    def server_init(self, model: torch.nn.Module, ctx: Context) -> dict[str, Any]:
        return {
            "weights": module_weights(model),
            "clients": {},
            "num_samples": {},
            "report": {},
            "rounds_per_global": self.config.rounds // self.params.global_rounds,
        }

    def cache_key(self, ctx: Context) -> str | None:
        if not self.params.cache_client_stage or ctx.data_digest is None:
            return None
        return client_cache.client_stage_key(self.config, ctx.data_digest, ctx.mean, ctx.std)

    def expected_entry(self, ctx: Context) -> client_cache.Expected:
        """What this run's client stage yields: each client's tensor shapes and sample count."""
        shapes, by_arch = {}, {}
        for k in range(self.config.clients.num):
            arch = ctx.spec.client_architecture(k)
            if arch.describe() not in by_arch:
                weights = module_weights(ctx.model("cache_check", arch))
                by_arch[arch.describe()] = {name: tuple(a.shape) for name, a in weights.items()}
            shapes[k] = by_arch[arch.describe()]
        counts = ctx.label_counts
        sizes = None if counts is None else {k: int(n) for k, n in enumerate(np.asarray(counts).sum(1))}
        return client_cache.Expected(shapes, sizes)

    def select_clients(self, state, round_index, rng, ctx) -> list[int]:
        g, epoch = self.position(state, round_index)
        if epoch:
            return []
        key = self.cache_key(ctx) if g == 1 else None
        # an unreadable entry, or one that is not this run's clients, is a miss
        self._cached_clients = client_cache.load(key, self.expected_entry(ctx)) if key is not None else None
        return [] if self._cached_clients is not None else list(range(self.config.clients.num))

    def broadcast(self, state, round_index, participants):
        g, _ = self.position(state, round_index)
        return {} if g == 1 else {"weights": state["weights"]}

    def server_update(self, state, replies: list[Reply], round_index: int, ctx: Context):
        g, epoch = self.position(state, round_index)
        if epoch:
            return self.distill(state, round_index, epoch, ctx)
        state = {**state, **self.collect_clients(replies, g, ctx)}
        if state["client_stage_cached"]:  # the stage's bytes as if it had run (the broadcast is {} then)
            for k, weights in state["clients"].items():
                message = {"weights": weights}
                up = self.upload_bytes(message)
                ctx.log.replayed_traffic(k, serialized_nbytes(message) if up is None else up, serialized_nbytes({}))
        self._teachers = self._test_logits = None
        state["report"] = {**state["report"], **self.report_clients(state, ctx)}
        return self.after_client_stage(state, round_index, ctx)

    def collect_clients(self, replies: list[Reply], g: int, ctx: Context) -> dict[str, Any]:
        key = self.cache_key(ctx) if g == 1 else None
        if replies:
            weights = {r.client: r.message["weights"] for r in replies}
            sizes = {r.client: r.num_samples for r in replies}
            if key is not None:
                client_cache.save(key, weights, sizes)
            return {"clients": weights, "num_samples": sizes, "client_stage_cached": False}
        weights, sizes = self._cached_clients
        self._cached_clients = None
        return {"clients": weights, "num_samples": sizes, "client_stage_cached": True}

    def teachers(self, state: dict[str, Any], ctx: Context) -> list[torch.nn.Module]:
        """The client models, in client order, in eval mode and without gradients."""
        if self._teachers is None:
            models = []
            for k in sorted(state["clients"]):
                model = ctx.model(f"client{k}", ctx.spec.client_architecture(k))
                load_weights(model, state["clients"][k])
                models.append(model.eval().requires_grad_(False))
            self._teachers = models
        return self._teachers

    def stacked_logits(self, teachers: list[torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
        return torch.stack([t(x) for t in teachers])

    def test_logits(self, teachers: list[torch.nn.Module], ctx: Context) -> torch.Tensor:
        """(K, test images, classes): every teacher's test-set logits, computed once per client round
        for the client, ensemble and stratified accuracies (K forward passes, not one per report)."""
        if self._test_logits is None:
            batch = self.config.eval.batch_size
            with torch.no_grad(), paused():  # a reading, not the method's work (raysim.macs)
                self._test_logits = torch.cat(
                    [
                        self.stacked_logits(teachers, ctx.test_x[start : start + batch])
                        for start in range(0, len(ctx.test_y), batch)
                    ],
                    dim=1,
                )
        return self._test_logits

    def report_clients(self, state: dict[str, Any], ctx: Context) -> dict[str, Any]:
        teachers = self.teachers(state, ctx)
        logits = self.test_logits(teachers, ctx)
        accuracy = {}
        for k, own in zip(sorted(state["clients"]), logits):
            accuracy[k] = int((own.argmax(1) == ctx.test_y).sum()) / len(ctx.test_y)
            ctx.log.client_value(k, "own_accuracy", accuracy[k])
        ensemble = self.ensemble_accuracy(teachers, ctx, lambda logits, _: mean_logits(logits))
        ctx.log.scalar("ensemble_accuracy", ensemble)
        return {
            "client_accuracy": accuracy,
            "best_client_accuracy": max(accuracy.values()),
            "ensemble_accuracy": ensemble,
        }

    def ensemble_accuracy(
        self, teachers, ctx: Context, combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> float:
        """Test accuracy of `combine(logits (K, B, C), labels (B,)) -> (B, C)`; a combiner may read the
        labels (FedHydra's SA given each image's true class as its target)."""
        logits = self.test_logits(teachers, ctx)
        batch = self.config.eval.batch_size
        correct = 0
        for start in range(0, len(ctx.test_y), batch):
            labels = ctx.test_y[start : start + batch]
            correct += int((combine(logits[:, start : start + batch], labels).argmax(1) == labels).sum())
        return correct / len(ctx.test_y)

    def after_client_stage(self, state: dict[str, Any], round_index: int, ctx: Context) -> dict[str, Any]:
        """What the server does once the models are in (average, fuse, stratify); default: nothing."""
        return state

    def distill(self, state: dict[str, Any], round_index: int, epoch: int, ctx: Context) -> dict[str, Any]:
        """One distillation epoch (a server-only round); default: the model stays as it is."""
        return state

    def summary_extras(self, state: dict[str, Any]) -> dict[str, Any]:
        report = dict(state["report"])
        if "client_accuracy" in report:
            report["client_accuracy"] = {str(k): v for k, v in report["client_accuracy"].items()}
        return {**report, "client_stage_cached": bool(state.get("client_stage_cached", False))}

    # ------------------------------------------------------------- client
    def initial_weights(self, client: int, arch: ModelConfig, spec: ModelSpec) -> dict[str, np.ndarray]:
        """Client `client`'s first weights (architecture `arch`): with `client_init: shared` the
        architecture's initial weights, every client of it the same; with `independent` its own, a
        function of (seed, client id) only. The caller's torch random stream is left untouched."""
        if self.params.client_init == "shared":
            return module_weights(spec.initial_model(arch))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.config.seed, MODEL_INIT, "client", client))
            return module_weights(spec.build("cpu", arch))

    def client_update(self, payload: dict[str, Any], client: ClientData, ctx: Context) -> dict[str, Any]:
        model = ctx.model()
        if "weights" in payload and client.arch == self.config.model:
            load_weights(model, payload["weights"])
        elif "weights" in client.state:
            load_weights(model, client.state["weights"])
        else:
            load_weights(model, self.initial_weights(client.id, client.arch, ctx.spec))
        steps, loss = local_train(
            model, client.x, client.y, self.config.local, client.generator, client_state=client.state
        )
        client.metrics["train_loss"] = loss
        client.metrics["local_steps"] = steps
        weights = module_weights(model)
        if self.params.global_rounds > 1 and client.arch != self.config.model:
            client.state["weights"] = weights
        return {"weights": weights}


@bench_work(keys={"local.epochs": "clients", "algorithm.generator_steps": "server"})
class DataFreeDistillation(OneShot):
    """DENSE's loop (and Co-Boosting's and FedHydra's): each distillation epoch trains a fresh
    generator against the ensemble (`generator_objective`, plus `bn_weight` times the BN-statistics
    loss), adds its best batch to the pool, and trains the server model one pass over the pool on
    `distillation_loss` against the ensemble (`ensemble`)."""

    def after_client_stage(self, state, round_index, ctx):
        return {**state, "pool_x": None, "pool_y": None}

    def own_model(self, state, round_index):
        # the client round's model is the student before any distillation (FedDF: the clients'
        # average, FedAvg one-shot's result): best_accuracy is over the distillation epochs
        return self.position(state, round_index)[1] > 0

    # the method's pieces -------------------------------------------------
    def ensemble(self, state: dict[str, Any], teachers: list[torch.nn.Module]) -> Callable:
        """(model-input images, target labels) -> ensemble logits."""
        return lambda x, y: mean_logits(self.stacked_logits(teachers, x))

    def generator_objective(self, state: dict[str, Any]) -> Callable:
        raise NotImplementedError

    def bn_weight(self) -> float:
        """The weight of the BN-statistics loss in the generator's objective."""
        return self.params.bn_weight

    def distillation_loss(self, state: dict[str, Any]) -> Callable:
        raise NotImplementedError

    def before_distillation(self, state, teachers, ctx, epoch: int, round_index: int) -> dict[str, Any]:
        """A hook after synthesis, before the student's pass (Co-Boosting re-weights its ensemble)."""
        return state

    def perturbation(self, state, teachers, ctx, generator: torch.Generator):
        """A function editing each distillation batch (Co-Boosting's ODS), or None."""
        return None

    # the loop ------------------------------------------------------------
    def authors_augmentation(self, phase: str, dataset: str) -> str:
        """`auto` for `phase` (synthesis | distill) on `dataset`: the method's authors' choice."""
        return "crop_flip"

    def augmentation(self, phase: str) -> str:
        if not self.params.augment:
            return "none"
        mode = getattr(self.params, f"{phase}_augment")
        return self.authors_augmentation(phase, self.config.dataset.name) if mode == "auto" else mode

    def to_input(self, ctx: Context) -> Callable[[torch.Tensor], torch.Tensor]:
        mean = torch.as_tensor(ctx.mean, dtype=torch.float32, device=ctx.device).view(1, -1, 1, 1)
        std = torch.as_tensor(ctx.std, dtype=torch.float32, device=ctx.device).view(1, -1, 1, 1)
        return lambda pixels: (pixels - mean) / std

    def generator(self, ctx: Context) -> Generator:
        if self._generator is None:
            spec = ctx.spec
            self._generator = Generator(self.params.nz, self.params.ngf, spec.image_size, spec.in_channels).to(
                ctx.device
            )
        return self._generator

    def kd_learning_rate(self, state: dict[str, Any], epoch: int) -> float:
        """The student's learning rate in distillation epoch `epoch` (from 1) of a global round:
        kd_lr, or with `kd_schedule: cosine` annealed as torch's CosineAnnealingLR stepped once per
        epoch over the round's epochs (Co-Boosting's code)."""
        p = self.params
        if p.kd_schedule == "constant":
            return p.kd_lr
        epochs = max(state["rounds_per_global"] - 1, 1)
        return p.kd_lr * 0.5 * (1.0 + math.cos(math.pi * min(epoch - 1, epochs) / epochs))

    def student(self, state, ctx: Context, epoch: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        student = ctx.model("student")
        load_weights(student, state["weights"])
        p = self.params
        if p.kd_optimizer == "adam":
            optimizer = torch.optim.Adam(student.parameters(), lr=p.kd_lr, weight_decay=p.kd_weight_decay)
        else:
            optimizer = torch.optim.SGD(
                student.parameters(), lr=p.kd_lr, momentum=p.kd_momentum, weight_decay=p.kd_weight_decay
            )
        if state.get("kd_optimizer") is not None:
            optimizer.load_state_dict(state["kd_optimizer"])
        for group in optimizer.param_groups:
            group["lr"] = self.kd_learning_rate(state, epoch)
        return student, optimizer

    def new_images(self, state, teachers, student, ctx: Context, round_index: int) -> dict[str, float]:
        """Add one synthesis to the pool (in `state`); returns the scalars to log."""
        p = self.params
        result = synthesize(
            self.generator(ctx),
            teachers,
            self.ensemble(state, teachers),
            student,
            self.generator_objective(state),
            self.to_input(ctx),
            num_classes=ctx.num_classes,
            steps=p.generator_steps,
            batch=p.synthesis_batch,
            lr=p.generator_lr,
            bn_weight=self.bn_weight(),
            seed=derive_seed(self.config.seed, SERVER, round_index),
            augment=self.augmentation("synthesis"),
            grad_clip=p.generator_grad_clip,
        )
        state["pool_x"], state["pool_y"] = add_to_pool(state["pool_x"], state["pool_y"], result, p.pool_size)
        state["pool_added"] = len(result.targets)  # the newest images (Co-Boosting re-weights on the others)
        return {"generator_loss": result.loss, "bn_loss": result.bn_loss}

    def distill(self, state, round_index, epoch, ctx):
        state = dict(state)
        teachers = self.teachers(state, ctx)
        student, optimizer = self.student(state, ctx, epoch)
        scalars = self.new_images(state, teachers, student, ctx, round_index)
        state = self.before_distillation(state, teachers, ctx, epoch, round_index)
        g = torch_generator(self.config.seed, SERVER, round_index, "distill")
        stats = distill_epoch(
            student,
            optimizer,
            state["pool_x"],
            state["pool_y"],
            self.ensemble(state, teachers),
            self.distillation_loss(state),
            self.to_input(ctx),
            batch=self.params.kd_batch,
            generator=g,
            augment=self.augmentation("distill"),
            perturb=self.perturbation(state, teachers, ctx, g),
            grad_clip=self.params.kd_grad_clip,
        )
        scalars["kd_lr"] = optimizer.param_groups[0]["lr"]
        for name, value in {**scalars, "distill_loss": stats.mean_loss, "pool_images": len(state["pool_y"])}.items():
            ctx.log.scalar(name, value)
        state["weights"] = module_weights(student)
        state["kd_optimizer"] = to_cpu(optimizer.state_dict())
        return state
