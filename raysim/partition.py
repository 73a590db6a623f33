"""Split a training set among virtual clients (Dirichlet label skew as in NIID-Bench, Li et al. ICDE 2022).

Every partitioner takes the label of each training sample and returns, for each
client, a sorted ``int64`` array of indices into those labels. No index is
given to two clients. All randomness comes from the ``numpy.random.Generator``
passed in, so the same generator state always gives the same partition.

Kinds (``partition.kind``):

``iid``
    Shuffle, then cut into ``num_clients`` nearly equal parts.
``dirichlet``
    Label skew, the scheme of the FedAF / FedDM / MOON code.
``dirichlet_balanced``
    DynaFed's doubly stochastic Dirichlet: label skew with (nearly) equal
    client sizes.
``classes``
    "Pathological" k classes per client (DCFL's C_k, FedHydra's 2c/c).
``quantity``
    Quantity skew: IID labels, client sizes ~ Dirichlet.
``domain``
    Feature skew: one domain (e.g. a DomainNet domain) per client.

User mistakes raise :class:`raysim.errors.RaysimError` with a one-line message
that names the config key and the fix.
"""

from __future__ import annotations

import numpy as np

from raysim.errors import RaysimError
from raysim.seeding import VALIDATION, numpy_rng
from raysim.text_table import text_table

PARTITION_KINDS = ("iid", "dirichlet", "dirichlet_balanced", "classes", "quantity", "domain")

# Kinds that read ``alpha`` (only these validate it).
_ALPHA_KINDS = ("dirichlet", "dirichlet_balanced", "quantity")

# Sinkhorn settings for ``dirichlet_balanced``. DynaFed's code runs at most 1000
# alternating normalisations; we stop earlier once client totals are within
# 1e-9 (relative) of their target.
_SINKHORN_MAX_ITERS = 1000
_SINKHORN_TOL = 1e-9


# --------------------------------------------------------------------------- API


