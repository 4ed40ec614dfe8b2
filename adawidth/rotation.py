"""Fixed rotations used as baselines and as starting points for the adapter.

A rotation is an orthogonal matrix ``R`` of shape (D, D), float32 or float64;
an embedding x is rotated as ``R @ x`` and only its leading ``m`` coordinates
are scored at width ``m`` (Eq. (1) of 001).  By Eq. (4) of 001 every
orthogonal ``R`` leaves full-width inner products unchanged.
"""

from __future__ import annotations

import numpy as np


def identity_rotation(D: int) -> np.ndarray:
    """``I_D`` (plain prefix truncation); shape (D, D), float64."""
    return np.eye(D)


def pca_rotation(X: np.ndarray) -> np.ndarray:
    """PCA rotation: eigenvectors of the uncentred second-moment matrix ``X^T X / N``.

    The baseline adapter of the main-job issue (FINDINGS.md "PCA rotation (document
    second moment)").  Rows of the result are eigenvectors sorted by decreasing
    eigenvalue, so ``(R @ x)[:m]`` keeps the ``m`` directions of largest
    document energy.  Each eigenvector's sign is fixed so that its largest-magnitude
    entry is positive, which makes the result deterministic.

    Args:
        X: document embeddings, shape (N, D), unit rows, float32 or float64.

    Returns:
        R: shape (D, D), float64, orthogonal.

    Raises:
        ValueError: if ``X`` is not 2-D or has fewer than 1 row.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"X must be (N, D) with N >= 1, got shape {X.shape}")
    second_moment = X.T @ X / X.shape[0]
    evals, evecs = np.linalg.eigh(second_moment)
    order = np.argsort(evals)[::-1]
    R = evecs[:, order].T
    flip = np.sign(R[np.arange(R.shape[0]), np.argmax(np.abs(R), axis=1)])
    flip[flip == 0] = 1.0
    return R * flip[:, None]


def orthogonality_error(R: np.ndarray) -> float:
    """max |R R^T − I|: 0 for an exactly orthogonal matrix (lower is better)."""
    R = np.asarray(R, dtype=np.float64)
    return float(np.max(np.abs(R @ R.T - np.eye(R.shape[0]))))
