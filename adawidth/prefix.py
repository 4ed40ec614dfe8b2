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


SMALL_ROW = 256
"""Up to this many scores one stable sort is the cheaper exact top-k (27 against 6 us at 20 scores, 29 against 14
at 256, 31 against 47 at 1,000, one thread): the rescoring of a short candidate list is the common case."""


def _top_k_row(scores: np.ndarray, k: int) -> np.ndarray:
    """:func:`top_k` of one row, exact at the cutoff: every score above the k-th largest value, then the
    lowest positions among those equal to it."""
    if scores.shape[0] <= SMALL_ROW:  # a stable sort of the negated scores: equal scores keep position order
        return np.argsort(-scores, kind="stable")[:k].astype(np.int64)
    kth = np.partition(scores, scores.shape[0] - k)[scores.shape[0] - k]
    above = np.flatnonzero(scores > kth)
    part = np.concatenate([above, np.flatnonzero(scores == kth)[: k - above.size]])
    return part[np.lexsort((part, -scores[part]))].astype(np.int64)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest scores, best first, of a vector or of each row of a matrix.

    The one exact top-k of the project (stage 1 of the exact backends, offline evaluation, mining, benchmarks).
    Tie-breaking is by position, the lower first, *including at the cutoff*: among equal scores competing for
    the last places, the lowest positions are kept (faiss's flat scan keeps the lower row on equal scores too,
    so an exact numpy stage 1 and ``IndexFlatIP`` agree).

    Args:
        scores: (C,) or (Q, C), real; higher is better; no NaN.
        k: >= 0; values above C return all C positions.

    Returns:
        (min(k, C),) or (Q, min(k, C)) int64 positions into the last axis, best first.

    Raises:
        ValueError: if ``scores`` has more than two dimensions.
    """
    scores = np.asarray(scores)
    if scores.ndim not in (1, 2):
        raise ValueError(f"top_k takes a vector or a matrix, got shape {scores.shape}")
    C = scores.shape[-1]
    k = max(min(int(k), C), 0)
    if scores.ndim == 1:
        return np.empty(0, dtype=np.int64) if k == 0 else _top_k_row(scores, k)
    Q = scores.shape[0]
    if k == 0 or Q == 0:
        return np.empty((Q, k), dtype=np.int64)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < C else np.broadcast_to(np.arange(C), (Q, C))
    vals = np.take_along_axis(scores, part, axis=1)
    out = np.take_along_axis(part, np.lexsort((part, -vals), axis=-1), axis=1).astype(np.int64)
    if k < C:  # rows where equal scores straddle the cutoff: argpartition kept arbitrary ones; redo them exactly
        kth = vals.min(axis=1, keepdims=True)
        for i in np.flatnonzero((scores >= kth).sum(axis=1) > k):
            out[i] = _top_k_row(scores[i], k)
    return out


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
    return top_k(prefix_normalize(queries, m) @ prefix_normalize(docs, m).T, k)
