"""Stage ``rotate``: the leading coordinates of ``R q`` that the plan can reach (§3.1 of 001)."""

from __future__ import annotations

import numpy as np

from engine.plan import Plan


def reach(plan: Plan, version) -> int:
    """Coordinates of the rotated query the plan's stages read (m0 at least; D for exact, recall, funnel)."""
    D = version.dimension
    if plan.policy in ("exact", "recall", "funnel"):
        return D
    if plan.policy == "fixed":
        return max(plan.width, version.m0)
    if plan.policy == "router":
        return max(plan.pair[1], version.m0)
    return D  # a lexical-only plan rotates nothing; D keeps the query usable by a fusion rescoring


def rotate(plan: Plan, version, embedding: np.ndarray) -> np.ndarray:
    """``R[:w] @ q``: embedding (D,) float32 unit norm -> (w,) float32, w = :func:`reach` (costs D·w)."""
    return np.asarray(version.rotation[:reach(plan, version)] @ embedding, dtype=np.float32)  # (no copy if float32)
