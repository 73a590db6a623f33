"""Tests for raysim.data: embedded sample, layouts, cache, one-line errors."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import raysim.data.embedded as embedded_mod
from raysim.data import DATASET_NAMES, ArrayDataset, clear_memory_cache, describe_datasets, load_dataset
from raysim.data.cache import cache_dir
from raysim.data.classnames import FASHION_MNIST
from raysim.errors import RaysimError

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    clear_memory_cache()
    yield
    clear_memory_cache()


def _raises_one_line(match: str, *args, **kwargs) -> str:
    with pytest.raises(RaysimError) as info:
        load_dataset(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    assert match in msg, msg
    return msg


def _png(path: Path, value: int, size=(8, 8), mode="L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = value if mode == "L" else (value, 255 - value, value // 2)
    Image.new(mode, size, fill).save(path)


# --- embedded -------------------------------------------------------------------------------------


def test_embedded_loads():
    ds = load_dataset("embedded", root="/ignored/for/embedded")
    assert isinstance(ds, ArrayDataset)
    assert ds.train_x.shape == (10_000, 28, 28, 1) and ds.test_x.shape == (2_000, 28, 28, 1)
    assert ds.train_x.dtype == np.uint8 and ds.train_y.dtype == np.int64
    assert ds.num_classes == 10 and ds.channels == 1 and ds.image_size == 28
    assert ds.classes == FASHION_MNIST
    assert np.bincount(ds.train_y, minlength=10).tolist() == [1000] * 10
    assert np.bincount(ds.test_y, minlength=10).tolist() == [200] * 10
    assert ds.domains is None and ds.train_domain is None
    assert not ds.train_x.flags.writeable  # shared by the memo: read-only


def test_embedded_mean_std():
    mean, std = load_dataset("embedded").mean_std()
    assert mean.dtype == np.float32 and mean.shape == (1,) and std.shape == (1,)
    assert 0.25 < mean[0] < 0.32 and 0.32 < std[0] < 0.38  # Fashion-MNIST: ~0.286 / ~0.353


def test_fixed_normalisation_constants_replace_the_training_splits_own():
    from raysim.experiment import load_config
    from raysim.runner import prepare

    quick = Path(__file__).resolve().parents[1] / "configs/quickstart.yaml"
    own = prepare(load_config(quick, []))
    assert abs(own.mean[0] - 0.286) < 0.03  # the embedded FMNIST split's own
    fixed = prepare(load_config(quick, ["dataset.mean=[0.1307]", "dataset.std=[0.3081]"]))
    assert fixed.mean.dtype == np.float32 and fixed.mean.tolist() == pytest.approx([0.1307])
    assert fixed.std.tolist() == pytest.approx([0.3081])
    with pytest.raises(RaysimError, match=r"dataset.mean has 3 values but embedded has 1 channel"):
        prepare(load_config(quick, ["dataset.mean=[0.5,0.5,0.5]", "dataset.std=[0.2,0.2,0.2]"]))
    with pytest.raises(RaysimError, match="dataset.mean and dataset.std go together"):
        load_config(quick, ["dataset.mean=[0.5]"])
    with pytest.raises(RaysimError, match="dataset.std must be > 0"):
        load_config(quick, ["dataset.mean=[0.5]", "dataset.std=[0]"])


def test_cache_hit_returns_identical_arrays(monkeypatch):
    first = load_dataset("embedded")
    assert load_dataset("embedded") is first  # in-process memo
    files = list(cache_dir().iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # no leftover temporary files

    clear_memory_cache()
    monkeypatch.setattr(embedded_mod, "read_parquet_dataset", lambda *a, **k: pytest.fail("decoded again"))
    second = load_dataset("embedded")
    assert second is not first
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(first, field), getattr(second, field))
    assert second.classes == first.classes and second.name == "embedded"


def test_corrupt_cache_is_rebuilt():
    first = load_dataset("embedded")
    (entry,) = cache_dir().iterdir()
    entry.write_bytes(b"not an npz")
    clear_memory_cache()
    again = load_dataset("embedded")
    assert np.array_equal(first.train_x, again.train_x)


# --- image folders --------------------------------------------------------------------------------


def _make_folder(root: Path, test_split="test") -> None:
    for split, n in (("train", 3), (test_split, 2)):
        for label, cls in enumerate(("cat", "dog")):
            for i in range(n):
                _png(root / split / cls / f"{i}.png", value=10 + 200 * label + i)


def test_image_folder(tmp_path):
    _make_folder(tmp_path / "d")
    ds = load_dataset("cifar10", tmp_path / "d", verify=False)
    assert ds.classes == ["cat", "dog"]
    assert ds.train_x.shape == (6, 8, 8, 1) and ds.test_x.shape == (4, 8, 8, 1)
    assert ds.train_y.tolist() == [0, 0, 0, 1, 1, 1]
    # pixel value encodes the class: 10..12 for cat, 210..212 for dog
    assert ((ds.train_x[:, 0, 0, 0] >= 200) == (ds.train_y == 1)).all()
    assert ((ds.test_x[:, 0, 0, 0] >= 200) == (ds.test_y == 1)).all()


def test_image_folder_uses_valid_when_no_test_and_resizes_mixed_sizes(tmp_path):
    root = tmp_path / "cinic"
    _make_folder(root, test_split="valid")
    _png(root / "train" / "cat" / "big.png", 50, size=(12, 12), mode="RGB")
    _raises_one_line("image_size", "cinic10", root)
    ds = load_dataset("cinic10", root, image_size=8, verify=False)
    assert ds.train_x.shape == (7, 8, 8, 3) and ds.test_x.shape == (4, 8, 8, 3)  # one colour image -> all RGB


def test_cache_invalidated_when_source_changes(tmp_path):
    root = tmp_path / "d"
    _make_folder(root)
    before = load_dataset("mnist", root, verify=False)
    _png(root / "train" / "cat" / "0.png", value=99)
    clear_memory_cache()
    after = load_dataset("mnist", root, verify=False)
    assert before.train_x[0, 0, 0, 0] == 10 and after.train_x[0, 0, 0, 0] == 99


def test_domainnet_folders(tmp_path):
    root = tmp_path / "dn"
    for d, (domain, size) in enumerate((("clipart", (20, 12)), ("real", (16, 16)))):
        for label, cls in enumerate(("apple", "bus")):
            for i in range(2 + d):
                _png(root / domain / "train" / cls / f"{i}.jpg", 40 * label + 100 * d, size=size, mode="RGB")
            _png(root / domain / "test" / cls / "0.png", 40 * label + 100 * d, size=size, mode="RGB")
    ds = load_dataset("domainnet", root)
    assert ds.domains == ["clipart", "real"] and ds.classes == ["apple", "bus"]
    assert ds.train_x.shape == (10, 64, 64, 3) and ds.test_x.shape == (4, 64, 64, 3)
    assert ds.train_domain.tolist() == [0] * 4 + [1] * 6 and ds.test_domain.tolist() == [0, 0, 1, 1]
    assert ds.train_y.tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    small = load_dataset("domainnet", root, image_size=16)
    assert small.train_x.shape == (10, 16, 16, 3)

    _png(root / "real" / "train" / "car" / "0.png", 1, mode="RGB")
    clear_memory_cache()
    _raises_one_line("clipart", "domainnet", root)


# --- torchvision root -----------------------------------------------------------------------------


def _idx_images(path: Path, x: np.ndarray) -> None:
    path.write_bytes(struct.pack(">iiii", 0x803, *x.shape) + x.tobytes())


def _idx_labels(path: Path, y: np.ndarray) -> None:
    path.write_bytes(struct.pack(">ii", 0x801, len(y)) + y.astype(np.uint8).tobytes())


def test_torchvision_mnist_root(tmp_path):
    raw = tmp_path / "tv" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 256, (12, 28, 28), dtype=np.uint8)
    y_train = np.arange(12) % 10
    x_test = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    y_test = np.arange(5)
    _idx_images(raw / "train-images-idx3-ubyte", x_train)
    _idx_labels(raw / "train-labels-idx1-ubyte", y_train)
    _idx_images(raw / "t10k-images-idx3-ubyte", x_test)
    _idx_labels(raw / "t10k-labels-idx1-ubyte", y_test)

    ds = load_dataset("mnist", tmp_path / "tv", verify=False)
    assert ds.train_x.shape == (12, 28, 28, 1) and ds.test_x.shape == (5, 28, 28, 1)
    assert np.array_equal(ds.train_x[..., 0], x_train) and ds.train_y.tolist() == y_train.tolist()
    assert ds.classes == [str(i) for i in range(10)]
    # pointing at MNIST/ itself works too
    assert np.array_equal(load_dataset("mnist", tmp_path / "tv" / "MNIST", verify=False).test_x[..., 0], x_test)

    (raw / "t10k-labels-idx1-ubyte").unlink()
    clear_memory_cache()
    _raises_one_line("t10k-labels-idx1-ubyte", "mnist", tmp_path / "tv")


def test_torchvision_error_does_not_escape(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / f).write_bytes(b"garbage")
    _raises_one_line("cifar10", "cifar10", tmp_path)


# --- Parquet --------------------------------------------------------------------------------------


def test_parquet_shards_and_fine_label(tmp_path):
    def shard(path: Path, labels: list[int]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        blobs = []
        for v in labels:
            buf = __import__("io").BytesIO()
            Image.new("RGB", (4, 4), (v, v, v)).save(buf, format="PNG")
            blobs.append({"bytes": buf.getvalue(), "path": f"{v}.png"})
        pq.write_table(pa.table({"img": blobs, "fine_label": pa.array(labels, pa.int64())}), path)

    shard(tmp_path / "data" / "train-00000-of-00002.parquet", [0, 5])
    shard(tmp_path / "data" / "train-00001-of-00002.parquet", [99])
    shard(tmp_path / "data" / "test-00000-of-00001.parquet", [7])
    ds = load_dataset("cifar100", tmp_path, verify=False)
    assert ds.num_classes == 100 and ds.classes[99] == "worm"
    assert ds.train_y.tolist() == [0, 5, 99] and ds.train_x.shape == (3, 4, 4, 3)
    assert ds.train_x[2, 0, 0].tolist() == [99, 99, 99]
    _raises_one_line("labels", "cifar10", tmp_path)  # label 99 does not fit 10 classes


# --- errors and description -----------------------------------------------------------------------


def test_errors_are_one_line(tmp_path):
    _raises_one_line("cifar10", "imagenet_full", str(tmp_path))
    _raises_one_line("does not exist", "mnist", str(tmp_path / "nope"))
    _raises_one_line("raysim data get mnist", "mnist", None)
    msg = _raises_one_line("no data under", "cifar10", str(tmp_path))
    assert "cifar-10-batches-py" in msg and "train.parquet" in msg and "train/<class>" in msg
    (tmp_path / "file.txt").write_text("x")
    _raises_one_line("not a folder", "mnist", str(tmp_path / "file.txt"))
    _raises_one_line("image_size", "mnist", str(tmp_path), image_size=-3)


def test_describe_datasets():
    rows = describe_datasets()
    assert [n for n, _ in rows] == list(DATASET_NAMES)
    assert all(text and "\n" not in text for _, text in rows)


# --- real data in ../shared/data ------------------------------------------------------------------


def _shared(name: str) -> Path:
    root = SHARED_DATA / name
    if not (root / "train.parquet").is_file():
        pytest.skip(f"real {name} data not found at {root} (project checkout without ../shared/data)")
    return root


@pytest.mark.slow  # decodes the real MNIST: about 6 s
@pytest.mark.shared_data
def test_shared_mnist():
    ds = load_dataset("mnist", _shared("mnist"))
    assert ds.train_x.shape == (60_000, 28, 28, 1) and ds.test_x.shape == (10_000, 28, 28, 1)
    assert np.bincount(ds.train_y)[0] == 5923
    assert abs(float(ds.mean_std()[0][0]) - 0.1307) < 0.002


@pytest.mark.slow  # decodes the real CIFAR-10: about 10 s
@pytest.mark.shared_data
def test_shared_cifar10():
    ds = load_dataset("cifar10", _shared("cifar10"))
    assert ds.train_x.shape == (50_000, 32, 32, 3) and ds.test_x.shape == (10_000, 32, 32, 3)
    assert np.bincount(ds.train_y).tolist() == [5000] * 10
    assert ds.classes[0] == "airplane"
