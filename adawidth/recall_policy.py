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
from scipy.interpolate import PchipInterpolator

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
    """A one-sided margin added to a target before calibrating, rule ``share``: ``share`` of its miss budget
    1 - target (0.99 -> 0.9925 at 0.25).  Served for pseudo-queries (their shift from the users' queries is not a
    sampling error) and by versions written before :data:`MARGIN_RULES`."""
    return share * (1.0 - float(target))


MARGIN_RULES: tuple[str, ...] = ("standard_error", "share")
"""How :func:`calibration_goal` sets a target's margin.  ``standard_error`` (training queries): one standard error
of the calibration queries' mean recall, the sampling error of the estimate the calibration rests on.  ``share``
(pseudo-queries): :func:`safety_margin`.  The share rule over-delivered at 0.95 by about its margin, 0.0125
(the per-query model realised 0.958-0.965 on SciFact, debdocs and synthetic test queries; docs/METHOD.md)."""


def calibration_goal(target: float, realised: np.ndarray, rule: str = "standard_error", share: float = 0.25) -> float:
    """The mean calibration recall a declared recall is calibrated to: ``target + margin``, at most 1.

    Rule ``standard_error``: the margin is the standard error of the calibration queries' mean realised recall
    (sample standard deviation / sqrt(Q)) at the grid's first confidence whose mean meets ``target``, the last
    one where none does.  The population's mean recall at the served setting then clears the target with
    probability about 0.84 (one-sided, normal approximation) when new queries come from the calibration queries'
    distribution; 0.0016-0.0035 at 0.95 and 0.0007-0.0013 at 0.99 with 800-2,000 calibration queries on SciFact,
    debdocs and synthetic.  Rule ``share``: :func:`safety_margin` with ``share``.

    Args:
        target: the declared recall@k in (0, 1].
        realised: (Q, Z) calibration queries' realised recall@k at each confidence, columns increasing.
        rule: one of :data:`MARGIN_RULES`.
        share: the share of the miss budget (rule ``share`` only).

    Returns:
        The goal in (0, 1] (higher is stricter).

    Raises:
        ValueError: for an unknown rule, a target outside (0, 1] or no calibration queries.
    """
    if rule not in MARGIN_RULES:
        raise ValueError(f"margin rule must be one of {MARGIN_RULES}, got {rule!r}")
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    if rule == "share":
        return min(float(target) + safety_margin(target, share), 1.0)
    realised = np.atleast_2d(np.asarray(realised, np.float64))
    if realised.shape[0] == 0:
        raise ValueError("the standard-error margin needs calibration queries")
    mean = realised.mean(axis=0)
    meets = np.flatnonzero(mean >= target - 1e-12)
    j = int(meets[0]) if len(meets) else realised.shape[1] - 1
    se = float(realised[:, j].std(ddof=1)) / np.sqrt(realised.shape[0]) if realised.shape[0] > 1 else 0.0
    return min(float(target) + se, 1.0)


def interpolated_confidence(z_grid: np.ndarray, mean_recall: np.ndarray, goal: float) -> float | None:
    """The one confidence z whose mean recall reaches ``goal``, read off the grid's curve between its points.

    The curve through the grid's points is the monotone piecewise-cubic Hermite interpolant (PCHIP,
    Fritsch & Carlson 1980, SIAM J. Numer. Anal. 17(2); ``scipy.interpolate.PchipInterpolator``) of the running
    maximum of the mean recall: it keeps the curve's bend between points, where a chord lies under a concave
    curve.  The z is where it crosses the goal, between the last grid point below the goal and the first that
    meets it (bisection).  Why not the grid point itself: the steps are coarse where recall rises fast
    (debdocs 0.947 at z = 5.5, 0.974 at 6) and rounding up over-delivered (0.977 for a target of 0.95); why not
    the chord: it over-delivered by 0.002-0.006 on test queries (SciFact, debdocs, synthetic; PCHIP landed within
    0.002 of the goal, docs/METHOD.md "Landing on the target").

    Args:
        z_grid: (Z,) float64 confidences, increasing.
        mean_recall: (Z,) float64 mean calibration recall at each, in [0, 1].
        goal: the mean recall to reach (:func:`calibration_goal`).

    Returns:
        z (float, between two grid points or a grid point), or None when no grid point reaches the goal.
    """
    z = np.asarray(z_grid, np.float64)
    m = np.maximum.accumulate(np.asarray(mean_recall, np.float64))  # a dip between points is noise: never fall
    meets = np.flatnonzero(m >= goal - 1e-12)
    if not len(meets):
        return None
    j = int(meets[0])
    if j == 0 or m[j] <= m[j - 1] or m[j] <= goal + 1e-12:  # at (or on a flat step to) a grid point
        return float(z[j])
    curve = PchipInterpolator(z, m)
    lo, hi = float(z[j - 1]), float(z[j])  # curve(lo) < goal <= curve(hi); PCHIP is monotone between them
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if curve(mid) >= goal:
            hi = mid
        else:
            lo = mid
    return hi
