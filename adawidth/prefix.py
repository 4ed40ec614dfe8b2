"""Prefix scoring with reusable partial sums (Eq. (1) and §3.2.1 of 001).

The prefix score at width m is the cosine of the m-prefixes of the rotated
query and document (Eq. (1) of 001)::

    s_m(q, d) = <q[:m], d[:m]> / (||q[:m]|| ||d[:m]||).

Because queries and documents share one coordinate order, the raw partial dot
product and both partial squared norms at width m are sums over coordinates
``< m``; extending a candidate set from width m to m' adds only the
coordinates ``m..m'-1`` (cost m' - m per candidate, §3.2.1).  :class:`PartialScores`
carries those sums so stage 1 and every later rescoring pass reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS = 1e-12


def prefix_normalize(X: np.ndarray, m: int) -> np.ndarray:
    """``pi_m`` of 001 applied row-wise: the m-prefix of each row, L2-normalised.

    Args:
        X: shape (n, D') with D' >= m, rotated embeddings.
        m: prefix width, 1 <= m <= D'.

    Returns:
        shape (n, m), float32; a row whose prefix is all zeros stays zero.

    Raises:
        ValueError: if m is outside [1, D'].
    """
    if not 1 <= m <= X.shape[-1]:
        raise ValueError(f"width {m} outside [1, {X.shape[-1]}]")
    P = np.asarray(X[..., :m], dtype=np.float32)
    n = np.linalg.norm(P, axis=-1, keepdims=True)
    return P / np.maximum(n, EPS)


@dataclass(frozen=True)
class PartialScores:
    """Partial sums of one query against a candidate set, at some width.

    Attributes:
        candidates: shape (C,), int64, row numbers of the candidates in the index.
        dot: shape (C,), float64, ``<q[:width], d[:width]>`` (raw, not normalised).
        doc_sqnorm: shape (C,), float64, ``||d[:width]||^2``.
        query_sqnorm: float, ``||q[:width]||^2``.
        width: the width these sums cover.
    """

    candidates: np.ndarray
    dot: np.ndarray
    doc_sqnorm: np.ndarray
    query_sqnorm: float
    width: int

    def cosine(self) -> np.ndarray:
        """Prefix cosines s_width(q, d) of Eq. (1) (001); shape (C,), float64, in [-1, 1]."""
        denom = np.sqrt(np.maximum(self.doc_sqnorm * self.query_sqnorm, EPS * EPS))
        return self.dot / denom

    def extend(self, query: np.ndarray, docs: np.ndarray, width: int) -> "PartialScores":
        """Extend the sums to a wider prefix, reading only coordinates ``self.width..width-1``.

        Args:
            query: rotated query, shape (D',) with D' >= width.
            docs: rotated documents of the whole index, shape (N, D'') with D'' >= width;
                only rows ``self.candidates`` and columns ``self.width:width`` are read.
            width: the new width, >= self.width.

        Returns:
            New :class:`PartialScores` at ``width`` (self is unchanged).

        Raises:
            ValueError: if ``width < self.width`` or exceeds the stored width.
        """
        if width < self.width:
            raise ValueError(f"cannot extend from width {self.width} down to {width}")
        if width > min(query.shape[-1], docs.shape[-1]):
            raise ValueError(f"width {width} exceeds the stored width {min(query.shape[-1], docs.shape[-1])}")
        if width == self.width:
            return self
        tail_q = np.asarray(query[self.width:width], dtype=np.float64)
        tail_d = np.asarray(docs[self.candidates, self.width:width], dtype=np.float64)
        return PartialScores(
            candidates=self.candidates,
            dot=self.dot + tail_d @ tail_q,
            doc_sqnorm=self.doc_sqnorm + np.einsum("ij,ij->i", tail_d, tail_d),
            query_sqnorm=self.query_sqnorm + float(tail_q @ tail_q),
            width=width,
        )


def partial_scores_from_cosines(candidates: np.ndarray, cosines: np.ndarray, query: np.ndarray,
                                doc_sqnorm_m0: np.ndarray, m0: int) -> PartialScores:
    """Recover stage-1 partial sums from the normalised m0-prefix cosines a MIPS index returns.

    Stage 1 searches the L2-normalised m0-prefixes, so its scores are cosines;
    the raw partial dot product is ``cos * ||q[:m0]|| * ||d[:m0]||``.

    Args:
        candidates: shape (C,), int64 row numbers (no -1 entries).
        cosines: shape (C,), stage-1 scores for those rows.
        query: rotated query, shape (>= m0,).
        doc_sqnorm_m0: shape (N,), ``||d[:m0]||^2`` for every document of the index.
        m0: stage-1 width.

    Returns:
        :class:`PartialScores` at width m0.
    """
    q0 = np.asarray(query[:m0], dtype=np.float64)
    qs = float(q0 @ q0)
    ds = np.asarray(doc_sqnorm_m0[candidates], dtype=np.float64)
    dot = np.asarray(cosines, dtype=np.float64) * np.sqrt(qs * ds)
    return PartialScores(candidates=np.asarray(candidates, dtype=np.int64), dot=dot,
                         doc_sqnorm=ds, query_sqnorm=qs, width=m0)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest scores, best first (ties broken by position).

    Args:
        scores: shape (C,).
        k: >= 0; values above C return all C positions.

    Returns:
        shape (min(k, C),), int64.
    """
    k = min(int(k), scores.shape[0])
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k < scores.shape[0]:
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(scores.shape[0])
    order = np.lexsort((part, -scores[part]))
    return part[order].astype(np.int64)


def exact_prefix_search(queries: np.ndarray, docs: np.ndarray, m: int, k: int) -> np.ndarray:
    """Brute-force reference: top-k documents of each query by the width-m prefix cosine.

    Args:
        queries: rotated queries, shape (Q, D').
        docs: rotated documents, shape (N, D'').
        m: width, 1 <= m <= min(D', D'').
        k: results per query.

    Returns:
        shape (Q, min(k, N)), int64 row numbers, best first.
    """
    S = prefix_normalize(queries, m) @ prefix_normalize(docs, m).T
    return np.stack([top_k(row, k) for row in S]) if S.shape[0] else np.empty((0, min(k, docs.shape[0])), np.int64)
