"""The adaptive-width query path, independent of where stage 1 runs (§3.2 and Algorithm 3 of 001).

stage 1  rank the corpus on the normalised m0-prefix, keep a shortlist of C
route    (policy ``auto``) read the 18 order-statistic features of the sorted
         stage-1 scores and escalate to width h when the predicted gain clears
         the threshold, else resolve at width l
rescore  prefix cosines of the shortlist at the chosen width, reusing the
         stage-1 partial sums (a query resolved at width m costs m, not m0 + m)

The service calls :func:`resolve` with faiss's stage-1 output; the trainer and
the benchmarks call it with the brute-force :func:`exact_stage1`, so offline
numbers and served numbers come from one implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adawidth.prefix import PartialScores, partial_scores_from_cosines, prefix_normalize, top_k
from adawidth.router import router_features


@dataclass(frozen=True)
class Resolution:
    """Outcome of one query.

    Attributes:
        rows: (k',) int64 index rows, best first (k' = min(k, C)).
        scores: (k',) float64 prefix cosines at ``width`` (higher is better).
        width: width the shortlist was rescored at.
        escalated: True when the router chose the high width of the action pair.
        router_score: predicted escalation gain (None unless policy ``auto``).
        coordinates_scored: multiply-adds of the query, stage 1 (N × m0 for a flat
            scan) plus rescoring (C × (width − m0) when width > m0, else C × width).
        stage1_work: the stage-1 share of ``coordinates_scored`` (documents visited × width).
        rescoring_work: the rescoring share (candidates × coordinates added).
    """

    rows: np.ndarray
    scores: np.ndarray
    width: int
    escalated: bool
    router_score: float | None
    coordinates_scored: int
    stage1_work: int = 0
    rescoring_work: int = 0


def exact_stage1(query: np.ndarray, docs_prefix_normalized: np.ndarray, m0: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force stage 1 (the reference faiss IndexFlatIP must equal).

    Args:
        query: rotated query, shape (>= m0,).
        docs_prefix_normalized: (N, m0) float32, normalised m0-prefixes.
        m0: stage-1 width.
        size: shortlist size C.

    Returns:
        (rows (C',) int64, cosines (C',) float32), best first, C' = min(C, N).
    """
    qp = prefix_normalize(query[None, :], m0)[0]
    s = docs_prefix_normalized @ qp
    rows = top_k(s, size)
    return rows, s[rows]


def resolve(query: np.ndarray, docs: np.ndarray, doc_sqnorm_m0: np.ndarray, stage1_rows: np.ndarray,
            stage1_scores: np.ndarray, *, m0: int, k: int, width: int | None,
            action_pair: tuple[int, int] | None = None, predict_gain: Callable[[np.ndarray], float] | None = None,
            threshold: float | None = None, theta: float = 0.05, stage1_work: int | None = None) -> Resolution:
    """Route and rescore one query's shortlist.

    Args:
        query: rotated query, shape (D',), at least the largest width used.
        docs: rotated documents of the index, (N, D''), float32.
        doc_sqnorm_m0: (N,), ``||d[:m0]||^2``.
        stage1_rows, stage1_scores: the shortlist, (C,), best first; rows must be
            valid (callers drop faiss's -1 padding).
        m0: stage-1 width.
        k: results to return.
        width: a fixed width in [1, D''], or None for the routed policy (``auto``).
        action_pair: (l, h) for the routed policy, m0 <= l < h.
        predict_gain: features (18,) -> predicted gain, for the routed policy.
        threshold: escalate when predicted gain >= threshold.
        theta: entropy temperature of the features.
        stage1_work: multiply-adds spent by stage 1 (default N × m0, a flat scan).

    Returns:
        :class:`Resolution`.

    Raises:
        ValueError: if ``width`` is outside [1, D''] or the routed policy lacks its inputs.
    """
    D = min(query.shape[-1], docs.shape[-1])
    if width is None:
        if action_pair is None or predict_gain is None or threshold is None:
            raise ValueError("the routed policy needs action_pair, predict_gain and threshold")
        low, high = action_pair
        router_score = float(predict_gain(router_features(stage1_scores, theta)))
        escalated = router_score >= threshold
        width = high if escalated else low
    else:
        router_score, escalated = None, False
    if not 1 <= width <= D:
        raise ValueError(f"width {width} outside [1, {D}]")
    if width >= m0:
        partial = partial_scores_from_cosines(stage1_rows, stage1_scores, query, doc_sqnorm_m0, m0)
        rescoring = len(stage1_rows) * (width - m0)
    else:  # narrower than stage 1: start the sums afresh over the shortlist
        zeros = np.zeros(len(stage1_rows))
        partial = PartialScores(np.asarray(stage1_rows, np.int64), zeros, zeros, 0.0, 0)
        rescoring = len(stage1_rows) * width
    partial = partial.extend(query, docs, width)
    cos = partial.cosine()
    pos = top_k(cos, k)
    s1 = stage1_work if stage1_work is not None else docs.shape[0] * m0
    return Resolution(rows=partial.candidates[pos], scores=cos[pos], width=int(width),
                      escalated=bool(escalated), router_score=router_score,
                      coordinates_scored=int(s1 + rescoring), stage1_work=int(s1), rescoring_work=int(rescoring))


def exact_stage1_batch(queries: np.ndarray, docs_prefix_normalized: np.ndarray, m0: int, size: int,
                       chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """:func:`exact_stage1` for many queries at once.

    Args:
        queries: rotated queries, (Q, >= m0).
        docs_prefix_normalized: (N, m0) float32.

    Returns:
        (rows (Q, C') int64, cosines (Q, C') float32), each row best first.
    """
    Qp = prefix_normalize(queries, m0)
    size = min(size, docs_prefix_normalized.shape[0])
    rows = np.empty((Qp.shape[0], size), dtype=np.int64)
    scores = np.empty((Qp.shape[0], size), dtype=np.float32)
    for s in range(0, Qp.shape[0], chunk):
        S = Qp[s:s + chunk] @ docs_prefix_normalized.T
        if size < S.shape[1]:
            part = np.argpartition(-S, size - 1, axis=1)[:, :size]
        else:
            part = np.tile(np.arange(S.shape[1]), (S.shape[0], 1))
        sc = np.take_along_axis(S, part, 1)
        order = np.lexsort((part, -sc), axis=1)
        rows[s:s + chunk] = np.take_along_axis(part, order, 1)
        scores[s:s + chunk] = np.take_along_axis(sc, order, 1)
    return rows, scores
