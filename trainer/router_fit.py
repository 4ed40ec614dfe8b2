"""Fitting the per-query width router (§3.2.3 and Algorithm 3 of 001) with LightGBM.

Target: the escalation gain g(q) = NDCG@10_h(q) − NDCG@10_l(q) (Eq. (12)) on
training queries only.  The escalation threshold for a target fraction ρ is
calibrated on **out-of-fold** predictions (K-fold over the training queries)
rather than on in-sample predictions: FINDINGS.md measured that thresholds set
on in-sample predictions escalate far fewer unseen queries than asked
(ρ = 0.1 escalated 3 %).
"""

from __future__ import annotations

from dataclasses import dataclass

import lightgbm as lgb
import numpy as np

from adawidth.funnel import resolve
from adawidth.metrics import ranking_metric
from adawidth.router import FEATURE_NAMES, router_feature_matrix

LGB_PARAMS = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "lambda_l2": 1.0,
    "verbose": -1,
    "num_threads": 1,
    "deterministic": True,
    "force_row_wise": True,
}
NUM_ROUNDS = 200


@dataclass
class RouterFit:
    """A fitted router for one action pair.

    Attributes:
        booster: the LightGBM model fitted on all training queries.
        oof_predictions: (n,) out-of-fold predicted gains, for calibration.
        gains: (n,) true gains g(q) of the training queries.
        action_pair: (l, h).
    """

    booster: lgb.Booster
    oof_predictions: np.ndarray
    gains: np.ndarray
    action_pair: tuple[int, int]


def escalation_gains(q_rot: np.ndarray, docs: np.ndarray, doc_sqnorm_m0: np.ndarray, rows: np.ndarray,
                     scores: np.ndarray, judgments: list[dict[str, int]], doc_ids: list[str], *,
                     m0: int, pair: tuple[int, int], k_eval: int = 10) -> np.ndarray:
    """g(q) of Eq. (12) for each query: NDCG@10 at h minus NDCG@10 at l over its shortlist.

    Args:
        q_rot: (n, D) rotated queries; docs: (N, D) rotated documents.
        rows, scores: stage-1 shortlists (n, C).
        judgments: n dicts doc id -> label.

    Returns:
        (n,) float64 gains in [-1, 1].
    """
    nd = {w: ranking_metric([resolve(q_rot[i], docs, doc_sqnorm_m0, rows[i], scores[i], m0=m0, k=k_eval, width=w).rows
                             for i in range(len(q_rot))], judgments, "ndcg", k_eval, doc_ids) for w in pair}
    return nd[pair[1]] - nd[pair[0]]


def _train(X: np.ndarray, y: np.ndarray, seed: int) -> lgb.Booster:
    params = dict(LGB_PARAMS, seed=seed)
    return lgb.train(params, lgb.Dataset(X, y, feature_name=list(FEATURE_NAMES)), num_boost_round=NUM_ROUNDS)


def fit_router(stage1_scores: np.ndarray, gains: np.ndarray, pair: tuple[int, int], *, folds: int = 5,
               seed: int = 0, theta: float = 0.05) -> RouterFit:
    """Fit the gain regressor and its out-of-fold calibration predictions.

    Args:
        stage1_scores: (n, C) sorted stage-1 scores of the training queries.
        gains: (n,) g(q).
        pair: the action pair (l, h).
        folds: K of the K-fold out-of-fold predictions (>= 2).

    Returns:
        :class:`RouterFit`.
    """
    X = router_feature_matrix(list(stage1_scores), theta)
    n = len(gains)
    rng = np.random.default_rng(seed)
    fold_of = rng.permutation(n) % folds
    oof = np.empty(n)
    for f in range(folds):
        tr, te = fold_of != f, fold_of == f
        oof[te] = _train(X[tr], gains[tr], seed).predict(X[te])
    return RouterFit(_train(X, gains, seed), oof, np.asarray(gains, dtype=np.float64), tuple(pair))
