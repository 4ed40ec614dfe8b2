"""DART tiers (000 §4.2, Appendix A): oracle tier labels, the difficulty head's prediction, MaxSim scoring.

Pure numpy; the head is trained in ``trainer/dart/difficulty.py`` (torch) and applied by the gateway with
:func:`predict_tier` (no torch on the serving path).

Tiers, cheapest first (Algorithm 1 of 000):

0. ``mips``: the bi-encoder ranking alone (here: the adaptive-width funnel);
1. ``maxsim``: late interaction, Σ_i max_j <q_i, d_j> over token embeddings, on the top-50 candidates;
2. ``cross_encoder``: a cross-encoder's score of (query, document) on the top-50 candidates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TIERS: tuple[str, ...] = ("mips", "maxsim", "cross_encoder")
"""Tier names in order of cost (index = class of the difficulty head)."""
RERANK_TIERS: tuple[str, ...] = TIERS[1:]
"""The tiers that rerank the MIPS candidates (the expensive ones)."""

RERANK_DEPTH = 50
"""Candidates reranked by the MaxSim and cross-encoder tiers (Algorithm 1 of 000, k = 50)."""


def oracle_tier(quality: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """The oracle tier t* of each query: the cheapest tier whose ranking is best.

    Args:
        quality: shape (Q, T) float, a ranking-quality metric per query and tier (NDCG@10 here; higher is
            better), tiers in the order of :data:`TIERS` (cheapest first).
        tol: a tier within ``tol`` of the best counts as best (0: exact ties only).

    Returns:
        shape (Q,) int64 in [0, T): the smallest tier index whose quality >= max over tiers − tol. A query on
        which every tier scores the same (e.g. 0 everywhere) gets tier 0: paying more buys nothing.

    Raises:
        ValueError: if ``quality`` is not 2-d with at least one tier, holds NaN, or tol < 0.
    """
    q = np.asarray(quality, dtype=np.float64)
    if q.ndim != 2 or q.shape[1] < 1:
        raise ValueError(f"quality must be (Q, T) with T >= 1, got shape {q.shape}")
    if np.isnan(q).any() or tol < 0:
        raise ValueError("quality must not hold NaN and tol must be >= 0")
    best = q.max(axis=1, keepdims=True)
    return np.argmax(q >= best - tol, axis=1).astype(np.int64)


def predict_tier(W: np.ndarray, query_embedding: np.ndarray) -> np.ndarray:
    """t̂(q) = argmax W_t h_q of §4.2 of 000.

    Args:
        W: shape (T, D) float32, the head's weights (rows in :data:`TIERS` order).
        query_embedding: shape (D,) or (Q, D) float32, the encoder's unit query embedding(s).

    Returns:
        int64 tier index, shape () for one query or (Q,).

    Raises:
        ValueError: on a dimension mismatch.
    """
    W = np.asarray(W, dtype=np.float32)
    h = np.asarray(query_embedding, dtype=np.float32)
    if W.ndim != 2 or h.shape[-1] != W.shape[1]:
        raise ValueError(f"head of shape {W.shape} cannot read embeddings of shape {h.shape}")
    return np.argmax(h @ W.T, axis=-1).astype(np.int64)


def maxsim(query_tokens: np.ndarray, doc_tokens: Sequence[np.ndarray]) -> np.ndarray:
    """Late-interaction score Σ_i max_j <q_i, d_j> (ColBERT's MaxSim) of one query against documents.

    Args:
        query_tokens: shape (Lq, D) float32, the query's token embeddings (L2-normalised rows, so each term is a
            cosine).
        doc_tokens: C arrays of shape (L_c, D) float32 (normalised rows), one per candidate; an empty document
            (L_c = 0) scores -inf.

    Returns:
        shape (C,) float32 scores, higher is better (in [-Lq, Lq] for unit rows).
    """
    q = np.asarray(query_tokens, dtype=np.float32)
    out = np.empty(len(doc_tokens), dtype=np.float32)
    for c, d in enumerate(doc_tokens):
        out[c] = -np.inf if len(d) == 0 else float((q @ np.asarray(d, dtype=np.float32).T).max(axis=1).sum())
    return out


def normalize_rows(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero); returns a new float32 array."""
    X = np.asarray(X, dtype=np.float32)
    n = np.linalg.norm(X, axis=-1, keepdims=True)
    return X / np.maximum(n, 1e-12)
