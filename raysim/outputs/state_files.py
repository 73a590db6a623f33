"""Checkpoints and client state on disk that load with `torch.load(weights_only=True)`.

A run directory may come from someone else, and `--resume` reads it on the driver and in every
client actor: a file that could run code when loaded (any pickle) would run it there. So states
are written as what the restricted unpickler accepts - tensors, numbers, strings, None and
dict/list/tuple of them - and numpy arrays are stored as their raw bytes in a uint8 tensor with
their dtype and shape (exact for every dtype, no pickled numpy objects). Reading refuses anything
else in one line, without running it.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.errors import RaysimError
from raysim.outputs.safe_write import atomic_write

_ARRAY = "__raysim_ndarray__"  # tag of an encoded numpy array


def encode(obj: Any, where: str = "state") -> Any:
    """`obj` as tensors and plain containers; a clear error for anything else."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(
                f"{where} is a numpy array of Python objects, which a checkpoint cannot hold safely: store numbers"
            )
        flat = np.ascontiguousarray(obj).reshape(-1)  # (ascontiguousarray makes a 0-d array 1-d: keep obj's shape)
        return {_ARRAY: torch.from_numpy(flat.view(np.uint8).copy()), "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):  # a numpy scalar comes back as one, of its dtype
        return {**encode(np.asarray(obj), where), "scalar": True}
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
                raise TypeError(f"{where} has a key of type {type(key).__name__}: use strings or numbers")
        return {key: encode(value, f"{where}[{key!r}]") for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [encode(value, f"{where}[{i}]") for i, value in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__name__}, which a checkpoint cannot hold "
        "safely: keep tensors, numpy arrays, numbers, strings and dict/list/tuple of them in states"
    )


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _ARRAY in obj:
            raw = obj[_ARRAY].numpy()
            array = raw.view(np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
            return array[()] if obj.get("scalar") else array
        return {key: decode(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [decode(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(decode(value) for value in obj)
    return obj


def save_state(path: Path, obj: Any) -> None:
    """Write `obj` atomically (a run killed at any moment leaves the previous file intact), never
    through a link planted at its name or its temporary one (raysim.outputs.safe_write)."""
    encoded = encode(obj)
    atomic_write(Path(path), lambda p: torch.save(encoded, p))


class UnreadableStateError(RaysimError):
    """A checkpoint or client-state file that is damaged or holds more than tensors and containers."""


def load_state(path: Path, way_out: str) -> Any:
    """The object `save_state` wrote. Anything that is not a tensor or a plain container is refused
    unread; a damaged file is named. `way_out` completes the message: what the user can do."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            # torch warns about a plain pickle's protocol before its restricted unpickler reads (or
            # refuses) it: a line beside raysim's own that the user can do nothing with
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            loaded = torch.load(path, weights_only=True, map_location="cpu")
        return decode(loaded)
    except pickle.UnpicklingError:
        # torch's restricted unpickler stopped at something it does not allow: nothing was executed.
        raise UnreadableStateError(
            f"{path} holds objects other than tensors and plain containers, so raysim refuses to load it "
            f"(a pickle could run code; this version of raysim never writes one): {way_out}"
        ) from None
    except OSError as exc:
        if exc.errno is not None:
            raise  # a disk or permission problem, not a damaged file
        raise UnreadableStateError(f"{path} is damaged or truncated ({_reason(exc)}): {way_out}") from None
    except (RuntimeError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableStateError(f"{path} is damaged or truncated ({_reason(exc)}): {way_out}") from None


def _reason(exc: Exception) -> str:
    """The first sentence of torch's message (its miniz errors go on for several)."""
    text = str(exc).strip().split("\n")[0].split(". ")[0]
    return text if len(text) > 12 else "not a checkpoint raysim wrote"


# ---------------------------------------------------------------- checkpoints (RunDir names and reads them)
CHECKPOINT_FIELDS = {"round": int, "state": dict, "wall_time_s": (int, float)}


def checked_checkpoint(checkpoint: Any, path: Path, way_out: str) -> dict[str, Any]:
    """A file that loads safely but is not what write_checkpoint wrote is refused, naming what it lacks."""
    if not isinstance(checkpoint, dict):
        raise UnreadableStateError(
            f"{path} is not a raysim checkpoint (it holds a {type(checkpoint).__name__}): {way_out}"
        )
    wrong = [
        name
        for name, kind in CHECKPOINT_FIELDS.items()
        if not isinstance(checkpoint.get(name), kind) or isinstance(checkpoint.get(name), bool)
    ]
    if wrong or checkpoint["round"] < 0:
        raise UnreadableStateError(
            f"{path} is not a raysim checkpoint (missing or malformed: {', '.join(wrong) or 'round'}): {way_out}"
        )
    return checkpoint


def check_model_arrays(
    checkpoint: dict[str, Any], key: str, expected: dict[str, tuple[int, ...]], path: Path, way_out: str
) -> None:
    """The checkpoint's state[key] holds one numeric array per name of `expected` (name -> shape),
    each of that shape: the global model ('weights', every name of the model's state dict) or an
    algorithm's per-parameter state (SCAFFOLD's 'control'). Refused in one line before Ray starts,
    not an actor's KeyError or size mismatch after it."""

    def refuse(what: str) -> UnreadableStateError:
        return UnreadableStateError(f"{path} does not hold this run's model ({what}): {way_out}")

    arrays = checkpoint["state"].get(key)
    if not isinstance(arrays, dict):
        if arrays is None:
            raise refuse(f"no '{key}' in its state")
        raise refuse(f"its state's '{key}' is a {type(arrays).__name__}")
    missing = [name for name in expected if name not in arrays]
    extra = [name for name in arrays if name not in expected]
    if missing or extra:
        parts = [f"lack {_names(missing)}"] if missing else []
        parts += [f"have {_names(extra)}, which the model has not"] if extra else []
        raise refuse(f"its '{key}' " + " and ".join(parts))
    for name, shape in expected.items():
        value = arrays[name]
        if isinstance(value, torch.Tensor):
            numeric, got = not value.dtype.is_complex, tuple(value.shape)
        elif isinstance(value, (np.ndarray, np.generic)):  # a 0-d buffer (num_batches_tracked) is a numpy scalar
            numeric, got = np.asarray(value).dtype.kind in "biuf", np.shape(value)
        else:
            raise refuse(f"'{key}' entry '{name}' is a {type(value).__name__}, not an array")
        if not numeric:
            raise refuse(f"'{key}' entry '{name}' holds {value.dtype}, not numbers")
        if tuple(got) != tuple(shape):
            raise refuse(f"'{key}' entry '{name}' has shape {list(got)}, the model's is {list(shape)}")


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(str(n)) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
