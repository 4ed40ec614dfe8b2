"""Declared recall: per query, the cheapest level-pruning confidence expected to meet a recall@k target.

The level scan (:mod:`adawidth.levels`) prunes a document once its partial inner product plus
``z * spread(tail)`` cannot reach the current k-th best exact score.  A larger confidence ``z`` prunes less:
more work, higher recall@k against exhaustive search.  Queries differ: one whose k-th best score stands far
above the bulk after the first level is safe at a small z; a crowded one needs a large z.

The model (LightGBM, fitted by the trainer, label-free: the target is each configuration's recall@k against
the exhaustive full-width top-k, so any query, judged or not, is training data) reads a row of
``evidence (E,) ++ [z]`` and predicts that recall.  :func:`choose` takes, per query, the smallest ``z`` of the
grid whose prediction clears a bar τ; :func:`calibrate_bar` sets τ for a target so that the **realised** mean
recall of the choices over held-out calibration queries (out-of-fold predictions) meets the target.  The
same construction as the funnel policy's (``adawidth.stage1_policy``) and the router's calibration on
out-of-fold predictions (§3.2.3 of 001_63bafbdb24f0770e.txt).

Glossary: Q queries, Z confidences in the grid, E evidence values.
"""

from __future__ import annotations

import numpy as np

DEFAULT_Z_GRID: tuple[float, ...] = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 9.0,
                                     10.0)
"""Confidences the policy chooses among, increasing (more work, higher recall).  Steps of 0.5 up to 8: real text
needs z = 5-8 for recall 0.99 (SciFact 5, debdocs 7), and a coarser grid rounds a target's one calibrated z up to
the next step (debdocs: 8 instead of 7, 15 % more work at the same target)."""


def design(evidence: np.ndarray, z_grid: np.ndarray | tuple[float, ...]) -> np.ndarray:
    """Model rows: every query's evidence beside every confidence of the grid.

    Args:
        evidence: (Q, E) or (E,) float64 early evidence of the level scan.
        z_grid: (Z,) confidences.

    Returns:
        (Q·Z, E + 1) float64, query-major (row q·Z + j is query q at ``z_grid[j]``).
    """
    ev = np.atleast_2d(np.asarray(evidence, dtype=np.float64))
    z = np.asarray(z_grid, dtype=np.float64)
    return np.concatenate([np.repeat(ev, len(z), 0), np.tile(z[:, None], (ev.shape[0], 1))], axis=1)


def choose(pred: np.ndarray, bar: float) -> np.ndarray:
    """Per query, the first (cheapest) grid position whose predicted recall is at least ``bar``.

    Args:
        pred: (Q, Z) predicted recall@k, columns in increasing confidence.
        bar: τ; a query no confidence clears gets the last (safest) one.

    Returns:
        (Q,) int64 grid positions.
    """
    pred = np.atleast_2d(pred)
    ok = pred >= bar
    pick = np.argmax(ok, axis=1)
    pick[~ok.any(axis=1)] = pred.shape[1] - 1
    return pick.astype(np.int64)


def calibrate_bar(pred: np.ndarray, realised: np.ndarray, target: float, bars: np.ndarray | None = None) -> float:
    """The lowest bar τ whose choices meet ``target`` in mean realised recall on calibration queries.

    Args:
        pred: (Q, Z) out-of-fold predicted recall of calibration queries (the model never saw them).
        realised: (Q, Z) their realised recall@k at each confidence, in [0, 1].
        target: the declared recall in (0, 1].
        bars: candidate bars (default: 0.5 .. 1.0 in steps of 0.0025, then +inf).

    Returns:
        τ (float).  ``+inf`` means "always the safest confidence of the grid" (the target cannot be met cheaper;
        whether even that meets it is :func:`safest_meets`).

    Raises:
        ValueError: for shapes that differ, no calibration queries, or a target outside (0, 1].
    """
    pred, realised = np.atleast_2d(pred), np.atleast_2d(realised)
    if pred.shape != realised.shape or pred.shape[0] == 0:
        raise ValueError(f"pred {pred.shape} and realised {realised.shape} must be equal, non-empty (Q, Z)")
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    if bars is None:
        bars = np.arange(0.5, 1.0 + 1e-9, 0.0025)
    rows = np.arange(pred.shape[0])
    for bar in np.sort(np.asarray(bars, dtype=np.float64)):
        if realised[rows, choose(pred, float(bar))].mean() >= target - 1e-12:
            return float(bar)
    return float("inf")


def safest_meets(realised: np.ndarray, target: float) -> bool:
    """True when the grid's safest confidence meets ``target`` in mean realised recall; (Q, Z) -> bool."""
    return bool(np.atleast_2d(realised)[:, -1].mean() >= target - 1e-12)


def safety_margin(target: float, share: float = 0.25) -> float:
    """A one-sided margin added to a target before calibrating: ``share`` of its miss budget 1 - target
    (0.99 -> 0.9925 at the default), so that the realised recall of new queries stays at or above the target
    when it falls a little below the calibration queries'."""
    return share * (1.0 - float(target))
