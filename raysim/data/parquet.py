"""Hugging Face image layout: train/test Parquet files with an encoded-image struct column."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.data.arrays import ArrayDataset
from raysim.data.decode import decode_images
from raysim.data.records import known_classes
from raysim.data.source import Source, one_line
from raysim.errors import RaysimError

IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "fine_label", "labels")
TEST_SPLITS = ("test", "valid", "validation")


def _split_files(root: Path, split: str) -> list[Path]:
    single = root / f"{split}.parquet"
    if single.is_file():
        return [single]
    for folder in (root, root / "data"):
        shards = sorted(p for p in folder.glob(f"{split}-*.parquet") if p.is_file())
        if shards:
            return shards
    return []


def find_parquet(root: Path, name: str, image_size: int | None) -> Source | None:
    """A Source if ``root`` holds train(-*).parquet (directly or under data/), else None."""
    train = _split_files(root, "train")
    if not train:
        return None
    test: list[Path] = []
    for split in TEST_SPLITS:
        test = _split_files(root, split)
        if test:
            break
    if not test:
        raise RaysimError(
            f"{name}: found {train[0].name} under {root} but no test split: "
            f"add test.parquet (or test-*.parquet shards) next to it"
        )
    return Source(
        layout="parquet",
        files=tuple(train + test),
        build=lambda: read_parquet_dataset(name, train, test, image_size),
        where=str(train[0].parent),
    )


def _pick_columns(schema: pa.Schema, path: Path, name: str) -> tuple[str, str]:
    image_col = None
    candidates = [f for f in schema if pa.types.is_struct(f.type) and f.type.get_field_index("bytes") >= 0]
    for f in candidates:
        if f.name in IMAGE_COLUMNS:
            image_col = f.name
            break
    if image_col is None and candidates:
        image_col = candidates[0].name
    if image_col is None:
        raise RaysimError(
            f"{name}: {path} has no image column (a struct with a 'bytes' field, e.g. 'image' or 'img'): "
            f"use the Hugging Face image layout"
        )
    label_col = next(
        (c for c in LABEL_COLUMNS if c in schema.names and pa.types.is_integer(schema.field(c).type)), None
    )
    if label_col is None:
        raise RaysimError(
            f"{name}: {path} has no integer label column (one of {', '.join(LABEL_COLUMNS)}; "
            f"columns are {', '.join(schema.names)}): add one"
        )
    return image_col, label_col


def _hf_class_names(schema: pa.Schema, label_col: str) -> list[str] | None:
    """ClassLabel names from the 'huggingface' schema metadata, when the file has them."""
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][label_col]
        names = feature.get("names")
        return [str(n) for n in names] if names else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _read_split(name: str, files: list[Path], image_size: int | None, split: str):
    blobs: list[bytes] = []
    labels: list[np.ndarray] = []
    origin: list[tuple[int, Path]] = []  # (first global row, file) for error messages
    class_names = None
    for path in files:
        try:
            schema = pq.read_schema(path)
            image_col, label_col = _pick_columns(schema, path, name)
            table = pq.read_table(path, columns=[image_col, label_col])
        except RaysimError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreadable file -> one line
            raise RaysimError(f"{name}: cannot read {path} ({one_line(exc, 120)}): replace the file") from None
        class_names = class_names or _hf_class_names(schema, label_col)
        origin.append((len(blobs), path))
        for chunk in table.column(image_col).chunks:
            file_blobs = chunk.field("bytes").to_pylist()
            if any(b is None for b in file_blobs):
                raise RaysimError(
                    f"{name}: {path} has images without embedded bytes (paths only): "
                    f"re-export the dataset with the image bytes embedded"
                )
            blobs.extend(file_blobs)
        lab = table.column(label_col)
        if lab.null_count:
            raise RaysimError(f"{name}: {path} has rows without a label: drop them or fill the '{label_col}' column")
        labels.append(lab.to_numpy().astype(np.int64))

    def describe(i: int) -> str:
        start, path = max((o for o in origin if o[0] <= i), key=lambda o: o[0])
        return f"{path.name} row {i - start}"

    x = decode_images(blobs, image_size, describe, f"{name} {split}")
    return x, np.concatenate(labels), class_names


def read_parquet_dataset(name: str, train: list[Path], test: list[Path], image_size: int | None) -> ArrayDataset:
    train_x, train_y, names_a = _read_split(name, train, image_size, "train")
    test_x, test_y, names_b = _read_split(name, test, image_size, "test")
    if train_x.shape[3] != test_x.shape[3]:  # e.g. grey train shard, colour test shard
        train_x, test_x = (np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x for x in (train_x, test_x))
    if train_x.shape[1] != test_x.shape[1]:
        raise RaysimError(
            f"{name}: train images are {train_x.shape[1]}px but test images are {test_x.shape[1]}px: "
            f"set dataset.image_size=N to resize both"
        )
    classes = names_a or names_b or known_classes(name)
    top = int(max(train_y.max(initial=-1), test_y.max(initial=-1)))
    low = int(min(train_y.min(initial=0), test_y.min(initial=0)))
    if classes is None:
        classes = [str(i) for i in range(top + 1)]
    if low < 0 or top >= len(classes):
        raise RaysimError(
            f"{name}: labels in {train[0].parent} range {low}..{top} but {name} has {len(classes)} classes "
            f"(0..{len(classes) - 1}): check dataset.name matches the data"
        )
    return ArrayDataset(
        name=name, classes=list(classes), train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y
    )
