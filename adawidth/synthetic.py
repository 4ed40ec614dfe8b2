"""Synthetic embedding corpora whose spectrum follows real embeddings (for scaling benchmarks).

A real corpus of a few thousand documents is too small to measure what stage 1 costs at N = 10^6.
:func:`fit_gaussian` fits a Gaussian N(mu, Sigma) to real document embeddings (mean and second
central moment); :func:`sample_corpus` draws any number of documents from it, chunk by chunk, and
L2-normalises each row as the encoder does.  The sampled corpus has the real corpus's mean direction
and eigen-spectrum (before the normalisation, which changes the spectrum little when the norms
concentrate, as they do at D = 384), but no topical clusters beyond what a Gaussian carries, so
retrieval *quality* on it is only measurable against exact search (top-k overlap), not against labels.

Sampling in a rotated basis costs nothing extra: ``R x`` of ``x ~ N(mu, Sigma)`` is
``N(R mu, R Sigma R^T)`` and the norm is rotation-invariant, so ``sample_corpus(..., rotation=R)``
returns exactly ``normalise(x) @ R.T`` for the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GaussianModel:
    """A Gaussian fitted to embeddings.

    Attributes:
        mean: (D,) float64, the mean embedding.
        factor: (D, D) float64, ``L`` with ``L @ L.T == Sigma`` (symmetric square root from the
            eigendecomposition; eigenvalues clipped at 0).
        eigenvalues: (D,) float64, eigenvalues of Sigma, descending (the spectrum).
        n_fitted: number of embeddings the model was fitted on.
    """

    mean: np.ndarray
    factor: np.ndarray
    eigenvalues: np.ndarray
    n_fitted: int

    @property
    def dimension(self) -> int:
        return int(self.mean.shape[0])


def fit_gaussian(X: np.ndarray) -> GaussianModel:
    """Fit N(mu, Sigma) to embeddings by their sample mean and covariance.

    Args:
        X: (n, D) embeddings (any float dtype), n >= 2.

    Returns:
        :class:`GaussianModel`.

    Raises:
        ValueError: for fewer than two rows or a non-2-D array.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"need a (n >= 2, D) array, got shape {X.shape}")
    mu = X.mean(axis=0)
    C = np.cov(X, rowvar=False)
    w, V = np.linalg.eigh(C)
    w = np.clip(w, 0.0, None)
    order = np.argsort(w)[::-1]
    w, V = w[order], V[:, order]
    L = (V * np.sqrt(w)) @ V.T
    return GaussianModel(mean=mu, factor=L, eigenvalues=w, n_fitted=int(X.shape[0]))


def sample_corpus(model: GaussianModel, n: int, *, seed: int = 0, rotation: np.ndarray | None = None,
                  normalize: bool = True, chunk: int = 65536, out: np.ndarray | None = None) -> np.ndarray:
    """Draw ``n`` documents from ``model``, row-normalised, optionally in a rotated basis.

    Deterministic for a given (model, n, seed, chunk): chunk ``i`` uses the generator
    ``numpy.random.default_rng([seed, i])``, so a corpus can be produced in pieces.

    Args:
        model: the fitted :class:`GaussianModel` (dimension D).
        n: documents to draw, >= 0.
        seed: random seed.
        rotation: optional (D, D) orthogonal R; rows are returned as ``normalise(x) @ R.T``.
        normalize: L2-normalise every row (as the encoder does); default True.
        chunk: rows drawn per step (bounds the float64 temporaries to chunk x D).
        out: optional preallocated (n, D) float32 array (e.g. a ``numpy.memmap``) to fill.

    Returns:
        (n, D) float32 (``out`` when given).

    Raises:
        ValueError: for a negative n, a rotation or ``out`` of the wrong shape.
    """
    D = model.dimension
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    mu, L = model.mean, model.factor
    if rotation is not None:
        R = np.asarray(rotation, dtype=np.float64)
        if R.shape != (D, D):
            raise ValueError(f"rotation must be ({D}, {D}), got {R.shape}")
        mu, L = R @ mu, R @ L
    if out is None:
        out = np.empty((n, D), dtype=np.float32)
    elif out.shape != (n, D):
        raise ValueError(f"out must have shape ({n}, {D}), got {out.shape}")
    Lt = L.T
    for i, start in enumerate(range(0, n, chunk)):
        stop = min(start + chunk, n)
        z = np.random.default_rng([seed, i]).standard_normal((stop - start, D))
        x = z @ Lt
        x += mu
        if normalize:
            x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        out[start:stop] = x
    return out
