"""Linear centred kernel alignment (CKA; Kornblith et al., ICML 2019, "Similarity of neural network
representations revisited", Sec. 3 and Table 1), as DCFL uses it to compare clients.

For X (n x p) and Y (n x q) whose rows are the same n examples, with every column centred
(X <- X - 1 mean(X)):

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)          (linear CKA, Kornblith et al. Table 1)

equal to <XX^T, YY^T>_F / (||XX^T||_F ||YY^T||_F), the alignment of the two n x n Gram matrices,
which is how it is computed when n is the smaller side. It lies in [0, 1], is 1 for Y = X, and is
invariant to an orthogonal transform and an isotropic scaling of either side (Y = c X Q).

DCFL (paper 002, Sec. II-A, Algorithm 1 line 13 `updateCKAMatrix(w_1^c, ..., w_n^c)`) fills the
matrix M of CKA values between the clients' classifier (last-layer) weights, and Eq. (4) turns
each row's off-diagonal sum into a client's selection probability. The paper does not say which
axis of a weight W of shape (C, d) holds the examples; here it is the first: the C class rows are
the shared n (row c is the client's representation of class c) and the d inputs are features.
Classes are the one axis that means the same thing in every client, and it also lets clients with
different feature widths (heterogeneous models) be compared. A tensor of more than two dimensions
is read as (n, everything else). Beware that with n = C rows much smaller than d, the linear CKA of
unrelated matrices is far from 0 (both Gram matrices approach the centring matrix): DCFL ranks
clients by relative CKA values, which this does not affect.

A matrix whose columns do not vary over the rows (e.g. all zeros) has no centred signal: its CKA
with anything is defined as 0, not NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.stats import spearmanr

ZERO_VARIANCE = 1e-10  # centred norm below this fraction of the raw norm: a constant (degenerate) matrix


def centred(x: torch.Tensor) -> torch.Tensor:
    """`x` as a float64 (n, features) matrix with each column's mean over the n rows removed;
    all zeros when it does not vary over the rows."""
    x = x.detach().reshape(len(x), -1).double()
    out = x - x.mean(0)
    return torch.zeros_like(out) if out.norm() <= ZERO_VARIANCE * x.norm() else out


def _alignment(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||Y^T X||_F^2 of centred x, y, through whichever product is smaller (p x q or n x n)."""
    n, p, q = len(x), x.shape[1], y.shape[1]
    if n * n < p * q:
        return ((x @ x.T) * (y @ y.T)).sum()
    return (y.T @ x).square().sum()


def _cka(x: torch.Tensor, y: torch.Tensor, self_x: torch.Tensor, self_y: torch.Tensor) -> float:
    """CKA of centred x, y given their self-alignments ||X^T X||_F^2 and ||Y^T Y||_F^2."""
    if self_x == 0 or self_y == 0:
        return 0.0
    return min(1.0, float(_alignment(x, y) / (self_x.sqrt() * self_y.sqrt())))


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA in [0, 1] between x (n x p) and y (n x q), rows the same n examples (see the module
    docstring; 0 when either does not vary over its rows)."""
    if len(x) != len(y):
        raise ValueError(f"linear_cka compares matrices over the same rows, got {len(x)} and {len(y)} rows")
    x, y = centred(x), centred(y)
    return _cka(x, y, _alignment(x, x), _alignment(y, y))


def cka_matrix(matrices: Sequence[torch.Tensor]) -> np.ndarray:
    """The symmetric (k x k) matrix of pairwise linear CKA between k matrices over the same rows
    (DCFL's M: one classifier weight per client). The diagonal is 1 by definition, also for a
    degenerate matrix (whose other entries are 0)."""
    if len({len(m) for m in matrices}) > 1:
        raise ValueError(
            f"cka_matrix compares matrices over the same rows, got row counts {sorted({len(m) for m in matrices})}"
        )
    xs = [centred(m) for m in matrices]
    selfs = [_alignment(x, x) for x in xs]
    out = np.eye(len(xs))
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            out[i, j] = out[j, i] = _cka(xs[i], xs[j], selfs[i], selfs[j])
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get average ranks); NaN when
    either side is constant (no ranking to compare)."""

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)
