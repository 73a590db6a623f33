"""torchvision dataset roots (download=False): MNIST, FashionMNIST, CIFAR10, CIFAR100, SVHN."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raysim.data.arrays import ArrayDataset
from raysim.data.decode import resize_array
from raysim.data.records import RECORDS, TorchvisionSpec, known_classes
from raysim.data.source import Source, one_line
from raysim.errors import RaysimError

# The torchvision root of each dataset that has one (its record's `torchvision`).
SPECS: dict[str, TorchvisionSpec] = {r.name: r.torchvision for r in RECORDS if r.torchvision is not None}


def _candidate_roots(root: Path, spec: TorchvisionSpec) -> list[Path]:
    """The torchvision root itself, or its parents when the user pointed at MNIST/ or MNIST/raw/."""
    out = [root]
    parts = Path(spec.folder).parts
    for depth in range(1, len(parts) + 1):
        if tuple(root.parts[-depth:]) == parts[:depth]:
            out.append(root.parents[depth - 1])
    return out


def find_torchvision(root: Path, name: str, image_size: int | None) -> Source | None:
    spec = SPECS.get(name)
    if spec is None:
        return None
    partial: tuple[Path, list[str]] | None = None
    for tv_root in _candidate_roots(root, spec):
        folder = tv_root / spec.folder
        present = [f for f in spec.files if (folder / f).is_file()]
        if len(present) == len(spec.files):
            files = tuple(folder / f for f in spec.files)
            return Source(
                layout="torchvision",
                files=files,
                build=lambda tv_root=tv_root: read_torchvision_dataset(name, tv_root, image_size),
                where=str(folder),
            )
        if present and partial is None:
            partial = (folder, [f for f in spec.files if f not in present])
    if partial is not None:
        folder, missing = partial
        raise RaysimError(
            f"{name}: incomplete torchvision layout in {folder}: missing {', '.join(missing)}: "
            f"add them (torchvision expects {spec.hint})"
        )
    return None


def _arrays(kind: str, ds) -> tuple[np.ndarray, np.ndarray]:
    data = ds.data
    data = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
    labels = ds.labels if kind == "svhn" else ds.targets
    labels = labels.numpy() if hasattr(labels, "numpy") else np.asarray(labels)
    if kind == "idx":
        data = data[..., None]  # (N, 28, 28) -> (N, 28, 28, 1)
    elif kind == "svhn":
        data = data.transpose(0, 2, 3, 1)  # (N, 3, 32, 32) -> (N, 32, 32, 3)
    return np.ascontiguousarray(data, dtype=np.uint8), labels.astype(np.int64)


def _reason(exc: Exception) -> str:
    """torchvision's message without its download=True advice (raysim never downloads)."""
    text = one_line(exc, 160).replace("You can use download=True to download it", "").strip(" .")
    return text or type(exc).__name__


def read_torchvision_dataset(name: str, tv_root: Path, image_size: int | None) -> ArrayDataset:
    spec = SPECS[name]
    try:
        # lazy: torchvision takes seconds to import, and only data in its layout need it
        import torchvision.datasets as tvd

        cls = getattr(tvd, spec.cls)
        if spec.kind == "svhn":
            train = cls(str(tv_root), split="train", download=False)
            test = cls(str(tv_root), split="test", download=False)
        else:
            train = cls(str(tv_root), train=True, download=False)
            test = cls(str(tv_root), train=False, download=False)
    except ImportError as exc:
        raise RaysimError(
            f"{name}: reading the torchvision files needs a missing module ({one_line(exc, 80)}): "
            f"install it (svhn needs scipy) or use train.parquet/test.parquet instead"
        ) from None
    except Exception as exc:  # noqa: BLE001 - torchvision's RuntimeError etc. must not escape
        raise RaysimError(
            f"{name}: torchvision could not read {tv_root / spec.folder} ({_reason(exc)}): "
            f"replace the files with the official ones ({spec.hint})"
        ) from None
    train_x, train_y = _arrays(spec.kind, train)
    test_x, test_y = _arrays(spec.kind, test)
    classes = list(getattr(train, "classes", None) or []) if spec.classes_from_files else []
    classes = classes or known_classes(name)
    return ArrayDataset(
        name=name,
        classes=list(classes),
        train_x=resize_array(train_x, image_size),
        train_y=train_y,
        test_x=resize_array(test_x, image_size),
        test_y=test_y,
    )
