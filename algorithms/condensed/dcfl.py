"""DCFL (Data Condensation aided FL with non-IID awareness; paper 002, Algorithms 1-2, eq. 4) on a base
algorithm: `base: fedavg | fedprox | fednova | feddisco`, with that base's own parameters
(`mu` for FedProx, `a` and `b` for FedDisco; unset: the base's default).

Server (Algorithm 1):
- *Pre-training* (rounds 1..`pretrain_rounds` = M): each round a random `pretrain_fraction` (C_pre)
  of the K clients is asked; those not seen before condense their data (DM with DSA, `ipc` per
  class), train from w^0, and upload model and condensed set (ClientUpdateWoCD). A client first seen
  after pre-training does the same in its first round (its set joins the pool for returning clients),
  except with `use_condensed: none` (Client, below). The global model
  stays w^0 until round M, where the server trains it on the pooled condensed data (ServerUpdate,
  `server_epochs` at `server_lr`). Pre-training rounds count as rounds (rounds_to_accuracy).
- *Selection* (eq. 4): n = clients.per_round; round(epsilon n) seen clients are drawn without
  replacement with probability proportional to their CKA row sums (SelectForExploit), the rest
  uniformly among unseen clients (SelectForExplore); when either side runs short the other fills
  in. `epsilon` is the exploitation fraction, as in Algorithm 1 and the notation table (the prose
  calls it an exploration ratio with the opposite meaning). `selection: random` draws n uniformly
  (Table IV).
- *CKA* (raysim.algorithms.condensed.similarity): linear CKA between what clients' classifiers (the last linear layer,
  rows = classes) learnt, kept as a K x K matrix M over the clients seen so far. What is compared
  (`cka_on`) matters because M mixes clients last trained in different rounds, from different global
  models, and two unrelated 10 x 128 classifiers already have linear CKA near 0.94: compared raw, a
  classifier mostly shows the model it started from, not the data it saw.
  `initial` (default; the paper's reading, Algorithm 1 line 13: M is filled in pre-training, where
  every client trains from w^0): each client's classifier after training from w^0, written once,
  when the client is first seen. With one start for all, two rows differ only by the clients' data,
  which never changes, so M need not be refreshed. A client first seen once the global model has
  left w^0 (the paper never puts it in M) also trains a copy of w^0 on its data (the base's
  objective, E_c epochs, after its round's work) and uploads that copy's classifier; w^0 goes down
  to it beside the round's model (both counted in the bytes).
  `update`: each client's classifier change in its latest round, W_k - W_start, refreshed whenever
  it takes part: no extra training, but changes made from different global models are only partly
  comparable.
  `latest`: each client's newest classifier itself, which shows the stale-classifier effect.
  `initial` is the default because it is the paper's reading and because, on a run whose clients
  join in different rounds, it ranks client pairs by label overlap best (experiments/dcfl/README.md).
  Diagnostics per round (metrics.parquet; the last value in summary.json): `cka_label_spearman`,
  Spearman's rho over the seen pairs between M and the cosine similarity of the two clients'
  label histograms (does CKA see which clients hold the same classes? the server reads the
  histograms for this number only), and `selection_spread`, the largest over the smallest of
  eq. 4's probabilities.
- *Complementary data* (GetComplementaryCondensedDataForK): a returning client trains on the
  condensed sets of its group, the `group_size` seen clients with the LOWEST CKA to it
  (`complement: low`; the paper never says which, and low classifier similarity means dissimilar
  label distributions, i.e. data that complements the client's own). `group_size: 0` means
  participants per round - 1, the paper's communication estimate (Sec. IV-C). `filter_ratio` r > 0
  drops the fraction r of the group's images (all its sets together) with the highest loss under the
  current global model (the paper filters "based on their performance" without a rule; dropping the least
  consistent images is the reading that matches its stated aim of a more stable training).
  `grouping: random` gives a returning client `group_size` seen clients drawn at random instead
  (seeded by round and client): the control for what CKA grouping adds. The lowest-CKA rule
  (`grouping: cka`) can send the same few "hub" clients' sets to nearly everyone and never send the
  others (under `cka_on: initial` M, and so every group, is fixed once the clients are seen), while
  the random control, redrawn each round, eventually sends every set: comparing the two may measure
  coverage rather than complementarity. `grouping: cka_sampled` keeps the preference for dissimilar
  clients but reaches every client: each round a returning client's group is drawn without
  replacement from the other seen clients (seeded by round and client, like `random`) with
  probability proportional to exp(-(c - c_min) / (`group_temperature` (c_max - c_min))), c its CKA
  to the candidate and c_min, c_max the lowest and highest over the candidates (`complement: high`
  mirrors it). Scaling by the client's own CKA range makes the temperature independent of where and how
  widely M's values spread (CKA of classifiers sits in a narrow band below 1): the most dissimilar candidate is exp(1 /
  group_temperature) times as likely as the most similar one (0.5: about 7.4 times), every
  candidate has a positive chance, and the rule moves from `cka` (temperature -> 0) to `random`
  (temperature -> infinity). The default stays `cka`, the paper's rule as its Algorithm 1 states it
  (the authors released no code); `cka_sampled` and `random` are raysim's, for the question whether
  complementarity helps once every set is sent (the DCFL report's `dcfl_grouping` measures it).
  Diagnostics of coverage, from the per-client count of deliveries (how many times each client's
  condensed set was in a returning client's group, so trained on; it travels to a client once, below;
  server state): `sets_sent_clients`, how many clients'
  sets were sent at least once so far; `sets_sent_fraction`, that over the clients seen so far;
  `sets_sent_gini`, the Gini coefficient of the delivery counts over the seen clients (0: every
  seen client's set sent equally often; 1 - h/n when the sets of h of the n seen clients make all
  deliveries, equally: 0.9 for two hubs among 20; logged once something was sent). Per round in
  metrics.parquet, the final values in summary.json.
- *Delivery*: a set never changes once uploaded (a client condenses once, when first seen), so it
  travels to a client once. The server keeps, in its state (`held`), which clients' sets each client
  holds; each round a returning client receives its group's ids (in order) and, whole, the sets of
  the group it does not hold yet, and keeps them in its client state (`held`, checkpointed with it);
  it assembles the group's images from what it holds, in group order. With filter_ratio > 0 the
  server also sends, per set of the group, the indices of the images the filter keeps (a small
  unsigned integer array), and the client applies them: the images a client trains on are those the
  whole group's delivery of each round would give (raysim before issue 76 sent that; tested). Bytes
  down are measured from what is sent; `received_new_images` (per client and round) counts the
  images of the sets sent whole, `received_images` those trained on.
- *Aggregation*: the base's, with each client's new data size (own + received images) as n_k; for
  FedDisco the label counts include the received labels, for FedNova the steps include fine-tuning.

Client (Algorithm 2): train `local.epochs` (E_c) on the own data with the base's local objective
(FedProx's proximal term included), then with `use_condensed: finetune` `finetune_epochs` (E_s) on
the received data plus the client's own condensed set (Alg. 2 line 13) at `finetune_lr` (eta_s,
SGD with local.momentum), batch `finetune_batch` (B_s); `mix` trains E_c epochs on own + received
data together; `none` receives nothing (CKA selection alone, Table IV), and then a client first
seen after pre-training condenses nothing and uploads no set (no one would use it): with
`pretrain_rounds: 0` the run is its base with DSA on the local batches (`train_dsa`) and CKA or random
selection, nothing condensed (`filter_ratio` > 0 with `none` is refused: nothing is sent to filter).
`train_dsa` applies DSA to every training batch (Alg. 2 lines 8 and 20; off for Table IV).
Condensation matches through `match_gamma` w_global + (1 - match_gamma) w_random
(raysim.algorithms.condensed.match_models.resample_model): 0 = DM's fresh random network each step
(the default: DCFL cites DM), 1 = the received model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithm import (
    Algorithm,
    Broadcast,
    ClientData,
    Context,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Reply,
)
from raysim.algorithms.condensed.condensation import (
    CondensationParams,
    CondensedDataAlgorithm,
    frozen,
    train_server_model,
)
from raysim.algorithms.condensed.dsa import DSA
from raysim.algorithms.condensed.match_models import resample_model
from raysim.algorithms.condensed.similarity import linear_cka, spearman
from raysim.algorithms.condensed.synthetic import as_images, set_labels
from raysim.bench.cell import bench_work
from raysim.config.parse import Bound, build_dataclass
from raysim.errors import RaysimError
from raysim.registry import algorithm_class
from raysim.seeding import SERVER, numpy_rng, torch_generator
from raysim.tensors import load_weights, module_weights
from raysim.training import make_optimizer, train

Base = Literal["fedavg", "fedprox", "fednova", "feddisco"]
BASE_PARAMS = ("mu", "a", "b")  # the bases' own parameters, forwarded when set
CLASSIFIER = "classifier.weight"


@dataclass(frozen=True)
class DCFLParams(CondensationParams):
    ipc: PositiveInt = 10
    image_momentum: float = 0.5  # DM's
    server_epochs: NonNegativeInt = 200  # pre-training ServerUpdate (the paper gives no settings)
    server_lr: float = 0.01
    base: Base = "fedavg"
    mu: float | None = None  # FedProx
    a: float | None = None  # FedDisco
    b: float | None = None  # FedDisco
    pretrain_rounds: NonNegativeInt = 1  # M
    pretrain_fraction: Annotated[float, Bound(gt=0, le=1)] = 0.25  # C_pre
    selection: Literal["cka", "random"] = "cka"  # cka (eq. 4) | random (Table IV)
    cka_on: Literal["initial", "update", "latest"] = "initial"  # what M compares (module docstring)
    # who a returning client gets data from: cka | random (the control) | cka_sampled
    grouping: Literal["cka", "random", "cka_sampled"] = "cka"
    # cka_sampled: the most dissimilar is exp(1 / T) times as likely as the most similar
    group_temperature: PositiveFloat = 0.5
    epsilon: Annotated[float, Bound(ge=0, le=1)] = 0.5  # fraction of a round's clients chosen by exploitation
    complement: Literal["low", "high"] = "low"  # which CKA neighbours make a client's group
    group_size: NonNegativeInt = 0  # 0: participants per round - 1
    filter_ratio: Annotated[float, Bound(ge=0, lt=1)] = 0.0  # r
    use_condensed: Literal["none", "mix", "finetune"] = "finetune"
    finetune_epochs: NonNegativeInt = 20  # E_s (chosen on validation data: experiments/dcfl/README.md)
    finetune_lr: float = 0.001  # eta_s
    finetune_batch: PositiveInt = 32  # B_s
    train_dsa: bool = True  # DSA on the clients' training batches
    match_gamma: float = 0.0  # 0: DM's random networks; 1: the received global model

    def __post_init__(self):
        self.check_base_params()
        self.check_filter_needs_condensed()

    def check_base_params(self) -> None:
        """mu, a and b are forwarded to the base: each must be one of its parameters."""
        own = {f.name for f in fields(algorithm_class(self.base).Params)}
        foreign = [k for k in BASE_PARAMS if getattr(self, k) is not None and k not in own]
        if foreign:
            raise RaysimError(
                f"algorithm.{foreign[0]} is not a parameter of base '{self.base}': remove it "
                f"or set algorithm.base to the algorithm it belongs to"
            )

    def check_filter_needs_condensed(self) -> None:
        if self.use_condensed == "none" and self.filter_ratio > 0:
            raise RaysimError(
                f"algorithm.filter_ratio={self.filter_ratio} filters the condensed sets sent to returning clients, "
                "and use_condensed: none sends none: set filter_ratio=0 or use_condensed to mix or finetune"
            )


def make_base(params: DCFLParams, config) -> Algorithm:
    cls = algorithm_class(params.base)
    given = {k: getattr(params, k) for k in BASE_PARAMS if getattr(params, k) is not None}
    base_params = build_dataclass(cls.Params, given, "algorithm")  # the base's ranges checked
    return cls(base_params, config)


def exploit_probabilities(cka: np.ndarray, seen: list[int]) -> np.ndarray:
    """Eq. 4: each seen client's off-diagonal CKA row sum over the seen clients, normalised."""
    block = cka[np.ix_(seen, seen)]
    sums = np.nansum(block, axis=1) - np.nan_to_num(np.diag(block))
    sums = np.maximum(sums, 0.0) + 1e-12  # no information yet: uniform
    return sums / sums.sum()


