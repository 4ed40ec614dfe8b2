"""Router features and escalation calibration (§3.2 of 001).

The router reads only order statistics of the stage-1 score vector (§3.2.2 of
001) and predicts the escalation gain g(q) = NDCG@10_h(q) − NDCG@10_l(q)
(Eq. (12) of 001).  The learned model itself (LightGBM) lives in the trainer
(fit) and the service (predict); this module is the pure part both share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FEATURE_NAMES: tuple[str, ...] = (
    # levels
    "s1", "s2", "s5", "s10", "s11", "s20",
    # gaps
    "gap_1_2", "gap_1_10", "gap_10_11", "gap_10_15",
    # moments
    "mean_top10", "std_top10", "mean_top50", "std_top50",
    # shape
    "entropy_top50", "exp_entropy_top50", "zscore_s1_top50", "cv_top100",
)
"""The 18 features of §3.2.2 (001), in the order the router model expects."""

N_SCORES_USED = 100
_EPS = 1e-12


def router_features(scores: np.ndarray, theta: float = 0.05) -> np.ndarray:
    """The 18 order-statistic features of §3.2.2 (001) for one query.

    Args:
        scores: stage-1 scores of the shortlist, shape (C,), any order (they are
            sorted here, descending); C >= 1.  When C < 100 the sorted vector is
            padded with its smallest value so every feature is defined (small
            corpora such as LIMIT-small have 46 documents).
        theta: softmax temperature of the entropy, the contrastive temperature of
            Eq. (6) (0.05).

    Returns:
        shape (18,), float64, finite, in the order of :data:`FEATURE_NAMES`.

    Raises:
        ValueError: if ``scores`` is empty or holds a NaN or infinity, or theta <= 0.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    if s.size == 0:
        raise ValueError("router features need at least one stage-1 score")
    if not np.all(np.isfinite(s)):
        raise ValueError("stage-1 scores must be finite")
    if theta <= 0:
        raise ValueError(f"theta must be > 0, got {theta}")
    s = np.sort(s)[::-1]
    if s.size < N_SCORES_USED:
        s = np.concatenate([s, np.full(N_SCORES_USED - s.size, s[-1])])
    sig = lambda i: s[i - 1]  # noqa: E731  (1-indexed sigma_i, as in the paper)
    top10, p, top100 = s[:10], s[:50], s[:100]
    z = (p - p.max()) / theta
    eta = np.exp(z) / np.exp(z).sum()
    entropy = float(-(eta * np.log(np.maximum(eta, 1e-300))).sum())
    std_p = float(p.std())
    feats = [
        sig(1), sig(2), sig(5), sig(10), sig(11), sig(20),
        sig(1) - sig(2), sig(1) - sig(10), sig(10) - sig(11), sig(10) - sig(15),
        top10.mean(), top10.std(), p.mean(), std_p,
        entropy, np.exp(entropy),
        (sig(1) - p.mean()) / max(std_p, _EPS),
        top100.std() / max(abs(top100.mean()), _EPS),
    ]
    return np.asarray(feats, dtype=np.float64)


def router_feature_matrix(score_rows: Sequence[np.ndarray], theta: float = 0.05) -> np.ndarray:
    """:func:`router_features` for many queries; shape (Q, 18), float64."""
    if len(score_rows) == 0:
        return np.empty((0, len(FEATURE_NAMES)))
    return np.stack([router_features(r, theta) for r in score_rows])


def threshold_for_rate(calibration_predictions: np.ndarray, rho: float) -> float:
    """Escalation threshold so that a fraction ``rho`` of calibration queries clears it.

    A query escalates when its predicted gain is ``>= threshold``.  The
    calibration predictions should come from queries the router was not fitted
    on (the trainer uses out-of-fold predictions): FINDINGS.md showed thresholds
    set on in-sample predictions escalate far fewer test queries than asked.

    Args:
        calibration_predictions: shape (n,), predicted gains, n >= 1.
        rho: target escalation fraction in [0, 1].

    Returns:
        The threshold (float); +inf for rho == 0, -inf for rho == 1.

    Raises:
        ValueError: if rho is outside [0, 1] or there are no predictions.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    p = np.sort(np.asarray(calibration_predictions, dtype=np.float64))
    if p.size == 0:
        raise ValueError("no calibration predictions")
    if rho == 0.0:
        return float("inf")
    if rho == 1.0:
        return float("-inf")
    # the ceil(rho * n) largest predictions clear the threshold
    n_escalate = int(np.ceil(rho * p.size))
    return float(p[p.size - n_escalate])


def mean_width(escalated: np.ndarray, low: int, high: int) -> float:
    """Mean retained coordinates per query, Eq. (11) of 001: (1 − ρ) l + ρ h.

    Args:
        escalated: shape (Q,), bool.
    """
    rho = float(np.mean(escalated)) if len(escalated) else 0.0
    return (1.0 - rho) * low + rho * high
