"""Multiply-accumulates counted while models run (`eval.count_macs`), for the cost of a method's
client and server work beside its seconds: each client's step (`macs`, a client row of
metrics.parquet), the server update (`macs_server`) and the server's evaluation on the test split
(`macs_eval`), each counted inside its own `counting()` (raysim.engine). `raysim bench cell` divides
them by the phases' seconds for the share of the machine's peak a run reaches.

A process-wide forward hook (torch.nn.modules.module.register_module_forward_hook) adds, for
every linear and convolution layer that runs inside `counting()`, its multiply-accumulates: a
linear layer out.numel() x in_features, a convolution out.numel() x in_channels / groups x kernel
size. A forward pass with gradients enabled is counted with the backward pass it is run for: one
more forward's worth for the gradient of the input (when the input needs one) and one for the
gradient of the weights (when they need one), the usual 1:2 rule of a training step. So a client's
SGD step counts 3 forwards (2 in the first layer, whose input needs no gradient), a frozen teacher
behind a generator 2, an evaluation 1.

Readings that are not the method's work (the teachers' test-set logits of the one-shot family,
DynaFed's diagnostics) run inside `paused()` and are not counted; their seconds still are.

Work whose cost lies outside the layers' forward passes runs inside `every_operation()`, which counts
by PyTorch's dispatcher instead (torch.utils.flop_counter.FlopCounterMode: every matrix product and
convolution, forward or backward at any order, FLOPs / 2): DynaFed's synthesis, whose outer gradient
differentiates through its unrolled training steps, a second-order backward the hook would count as
one (about half of what runs: 1/2.2 with the MLP, 1/2.5 with LeNet). The dispatcher puts every
operation, not every layer, on a Python path (an MLP's synthesis iteration takes 3.8 times as long,
LeNet's 1.4), so it is not used everywhere, and `IdenticalWork` pays it once for work repeated
identically (each of the synthesis's iterations runs the same operations on tensors of the same
shapes): the first piece is counted by the dispatcher, the others add its count.

What it leaves out, on purpose: layers other than linear and convolution (norms, activations,
pooling: a few percent of a small CNN's MACs), and compiled models (`resources.compile` is refused
beside `eval.count_macs`: a compiled graph traces the hook in and recompiles for each new counter).
The counts are a measure for comparing methods, not a profiler's.

Cost: the hook puts every module call on PyTorch's slower path (a few microseconds a layer), which
is why counting is off unless a config asks for it; the numbers a run computes do not change.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_paused = 0  # > 0 inside paused(): layers run but are not counted
_installed: list[MacCounter] = []  # the counters of the counting() contexts now open


class MacCounter:
    """The multiply-accumulates of the layers run while it is installed (`counting`)."""

    def __init__(self) -> None:
        self.total = 0

    def __call__(self, module: nn.Module, inputs: tuple, output) -> None:
        if _paused:
            return
        if isinstance(module, nn.Linear):
            forward = output.numel() * module.in_features
        elif isinstance(module, _CONVOLUTIONS):
            forward = output.numel() * (module.in_channels // module.groups) * math.prod(module.kernel_size)
        else:
            return
        passes = 1
        if torch.is_grad_enabled():
            first = inputs[0] if inputs else None
            passes += int(isinstance(first, torch.Tensor) and first.requires_grad)
            passes += int(any(p.requires_grad for p in module.parameters(recurse=False)))
        self.total += forward * passes


@contextlib.contextmanager
def counting(enabled: bool = True) -> Iterator[MacCounter | None]:
    """Count the MACs of every linear and convolution layer run inside; None when not `enabled`."""
    if not enabled:
        yield None
        return
    counter = MacCounter()
    handle = nn.modules.module.register_module_forward_hook(counter)
    _installed.append(counter)
    try:
        yield counter
    finally:
        _installed.remove(counter)
        handle.remove()


@contextlib.contextmanager
def every_operation() -> Iterator[None]:
    """Count what runs inside by the dispatcher (every matrix product and convolution, higher-order
    gradients included) rather than by the layer hook, into every open counter; nothing is counted
    when no counter is open or inside paused()."""
    if not _installed or _paused:
        yield
        return
    # lazy: the dispatcher's counter pulls in torch's compiler stack (seconds), needed only here
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    with paused(), mode:  # the hook stands aside: each operation is counted once, by the dispatcher
        yield
    for counter in _installed:
        counter.total += mode.get_total_flops() // 2


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Layers run inside are not counted by any counter (readings, not the method's work)."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1


class IdenticalWork:
    """Pieces of work that run the same operations on tensors of the same shapes: the first counted by
    the dispatcher (every_operation), each other one as the first, without the dispatcher's cost."""

    def __init__(self) -> None:
        self.macs: int | None = None

    @contextlib.contextmanager
    def piece(self) -> Iterator[None]:
        if not _installed or _paused:
            yield
            return
        if self.macs is None:
            before = [counter.total for counter in _installed]
            with every_operation():
                yield
            self.macs = _installed[0].total - before[0]
            return
        with paused():
            yield
        for counter in _installed:
            counter.total += self.macs
