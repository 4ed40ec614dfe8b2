"""Stage ``rescore``: score the survivors of stage 1 at the width the route chose, reusing partial sums.

- ``fixed``, ``router``: prefix cosines of the shortlist at the chosen width; the stage-1 partial sums at m0
  are recovered from the stage-1 cosines, so a query resolved at width m costs C·(m − m0) more, not C·m
  (§3.2.1 of 001).  A width below m0 starts the sums afresh over the shortlist (C·m).
- ``funnel``: extend the blocked scan to the configuration's m1, keep its shortlist, rescore at its width.
- ``recall`` on an ANN version: the ANN candidates ranked by the full-width scores faiss computed for them in
  stage 1 (every ANN kind stores the float32 vectors, so these are the exact inner products; no second pass
  over the documents, no work here).
- ``exact``, ``recall``: rank the level scan's survivors (pruned level by level and rescored in float32 inside
  stage 1's compiled call).
"""

from __future__ import annotations

import numpy as np

from adawidth import stage1_policy
from adawidth.prefix import PartialScores, partial_scores_from_cosines, top_k
from engine.ann import ranked
from engine.candidates import Candidates
from engine.plan import Plan


def rescore(plan: Plan, version, query: np.ndarray, c: Candidates) -> Candidates:
    """Rescore ``c`` per the plan (and the route's choice); returns the ranked candidates (at most depth)."""
    if plan.policy in ("fixed", "router"):
        width = plan.width if plan.policy == "fixed" else c.trace["width"]
        c.trace.setdefault("escalated", False)
        c.trace.setdefault("router_score", None)
        c.trace["width"] = int(width)
        sl = c.state
        if sl is None:
            out = c.ranked(np.empty(0, np.int64), np.empty(0), width)
            out.work["rescore"] = 0
            return out
        m0 = version.m0
        if width >= m0:
            partial = partial_scores_from_cosines(sl.rows, sl.cosines, query, sl.doc_sqnorm_m0, m0)
            work = len(sl.rows) * (width - m0)
        else:
            zeros = np.zeros(len(sl.rows))
            partial = PartialScores(np.asarray(sl.rows, np.int64), zeros, zeros, 0.0, 0)
            work = len(sl.rows) * width
        partial = partial.extend(query, sl.docs, width)
        cos = partial.cosine()
        pos = top_k(cos, plan.depth)
        out = c.ranked(sl.to_index_rows(partial.candidates[pos]), cos[pos], width)
        out.work["rescore"] = int(work)
        return out
    if plan.policy == "funnel":
        fp = version.funnel_policy
        cfg, state = c.state
        corpus, N = fp.corpus, fp.corpus.N
        state = corpus.extend(state, query, cfg.m1)
        rows, _ = corpus.shortlist(state, min(max(cfg.shortlist, plan.depth), N))
        partial = corpus.partial_scores(state, rows).extend(query, corpus.matrix, cfg.rescore_width)
        cos = partial.cosine()
        pos = top_k(cos, plan.depth)
        out = c.ranked(partial.candidates[pos], cos[pos], cfg.rescore_width)
        out.work["stage1"] = int(state.work + stage1_policy.evidence_work())
        out.work["rescore"] = int(len(rows) * (cfg.rescore_width - cfg.m1))
        out.trace.update(escalated=False)
        return out
    if plan.policy == "recall" and getattr(version, "ann", None) is not None:
        top, scores = ranked(c.state.rows, c.state.scores, plan.depth)
        out = c.ranked(top, scores, version.dimension)
        out.work["rescore"] = 0  # faiss scored them at full width inside stage 1 (its work counts them)
        out.trace.update(width=version.dimension, escalated=False, router_score=None, certified=False)
        return out
    if plan.policy in ("exact", "recall") and c.state is not None:  # the level scan's result (stage 1 ran it)
        res = c.state
        out = c.ranked(res.rows, res.scores.astype(np.float64), version.dimension)
        out.work["rescore"] = int(res.coordinates - res.first_coordinates)
        out.trace.update(width=version.dimension, escalated=False, router_score=None, certified=bool(res.certified),
                         alive_per_level=res.alive_per_level.tolist())
        return out
    if plan.policy == "exact" and c.state is None:  # exhaustive stage 1 already ranked at full width
        c.trace.update(width=version.dimension, escalated=False, router_score=None)
        c.work.setdefault("rescore", 0)
        return c
    raise NotImplementedError(f"rescoring of policy {plan.policy!r}")
