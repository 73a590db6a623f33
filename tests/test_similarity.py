"""Linear CKA (raysim.algorithms.condensed.similarity): the properties Kornblith et al. prove, on
small random matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.algorithms.condensed.similarity import cka_matrix, linear_cka


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_identical_inputs_give_one_and_a_shift_of_the_columns_changes_nothing():
    x = randn(10, 64)
    assert linear_cka(x, x) == pytest.approx(1.0)
    assert linear_cka(x, x + randn(1, 64, seed=1)) == pytest.approx(1.0)  # centred first


@pytest.mark.parametrize("rows, cols", [(10, 64), (200, 8)])  # both ways of computing it
def test_invariant_to_orthogonal_rotation_and_isotropic_scaling(rows, cols):
    x, y = randn(rows, cols), randn(rows, cols, seed=1) + 0.5 * randn(rows, cols)
    q, _ = torch.linalg.qr(randn(cols, cols, seed=2))
    assert linear_cka(x, x @ q) == pytest.approx(1.0)
    assert linear_cka(x, 3.5 * x) == pytest.approx(1.0)
    assert linear_cka(x, 0.01 * y @ q) == pytest.approx(linear_cka(x, y))


def test_symmetric_in_zero_one_and_low_for_independent_matrices():
    for seed in range(5):
        x, y = randn(300, 6, seed=seed), randn(300, 9, seed=seed + 100)
        value = linear_cka(x, y)
        assert value == pytest.approx(linear_cka(y, x)) and 0.0 <= value <= 1.0
        assert value < 0.1  # many rows, few features: unrelated matrices align little
    related = randn(300, 6)
    assert linear_cka(related, related + 0.3 * randn(300, 6, seed=7)) > 0.8


def test_a_matrix_that_does_not_vary_over_its_rows_gives_zero_not_nan():
    x = randn(10, 16)
    for constant in (torch.zeros(10, 16), torch.full((10, 16), 0.1), torch.ones(10, 1) * randn(1, 16)):
        assert linear_cka(x, constant) == 0.0 and linear_cka(constant, constant) == 0.0


def test_rows_must_match():
    with pytest.raises(ValueError, match="same rows"):
        linear_cka(randn(10, 4), randn(9, 4))


def test_the_matrix_of_classifier_weights_is_symmetric_with_a_unit_diagonal():
    # three "clients" whose classifiers (10 classes x 32 features) are noisy copies of two patterns;
    # the fourth has a different feature width (heterogeneous models share the class rows)
    a, b = randn(10, 32), randn(10, 32, seed=1)
    weights = [
        a + 0.1 * randn(10, 32, seed=2),
        a + 0.1 * randn(10, 32, seed=3),
        b,
        torch.zeros(10, 32),
        randn(10, 8, seed=4),
    ]
    m = cka_matrix(weights)
    assert m.shape == (5, 5) and np.allclose(m, m.T) and np.allclose(np.diag(m), 1.0)
    assert ((m >= 0) & (m <= 1)).all()
    assert m[0, 1] > max(m[0, 2], m[1, 2])  # the two copies of one pattern are the most alike
    assert (m[3, [0, 1, 2, 4]] == 0).all()  # the degenerate one: 0 off the diagonal
    assert m[0, 2] == pytest.approx(linear_cka(weights[0], weights[2]))
