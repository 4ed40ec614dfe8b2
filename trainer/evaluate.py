"""Offline evaluation of rotations, static widths and routed policies on labelled queries.

Everything goes through :func:`adawidth.funnel.resolve`, the same code the
gateway runs, with the brute-force stage 1 (equal to faiss's flat index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adawidth.funnel import exact_stage1_batch, resolve
from adawidth.metrics import ranking_metric
from adawidth.prefix import exact_prefix_search, prefix_normalize


@dataclass
class QuerySet:
    """Labelled queries: ids, rotated or frozen embeddings (Q, D), judgments per query."""

    ids: list[str]
    emb: np.ndarray
    judgments: list[dict[str, int]]


def score_rankings(rankings: list[list[str]], qs: QuerySet, subset: np.ndarray | None = None) -> dict:
    """Mean NDCG@10 and Recall@100 of ranked id lists (one per query of ``qs``; ``subset``: (Q,) bool of the
    queries averaged, None for all); NaN over no query."""
    idx = np.arange(len(rankings)) if subset is None else np.flatnonzero(subset)
    ranked, judged = [rankings[i] for i in idx], [qs.judgments[i] for i in idx]
    nd, rc = ranking_metric(ranked, judged, "ndcg", 10), ranking_metric(ranked, judged, "recall", 100)
    return {"ndcg@10": float(nd.mean()) if len(nd) else float("nan"),
            "recall@100": float(rc.mean()) if len(rc) else float("nan"), "queries": int(len(idx))}


def per_query_ndcg(rankings: list[list[str]], qs: QuerySet) -> np.ndarray:
    """(Q,) float64 NDCG@10 of each query."""
    return ranking_metric(rankings, qs.judgments, "ndcg", 10)


def exact_rankings(R: np.ndarray, X: np.ndarray, qs: QuerySet, doc_ids: list[str], width: int,
                   k: int = 100) -> list[list[str]]:
    """Exact search of the whole corpus at ``width`` after rotating by R (no shortlist)."""
    rows = exact_prefix_search(qs.emb @ R.T, X @ R.T, width, k)
    return [[doc_ids[j] for j in r] for r in rows]


@dataclass
class Funnel:
    """A rotated index held in memory for offline evaluation of the served path."""

    docs: np.ndarray          # (N, D) rotated, float32
    doc_sqnorm_m0: np.ndarray  # (N,)
    doc_ids: list[str]
    m0: int
    shortlist: int

    @classmethod
    def build(cls, X_rot: np.ndarray, doc_ids: list[str], m0: int, shortlist: int) -> "Funnel":
        """Hold rotated documents X_rot (N, D) with their m0 partial norms (float32 rows, C-contiguous)."""
        X_rot = np.ascontiguousarray(X_rot, dtype=np.float32)
        return cls(X_rot, np.einsum("ij,ij->i", X_rot[:, :m0], X_rot[:, :m0]), doc_ids, m0, shortlist)

    def stage1(self, q_rot: np.ndarray, size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact stage 1 of rotated queries (Q, D): (rows (Q, C) int64, prefix cosines (Q, C) float32), C = ``size`` or the shortlist."""
        return exact_stage1_batch(q_rot, prefix_normalize(self.docs, self.m0), self.m0, size or self.shortlist)

    def rankings(self, q_rot: np.ndarray, stage1: tuple[np.ndarray, np.ndarray], widths: list[int],
                 k: int = 100) -> list[list[str]]:
        """Top-``k`` ids of each query, its shortlist rescored at ``widths[i]`` by :func:`adawidth.funnel.resolve`."""
        rows, scores = stage1
        out = []
        for i, w in enumerate(widths):
            r = resolve(q_rot[i], self.docs, self.doc_sqnorm_m0, rows[i], scores[i], m0=self.m0, k=k, width=int(w))
            out.append([self.doc_ids[j] for j in r.rows])
        return out


def routed_policy_report(funnel: Funnel, q_rot: np.ndarray, qs: QuerySet, stage1, pair: tuple[int, int],
                         predicted: np.ndarray, thresholds: dict[float, float], seed: int = 0,
                         subset: np.ndarray | None = None) -> list[dict]:
    """Routed policy at each target ρ against random escalation at the realised rate and the oracle.

    Args:
        predicted: (Q,) predicted gains for the evaluation queries.
        thresholds: ρ -> calibrated threshold (from the training queries).

    Returns:
        One dict per ρ: realised escalation rate, mean width, NDCG@10 / Recall@100 of
        the router, of random escalation at the same realised rate (mean over 20
        draws), of the oracle at the same rate, and of the static width nearest
        the router's mean width.
    """
    low, high = pair
    n = len(qs.ids)
    nd_low = per_query_ndcg(funnel.rankings(q_rot, stage1, [low] * n), qs)
    rank_high = funnel.rankings(q_rot, stage1, [high] * n)
    nd_high = per_query_ndcg(rank_high, qs)
    rank_low = funnel.rankings(q_rot, stage1, [low] * n)
    rng = np.random.default_rng(seed)
    sel = np.ones(n, bool) if subset is None else subset
    out = []
    for rho, thr in thresholds.items():
        esc = predicted >= thr
        rate = float(esc.mean())
        ranks = [rank_high[i] if esc[i] else rank_low[i] for i in range(n)]
        router = score_rankings(ranks, qs, subset)
        rand = []
        for _ in range(20):
            e = np.zeros(n, bool)
            e[rng.choice(n, int(round(rate * n)), replace=False)] = True
            rand.append(np.where(e, nd_high, nd_low)[sel].mean())
        order = np.argsort(-(nd_high - nd_low), kind="stable")
        e = np.zeros(n, bool)
        e[order[: int(round(rate * n))]] = True
        oracle = float(np.where(e, nd_high, nd_low)[sel].mean())
        mw = (1 - rate) * low + rate * high
        static = score_rankings(funnel.rankings(q_rot, stage1, [int(round(mw))] * n), qs, subset)
        out.append({"rho": rho, "escalation_rate": rate, "mean_width": mw,
                    "router": router, "random_ndcg@10": float(np.mean(rand)),
                    "oracle_ndcg@10": oracle, "static_same_width": {"width": int(round(mw)), **static}})
    return out
