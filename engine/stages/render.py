"""Stage ``render``: ids, scores and the trace of one search (the gateway's response, an offline result)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.candidates import Candidates
from engine.plan import Plan


@dataclass
class Result:
    """One finished search.

    Attributes:
        rows: (k',) int64 index rows, best first; ids: their document ids; scores: (k',) float64, higher is
            better (see :class:`engine.candidates.Candidates`).
        trace: the response's trace (policy, widths, work, confidence, tier, version, timings, ...).
        embedding: the encoder's (D,) float32 query embedding, or None when no dense lane ran.
    """

    rows: np.ndarray
    ids: list[str]
    scores: np.ndarray
    trace: dict[str, Any] = field(default_factory=dict)
    embedding: np.ndarray | None = None

    def hits(self) -> list[dict]:
        """``[{"id": str, "score": float}, ...]`` best first (the response's ``results``)."""
        return [{"id": i, "score": float(s)} for i, s in zip(self.ids, self.scores)]


def render(plan: Plan, version, c: Candidates, *, allowed_documents: int | None, embedding: np.ndarray | None,
           timings: dict[str, float]) -> Result:
    """Assemble the :class:`Result` of ``c`` (rows already at most k, best first)."""
    t = c.trace
    trace = {
        "policy": t.get("policy", plan.policy), "width": int(t.get("width", c.width)),
        "escalated": bool(t.get("escalated", False)), "router_score": t.get("router_score"),
        "index_version": version.version, "mode": plan.mode, "fusion": t.get("fusion"),
        "allowed_documents": allowed_documents,
        "coordinates_scored": c.coordinates_scored, "stage1_work": int(c.work.get("stage1", 0)),
        "rescoring_work": int(c.work.get("rescore", 0)),
        "stage1_width": t.get("stage1_width"), "shortlist": t.get("shortlist"),
        "recall_target": plan.recall_target if plan.policy == "recall" else None,
        "confidence": t.get("confidence"), "certified": t.get("certified"),
        "alive_per_level": t.get("alive_per_level"),
        "tier": t.get("tier", "mips"), "tier_predicted": t.get("tier_predicted"),
        "reranked": int(t.get("reranked", 0)), "timings_seconds": timings,
        "stage1_backend": t.get("stage1_backend"), "effort": t.get("effort"), "effort_name": t.get("effort_name"),
        "effort_per_query": t.get("effort_per_query"), "probe_coordinates": t.get("probe_coordinates"),
        "served_exact_because": t.get("served_exact_because"),
        "tier_fallback_because": t.get("tier_fallback_because"),
    }
    rows = np.asarray(c.rows, np.int64)
    doc_ids = version.doc_ids
    return Result(rows, [doc_ids[r] for r in rows.tolist()], np.asarray(c.scores, np.float64), trace, embedding)
