"""Householder reflections in compact WY form (Algorithm 1 of 001), in numpy.

The orthogonal prefix adapter of AdaWidth realises ``R^T`` as a product of
``F`` Householder reflections (Eq. (2) of 001)::

    R^T = H(v_1) H(v_2) ... H(v_F),   H(v) = I - 2 v v^T,

evaluated in the compact WY form ``H(v_1)...H(v_F) = I - V T V^T`` (Eq. (3)).
These numpy functions are the deployment-side half (materialise and verify);
the trainer has a torch twin for gradients (``trainer/adapter.py``) and the
tests check that both agree.
"""

from __future__ import annotations

import numpy as np


class AdapterVerificationError(RuntimeError):
    """Raised by :func:`verify` when the WY factors fail Algorithm 1's checks."""


def wy_factors(U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """WYFactors of Algorithm 1 (001): unit reflection vectors and the triangular factor.

    Args:
        U: free parameters, shape (F, D), any float dtype; row j is the
            (unnormalised) reflection vector v_j.  Rows must be non-zero.

    Returns:
        V: shape (D, F), float64, unit columns.
        T: shape (F, F), float64, upper triangular with T_jj = 2 and
           T[:j-1, j] = -2 T[:j-1, :j-1] Gamma[:j-1, j] (line 11 of Algorithm 1).

    Raises:
        ValueError: if ``U`` is not 2-D or has a zero row.
    """
    U = np.asarray(U, dtype=np.float64)
    if U.ndim != 2:
        raise ValueError(f"U must be (F, D), got shape {U.shape}")
    norms = np.linalg.norm(U, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("U has a zero row: a reflection vector must be non-zero")
    V = (U / norms).T
    gram = V.T @ V
    F = U.shape[0]
    T = np.zeros((F, F), dtype=np.float64)
    for j in range(F):
        T[j, j] = 2.0
        if j > 0:
            T[:j, j] = -2.0 * T[:j, :j] @ gram[:j, j]
    return V, T


def wy_apply(X: np.ndarray, V: np.ndarray, T: np.ndarray) -> np.ndarray:
    """Apply of Algorithm 1: ``X R^T = X - ((X V) T) V^T``.

    Args:
        X: shape (n, D); each row an embedding.
        V, T: from :func:`wy_factors`.

    Returns:
        shape (n, D), float64: row i is ``R x_i``.
    """
    X = np.asarray(X, dtype=np.float64)
    return X - ((X @ V) @ T) @ V.T


def sequential_product(U: np.ndarray) -> np.ndarray:
    """``H(v_1) H(v_2) ... H(v_F)`` by F sequential rank-one updates (Eq. (2) of 001).

    Returns shape (D, D), float64: this is ``R^T``.  The reference that
    :func:`verify` compares the WY form against.
    """
    U = np.asarray(U, dtype=np.float64)
    D = U.shape[1]
    P = np.eye(D)
    for u in U:
        v = u / np.linalg.norm(u)
        P = P - 2.0 * np.outer(P @ v, v)  # P @ H(v)
    return P


def materialize(V: np.ndarray, T: np.ndarray) -> np.ndarray:
    """Materialize of Algorithm 1: the explicit rotation ``R = Apply(I_D)^T``.

    Returns shape (D, D), float64, orthogonal; the service rotates an embedding
    x as ``R @ x`` (and only ever needs ``R[:h] @ x``).
    """
    D = V.shape[0]
    return wy_apply(np.eye(D), V, T).T


def verify(V: np.ndarray, T: np.ndarray, U: np.ndarray, *, n_probe: int = 64, tol: float = 1e-4,
           seed: int = 0) -> dict[str, float]:
    """Verify of Algorithm 1 (001), run before materialising R.

    Draws ``n_probe`` random unit rows Y (shape (n_probe, D)) and checks that
    (i) Apply preserves every inner product, max |Ỹ Ỹ^T − Y Y^T| <= tol, and
    (ii) Apply equals the sequential product ``Y H(v_1)...H(v_F)`` within tol.

    Returns:
        {"max_gram_error": float, "max_sequential_error": float}.

    Raises:
        AdapterVerificationError: if either check exceeds ``tol``.
    """
    rng = np.random.default_rng(seed)
    D = V.shape[0]
    Y = rng.standard_normal((n_probe, D))
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    Yt = wy_apply(Y, V, T)
    gram_err = float(np.max(np.abs(Yt @ Yt.T - Y @ Y.T)))
    seq_err = float(np.max(np.abs(Yt - Y @ sequential_product(U))))
    report = {"max_gram_error": gram_err, "max_sequential_error": seq_err}
    if gram_err > tol or seq_err > tol:
        raise AdapterVerificationError(f"adapter failed Verify (tol {tol}): {report}")
    return report


def paired_identity_init(F: int, D: int, seed: int = 0) -> np.ndarray:
    """Paired initialisation of §3.1.1 (001): v_{2i-1} = v_{2i}, so R = I exactly.

    Returns U of shape (F, D), float64, unit rows.  Raises ``ValueError`` if F is odd.
    """
    if F % 2:
        raise ValueError(f"F must be even for paired initialisation, got {F}")
    rng = np.random.default_rng(seed)
    half = rng.standard_normal((F // 2, D))
    half /= np.linalg.norm(half, axis=1, keepdims=True)
    return np.repeat(half, 2, axis=0)