def partition(
    labels: np.ndarray,
    num_clients: int,
    kind: str,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    min_size: int = 10,
    max_tries: int = 1000,
    classes_per_client: int = 2,
    domains: np.ndarray | None = None,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """Split ``labels`` (one integer class per sample) among ``num_clients`` clients.

    Returns one sorted ``int64`` index array per client; every index appears in
    at most one array. ``iid``, ``dirichlet``, ``dirichlet_balanced``,
    ``quantity`` and ``domain`` use every sample; ``classes`` may leave classes
    that no client owns unused.

    Args:
        labels: 1-D integer labels in ``[0, num_classes)``.
        num_clients: number of clients K (``clients.num``).
        kind: one of :data:`PARTITION_KINDS` (``partition.kind``).
        rng: the only source of randomness.
        alpha: Dirichlet concentration for ``dirichlet``, ``dirichlet_balanced``
            and ``quantity`` (``partition.alpha``, must be > 0; smaller is more
            skewed). Ignored by the other kinds.
        min_size: ``dirichlet`` and ``quantity`` redraw until every client has at
            least this many samples (``partition.min_size``).
        max_tries: bound on those redraws; then a RaysimError is raised.
        classes_per_client: k for ``classes`` (``partition.classes_per_client``).
        domains: per-sample domain id, required by ``domain``.
        num_classes: C; defaults to ``labels.max() + 1``.

    Kind details:

    * ``dirichlet``: for each class draw p ~ Dir(alpha * 1_K) over the clients,
      zero the share of every client already holding >= N/K samples,
      renormalise, and split the class's shuffled indices at
      ``floor(cumsum(p) * n_class)``. Everything is redrawn until each client
      has ``min_size`` samples, at most ``max_tries`` times. (The counts are
      drawn first and the class indices shuffled once for the accepted draw;
      that is the same distribution as shuffling on every try, only cheaper.)
      If a draw puts all of a class's mass on clients that are already full,
      that try counts as failed (the reference code would divide by zero).
    * ``dirichlet_balanced``: DynaFed's ``split_dirichlet(double_stochstic=True)``.
      A C x K matrix with rows ~ Dir(alpha * 1_K) is Sinkhorn-normalised so
      each class row sums to the class size and each client column to N/K,
      finishing on the rows so each class is distributed exactly; each class's
      shuffled indices are then cut at ``round(cumsum(p) * n_class)``. Client
      sizes are equal up to rounding (at most about C samples apart) whenever
      Sinkhorn converges, which it does except for extreme alpha (<~ 0.01)
      with many clients. No minimum size. Differences from DynaFed's code:
      the targets use the real class sizes (identical to DynaFed's for
      balanced classes, still balanced clients otherwise), the Dirichlet is
      drawn and scaled in log space so tiny alpha cannot produce 0/0, class
      indices are shuffled, and cut points are rounded, not truncated.
    * ``classes`` with k = ``classes_per_client`` (1 <= k <= C):
      if ``k * K <= C`` clients get disjoint classes, client i owning classes
      ``[i*k, (i+1)*k)`` (FedHydra's 2c/c: 5 clients x 2 classes of 10); classes
      ``>= K*k`` are unused. Otherwise client i owns class ``i mod C`` plus
      k-1 other distinct classes drawn uniformly from rng (DCFL's C_k); classes
      that nobody drew are unused. Each class's shuffled samples are split
      evenly (``array_split``) among its owners.
    * ``quantity``: client shares ~ Dir(alpha * 1_K); the shuffled indices are
      cut at ``floor(cumsum(p) * N)``; redrawn until every client has
      ``min_size`` samples (at most ``max_tries`` times).
    * ``iid``: shuffle and ``array_split`` into K parts.
    * ``domain``: needs ``domains`` and exactly one client per distinct domain;
      client i gets every sample of the i-th smallest domain id.
    """
    if kind not in PARTITION_KINDS:
        raise RaysimError(f"unknown partition.kind={kind!r}; set partition.kind to one of {', '.join(PARTITION_KINDS)}")
    labels = _as_labels(labels)
    n = int(labels.shape[0])
    num_clients = _as_int(num_clients, "clients.num")
    if num_clients < 1:
        raise RaysimError(f"clients.num={num_clients} is not allowed; set clients.num to 1 or more")
    if num_clients > n:
        raise RaysimError(
            f"clients.num={num_clients} exceeds the {n} training samples; use fewer clients or a larger dataset"
        )
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if n else 0
    else:
        num_classes = _as_int(num_classes, "num_classes")
        if n and int(labels.max()) >= num_classes:
            raise RaysimError(
                f"dataset labels go up to {int(labels.max())} but num_classes={num_classes}; "
                f"fix the dataset's class count or its labels"
            )
    if kind in _ALPHA_KINDS:
        alpha = float(alpha)
        if not (np.isfinite(alpha) and alpha > 0):
            raise RaysimError(
                f"partition.alpha={alpha:g} is not allowed for partition.kind={kind}; "
                f"partition.alpha must be > 0 (e.g. 0.5; smaller is more skewed)"
            )
    if kind in ("dirichlet", "quantity"):
        min_size = _as_int(min_size, "partition.min_size")
        if min_size < 0:
            raise RaysimError(f"partition.min_size={min_size} is negative; set partition.min_size to 0 or more")
        max_tries = _as_int(max_tries, "partition.max_tries")
        if max_tries < 1:
            raise RaysimError(f"partition.max_tries={max_tries} is not allowed; set partition.max_tries to 1 or more")

    if kind == "iid":
        parts = _iid(n, num_clients, rng)
    elif kind == "dirichlet":
        parts = _dirichlet(labels, num_clients, num_classes, rng, alpha, min_size, max_tries)
    elif kind == "dirichlet_balanced":
        parts = _dirichlet_balanced(labels, num_clients, num_classes, rng, alpha)
    elif kind == "classes":
        parts = _classes(labels, num_clients, num_classes, rng, classes_per_client)
    elif kind == "quantity":
        parts = _quantity(n, num_clients, rng, alpha, min_size, max_tries)
    else:
        parts = _domain(n, num_clients, domains)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def hold_out(parts: list[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's indices split into (training, held out): round(fraction * n) of its n examples,
    at most n - 1 (a client keeps at least one to train on), drawn by a generator seeded by (seed,
    client) alone, so the split depends on neither the number of actors nor the other clients. Both
    parts stay sorted (eval.selection=federated: the held-out share is the client's validation set)."""

    train, held = [], []
    for client, idx in enumerate(parts):
        idx = np.asarray(idx, dtype=np.int64)
        count = min(max(len(idx) - 1, 0), int(np.floor(fraction * len(idx) + 0.5)))
        chosen = np.zeros(len(idx), dtype=bool)
        chosen[numpy_rng(seed, VALIDATION, "client_holdout", client).permutation(len(idx))[:count]] = True
        train.append(idx[~chosen])
        held.append(idx[chosen])
    return train, held


def validating_clients(num_clients: int, count: int, seed: int) -> list[int]:
    """The clients that validate (eval.select_clients): all of them for 0, else a sample of `count`
    seeded by the run's seed alone, the same at every candidate round."""
    if count <= 0 or count >= num_clients:
        return list(range(num_clients))

    chosen = numpy_rng(seed, VALIDATION, "select_clients").choice(num_clients, size=count, replace=False)
    return sorted(int(k) for k in chosen)


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Return the (clients, classes) int64 matrix of how many samples of each class each client holds."""
    labels = np.asarray(labels)
    out = np.zeros((len(parts), int(num_classes)), dtype=np.int64)
    for i, idx in enumerate(parts):
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size:
            out[i] = np.bincount(labels[idx].astype(np.int64), minlength=num_classes)[:num_classes]
    return out


def format_counts(counts: np.ndarray, class_names: list[str] | None = None, *, max_classes: int = 20) -> str:
    """Render a (clients, classes) count matrix as a plain-text table.

    One row per client plus a final ``total`` row, with a ``total`` column.
    With more than ``max_classes`` classes (e.g. CIFAR-100) the per-class
    columns would not fit a terminal, so the table instead shows how many
    classes each client holds and its three largest classes (``name:count``).
    Class names are cut to 10 characters in column headers.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 2:
        raise ValueError(f"counts must be a (clients, classes) matrix, got shape {counts.shape}")
    k, c = counts.shape
    names = [str(x) for x in class_names] if class_names is not None else [str(j) for j in range(c)]
    if len(names) != c:
        raise ValueError(f"{len(names)} class names for {c} classes")
    row_totals = counts.sum(axis=1)
    col_totals = counts.sum(axis=0)
    row_labels = [str(i) for i in range(k)] + ["total"]

    if c <= max_classes:
        header = ["client"] + [nm[:10] for nm in names] + ["total"]
        body = [[row_labels[i]] + [str(v) for v in counts[i]] + [str(row_totals[i])] for i in range(k)]
        body.append(["total"] + [str(v) for v in col_totals] + [str(col_totals.sum())])
    else:
        header = ["client", "classes", "largest classes", "total"]
        body = []
        for i in range(k):
            row = counts[i]
            top = [j for j in np.argsort(-row, kind="stable")[:3] if row[j] > 0]
            body.append(
                [
                    row_labels[i],
                    str(int((row > 0).sum())),
                    " ".join(f"{names[j][:10]}:{row[j]}" for j in top),
                    str(row_totals[i]),
                ]
            )
        body.append(["total", str(int((col_totals > 0).sum())), "", str(col_totals.sum())])

    # The client column and the largest classes ("3:40 7:12") are text; the counts are numbers.
    align = "l" + ("rlr" if c > max_classes else "r" * (c + 1))
    return text_table(header, body[:-1], footer=body[-1:], align=align)


# ----------------------------------------------------------------- partitioners


def _iid(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(n), k)


def _class_indices(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Indices of each class, ascending (one stable argsort instead of C scans)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
    return [order[bounds[j] : bounds[j + 1]] for j in range(num_classes)]


def _split_by_counts(
    class_idx: list[np.ndarray], per_class_counts: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Shuffle each class and hand client i the next ``per_class_counts[c, i]`` indices."""
    num_clients = per_class_counts.shape[1]
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for idx, cnt in zip(class_idx, per_class_counts):
        if idx.size == 0:
            continue
        shuffled = rng.permutation(idx)
        for i, chunk in enumerate(np.split(shuffled, np.cumsum(cnt)[:-1])):
            if chunk.size:
                pieces[i].append(chunk)
    return [np.concatenate(p) if p else np.empty(0, dtype=np.int64) for p in pieces]


def _min_size_error(kind: str, k: int, min_size: int, alpha: float, tries: int | None, n: int) -> RaysimError:
    why = f"in {tries} tries" if tries is not None else f"(clients.num*partition.min_size > the {n} samples)"
    return RaysimError(
        f"partition.kind={kind} could not give each of clients.num={k} clients at least "
        f"partition.min_size={min_size} samples {why} with partition.alpha={alpha:g}; "
        f"raise partition.alpha, lower partition.min_size or use fewer clients"
    )


def _dirichlet(
    labels: np.ndarray,
    k: int,
    num_classes: int,
    rng: np.random.Generator,
    alpha: float,
    min_size: int,
    max_tries: int,
) -> list[np.ndarray]:
    n = labels.shape[0]
    if min_size * k > n:
        raise _min_size_error("dirichlet", k, min_size, alpha, None, n)
    class_idx = _class_indices(labels, num_classes)
    class_sizes = [idx.size for idx in class_idx]
    cap = n / k
    conc = np.full(k, alpha)
    for _ in range(max_tries):
        sizes = np.zeros(k, dtype=np.int64)
        counts = np.zeros((num_classes, k), dtype=np.int64)
        ok = True
        for c, n_c in enumerate(class_sizes):
            # Draw even for empty classes so the rng stream does not depend on them.
            p = rng.dirichlet(conc)
            if n_c == 0:
                continue
            p = np.where(sizes < cap, p, 0.0)
            total = p.sum()
            if not total > 0:
                ok = False
                break
            cuts = (np.cumsum(p / total) * n_c).astype(np.int64)[:-1]
            cnt = np.diff(np.concatenate(([0], cuts, [n_c])))
            counts[c] = cnt
            sizes += cnt
        if ok and sizes.min() >= min_size:
            return _split_by_counts(class_idx, counts, rng)
    raise _min_size_error("dirichlet", k, min_size, alpha, max_tries, n)


def _log_dirichlet(rng: np.random.Generator, alpha: float, shape: tuple[int, int]) -> np.ndarray:
    """log of Dirichlet(alpha) draws along the last axis, without underflow for tiny alpha.

    Uses Gamma(a) = Gamma(a + 1) * U**(1/a), so log Gamma(a) = log Gamma(a+1) + log(U)/a.
    """
    g = np.log(rng.standard_gamma(alpha + 1.0, size=shape))
    u = rng.random(size=shape)
    log_g = g + np.log(np.maximum(u, np.finfo(float).tiny)) / alpha
    return log_g - _logsumexp(log_g, axis=-1, keepdims=True)


def _logsumexp(x: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    out = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def _balanced_proportions(rng: np.random.Generator, alpha: float, class_sizes: np.ndarray, k: int) -> np.ndarray:
    """C x K matrix: row c is class c's split over clients; client totals ~ N/K (Sinkhorn in log space)."""
    num_classes = class_sizes.shape[0]
    present = class_sizes > 0
    log_p = _log_dirichlet(rng, alpha, (num_classes, k))
    if not present.any():
        return np.exp(log_p)
    lp = log_p[present]
    log_rows = np.log(class_sizes[present].astype(float))[:, None]  # class totals n_c
    log_cols = np.log(class_sizes.sum() / k)  # client totals N/K
    for _ in range(_SINKHORN_MAX_ITERS):
        lp = lp + (log_cols - _logsumexp(lp, axis=0, keepdims=True))  # clients -> N/K
        lp = lp + (log_rows - _logsumexp(lp, axis=1, keepdims=True))  # classes -> n_c
        if np.max(np.abs(_logsumexp(lp, axis=0) - log_cols)) < _SINKHORN_TOL:
            break
    out = np.exp(log_p)
    out[present] = np.exp(lp - _logsumexp(lp, axis=1, keepdims=True))
    return out


def _dirichlet_balanced(
    labels: np.ndarray, k: int, num_classes: int, rng: np.random.Generator, alpha: float
) -> list[np.ndarray]:
    class_idx = _class_indices(labels, num_classes)
    class_sizes = np.array([idx.size for idx in class_idx], dtype=np.int64)
    props = _balanced_proportions(rng, alpha, class_sizes, k)
    counts = np.zeros((num_classes, k), dtype=np.int64)
    for c, n_c in enumerate(class_sizes):
        cum = np.cumsum(props[c])
        cum /= cum[-1]
        cuts = np.rint(cum * n_c).astype(np.int64)
        cuts[-1] = n_c
        counts[c] = np.diff(np.concatenate(([0], cuts)))
    return _split_by_counts(class_idx, counts, rng)


def _classes(
    labels: np.ndarray, k: int, num_classes: int, rng: np.random.Generator, per_client: int
) -> list[np.ndarray]:
    per_client = _as_int(per_client, "partition.classes_per_client")
    if not 1 <= per_client <= num_classes:
        raise RaysimError(
            f"partition.classes_per_client={per_client} is out of range for a dataset with "
            f"{num_classes} classes; set it between 1 and {num_classes}"
        )
    if per_client * k <= num_classes:
        owned = [list(range(i * per_client, (i + 1) * per_client)) for i in range(k)]
    else:
        owned = []
        for i in range(k):
            first = i % num_classes
            others = np.delete(np.arange(num_classes), first)
            extra = rng.choice(others, size=per_client - 1, replace=False) if per_client > 1 else []
            owned.append([first] + sorted(int(x) for x in extra))
    owners: list[list[int]] = [[] for _ in range(num_classes)]
    for i, cls in enumerate(owned):
        for c in cls:
            owners[c].append(i)
    pieces: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, idx in enumerate(_class_indices(labels, num_classes)):
        if not owners[c] or idx.size == 0:
            continue
        for i, chunk in zip(owners[c], np.array_split(rng.permutation(idx), len(owners[c]))):
            pieces[i].append(chunk)
    return [np.concatenate(p) if p else np.empty(0, dtype=np.int64) for p in pieces]


def _quantity(
    n: int, k: int, rng: np.random.Generator, alpha: float, min_size: int, max_tries: int
) -> list[np.ndarray]:
    if min_size * k > n:
        raise _min_size_error("quantity", k, min_size, alpha, None, n)
    conc = np.full(k, alpha)
    for _ in range(max_tries):
        p = rng.dirichlet(conc)
        total = p.sum()
        if not total > 0:
            continue
        cuts = (np.cumsum(p / total) * n).astype(np.int64)[:-1]
        sizes = np.diff(np.concatenate(([0], cuts, [n])))
        if sizes.min() >= min_size:
            return np.split(rng.permutation(n), cuts)
    raise _min_size_error("quantity", k, min_size, alpha, max_tries, n)


def _domain(n: int, k: int, domains: np.ndarray | None) -> list[np.ndarray]:
    if domains is None:
        raise RaysimError(
            "partition.kind=domain needs a domain id per sample but the dataset has none; "
            "use a multi-domain dataset (e.g. DomainNet) or another partition.kind"
        )
    domains = np.asarray(domains)
    if domains.ndim != 1 or domains.shape[0] != n:
        raise RaysimError(
            f"partition.kind=domain got {domains.size} domain ids for {n} samples; "
            f"the dataset must give exactly one domain id per training sample"
        )
    values, inverse = np.unique(domains, return_inverse=True)
    if k != values.size:
        raise RaysimError(
            f"partition.kind=domain needs one client per domain but clients.num={k} and the dataset has "
            f"{values.size} domains; set clients.num={values.size}"
        )
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(k + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(k)]


# ---------------------------------------------------------------------- helpers


def _as_labels(labels: np.ndarray) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        arr = arr.reshape(-1) if arr.ndim == 2 and 1 in arr.shape else arr
    if arr.ndim != 1:
        raise RaysimError(
            f"dataset labels must be one class id per sample, got an array of shape {arr.shape}; "
            f"fix the dataset's label column"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if arr.dtype == bool:
            arr = arr.astype(np.int64)
        elif np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise RaysimError(
                f"dataset labels must be integer class ids, got dtype {arr.dtype}; fix the dataset's label column"
            )
    arr = arr.astype(np.int64, copy=False)
    if arr.size and int(arr.min()) < 0:
        raise RaysimError(f"dataset labels must be >= 0, found {int(arr.min())}; fix the dataset's label column")
    return arr


def _as_int(value, key: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise RaysimError(f"{key}={value!r} must be an integer; set {key} to a whole number")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise RaysimError(f"{key}={value!r} must be an integer; set {key} to a whole number")
