"""Fitting the per-query funnel policy (``adawidth.stage1_policy``) with LightGBM.

Target: for every training query and every configuration (m1, C, r) of the grid, the fraction of
the exhaustive full-width top-10 that the configuration's top-10 keeps.  The target needs no
relevance labels (full-width search is rotation-invariant, so it is the frozen encoder's ranking),
which makes every training query usable, judged or not.  For a learned rotation the training
queries are ranked through cross-fitted rotations (``trainer.build``), as for the width router: a
served adapter has memorised its own training queries and would make them look easy.

bench/adaptive.py measured this policy against the static frontier (bench/results/adaptive/).
"""

from __future__ import annotations

from dataclasses import dataclass

import lightgbm as lgb
import numpy as np

from adawidth import stage1_policy as sp
from adawidth.prefix import exact_prefix_search

LGB_PARAMS = {
    "objective": "regression", "learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 40,
    "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1, "verbose": -1, "num_threads": 1,
    "deterministic": True, "force_row_wise": True,
}
NUM_ROUNDS = 300


@dataclass
class PolicyFit:
    """A fitted funnel policy.

    Attributes:
        booster: LightGBM regressor of top-10 agreement on (evidence, configuration) rows.
        grid: the configurations it chooses among.
        train_queries: queries it was fitted on.
        mean_agreement: (K,) mean target per configuration on the training queries.
    """

    booster: lgb.Booster
    grid: list[sp.Config]
    train_queries: int
    mean_agreement: np.ndarray


def policy_training_data(X: np.ndarray, Q: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray]],
                         grid: list[sp.Config]) -> tuple[np.ndarray, np.ndarray]:
    """Evidence and agreement targets of training queries.

    Args:
        X: (N, D) unrotated unit-norm documents, float32.
        Q: (n, D) unrotated training queries.
        parts: (query indices, (D, D) rotation) pairs covering every query once; each part's queries
            are ranked through its rotation (cross-fitted rotations for a learned adapter).
        grid: configurations.

    Returns:
        (features (n, 22), agreement (n, K) in [0, 1]).
    """
    reference = exact_prefix_search(Q, X, X.shape[1], 10)
    feats = np.empty((len(Q), len(sp.EVIDENCE_NAMES)))
    agree = np.empty((len(Q), len(grid)))
    for idx, R in parts:
        Xr = np.ascontiguousarray(X @ R.T, dtype=np.float32)
        Qr = (Q[idx] @ R.T).astype(np.float32)
        feats[idx] = sp.evidence_matrix(Xr, Qr)
        agree[idx] = sp.top10_agreement(sp.funnel_rankings(Xr, Qr, grid), reference[idx])
    return feats, agree


def fit_stage1_policy(feats: np.ndarray, agreement: np.ndarray, grid: list[sp.Config], n_docs: int, dimension: int,
                      seed: int = 0) -> PolicyFit:
    """Fit the agreement regressor on (evidence, configuration) rows.

    Args:
        feats: (n, 22) evidence; agreement: (n, K) targets; n_docs: N; dimension: D.

    Raises:
        ValueError: on mismatched shapes or no training queries.
    """
    if len(feats) == 0 or agreement.shape != (len(feats), len(grid)):
        raise ValueError(f"need (n, {len(grid)}) targets for n >= 1 queries, got {agreement.shape}")
    names = list(sp.EVIDENCE_NAMES + sp.CONFIG_NAMES)
    data = lgb.Dataset(sp.design(feats, grid, n_docs, float(n_docs * dimension)), agreement.ravel(), feature_name=names)
    booster = lgb.train(dict(LGB_PARAMS, seed=seed), data, num_boost_round=NUM_ROUNDS)
    return PolicyFit(booster, list(grid), len(feats), agreement.mean(0))
