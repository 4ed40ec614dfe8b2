import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from adawidth import wy
from adawidth.rotation import orthogonality_error, pca_rotation


def test_wy_equals_sequential_product_and_is_orthogonal():
    rng = np.random.default_rng(0)
    U = rng.standard_normal((16, 32))
    V, T = wy.wy_factors(U)
    R = wy.materialize(V, T)
    assert np.allclose(R.T, wy.sequential_product(U), atol=1e-12)
    assert orthogonality_error(R) < 1e-12
    assert np.allclose(np.diag(T), 2.0) and np.allclose(np.tril(T, -1), 0.0)
    report = wy.verify(V, T, U)
    assert report["max_gram_error"] < 1e-10 and report["max_sequential_error"] < 1e-10


def test_apply_is_rotation_of_rows():
    rng = np.random.default_rng(1)
    U = rng.standard_normal((8, 12))
    V, T = wy.wy_factors(U)
    R = wy.materialize(V, T)
    X = rng.standard_normal((5, 12))
    assert np.allclose(wy.wy_apply(X, V, T), X @ R.T)


def test_paired_init_is_identity():
    U = wy.paired_identity_init(64, 384, seed=3)
    V, T = wy.wy_factors(U)
    assert np.abs(wy.materialize(V, T) - np.eye(384)).max() < 1e-12
    with pytest.raises(ValueError):
        wy.paired_identity_init(3, 8)


def test_verify_rejects_inconsistent_factors():
    rng = np.random.default_rng(2)
    U = rng.standard_normal((6, 10))
    V, T = wy.wy_factors(U)
    T_bad = T.copy()
    T_bad[0, 1] += 0.5
    with pytest.raises(wy.AdapterVerificationError):
        wy.verify(V, T_bad, U)


def test_zero_row_rejected():
    with pytest.raises(ValueError):
        wy.wy_factors(np.zeros((2, 4)))


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 12), st.integers(2, 24)),
              elements=st.floats(-10, 10, allow_nan=False, width=64)))
def test_orthogonal_for_random_parameters(U):
    """Property: any non-degenerate parameters give an orthogonal R equal to the sequential product."""
    norms = np.linalg.norm(U, axis=1)
    if np.any(norms < 1e-3):
        U = U + np.eye(U.shape[0], U.shape[1])  # keep rows away from zero
        if np.any(np.linalg.norm(U, axis=1) < 1e-3):
            return
    V, T = wy.wy_factors(U)
    R = wy.materialize(V, T)
    assert orthogonality_error(R) < 1e-8
    assert np.allclose(R.T, wy.sequential_product(U), atol=1e-8)


def test_pca_rotation_orders_energy_and_is_orthogonal():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((500, 16)) * np.linspace(0.1, 3.0, 16)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    R = pca_rotation(X)
    assert orthogonality_error(R) < 1e-10
    energy = ((X @ R.T) ** 2).mean(0)
    assert np.all(np.diff(energy) <= 1e-12)
    assert np.argmax(np.abs(R[0])) == 15  # the widest input axis comes first
