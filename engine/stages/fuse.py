"""Stage ``fuse``: the lexical lane (BM25) and its fusion with the dense lane (§20.2 of 003).

- mode ``lexical``: BM25 over the allowed documents that share an analysed term with the query.
- mode ``hybrid``: the dense list and the lexical list, each to the plan's depth, fused by reciprocal rank
  fusion (k = 60) or a min-max normalised convex combination with dense weight α, whose dense scores are
  recomputed for the union at the dense lane's width.
- mode ``dense``: nothing.
"""

from __future__ import annotations

import numpy as np

from adawidth import hybrid
from adawidth.prefix import top_k
from engine.candidates import Candidates
from engine.plan import Plan


def lexical_list(version, text: str, allowed: np.ndarray | None, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """BM25 top ``depth`` among allowed documents with a positive score.

    Returns:
        (rows (c,) int64 best first, scores (N,) float64 with -inf outside the matches).
    """
    scores = version.lexical.scores(text).astype(np.float64)
    ok = scores > 0.0  # a document sharing no analysed term with the query is not a lexical match
    if allowed is not None:
        ok &= allowed
    scores = np.where(ok, scores, -np.inf)
    return top_k(scores, min(depth, int(ok.sum()))), scores


def dense_scores(version, embedding: np.ndarray, rows: np.ndarray, width: int) -> np.ndarray:
    """Dense scores of given rows at ``width``, as the dense lane scores them.

    Args:
        embedding: unit-norm query embedding, (D,) float32.
        rows: (n,) int64 index rows.
        width: coordinates; D gives the full-width inner product, a smaller width the prefix cosine.

    Returns:
        (n,) float64, higher is better.
    """
    q = (version.rotation[:width] @ embedding).astype(np.float32).astype(np.float64)
    d = np.asarray(version.docs[np.asarray(rows, dtype=np.int64), :width], dtype=np.float64)
    if width >= version.dimension:
        return d @ q
    norms = np.linalg.norm(d, axis=1) * max(float(np.linalg.norm(q)), 1e-12)
    return (d @ q) / np.maximum(norms, 1e-12)


def fuse(plan: Plan, version, embedding: np.ndarray | None, allowed: np.ndarray | None,
         dense: Candidates | None, keep: int) -> Candidates:
    """The plan's lane result, at most ``keep`` rows.

    Args:
        dense: the dense lane's candidates (None in mode ``lexical``).
        keep: rows to return (k, or the rerank depth when a tier reranks next).
    """
    if plan.mode == "dense":
        return dense
    if plan.mode == "lexical":
        rows, scores = lexical_list(version, plan.text, allowed, keep)
        out = Candidates(rows, scores[rows] if len(rows) else np.empty(0), 0)
        out.trace.update(policy=None, width=0, escalated=False, router_score=None)
        return out
    lex_rows, lex_scores = lexical_list(version, plan.text, allowed, plan.depth)
    d_rows = dense.rows
    if plan.fusion == "rrf":
        rows, fused = hybrid.rrf_fuse([d_rows, lex_rows])
    else:
        union = np.asarray(list(dict.fromkeys([*d_rows.tolist(), *lex_rows.tolist()])), dtype=np.int64)
        width = version.dimension if plan.policy == "exact" else dense.width
        dense_sc = dense_scores(version, embedding, union, width) if len(union) else np.empty(0)
        lex_sc = np.where(np.isfinite(lex_scores[union]), lex_scores[union], 0.0) if len(union) else np.empty(0)
        rows, fused = hybrid.convex_fuse(union, dense_sc, lex_sc, plan.alpha)
    out = dense.ranked(rows[:keep], np.asarray(fused[:keep], dtype=np.float64))
    out.trace["fusion"] = plan.fusion
    return out
