"""Image folders: root/{train,test}/<class>/*.png|jpg, and DomainNet-style root/<domain>/{train,test}/<class>/*."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from raysim.data.arrays import ArrayDataset
from raysim.data.decode import decode_images
from raysim.data.source import Source
from raysim.errors import RaysimError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
TEST_SPLITS = ("test", "valid", "val")  # CINIC-10 has valid/ too: used only when there is no test/


def _subdirs(folder: Path) -> list[str]:
    with os.scandir(folder) as it:
        return sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))


def _images(folder: Path) -> list[Path]:
    with os.scandir(folder) as it:
        return sorted(
            Path(e.path)
            for e in it
            if e.is_file() and not e.name.startswith(".") and e.name.lower().endswith(IMAGE_EXTENSIONS)
        )


def _scan_split(split_dir: Path) -> dict[str, list[Path]]:
    """class name -> sorted image paths, for every class folder under split_dir."""
    return {c: _images(split_dir / c) for c in _subdirs(split_dir)}


def _test_dir(base: Path) -> Path | None:
    return next((base / s for s in TEST_SPLITS if (base / s).is_dir()), None)


def _flatten(name: str, split_dir: Path, per_class: dict[str, list[Path]], classes: list[str]):
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(per_class) - set(index))
    if unknown:
        raise RaysimError(
            f"{name}: {split_dir} has class folders not in train/: {', '.join(unknown[:5])}: "
            f"rename or remove them so every class has a train/ folder"
        )
    paths: list[Path] = []
    labels: list[int] = []
    for c, files in per_class.items():
        paths.extend(files)
        labels.extend([index[c]] * len(files))
    if not paths:
        raise RaysimError(
            f"{name}: no .png/.jpg/.jpeg images under {split_dir}/<class>/: add images or fix dataset.root"
        )
    return paths, np.asarray(labels, dtype=np.int64)


def _decode(name: str, paths: list[Path], image_size: int | None, what: str) -> np.ndarray:
    return decode_images(paths, image_size, lambda i: f"'{paths[i]}'", f"{name} {what}")


def _match_channels(*xs: np.ndarray) -> list[np.ndarray]:
    if len({x.shape[3] for x in xs}) > 1:  # some grey, some colour: all RGB
        return [np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x for x in xs]
    return list(xs)


def _check_sizes(name: str, root: Path, *xs: np.ndarray) -> None:
    sizes = sorted({x.shape[1] for x in xs})
    if len(sizes) > 1:
        raise RaysimError(
            f"{name}: images under {root} come in sizes {', '.join(f'{s}px' for s in sizes)}: "
            f"set dataset.image_size=N to resize all to NxN"
        )


# --- plain image folder -------------------------------------------------------------------------


def find_image_folder(root: Path, name: str, image_size: int | None) -> Source | None:
    train_dir = root / "train"
    if not train_dir.is_dir() or not _subdirs(train_dir):
        return None
    test_dir = _test_dir(root)
    if test_dir is None:
        raise RaysimError(
            f"{name}: found {train_dir} but no test/ (or valid/) folder next to it: add test/<class>/*.png"
        )
    train = _scan_split(train_dir)
    test = _scan_split(test_dir)
    classes = sorted(train)
    empty = [c for c in classes if not train[c]]
    if empty:
        raise RaysimError(
            f"{name}: class folder(s) {', '.join(empty[:5])} under {train_dir} hold no .png/.jpg/.jpeg images: "
            f"add images or remove the folder"
        )
    train_paths, train_y = _flatten(name, train_dir, train, classes)
    test_paths, test_y = _flatten(name, test_dir, test, classes)

    def build() -> ArrayDataset:
        train_x = _decode(name, train_paths, image_size, "train")
        test_x = _decode(name, test_paths, image_size, "test")
        _check_sizes(name, root, train_x, test_x)
        train_x, test_x = _match_channels(train_x, test_x)
        return ArrayDataset(name=name, classes=classes, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)

    return Source(layout="image_folder", files=tuple(train_paths + test_paths), build=build, where=str(root))


# --- DomainNet-style: one image folder per domain ------------------------------------------------


def find_domainnet(root: Path, name: str, image_size: int | None) -> Source | None:
    domains = [d for d in _subdirs(root) if (root / d / "train").is_dir()]
    if not domains:
        return None
    scans: dict[str, tuple[dict[str, list[Path]], dict[str, list[Path]], Path]] = {}
    for d in domains:
        test_dir = _test_dir(root / d)
        if test_dir is None:
            raise RaysimError(
                f"{name}: domain '{d}' has train/ but no test/ folder under {root / d}: add test/<class>/"
            )
        scans[d] = (_scan_split(root / d / "train"), _scan_split(test_dir), test_dir)
    classes = sorted(set().union(*(set(tr) for tr, _, _ in scans.values())))
    for d, (tr, te, _) in scans.items():
        missing = [c for c in classes if not tr.get(c)]
        if missing:
            raise RaysimError(
                f"{name}: domain '{d}' has no train images for class(es) {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''}: every domain must share the same class folders"
            )
    parts = []
    for k, d in enumerate(domains):
        tr, te, test_dir = scans[d]
        tp, ty = _flatten(name, root / d / "train", tr, classes)
        vp, vy = _flatten(name, test_dir, te, classes)
        parts.append((tp, ty, vp, vy, k))
    train_paths = [p for tp, *_ in parts for p in tp]
    test_paths = [p for _, _, vp, _, _ in parts for p in vp]

    def build() -> ArrayDataset:
        train_x = _decode(name, train_paths, image_size, "train")
        test_x = _decode(name, test_paths, image_size, "test")
        _check_sizes(name, root, train_x, test_x)
        train_x, test_x = _match_channels(train_x, test_x)
        return ArrayDataset(
            name=name,
            classes=classes,
            train_x=train_x,
            train_y=np.concatenate([ty for _, ty, _, _, _ in parts]),
            test_x=test_x,
            test_y=np.concatenate([vy for _, _, _, vy, _ in parts]),
            domains=domains,
            train_domain=np.concatenate([np.full(len(tp), k, np.int64) for tp, _, _, _, k in parts]),
            test_domain=np.concatenate([np.full(len(vp), k, np.int64) for _, _, vp, _, k in parts]),
        )

    return Source(layout="domainnet", files=tuple(train_paths + test_paths), build=build, where=str(root))
