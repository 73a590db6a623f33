"""Moving model weights between torch modules and numpy (what crosses the object store)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

Weights = dict[str, np.ndarray]


def to_numpy(state: Mapping[str, torch.Tensor]) -> Weights:
    """A state dict as numpy arrays (copied to host memory)."""
    return {name: t.detach().to("cpu").numpy().copy() for name, t in state.items()}


def module_weights(module: torch.nn.Module) -> Weights:
    return to_numpy(module.state_dict())


def load_weights(module: torch.nn.Module, weights: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Copy numpy weights into a module in place (read-only object-store arrays are fine)."""
    state = module.state_dict()
    if strict and set(state) != set(weights):
        missing = sorted(set(state) ^ set(weights))
        raise KeyError(f"weights do not match the model: {missing[:5]}")
    with torch.no_grad():
        for name, array in weights.items():
            if name in state:
                state[name].copy_(torch.from_numpy(np.asarray(array)))


def is_float(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.floating)


def weighted_average(
    weight_dicts: list[Weights], coefficients: Iterable[float], keys: Iterable[str] | None = None
) -> Weights:
    """sum_k c_k * w_k for float entries (c normalised to sum to 1), computed in float64 in list order.

    Integer buffers (BatchNorm's num_batches_tracked) take the maximum.
    """
    coefficients = np.asarray(list(coefficients), dtype=np.float64)
    coefficients = coefficients / coefficients.sum()
    keys = list(keys) if keys is not None else list(weight_dicts[0])
    out: Weights = {}
    for key in keys:
        first = weight_dicts[0][key]
        if is_float(first):
            acc = np.zeros(first.shape, dtype=np.float64)
            for c, weights in zip(coefficients, weight_dicts):
                acc += c * weights[key]
            out[key] = acc.astype(first.dtype)
        else:
            out[key] = np.max(np.stack([w[key] for w in weight_dicts]), axis=0)
    return out


def serialized_nbytes(obj: Any) -> int:
    """Bytes that Ray moves for `obj`: its pickle (protocol 5) plus out-of-band buffers.

    Ray serialises numpy arrays out of band the same way, so this is the size of what crosses
    between server and client, up to pickle's memo: the count is taken without it (each key and
    dtype written in full, a few bytes more per array than Ray may send) so that it depends on the
    values alone, not on which Python objects happen to be shared - a resumed run, whose state
    was read back from its checkpoint, counts the same bytes as an uninterrupted one.
    """
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    pickler = pickle.Pickler(stream, protocol=5, buffer_callback=buffers.append)
    pickler.fast = True  # no memo (payloads are trees, never cyclic)
    pickler.dump(obj)
    head = stream.getbuffer()
    return len(head) + sum(memoryview(b).nbytes for b in buffers)
