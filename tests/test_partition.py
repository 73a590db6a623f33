"""Tests for raysim.partition and raysim.plots (fast: pure numpy + one small PNG)."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.errors import RaysimError
from raysim.partition import PARTITION_KINDS, class_counts, format_counts, partition
from raysim.plots import partition_figure, save_partition_plot

C = 10


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """60,000 labels, 6,000 per class, shuffled (MNIST/FMNIST-sized)."""
    lab = np.repeat(np.arange(C), 6000)
    np.random.default_rng(123).shuffle(lab)
    return lab


def _check_disjoint(parts, n, *, full: bool):
    assert all(p.dtype == np.int64 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts), "each part sorted, no repeats"
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size, "an index is used twice"
    if allidx.size:
        assert allidx.min() >= 0 and allidx.max() < n
    if full:
        assert allidx.size == n


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "dirichlet_balanced", "quantity"])
@pytest.mark.parametrize("k", [10, 100])
def test_full_cover_without_overlap(labels, kind, k):
    alpha = 0.5 if kind != "quantity" else 5.0
    parts = partition(labels, k, kind, np.random.default_rng(0), alpha=alpha)
    assert len(parts) == k
    _check_disjoint(parts, labels.size, full=True)


def test_classes_no_overlap(labels):
    parts = partition(labels, 10, "classes", np.random.default_rng(0), classes_per_client=3)
    _check_disjoint(parts, labels.size, full=False)


def test_iid_even(labels):
    parts = partition(labels, 7, "iid", np.random.default_rng(0))
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1


def _mean_max_share(labels, parts):
    cc = class_counts(labels, parts, C)
    return float((cc.max(axis=1) / cc.sum(axis=1)).mean())


def test_dirichlet_skew(labels):
    skewed = partition(labels, 10, "dirichlet", np.random.default_rng(1), alpha=0.1)
    uniform = partition(labels, 10, "dirichlet", np.random.default_rng(1), alpha=1000.0)
    assert _mean_max_share(labels, skewed) > 0.5
    cc = class_counts(labels, uniform, C)
    shares = cc / cc.sum(axis=1, keepdims=True)
    assert np.abs(shares - 1 / C).max() < 0.03
    sizes = cc.sum(axis=1)
    assert sizes.max() / sizes.min() < 1.1


@pytest.mark.parametrize("min_size", [10, 500])
def test_dirichlet_min_size(labels, min_size):
    parts = partition(labels, 20, "dirichlet", np.random.default_rng(2), alpha=0.3, min_size=min_size)
    assert min(p.size for p in parts) >= min_size


def test_quantity_min_size_and_iid_labels(labels):
    parts = partition(labels, 10, "quantity", np.random.default_rng(3), alpha=0.5, min_size=50)
    sizes = np.array([p.size for p in parts])
    assert sizes.min() >= 50
    assert sizes.max() / sizes.min() > 2  # sizes are skewed ...
    cc = class_counts(labels, [p for p in parts if p.size >= 1000], C)
    shares = cc / cc.sum(axis=1, keepdims=True)
    assert np.abs(shares - 1 / C).max() < 0.05  # ... labels are not


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "dirichlet_balanced", "quantity", "classes"])
def test_deterministic(labels, kind):
    kw = dict(alpha=0.5 if kind != "quantity" else 5.0)
    a = partition(labels, 10, kind, np.random.default_rng(7), **kw)
    b = partition(labels, 10, kind, np.random.default_rng(7), **kw)
    c = partition(labels, 10, kind, np.random.default_rng(8), **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.5])
@pytest.mark.parametrize("k", [10, 100])
def test_dirichlet_balanced_sizes(labels, alpha, k):
    parts = partition(labels, k, "dirichlet_balanced", np.random.default_rng(4), alpha=alpha)
    sizes = np.array([p.size for p in parts])
    # Sinkhorn makes client totals N/K; only the per-class rounding (<= 1 sample
    # per class and client) remains. Measured: max/min <= 1.012 here.
    assert sizes.sum() == labels.size
    assert np.abs(sizes - labels.size / k).max() <= C
    assert sizes.max() / sizes.min() < 1.05


def test_dirichlet_balanced_is_skewed(labels):
    parts = partition(labels, 10, "dirichlet_balanced", np.random.default_rng(5), alpha=0.1)
    assert _mean_max_share(labels, parts) > 0.5


def test_dirichlet_balanced_imbalanced_classes():
    lab = np.concatenate([np.full(5000 // 2**j, j) for j in range(C)])
    parts = partition(lab, 10, "dirichlet_balanced", np.random.default_rng(6), alpha=0.1)
    _check_disjoint(parts, lab.size, full=True)
    sizes = np.array([p.size for p in parts])
    assert sizes.max() / sizes.min() < 1.05


def test_classes_k2_mod_rule(labels):
    parts = partition(labels, 10, "classes", np.random.default_rng(9), classes_per_client=2)
    cc = class_counts(labels, parts, C)
    for i in range(10):
        held = set(np.nonzero(cc[i])[0].tolist())
        assert len(held) == 2
        assert i % C in held
    # each class is split evenly among its owners
    for c in range(C):
        owned = cc[:, c][cc[:, c] > 0]
        assert owned.max() - owned.min() <= 1


def test_classes_disjoint_2c_per_client(labels):
    parts = partition(labels, 5, "classes", np.random.default_rng(0), classes_per_client=2)
    cc = class_counts(labels, parts, C)
    for i in range(5):
        assert set(np.nonzero(cc[i])[0].tolist()) == {2 * i, 2 * i + 1}
        assert cc[i].sum() == 12000
    _check_disjoint(parts, labels.size, full=True)


def test_domain():
    rng = np.random.default_rng(0)
    domains = rng.integers(0, 4, size=1000)
    lab = rng.integers(0, 5, size=1000)
    parts = partition(lab, 4, "domain", np.random.default_rng(1), domains=domains)
    _check_disjoint(parts, 1000, full=True)
    for i, p in enumerate(parts):
        assert np.all(domains[p] == i)
        assert p.size == int((domains == i).sum())


def _one_line_error(fn):
    with pytest.raises(RaysimError) as info:
        fn()
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("alpha", [0.0, -1.0])
@pytest.mark.parametrize("kind", ["dirichlet", "dirichlet_balanced", "quantity"])
def test_error_alpha(labels, kind, alpha):
    msg = _one_line_error(lambda: partition(labels, 10, kind, np.random.default_rng(0), alpha=alpha))
    assert "partition.alpha" in msg and "> 0" in msg


def test_error_unknown_kind(labels):
    msg = _one_line_error(lambda: partition(labels, 10, "shards", np.random.default_rng(0)))
    assert "partition.kind" in msg
    assert all(k in msg for k in PARTITION_KINDS)


def test_error_too_many_clients():
    lab = np.arange(50) % 5
    msg = _one_line_error(lambda: partition(lab, 100, "iid", np.random.default_rng(0)))
    assert "clients.num=100 exceeds the 50 training samples" in msg


def test_error_zero_clients(labels):
    msg = _one_line_error(lambda: partition(labels, 0, "iid", np.random.default_rng(0)))
    assert "clients.num" in msg


def test_error_min_size_bounded_retry():
    lab = np.repeat(np.arange(C), 100)
    msg = _one_line_error(
        lambda: partition(lab, 10, "dirichlet", np.random.default_rng(0), alpha=0.01, min_size=90, max_tries=50)
    )
    for key in ("partition.alpha", "partition.min_size", "clients.num", "50 tries"):
        assert key in msg


def test_error_min_size_quantity():
    lab = np.repeat(np.arange(C), 100)
    msg = _one_line_error(
        lambda: partition(lab, 10, "quantity", np.random.default_rng(0), alpha=0.05, min_size=90, max_tries=20)
    )
    assert "partition.min_size" in msg


def test_error_min_size_impossible_total():
    lab = np.repeat(np.arange(C), 10)
    msg = _one_line_error(lambda: partition(lab, 10, "dirichlet", np.random.default_rng(0), min_size=11))
    assert "partition.min_size" in msg


@pytest.mark.parametrize("k", [0, 11])
def test_error_classes_per_client(labels, k):
    msg = _one_line_error(lambda: partition(labels, 10, "classes", np.random.default_rng(0), classes_per_client=k))
    assert "partition.classes_per_client" in msg


def test_error_domain():
    lab = np.zeros(100, dtype=int)
    msg = _one_line_error(lambda: partition(lab, 3, "domain", np.random.default_rng(0)))
    assert "domain" in msg
    domains = np.arange(100) % 4
    msg = _one_line_error(lambda: partition(lab, 3, "domain", np.random.default_rng(0), domains=domains))
    assert "clients.num=4" in msg


def test_class_counts(labels):
    parts = partition(labels, 10, "iid", np.random.default_rng(0))
    cc = class_counts(labels, parts, C)
    assert cc.shape == (10, C) and cc.dtype == np.int64
    assert np.array_equal(cc.sum(axis=0), np.bincount(labels, minlength=C))


def test_format_counts(labels):
    parts = partition(labels, 12, "dirichlet", np.random.default_rng(0), alpha=0.3)
    cc = class_counts(labels, parts, C)
    text = format_counts(cc, [f"class{j}" for j in range(C)])
    lines = text.splitlines()
    for i in range(12):
        row = [ln for ln in lines if ln.split()[0] == str(i)]
        assert len(row) == 1 and row[0].split()[-1] == str(cc[i].sum())
    assert "total" in lines[0]
    assert max(len(ln) for ln in lines) < 120
    # many classes: condensed table, still one row per client and terminal-wide
    many = np.random.default_rng(0).integers(0, 50, size=(5, 100))
    text = format_counts(many)
    rows = [ln for ln in text.splitlines() if ln.split()[0] in {str(i) for i in range(5)}]
    assert len(rows) == 5 and max(len(ln) for ln in text.splitlines()) < 120


def test_partition_plot(tmp_path, labels):
    parts = partition(labels, 20, "dirichlet", np.random.default_rng(0), alpha=0.1)
    cc = class_counts(labels, parts, C)
    fig = partition_figure(cc, title="t")
    assert len(fig.axes) == 1
    out = tmp_path / "sub" / "partition.png"
    save_partition_plot(cc, out, class_names=[f"c{j}" for j in range(C)])
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
