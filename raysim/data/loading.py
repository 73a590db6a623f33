"""load_dataset: name + root -> ArrayDataset, detecting the layout of root automatically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from raysim.data.arrays import ArrayDataset
from raysim.data.cache import get_or_build, memo_put
from raysim.data.embedded import embedded_source
from raysim.data.home import dataset_folder, get_hint
from raysim.data.image_folder import find_domainnet, find_image_folder
from raysim.data.known import check_promise
from raysim.data.parquet import find_parquet
from raysim.data.records import DATASET_NAMES, record
from raysim.data.source import Source
from raysim.data.torchvision_root import find_torchvision
from raysim.errors import RaysimError

Finder = Callable[[Path, str, "int | None"], "Source | None"]
_FINDERS: dict[str, Finder] = {
    "parquet": find_parquet,
    "torchvision": find_torchvision,
    "image_folder": find_image_folder,
    "domainnet": find_domainnet,
}


def _hint(name: str) -> str:
    """What to put under dataset.root for this dataset, as one clause."""
    return record(name).hint()


def describe_datasets() -> list[tuple[str, str]]:
    """(name, one line: what it is and which layouts dataset.root may hold)."""
    out = []
    for name in DATASET_NAMES:
        needs = "no root needed" if name == "embedded" else f"root holds {_hint(name)}"
        out.append((name, f"{record(name).describe()}; {needs}"))
    return out


def _normalise_name(name: object) -> str:
    if not isinstance(name, str):
        raise RaysimError(f"dataset.name must be a string, got {name!r}: use one of {', '.join(DATASET_NAMES)}")
    key = name.strip().lower().replace("-", "_")
    if key not in DATASET_NAMES:
        raise RaysimError(f"unknown dataset '{name}': set dataset.name to one of {', '.join(DATASET_NAMES)}")
    return key


MAX_IMAGE_SIZE = 1024  # pixels a side: the papers use 28 to 64 (224 for ImageNet-sized models)


def _check_image_size(image_size: object) -> int | None:
    if image_size is None:
        return None
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise RaysimError(f"dataset.image_size must be a positive integer (pixels) or unset, got {image_size!r}")
    if image_size > MAX_IMAGE_SIZE:
        raise RaysimError(
            f"dataset.image_size={image_size} is too large: every image would be resized to "
            f"{image_size}x{image_size} ({3 * image_size**2 / 1e6:.3g} MB each in RGB, and as large an input for "
            f"the models): give at most {MAX_IMAGE_SIZE} (the papers use 28 to 64), or unset it"
        )
    return image_size


def _locate(name: str, root: str | Path | None, image_size: int | None) -> Source:
    given = root is not None and bool(str(root).strip())
    path = dataset_folder(name, root)
    if not path.exists():
        if not given:
            raise RaysimError(
                f"{name} is not in the data home (no {path}): {get_hint(name)}, or set dataset.root to the "
                f"folder holding {_hint(name)}"
            )
        raise RaysimError(
            f"dataset root '{root}' does not exist: set dataset.root=... to the folder holding {_hint(name)}, "
            f"or leave it unset and {get_hint(name)}"
        )
    if not path.is_dir():
        raise RaysimError(
            f"dataset root '{path}' is a file, not a folder: set dataset.root to the folder holding {_hint(name)}"
        )
    for layout in record(name).layouts:
        source = _FINDERS[layout](path, name, image_size)
        if source is not None:
            return source
    raise RaysimError(f"{name}: no data under {path}: put {_hint(name)} there, or {get_hint(name)}")


def load_dataset(
    name: str, root: str | None = None, image_size: int | None = None, verify: bool = True
) -> ArrayDataset:
    """Load a dataset as uint8 arrays, decoding once and caching (see raysim.data.cache).

    ``root`` is ignored for ``embedded``; unset, the dataset's folder in the data home is read
    (raysim.data.home).  ``image_size`` resizes every image to
    image_size x image_size (default: native size; 64 for domainnet).  ``verify``: refuse, in one
    line, data that are not what the name promises (raysim.data.known).  The returned arrays are
    read-only and shared with later calls in this process.
    """
    name = _normalise_name(name)
    image_size = _check_image_size(image_size)
    if image_size is None:
        image_size = record(name).default_image_size
    source = embedded_source(image_size) if name == "embedded" else _locate(name, root, image_size)
    root_key = None if name == "embedded" else str(dataset_folder(name, root).resolve())
    dataset = memo_put((name, root_key, image_size), get_or_build(name, source, image_size))
    if verify:
        check_promise(dataset, name, image_size, source.where or root_key)
    return dataset
