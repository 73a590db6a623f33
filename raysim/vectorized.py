"""Clients trained as one vectorised model (`resources.vectorize_clients`).

The clients an actor trains in a round that share an architecture take their local SGD steps
together: their weights, batch-norm statistics and momentum buffers are stacked along a leading
client dimension, and one `torch.func.vmap` of the gradient of a functional call of the model
steps all of them at once (on a GPU: one kernel per layer for all clients instead of one each).
Each client keeps what it has in `raysim.training._train_epochs`: its own data, its own batch
order (each epoch `torch.randperm(n, generator=its generator)` cut by `fixed_batches`), its own
number of steps, and the optimiser's arithmetic (torch.optim.SGD's: momentum, weight decay,
dampening 0, nesterov off), so each client ends where the sequential loop would, to float rounding.

Ragged steps. At step t the clients still training may hold batches of different sizes (an epoch's
last batch holds the rest) and some may have finished. Padding the small batches would feed the
padding into batch norm's batch statistics, which no loss mask undoes, so the step runs once per
batch size among the clients that train at t, each on the rows of the stack of the clients with
that size: a client outside them keeps its weights, momentum, statistics and loss untouched, and
every loss is the mean over the client's own real batch. A client that has taken all its steps
leaves the stack (its result kept), so the clients still training are most steps one group of
every row, which steps without copying a row.

Speed. Vectorising saves kernel launches and per-step Python work, not arithmetic, so it can pay
only where those dominate (small models on a GPU). On a CPU it does not: vmap runs a ConvNet's
convolutions as grouped convolutions, with layout copies (measured on 2 cores: the quickstart's
client training 3x slower), and an MLP's matrix products as batched ones (about as fast as in turn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import functional_call, grad, vmap

from raysim.config import LocalConfig
from raysim.training import LossFn, cross_entropy_loss, fixed_batches

KEY = "resources.vectorize_clients"

# (model carrying one client's weights, x, y, that client's `extra`) -> its loss
BatchLossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, dict[str, Any]], torch.Tensor]
Tensors = dict[str, torch.Tensor]


def plain_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
    return cross_entropy_loss(model, x, y)


@dataclass
class BatchLoss:
    """An algorithm's client loss and gradient correction for several clients at once, in the form
    one vectorised step runs. `loss` sees one client at a time (vmap hides the client dimension):
    the model carries that client's weights, and `extra` holds that client's entry of `extras`
    (dicts of tensors, stacked and mapped over). What is the same for every client (the global
    weights of a proximal term) the loss may read from its closure instead."""

    loss: BatchLossFn = plain_loss
    extras: list[dict[str, Any]] | None = None  # one per client
    corrections: list[Tensors] | None = None  # one per client: added to each parameter's gradient (SCAFFOLD)

    @classmethod
    def shared(cls, loss_fn: LossFn) -> BatchLoss:
        """A loss the same for every client (it reads the payload only, not a client's own state)."""
        return cls(lambda model, x, y, extra: loss_fn(model, x, y))


@dataclass
class ClientRun:
    """One client's share of a vectorised training: its data, its generator, its starting state dict."""

    x: torch.Tensor
    y: torch.Tensor
    generator: torch.Generator
    start: Tensors


@dataclass
class Trained:
    """One client's result: its final state dict (on the training device), steps and mean loss, as
    raysim.training.local_train returns them."""

    state: Tensors
    steps: int
    mean_loss: float


def refusal(name: str, algorithm: type) -> str | None:
    """Why `resources.vectorize_clients` cannot run the client step of `algorithm` (named `name` in
    the config), in one line with the fix, or None. The settings it cannot run with (compile,
    bfloat16, MAC counting, Adam, kept optimisers) are refused by the config's own checks."""
    off = f"{KEY}=false"
    if not callable(getattr(algorithm, "client_update_batch", None)):
        return f"{KEY}: algorithm '{name}' has no vectorised client step (client_update_batch): set {off}"
    why = algorithm.vectorized_refusal() if callable(getattr(algorithm, "vectorized_refusal", None)) else None
    return None if why is None else f"{KEY}: algorithm '{name}' {why}: set {off}"


def train_together(model: torch.nn.Module, runs: list[ClientRun], local: LocalConfig, loss: BatchLoss) -> list[Trained]:
    """`local.epochs` of local SGD for every client of `runs` at once; `model` (of their shared
    architecture) is the function that is called, its own weights are not used or changed."""
    model.train()
    schedules = [client_batches(len(run.y), local, run.generator, run.y.device) for run in runs]
    stack = _Stack.of(model, runs, loss, with_momentum=local.momentum != 0)
    gradients = _vmapped_gradients(model, loss.loss)
    names = list(runs[0].start)
    losses: list[list[torch.Tensor]] = [[] for _ in runs]
    trained: dict[int, Trained] = {}
    rows = list(range(len(runs)))  # the client of each row of the stack
    t = 0
    while True:
        stack, rows = _retire(stack, rows, [len(schedules[i]) == t for i in rows], names, losses, trained)
        if not rows:
            return [trained[i] for i in range(len(runs))]
        batches = [schedules[i][t] for i in rows]
        for members in _same_size_groups(batches):
            x = torch.stack([runs[rows[p]].x[batches[p]] for p in members])
            y = torch.stack([runs[rows[p]].y[batches[p]] for p in members])
            for p, value in zip(members, _step(stack, members, x, y, gradients, local)):
                losses[rows[p]].append(value)
        t += 1


def client_batches(n: int, local: LocalConfig, generator: torch.Generator, device: torch.device) -> list[torch.Tensor]:
    """The batches of indices raysim.training._train_epochs draws for a client of `n` examples:
    each epoch's order from `generator` (nothing else draws from it), cut by `fixed_batches`."""
    return [
        batch
        for _ in range(local.epochs)
        for batch in fixed_batches(torch.randperm(n, generator=generator).to(device), local.batch_size)
    ]


def call_method(module: torch.nn.Module, method: str, weights: Tensors, *args: Any) -> Any:
    """`module.method(*args)` computed with `weights` (parameters and buffers by state-dict name) in
    place of the module's own: a functional call of a method other than forward (MOON's `embed`)."""
    bound = _Bound(module, lambda inner, *a: getattr(inner, method)(*a))
    return functional_call(bound, _prefixed(weights), args)


class _Bound(torch.nn.Module):
    """`module` under the name `inner`, whose forward is `body(module, *args)`: functional_call
    then swaps the weights of `module` for the duration of `body`, whatever it calls on it."""

    def __init__(self, module: torch.nn.Module, body: Callable[..., Any]):
        super().__init__()
        self.inner = module
        self.body = body

    def forward(self, *args: Any) -> Any:
        return self.body(self.inner, *args)


def _prefixed(tensors: Tensors) -> Tensors:
    return {f"inner.{name}": value for name, value in tensors.items()}


def _vmapped_gradients(model: torch.nn.Module, loss: BatchLossFn):
    """(stacked params, stacked buffers, x, y, stacked extras) -> (each client's gradients, each
    client's loss). Batch norm updates the stacked running statistics it is given in place."""
    bound = _Bound(model, loss)

    def client_loss(params: Tensors, buffers: Tensors, x, y, extra) -> tuple[torch.Tensor, torch.Tensor]:
        value = functional_call(bound, (_prefixed(params), _prefixed(buffers)), (x, y, extra)).float()
        return value, value.detach()

    return vmap(grad(client_loss, has_aux=True))


@dataclass
class _Stack:
    """The clients' tensors, stacked along a leading client dimension."""

    params: Tensors
    buffers: Tensors
    # SGD's momentum buffers (none without momentum), from zeros: the first step's buffer is then
    # 0 * momentum + d_p = d_p, the clone torch.optim.SGD starts with.
    momenta: Tensors
    extras: dict[str, Any] = field(default_factory=dict)
    corrections: Tensors | None = None

    @classmethod
    def of(cls, model: torch.nn.Module, runs: list[ClientRun], loss: BatchLoss, with_momentum: bool) -> _Stack:
        names = {name for name, _ in model.named_parameters()}
        params = {n: torch.stack([run.start[n] for run in runs]) for n in runs[0].start if n in names}
        buffers = {n: torch.stack([run.start[n] for run in runs]) for n in runs[0].start if n not in names}
        return cls(
            params,
            buffers,
            {n: torch.zeros_like(p) for n, p in params.items()} if with_momentum else {},
            _stack_trees(loss.extras) if loss.extras is not None else {},
            _stack_trees(loss.corrections) if loss.corrections is not None else None,
        )

    @property
    def size(self) -> int:
        return len(next(iter(self.params.values())))

    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device

    def take(self, index: torch.Tensor | None) -> _Stack:
        """The rows `index` (copies); index None: every row (the tensors themselves)."""
        if index is None:
            return self
        return _Stack(
            _select(self.params, index),
            _select(self.buffers, index),
            _select(self.momenta, index),
            _select(self.extras, index),
            None if self.corrections is None else _select(self.corrections, index),
        )

    def put(self, index: torch.Tensor | None, params: Tensors, momenta: Tensors, buffers: Tensors) -> None:
        """The new tensors of the rows `index` written back (index None: every row)."""
        if index is None:
            self.params, self.momenta, self.buffers = params, momenta, buffers
            return
        for mine, new in ((self.params, params), (self.momenta, momenta), (self.buffers, buffers)):
            for name, value in new.items():
                mine[name][index] = value


def _select(tree: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    return {k: _select(v, index) if isinstance(v, dict) else v.index_select(0, index) for k, v in tree.items()}


def _stack_trees(trees: list[dict[str, Any]]) -> dict[str, Any]:
    """Dicts (possibly nested) of tensors of the same layout -> one dict of stacked tensors."""
    return {
        k: _stack_trees([t[k] for t in trees]) if isinstance(v, dict) else torch.stack([t[k] for t in trees])
        for k, v in trees[0].items()
    }


def _same_size_groups(batches: list[torch.Tensor]) -> list[list[int]]:
    """The rows of the stack (one batch each) grouped by the size of their batch."""
    groups: dict[int, list[int]] = {}
    for row, batch in enumerate(batches):
        groups.setdefault(len(batch), []).append(row)
    return list(groups.values())


def _retire(
    stack: _Stack,
    rows: list[int],
    done: list[bool],
    names: list[str],
    losses: list[list[torch.Tensor]],
    trained: dict[int, Trained],
) -> tuple[_Stack, list[int]]:
    """The clients whose rows are `done` (all steps taken) leave the stack, their results kept in
    `trained`: the later steps neither compute nor copy them. Returns the stack of the others and
    the client of each of its rows."""
    if not any(done):
        return stack, rows
    for row, finished in enumerate(done):
        if finished:
            values = losses[rows[row]]
            trained[rows[row]] = _trained(stack, row, names, torch.stack(values).tolist() if values else [])
    keep = [row for row, finished in enumerate(done) if not finished]
    if not keep:
        return stack, []
    return stack.take(torch.tensor(keep, device=stack.device)), [rows[row] for row in keep]


def _step(
    stack: _Stack, members: list[int], x: torch.Tensor, y: torch.Tensor, gradients: Callable, local: LocalConfig
) -> torch.Tensor:
    """One SGD step of the rows `members` (clients whose batches x, y have one size); returns their losses."""
    index = None if len(members) == stack.size else torch.tensor(members, device=stack.device)
    part = stack.take(index)
    grads, values = gradients(part.params, part.buffers, x, y, part.extras)
    if part.corrections is not None:  # SCAFFOLD's grad_hook: p.grad += correction, before the step
        grads = {n: g + part.corrections[n] for n, g in grads.items()}
    params, momenta = sgd_step(part.params, grads, part.momenta, local)
    stack.put(index, params, momenta, part.buffers)
    return values


def sgd_step(params: Tensors, grads: Tensors, momenta: Tensors, local: LocalConfig) -> tuple[Tensors, Tensors]:
    """torch.optim.SGD's step (dampening 0, nesterov off) on stacked tensors, out of place: the
    optimiser's operations in its order, so each client's numbers are those of its own optimiser.
    Returns the new parameters and momentum buffers (none without momentum)."""
    new_params, new_momenta = {}, {}
    for name, p in params.items():
        d_p = grads[name]
        if local.weight_decay != 0:
            d_p = d_p.add(p, alpha=local.weight_decay)
        if local.momentum != 0:
            d_p = new_momenta[name] = momenta[name].mul(local.momentum).add_(d_p)
        new_params[name] = p.add(d_p, alpha=-local.lr)
    return new_params, new_momenta


def _trained(stack: _Stack, i: int, names: list[str], losses: list[float]) -> Trained:
    """Row i's final state dict (in its start's key order), steps and mean loss; the losses are
    summed in step order, as raysim.training._train_epochs sums them."""
    tensors = {**stack.params, **stack.buffers}
    return Trained({n: tensors[n][i] for n in names}, len(losses), sum(losses) / max(len(losses), 1))
