"""Retrieval metrics: NDCG@k and Recall@k, per query and averaged.

Definitions follow trec_eval (and therefore pytrec_eval, which the tests use as
the reference; see ``tests/unit/test_metrics.py``):

* gain is the graded relevance label itself (linear gain, trec_eval's
  ``ndcg_cut``), not ``2**rel - 1``; labels <= 0 are non-relevant;
* the ideal DCG is computed over **all** judged relevant documents of the query
  in the corpus, not only those retrieved (as in Eq. (1)'s evaluation protocol
  of 001, "ideal gain computed over all judged relevant documents");
* Recall@k is |relevant ∩ top-k| / |relevant|;
* queries without any relevant document are skipped by the averages (they have
  no defined NDCG or recall), as trec_eval skips queries absent from the qrels.

All metrics are in [0, 1]; higher is better.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Qrels = Mapping[str, Mapping[str, int]]
"""query id -> {document id -> graded relevance label (int)}."""

Run = Mapping[str, Sequence[str]]
"""query id -> ranked document ids, best first (no duplicates)."""


def _discounts(n: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, n + 2, dtype=np.float64))


def ndcg_at_k(ranked: Sequence[str], judgments: Mapping[str, int], k: int = 10) -> float:
    """NDCG@k of one ranked list.

    Args:
        ranked: document ids, best first; only the first ``k`` are read.
        judgments: document id -> relevance label for this query.
        k: cutoff, >= 1.

    Returns:
        NDCG@k in [0, 1] (higher is better); 0.0 when the query has no
        relevant document.

    Raises:
        ValueError: if ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    gains = np.array([max(judgments.get(d, 0), 0) for d in list(ranked)[:k]], dtype=np.float64)
    ideal = np.sort(np.array([g for g in judgments.values() if g > 0], dtype=np.float64))[::-1][:k]
    if ideal.size == 0:
        return 0.0
    dcg = float(gains @ _discounts(gains.size)) if gains.size else 0.0
    idcg = float(ideal @ _discounts(ideal.size))
    return dcg / idcg


def recall_at_k(ranked: Sequence[str], judgments: Mapping[str, int], k: int = 100) -> float:
    """Recall@k of one ranked list: share of the relevant documents in the top ``k``.

    Returns a value in [0, 1] (higher is better); 0.0 when the query has no
    relevant document.  Raises ``ValueError`` if ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    relevant = {d for d, g in judgments.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(list(ranked)[:k])) / len(relevant)


_METRICS = {"ndcg": ndcg_at_k, "recall": recall_at_k}


def ranking_metric(rankings: Sequence[Sequence], judgments: Sequence[Mapping[str, int]], metric: str = "ndcg",
                   k: int = 10, doc_ids: Sequence[str] | None = None) -> np.ndarray:
    """The one "ranking -> metric" step: each query's ranking scored against its judgments.

    Rankings of index rows become document ids through ``doc_ids`` (rows -> ids -> metric); take ``.mean()``
    (or a subset's mean) of the result for the average.

    Args:
        rankings: Q rankings, best first: document ids, or int index rows when ``doc_ids`` is given
            (a (Q, k') int array works too).
        judgments: Q mappings document id -> relevance label, in the order of ``rankings``.
        metric: ``"ndcg"`` (:func:`ndcg_at_k`) or ``"recall"`` (:func:`recall_at_k`).
        k: cutoff, >= 1.
        doc_ids: N ids of the index rows, or None when the rankings hold ids.

    Returns:
        (Q,) float64 in [0, 1], higher is better (0 for a query without relevant documents).

    Raises:
        ValueError: for an unknown metric, ``k < 1`` or rankings and judgments of different lengths.
    """
    fn = _METRICS.get(metric)
    if fn is None:
        raise ValueError(f"unknown metric {metric!r}; expected 'ndcg' or 'recall'")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(rankings) != len(judgments):
        raise ValueError(f"{len(rankings)} rankings but {len(judgments)} judgment sets")
    if doc_ids is not None:
        rankings = [[doc_ids[int(r)] for r in ranked] for ranked in rankings]
    return np.array([fn(ranked, judg, k) for ranked, judg in zip(rankings, judgments)], dtype=np.float64)


def per_query(run: Run, qrels: Qrels, metric: str, k: int) -> dict[str, float]:
    """Evaluate ``metric`` ("ndcg" or "recall") at cutoff ``k`` for every judged query.

    Only queries of ``run`` that have at least one relevant document in
    ``qrels`` are scored; a judged query missing from ``run`` scores 0.

    Returns:
        query id -> metric value in [0, 1].

    Raises:
        ValueError: for an unknown metric name.
    """
    fn = _METRICS.get(metric)
    if fn is None:
        raise ValueError(f"unknown metric {metric!r}; expected 'ndcg' or 'recall'")
    out: dict[str, float] = {}
    for qid, judg in qrels.items():
        if not any(g > 0 for g in judg.values()):
            continue
        out[qid] = fn(run.get(qid, ()), judg, k)
    return out


def mean_metric(run: Run, qrels: Qrels, metric: str, k: int) -> float:
    """Mean of :func:`per_query` over judged queries (NaN when none is judged)."""
    vals = list(per_query(run, qrels, metric, k).values())
    return float(np.mean(vals)) if vals else float("nan")