def complementary_group(cka: np.ndarray, seen: list[int], client: int, size: int, complement: str) -> list[int]:
    """The `size` seen clients (not `client`) with the lowest (complement=low) or highest CKA to
    `client`; ties broken by client id."""
    others = [k for k in seen if k != client]
    sign = 1.0 if complement == "low" else -1.0
    return sorted(others, key=lambda k: (sign * np.nan_to_num(cka[client, k], nan=0.0), k))[:size]


def random_group(seed: int, round_index: int, seen: list[int], client: int, size: int) -> list[int]:
    """`grouping: random`: `size` seen clients (not `client`) drawn uniformly, seeded by (round, client)."""
    others = [k for k in seen if k != client]
    picked = numpy_rng(seed, SERVER, "grouping", round_index, client).choice(
        len(others), size=min(size, len(others)), replace=False
    )
    return sorted(others[i] for i in picked)


def sampling_logits(cka_row: np.ndarray, temperature: float, complement: str) -> np.ndarray:
    """`grouping: cka_sampled`: each candidate's log-weight (entries of `cka_row`: one client's CKA to
    them), -(c - c_min) / (temperature (c_max - c_min)) (complement=low; high mirrors it); all 0
    when the candidates' CKAs are equal."""
    c = np.nan_to_num(np.asarray(cka_row, dtype=np.float64), nan=0.0)
    distance = c - c.min() if complement == "low" else c.max() - c
    span = float(c.max() - c.min())
    return -distance / (temperature * span) if span > 0 else np.zeros(len(c))


