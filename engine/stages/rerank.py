"""Stage ``rerank``: the DART tiers (Algorithm 1 of 000_113656fbc6e06895.txt).

``mips`` keeps the first stage's ranking; ``maxsim`` (late interaction over the encoder's token embeddings)
and ``cross_encoder`` rerank its top :data:`adawidth.tiers.RERANK_DEPTH` (50) by the documents' encoder texts;
``auto`` lets the version's difficulty head pick per query, t̂ = argmax W_t h_q (lines 1-2, O(3D), no qrels),
served at the nearest cheaper tier when this replica cannot serve the prediction.
"""

from __future__ import annotations

import numpy as np

from adawidth.tiers import RERANK_DEPTH, TIERS, predict_tier
from engine.candidates import Candidates
from engine.plan import Plan
from engine.scorers import rerank_order


def served_tier(plan: Plan, version, embedding: np.ndarray | None, available: frozenset[str]) -> tuple[str, str | None]:
    """(the tier that serves, the head's prediction or None): for ``auto``, the prediction or the nearest
    cheaper tier in ``available``; otherwise the plan's tier."""
    if plan.tier != "auto":
        return plan.tier, None
    predicted = TIERS[int(predict_tier(version.tier_head, embedding))]
    for t in reversed(TIERS[:TIERS.index(predicted) + 1]):
        if t in available:
            return t, predicted
    return "mips", predicted


def rerank(plan: Plan, version, c: Candidates, tier: str, rerankers: dict) -> Candidates:
    """Rerank ``c`` with ``tier`` and keep the plan's k.

    Args:
        tier: the serving tier (:func:`served_tier`).
        rerankers: ``{"maxsim": MaxSimScorer, "cross_encoder": CrossEncoderScorer}`` (the ones loaded).
    """
    if tier == "mips":  # keep the ranking: cut it to k in place (the last stage; nothing reads c after it)
        c.rows, c.scores, c.state = c.rows[:plan.k], c.scores[:plan.k], None
        c.trace["reranked"] = 0
        return c
    rows = [int(r) for r in c.rows[:RERANK_DEPTH]]
    texts = [version.texts[r] for r in rows]
    if tier == "maxsim":
        scores = rerankers["maxsim"].score(plan.text, version.version, rows, texts)
    else:
        scores = rerankers["cross_encoder"].score(plan.text, texts)
    order = rerank_order(scores)[:plan.k]
    out = c.ranked(np.asarray(rows, np.int64)[order], np.asarray(scores, np.float64)[order])
    out.trace["reranked"] = len(rows)
    return out
