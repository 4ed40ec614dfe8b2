"""Stage ``rotate``: the leading coordinates of ``R q`` that the plan can reach (§3.1 of 001)."""

from __future__ import annotations

import numpy as np

from engine.ann import ENERGY_PREFIX
from engine.plan import Plan


def reach(plan: Plan, version) -> int:
    """Coordinates of the rotated query the plan's stages read (m0 at least; D for exact, recall, funnel; for
    ``recall`` served by an ANN index over the documents as encoded, only the effort model's evidence prefix,
    :data:`engine.ann.ENERGY_PREFIX`, and none where no model serves the target or the model reads no energy
    feature, :meth:`engine.stage1.AnnStage1.needs_prefix`: stage 1 searches with the embedding itself,
    :func:`engine.ann.index_space`)."""
    D = version.dimension
    a = getattr(version, "ann", None)
    if plan.policy == "recall" and getattr(a, "space", "rotated") == "embedding":
        return min(ENERGY_PREFIX, D) if a.needs_prefix(float(plan.recall_target)) else 0
    if plan.policy in ("exact", "recall", "funnel"):
        return D
    if plan.policy == "fixed":
        return max(plan.width, version.m0)
    if plan.policy == "router":
        return max(plan.pair[1], version.m0)
    return D  # a lexical-only plan rotates nothing; D keeps the query usable by a fusion rescoring


def rotate(plan: Plan, version, embedding: np.ndarray) -> np.ndarray:
    """``R[:w] @ q``: embedding (D,) float32 unit norm -> (w,) float32, w = :func:`reach` (costs D·w)."""
    w = reach(plan, version)
    if w == 0:  # an ANN index over the documents as encoded, and no effort model's energy feature to feed
        return _NOTHING
    return np.asarray(version.rotation[:w] @ embedding, dtype=np.float32)  # (no copy if float32)


_NOTHING = np.empty(0, np.float32)