def sampling_probabilities(cka_row: np.ndarray, temperature: float, complement: str) -> np.ndarray:
    """The probability of each candidate being drawn first under `cka_sampled` (softmax of the logits)."""
    logits = sampling_logits(cka_row, temperature, complement)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def sampled_group(
    cka: np.ndarray,
    seen: list[int],
    client: int,
    size: int,
    temperature: float,
    complement: str,
    seed: int,
    round_index: int,
) -> list[int]:
    """`grouping: cka_sampled`: `size` seen clients (not `client`) drawn one after another without
    replacement, each with probability proportional to exp(logit) among those left (Gumbel top-k:
    the `size` largest logit + Gumbel noise, exact in log space at any temperature), seeded by
    (round, client)."""
    others = [k for k in seen if k != client]
    if not others:
        return []
    logits = sampling_logits(cka[client, others], temperature, complement)
    noise = numpy_rng(seed, SERVER, "grouping", round_index, client).gumbel(size=len(others))
    picked = np.argsort(-(logits + noise), kind="stable")[:size]
    return sorted(others[i] for i in picked)


def sets_sent_coverage(sent: np.ndarray, seen: list[int]) -> dict[str, int | float]:
    """Coverage of the groups from the per-client delivery counts `sent` (module docstring):
    `sets_sent_clients`, `sets_sent_fraction` over the seen clients and, once anything was sent,
    `sets_sent_gini` over the seen clients' counts."""
    counts = np.asarray(sent, dtype=np.float64)
    reached = int((counts > 0).sum())
    out: dict[str, int | float] = {"sets_sent_clients": reached, "sets_sent_fraction": reached / max(len(seen), 1)}
    mine = counts[list(seen)] if seen else counts[:0]
    if mine.sum() > 0:
        n = len(mine)
        out["sets_sent_gini"] = float(np.abs(mine[:, None] - mine[None, :]).sum() / (2 * n * mine.sum()))
    return out


