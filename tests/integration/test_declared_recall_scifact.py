"""A declared recall lands on its target: SciFact's test queries, a policy calibrated on its training queries.

Issue 19 asks the realised recall@10 of test queries to be within 0.005 of the declared 0.95 and 0.99.  The policy
is fitted as a build fits it (every training query at every z of the grid, LightGBM out of fold; margin rule
``standard_error``); both ways a version serves a target are checked through the compiled kernel: one calibrated z
for every query (read off the calibration curve between grid points) and the per-query model.  The previous rule
(a quarter of the miss budget, z rounded up to the grid) over-delivered at 0.95, which the last assertion keeps
in view.  Embeddings come from the cache the shipped SciFact vectors seed (``make embeddings``).
"""

from __future__ import annotations

import numpy as np
import pytest

from adawidth import levels as lv
from adawidth import recall_policy
from adawidth.rotation import pca_rotation
from engine.io.beir import load_collection
from engine.recall import RecallPolicy
from tests.conftest import SCIFACT, VAR
from trainer.embed_cache import EmbeddingCache, encode_with_cache
from trainer.recall_fit import fit_recall_policy, recall_table

pytestmark = pytest.mark.integration

BOUND = "data_aware_doc"


@pytest.fixture(scope="module")
def calibrated(encoder):
    """(store, policy, test queries (300, D) rotated, their exact top-10 rows)."""
    train, test = load_collection(SCIFACT, "train"), load_collection(SCIFACT, "test")
    cache = EmbeddingCache(VAR / "cache" / "embeddings.sqlite", encoder.dimension)
    try:
        X, _ = encode_with_cache(encoder, [d.encoder_text() for d in test.corpus], cache, desc="scifact corpus")
        QT, _ = encode_with_cache(encoder, [train.queries[q] for q in sorted(train.judged_queries())], cache,
                                  desc="scifact train queries")
        QE, _ = encode_with_cache(encoder, [test.queries[q] for q in sorted(test.judged_queries())], cache,
                                  desc="scifact test queries")
    finally:
        cache.close()
    R = pca_rotation(X)
    rot = lambda A: np.ascontiguousarray(A @ R.T, np.float32)  # noqa: E731
    store = lv.LevelStore.build(rot(X))
    table = recall_table(store, rot(QT), k=10, bound=BOUND)
    booster, oof = fit_recall_policy(table)
    policy = RecallPolicy(booster, table.feature_names, table.z_grid, BOUND, oof, table.recall, table.coordinates, k=10)
    Q = rot(QE)
    exact = [lv.fused_search(store, q, 10).rows for q in Q]
    return store, policy, Q, exact


def realised(store, Q, exact, **kw) -> np.ndarray:
    """(Q,) recall@10 of each test query against its exact top-10."""
    return np.array([len(set(lv.fused_search(store, q, 10, bound=BOUND, **kw).rows.tolist()) & set(e.tolist())) / 10
                     for q, e in zip(Q, exact)])


@pytest.mark.parametrize("target", [0.95, 0.99])
def test_a_declared_recall_lands_within_0005_of_its_target(calibrated, target):
    store, policy, Q, exact = calibrated
    assert policy.margin_rule == "standard_error" and target < policy.goal(target) < target + 0.005
    z = policy.fixed_z(target)
    assert policy.z_grid[0] < z < policy.z_grid[-1] and z not in policy.z_grid  # between grid points here
    one = realised(store, Q, exact, z=z)
    per_query = realised(store, Q, exact, model=policy.confidence_model(target, store.layout.L))
    for name, r in (("one z", one), ("per-query model", per_query)):
        assert abs(r.mean() - target) <= 0.005, (name, r.mean(), r.std(ddof=1) / np.sqrt(len(r)))


def test_the_previous_rule_over_delivered_at_095(calibrated):
    """A quarter of the miss budget and z rounded up to the grid: the test queries' recall lands well above 0.95
    (and the interpolated z with the new margin does less work per query)."""
    store, policy, Q, exact = calibrated
    mean = policy.calibration_recall.mean(axis=0)
    goal = recall_policy.calibration_goal(0.95, policy.calibration_recall, "share", 0.25)
    z_old = float(policy.z_grid[np.flatnonzero(mean >= goal)[0]])
    assert realised(store, Q, exact, z=z_old).mean() > 0.955
    assert policy.fixed_z(0.95) < z_old
