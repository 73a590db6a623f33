"""`resources.compile`: the hot loops' models run through torch.compile (TorchInductor), set once per
process (each actor's and the server's, from its config, in raysim.engine.devices.configure_torch).

Where: the model's forward in raysim.training.train (local training, the server's training on
condensed and synthetic images, DynaFed's fine-tuning, the one-shot distillation) and the embedding
in distribution matching (FedAF, FedDM, DCFL). Not DynaFed's unrolled trajectory steps: they take
gradients of gradients (`create_graph`), which a compiled graph does not give (AOTAutograd has no
double backward); they stay eager.

Decided: shapes are compiled dynamic from the first call (`dynamic=True`). One graph then serves
every batch size, so which graph computes a batch never depends on the batches the process saw
before; with PyTorch's default (a static graph for the first shape, a dynamic one from the second
shape on) the same client could be computed by either graph depending on which clients its actor
had trained earlier, and results would depend on the number of actors. Compiled graphs are reused
across model instances of one class (a fresh wrapper costs nothing), and Inductor caches its
kernels on disk, so a machine's later processes compile faster.

The numbers differ from eager mode in the last bits (fused kernels round differently); they are the
same across actor counts and repeats. Whether compiling pays depends on the model (the first call
of each graph compiles for seconds to a minute on a CPU core): the engine report measures it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch._functorch.config

_on = False


def set_compile(on: bool) -> None:
    global _on
    _on = bool(on)
    if _on:
        # FedAF logs its terms' gradient ratio with two backward passes through one graph
        # (retain_graph), which a compiled backward that reuses ("donates") its buffers refuses

        torch._functorch.config.donated_buffer = False
        # a model's graphs: grad mode x train/eval x which inputs need gradients; past the limit
        # Dynamo would fall back to eager for the rest, and the numbers would depend on history
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)


def enabled() -> bool:
    return _on


@contextmanager
def kept() -> Iterator[None]:
    """The process's setting as it was before the block (an in-process run sets its own)."""
    before = _on
    try:
        yield
    finally:
        set_compile(before)


def function(fn: Callable) -> Callable:
    """`fn` compiled when resources.compile is on, else `fn` itself.

    Its tensor arguments are handed over as tensors of their own (not views), contiguous and at
    offset 0: a graph is guarded on its inputs' strides, storage offsets and bases too, and
    augmentations and views (DSA's flips and crops, a slice or a reshape of a batch) vary them
    from call to call, which would compile a graph per layout (a copy costs far less than a step).
    """
    if not _on:
        return fn
    compiled_fn = torch.compile(fn, dynamic=True)
    return lambda *args: compiled_fn(*(_plain(a) for a in args))


def _plain(value):
    if not torch.is_tensor(value) or (value._base is None and value.is_contiguous() and value.storage_offset() == 0):
        return value
    return value.clone(memory_format=torch.contiguous_format)


@contextmanager
def forward(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` whose forward is compiled while the block runs (when resources.compile is on).

    The compiled forward is an attribute of the instance for the block only, so hooks, state
    dicts, copies and every other use of the model outside the block see the plain module.
    """
    if not _on or "forward" in vars(model):
        yield model
        return
    model.forward = function(model.forward)
    try:
        yield model
    finally:
        del model.forward