def cka_representation(classifier: np.ndarray, start: np.ndarray, cka_on: str) -> np.ndarray:
    """What M compares for one client: its classifier's change from `start` (update) or the classifier
    itself (initial: trained from w^0; latest)."""
    return classifier - start if cka_on == "update" else classifier


def label_similarity(counts: np.ndarray) -> np.ndarray:
    """Cosine similarity of the clients' label histograms (rows of `counts`)."""
    unit = counts / np.maximum(np.linalg.norm(counts, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


def cka_label_spearman(cka: np.ndarray, counts: np.ndarray, seen: list[int]) -> float:
    """Spearman's rho between M and the label-histogram similarity over the pairs of seen clients
    (NaN with fewer than three pairs or a constant side)."""
    pairs = [(i, j) for n, i in enumerate(seen) for j in seen[n + 1 :]]
    if len(pairs) < 3:
        return float("nan")
    similar = label_similarity(counts.astype(np.float64))
    return spearman([cka[i, j] for i, j in pairs], [similar[i, j] for i, j in pairs])


class Condenser(CondensedDataAlgorithm):
    """DCFL's ClientDatasetDistillation: DM with DSA (raysim's condensation loop, FedDM/FedAF's)."""

    def matching_model(self, payload, client, ctx, seed):
        net = frozen(ctx.model("match"))
        net.train()
        return resample_model(net, frozen(ctx.model("random")), payload["weights"], self.params.match_gamma, seed)


@bench_work(
    keys={
        "local.epochs": "clients",
        "algorithm.steps": "clients",  # a client's condensation, the first time it is selected
        "algorithm.finetune_epochs": "clients",
        "algorithm.server_epochs": "server",  # the pre-training ServerUpdate
    }
)
class DCFL(Algorithm):
    name = "dcfl"
    summary = "DCFL: CKA-guided selection, clients share condensed data with complementary clients (on a base)"
    Params = DCFLParams

    def __init__(self, params, config):
        super().__init__(params, config)
        self.base = make_base(params, config)
        self.condenser = Condenser(params, config)

    @classmethod
    def check_config(cls, config, params) -> None:
        if config.rounds <= params.pretrain_rounds:
            raise RaysimError(
                f"rounds={config.rounds} leaves no training round after "
                f"algorithm.pretrain_rounds={params.pretrain_rounds}: raise rounds or lower it"
            )

    @classmethod
    def check_models(cls, spec) -> None:
        if not isinstance(getattr(spec.build(), "classifier", None), torch.nn.Linear):
            raise RaysimError(
                f"dcfl compares clients by their classifier weights, and model '{spec.config.model.name}' "
                "has no final linear layer named `classifier`: expose it as model.classifier"
            )

    # ------------------------------------------------------------- server
    def server_init(self, model, ctx):
        k = self.config.clients.num
        weights = module_weights(model)
        return {
            "weights": weights,
            "initial": weights if self.params.cka_on == "initial" else None,  # w^0, for late first-timers
            "seen": [],
            "classifiers": {},
            "pool": {},
            "cka": np.full((k, k), np.nan),
            "pool_loss": {},
            "sent": np.zeros(k, dtype=np.int64),  # per client: how often its set was in a returning client's group
            "held": {},  # client -> the clients whose condensed sets it holds (received once, kept in its state)
        }

    def pretraining(self, round_index: int) -> bool:
        return round_index <= self.params.pretrain_rounds

    def condenses(self, round_index: int) -> bool:
        """Whether a client first seen in this round condenses and uploads a set: when a set is used,
        by pre-training's ServerUpdate (round M trains on the pool) or by returning clients
        (use_condensed mix or finetune). `use_condensed: none` after pre-training, and so with
        `pretrain_rounds: 0` throughout, condenses nothing: the run is its base with DSA on the local
        batches (train_dsa) and CKA or random selection."""
        return self.pretraining(round_index) or self.params.use_condensed != "none"

    def uses_cka(self) -> bool:
        """Whether M decides anything: eq. 4's selection, or groups drawn by CKA for condensed sets that
        are sent. Without it a late first-timer trains no copy of w^0 for M (`cka_on: initial`): M is
        then a diagnostic only, and its rows for such clients compare the classifier they returned."""
        p = self.params
        return p.selection == "cka" or (p.use_condensed != "none" and p.grouping != "random")

    def left_initial(self, round_index: int) -> bool:
        """Whether the round's global model differs from w^0: it changes at the end of pre-training
        (round M, the pool always holds round 1's sets) or, without pre-training, after round 1."""
        return round_index > max(self.params.pretrain_rounds, 1)

    def select_clients(self, state, round_index, rng, ctx):
        p, num = self.params, self.config.clients.num
        seen = state["seen"]
        if self.pretraining(round_index):
            n = max(round(p.pretrain_fraction * num), 1)
            asked = rng.choice(num, size=n, replace=False)
            return sorted(int(k) for k in asked if int(k) not in seen)  # seen clients have nothing to add
        n = self.config.clients_per_round()
        if p.selection == "random":
            return super().select_clients(state, round_index, rng, ctx)
        unseen = [k for k in range(num) if k not in seen]
        exploit = min(round(p.epsilon * n), len(seen))
        exploit = max(exploit, n - len(unseen))  # too few unseen clients: exploit the rest
        chosen = []
        if exploit:
            chosen += [
                int(k)
                for k in rng.choice(seen, size=exploit, replace=False, p=exploit_probabilities(state["cka"], seen))
            ]
        if n - exploit:
            chosen += [int(k) for k in rng.choice(unseen, size=n - exploit, replace=False)]
        return sorted(chosen)

    def group_size(self) -> int:
        return self.params.group_size or max(self.config.clients_per_round() - 1, 1)

    def broadcast(self, state, round_index, participants):
        out = Broadcast({"weights": state["weights"]})
        first = [k for k in participants if k not in state["seen"]]
        part = {"condense": True} if first and self.condenses(round_index) else {}
        if first and self.params.cka_on == "initial" and self.left_initial(round_index) and self.uses_cka():
            part["cka_from"] = state["initial"]  # M's classifier comes from w^0 (module docstring)
        if part:
            out.to(first, part)
        for k, group in self.round_groups(state, round_index, participants).items():
            if group:
                out.to(k, self.delivery(state, k, group))
        return out

    def round_groups(self, state, round_index: int, participants: list[int]) -> dict[int, list[int]]:
        """Each returning participant's group this round ({} with use_condensed none): broadcast and
        server_update compute them from the state the round started from, so they agree."""
        if self.params.use_condensed == "none":
            return {}
        return {k: self.group(state, round_index, k) for k in participants if k in state["seen"]}

    def group(self, state, round_index: int, client: int) -> list[int]:
        """The seen clients whose condensed sets a returning client receives."""
        p = self.params
        if p.grouping == "random":
            return random_group(self.config.seed, round_index, state["seen"], client, self.group_size())
        if p.grouping == "cka_sampled":
            return sampled_group(
                state["cka"],
                state["seen"],
                client,
                self.group_size(),
                p.group_temperature,
                p.complement,
                self.config.seed,
                round_index,
            )
        return complementary_group(state["cka"], state["seen"], client, self.group_size(), self.params.complement)

    def count_deliveries(self, state, round_index: int, participants: list[int]) -> np.ndarray:
        """The per-client delivery counts after this round's broadcast (the same groups as
        `broadcast`: it and this read the state the round started from)."""
        sent = np.array(state.get("sent", np.zeros(self.config.clients.num, dtype=np.int64)), dtype=np.int64)
        for group in self.round_groups(state, round_index, participants).values():
            for j in group:
                sent[j] += 1
        return sent

    def delivery(self, state, client: int, group: list[int]) -> dict[str, Any]:
        """What returning client `client` receives for `group` (module docstring, *Delivery*): the
        group's ids, in order; the sets of it the client does not hold yet, whole; with
        filter_ratio > 0 the indices of each group set's images the filter keeps."""
        held = set(state.get("held", {}).get(client, ()))
        part: dict[str, Any] = {"group": np.asarray(group, dtype=np.int64)}
        new = {j: state["pool"][j] for j in group if j not in held}
        if new:
            part["new_sets"] = {j: {"images": s["images"], "classes": s["classes"]} for j, s in new.items()}
        if self.params.filter_ratio > 0:
            part["kept"] = self.kept_indices(state, group)
        return part

    def kept_indices(self, state, group: list[int]) -> dict[int, np.ndarray]:
        """filter_ratio r: of the group's images together, the fraction r with the highest loss under
        the current global model is dropped (ties: the earlier image, in group order, is kept); per
        group set, the indices of its kept images, in order, as the smallest unsigned integer type."""
        losses = [state["pool_loss"][k] for k in group]
        loss = np.concatenate(losses)
        kept = max(1, round(len(loss) * (1 - self.params.filter_ratio)))
        keep = np.sort(np.argsort(loss, kind="stable")[:kept])
        out, start = {}, 0
        for k, part in zip(group, losses):
            mine = keep[(keep >= start) & (keep < start + len(part))] - start
            out[k] = mine.astype(np.min_scalar_type(max(len(part) - 1, 0)))
            start += len(part)
        return out

    def hold(self, state, groups: dict[int, list[int]], replies: list[Reply]) -> dict[int, list[int]]:
        """The sets each client holds after this round: a client that replied holds its group's sets
        (a client whose reply is lost kept nothing: its state is as of its previous round)."""
        held = dict(state.get("held", {}))
        for r in replies:
            if groups.get(r.client):
                held[r.client] = sorted(set(held.get(r.client, ())) | set(groups[r.client]))
        return held

    def server_update(self, state, replies: list[Reply], round_index, ctx):
        groups = self.round_groups(state, round_index, [r.client for r in replies])
        state = {
            **state,
            "seen": sorted(set(state["seen"]) | {r.client for r in replies}),  # first-timers too
            "pool": dict(state["pool"]),
            "classifiers": dict(state["classifiers"]),
            "cka": state["cka"].copy(),
            "sent": self.count_deliveries(state, round_index, [r.client for r in replies]),
            "held": self.hold(state, groups, replies),
        }
        for r in replies:
            if "images" in r.message:  # a client condenses once, when first seen: sets never change
                # writable copies: a read-only array (a reply's, from the object store) pickles 2 bytes
                # longer than the same array read back from a checkpoint, and a resumed run must count
                # the same bytes down
                state["pool"][r.client] = {
                    "images": np.array(r.message["images"]),
                    "classes": np.array(r.message["classes"]),
                }
            self.update_cka(state, r.client, r.message)
        if self.pretraining(round_index):
            if round_index == self.params.pretrain_rounds and state["pool"]:
                state["weights"] = self.train_on_pool(state, round_index, ctx)
        elif replies:
            resized = [Reply(r.client, int(r.message["data_size"]), r.message) for r in replies]
            state["weights"] = self.base.aggregate(state, resized, ctx)
        if self.params.filter_ratio > 0:
            state["pool_loss"] = self.pool_losses(state, ctx)
        self.log_diagnostics(state, ctx)
        return state

    def update_cka(self, state, client: int, message: dict[str, Any]) -> None:
        """Client `client`'s row of M from this round's reply (module docstring, `cka_on`); with
        `initial` a row is written once, when the client is first seen."""
        if self.params.cka_on == "initial":
            if client in state["classifiers"]:
                return
            classifier = message.get("cka_classifier", message["weights"][CLASSIFIER])
        else:
            classifier = message["weights"][CLASSIFIER]
        start = state["weights"][CLASSIFIER]  # the model this round's replies trained from
        state["classifiers"][client] = mine = cka_representation(classifier, start, self.params.cka_on)
        for other, theirs in state["classifiers"].items():
            value = 1.0 if other == client else linear_cka(torch.as_tensor(mine), torch.as_tensor(theirs))
            state["cka"][client, other] = state["cka"][other, client] = value

    def log_diagnostics(self, state, ctx) -> None:
        """M's off-diagonal mean, `cka_label_spearman`, `selection_spread` and the coverage of the
        groups (`sets_sent_*`; module docstring)."""
        seen = state["seen"]
        ctx.log.scalar("clients_seen", len(seen))
        for name, value in sets_sent_coverage(state["sent"], seen).items():
            ctx.log.scalar(name, value)
        if len(seen) < 2:
            return
        block = state["cka"][np.ix_(seen, seen)]
        ctx.log.scalar("cka_mean_off_diagonal", float((np.nansum(block) - len(seen)) / (len(seen) ** 2 - len(seen))))
        probabilities = exploit_probabilities(state["cka"], seen)
        ctx.log.scalar("selection_spread", float(probabilities.max() / probabilities.min()), summary=True)
        if ctx.label_counts is not None:
            rho = cka_label_spearman(state["cka"], np.asarray(ctx.label_counts), seen)
            if np.isfinite(rho):
                ctx.log.scalar("cka_label_spearman", rho, summary=True)

    def train_on_pool(self, state, round_index, ctx):
        """ServerUpdate(w^0, D~): the initial model trained on every condensed set received."""
        x, y = pool_arrays(state["pool"], sorted(state["pool"]))
        x, y = to_images(x, ctx), torch.as_tensor(y, device=ctx.device)
        model = ctx.model("server")
        load_weights(model, state["weights"])
        train_server_model(model, x, y, self.params, torch_generator(self.config.seed, SERVER, round_index))
        return module_weights(model)

    def pool_losses(self, state, ctx) -> dict[int, np.ndarray]:
        """Each pooled image's cross-entropy under the current global model (for filter_ratio)."""
        model = ctx.model("server")
        load_weights(model, state["weights"])
        model.eval()
        out = {}
        with torch.no_grad():
            for k in sorted(state["pool"]):
                x, y = pool_arrays(state["pool"], [k])
                x, y = to_images(x, ctx), torch.as_tensor(y, device=ctx.device)
                out[k] = F.cross_entropy(model(x), y, reduction="none").cpu().numpy()
        return out

    # ------------------------------------------------------------- client
    def client_update(self, payload: dict[str, Any], client: ClientData, ctx: Context) -> dict[str, Any]:
        p, local = self.params, self.config.local
        message = {}
        if payload.get("condense"):
            message.update(self.condenser.client_update(payload, client, ctx))
            client.state["condensed"] = {"images": message["images"], "classes": message["classes"]}
        model = ctx.model()
        load_weights(model, payload["weights"])
        group = self.group_sets(payload, client)
        extra_x, extra_y = self.received(group, client, ctx)
        augment = DSA(per_image=True) if p.train_dsa else None
        loss_fn, hook = self.base.local_loss(payload, client, ctx), self.base.grad_hook(payload, client, ctx)
        x, y = client.x, client.y
        if p.use_condensed == "mix" and extra_y is not None:
            x, y = torch.cat([x, extra_x]), torch.cat([y, extra_y])
        stats = self.train_locally(model, x, y, payload, client, ctx, augment)
        steps = stats.steps
        if p.use_condensed == "finetune" and extra_y is not None:
            tune = torch.optim.SGD(model.parameters(), lr=p.finetune_lr, momentum=local.momentum)
            steps += train(
                model,
                extra_x,
                extra_y,
                epochs=p.finetune_epochs,
                batch_size=p.finetune_batch,
                optimizer=tune,
                generator=client.generator,
                loss_fn=loss_fn,
                augment=augment,
                grad_hook=hook,
            ).steps
        client.metrics["train_loss"] = stats.mean_loss
        client.metrics["local_steps"] = steps
        received = 0 if group is None else len(group[1])
        client.metrics["received_images"] = received
        client.metrics["received_new_images"] = sum(len(s["images"]) for s in payload.get("new_sets", {}).values())
        counts = client.label_counts.copy()
        if received:
            counts += np.bincount(group[1], minlength=len(counts))
        message["weights"] = module_weights(model)
        message.update(
            self.base.after_training(model, payload, dataclasses.replace(client, label_counts=counts), ctx, steps)
        )
        message["data_size"] = np.int64(client.num_samples + received)
        if "cka_from" in payload:
            message["cka_classifier"] = self.classifier_from_initial(payload, client, ctx, augment)
        return message

    def classifier_from_initial(self, payload, client: ClientData, ctx, augment) -> np.ndarray:
        """`cka_on: initial` for a client first seen after pre-training: the classifier of a copy of
        w^0 trained as in pre-training (the base's objective anchored at w^0, E_c epochs)."""
        start = {**payload, "weights": payload["cka_from"]}
        model = ctx.model("cka")
        load_weights(model, start["weights"])
        self.train_locally(model, client.x, client.y, start, client, ctx, augment)
        return model.classifier.weight.detach().cpu().numpy().copy()

    def train_locally(self, model, x, y, payload, client: ClientData, ctx, augment):
        """E_c epochs of the base's local objective (anchored at payload's weights) on (x, y)."""
        local = self.config.local
        return train(
            model,
            x,
            y,
            epochs=local.epochs,
            batch_size=local.batch_size,
            optimizer=make_optimizer(model.parameters(), local),
            generator=client.generator,
            loss_fn=self.base.local_loss(payload, client, ctx),
            augment=augment,
            grad_hook=self.base.grad_hook(payload, client, ctx),
        )

    def group_sets(self, payload, client: ClientData) -> tuple[np.ndarray, np.ndarray] | None:
        """The group's condensed images (as they travelled) and labels, in group order, less what the
        filter drops: assembled from the sets the client holds, the round's new ones added to its
        state first (module docstring, *Delivery*); None when it received no group."""
        if "group" not in payload:
            return None
        held = dict(client.state.get("held", {}))
        for j, s in payload.get("new_sets", {}).items():  # copies: object-store arrays are read-only views
            held[int(j)] = {"images": np.array(s["images"]), "classes": np.array(s["classes"])}
        client.state["held"] = held
        xs, ys = [], []
        for j in (int(j) for j in payload["group"]):
            if j not in held:
                raise RaysimError(
                    f"dcfl: client {client.id} was sent client {j}'s condensed set as held, and its state lacks it: "
                    "its client state was lost or is from another run; start a fresh run"
                )
            x, y = held[j]["images"], set_labels(held[j]["classes"], len(held[j]["images"]))
            if "kept" in payload:
                keep = np.asarray(payload["kept"][j], dtype=np.int64)
                x, y = x[keep], y[keep]
            xs.append(x)
            ys.append(y)
        return np.concatenate(xs), np.concatenate(ys)

    def received(self, group, client: ClientData, ctx) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What a returning client trains on besides its data: its group's condensed sets (`group`:
        images and labels from group_sets) and (fine-tune) its own condensed set (Alg. 2 line 13)."""
        if group is None:
            return None, None
        xs = [to_images(group[0], ctx)]
        ys = [torch.as_tensor(group[1], device=ctx.device)]
        own = client.state.get("condensed")
        if own is not None and self.params.use_condensed == "finetune":
            xs.append(to_images(own["images"], ctx))
            ys.append(torch.as_tensor(set_labels(own["classes"], len(own["images"])), device=ctx.device))
        return torch.cat(xs), torch.cat(ys)

    def summary_extras(self, state):
        sent = state.get("sent", np.zeros(self.config.clients.num, dtype=np.int64))
        return {"clients_seen": len(state["seen"]), **sets_sent_coverage(sent, state["seen"])}


def pool_arrays(pool: dict[int, dict[str, np.ndarray]], clients: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The condensed sets of `clients` (in that order) as one array of images and one of labels."""
    images = [pool[k]["images"] for k in clients]
    labels = [set_labels(pool[k]["classes"], len(x)) for k, x in zip(clients, images)]
    return np.concatenate(images), np.concatenate(labels)


def to_images(images: np.ndarray, ctx: Context) -> torch.Tensor:
    return as_images(images, ctx.mean, ctx.std, ctx.device)
