"""Hypothesis properties of the pure library: metric bounds and ideal rankings, router features under
permutation, adapter orthogonality for random parameters at larger widths.

(Adapter orthogonality on small shapes and router features on arbitrary score
vectors are in test_wy.py and test_router.py.)
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adawidth import wy
from adawidth.metrics import ndcg_at_k, per_query, recall_at_k
from adawidth.rotation import orthogonality_error
from adawidth.router import router_features

DOCS = [f"d{i}" for i in range(40)]

judgments = st.dictionaries(st.sampled_from(DOCS), st.integers(-1, 4), max_size=25)
rankings = st.lists(st.sampled_from(DOCS), unique=True, max_size=40)
cutoffs = st.integers(1, 50)


@settings(max_examples=300, deadline=None)
@given(rankings, judgments, cutoffs)
def test_ndcg_and_recall_are_in_unit_interval(ranked, judg, k):
    for value in (ndcg_at_k(ranked, judg, k), recall_at_k(ranked, judg, k)):
        assert 0.0 <= value <= 1.0 + 1e-12


@settings(max_examples=300, deadline=None)
@given(judgments, cutoffs, st.randoms(use_true_random=False))
def test_ideal_ranking_scores_one(judg, k, rnd):
    relevant = [d for d, g in judg.items() if g > 0]
    if not relevant:
        assert ndcg_at_k(DOCS, judg, k) == 0.0 and recall_at_k(DOCS, judg, k) == 0.0
        return
    ideal = sorted(relevant, key=lambda d: -judg[d])
    rest = [d for d in DOCS if d not in relevant]
    rnd.shuffle(rest)
    assert ndcg_at_k(ideal + rest, judg, k) == pytest.approx(1.0, abs=1e-12)
    if k >= len(relevant):
        assert recall_at_k(ideal + rest, judg, k) == 1.0
    # any ranking scores at most the ideal one
    other = ideal + rest
    rnd.shuffle(other)
    assert ndcg_at_k(other, judg, k) <= ndcg_at_k(ideal + rest, judg, k) + 1e-12


@settings(max_examples=200, deadline=None)
@given(rankings, judgments, st.integers(1, 49))
def test_recall_is_monotone_in_k(ranked, judg, k):
    assert recall_at_k(ranked, judg, k) <= recall_at_k(ranked, judg, k + 1)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), rankings, max_size=3),
       st.dictionaries(st.sampled_from(["q1", "q2", "q3", "q4"]), judgments, max_size=4))
def test_per_query_values_are_bounded_and_cover_judged_queries(run, qrels):
    for metric in ("ndcg", "recall"):
        out = per_query(run, qrels, metric, 10)
        assert set(out) == {q for q, j in qrels.items() if any(g > 0 for g in j.values())}
        assert all(0.0 <= v <= 1.0 + 1e-12 for v in out.values())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=600), st.randoms(use_true_random=False))
def test_router_features_do_not_depend_on_score_order(scores, rnd):
    shuffled = list(scores)
    rnd.shuffle(shuffled)
    assert np.allclose(router_features(np.array(scores)), router_features(np.array(shuffled)), rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.integers(0, 2 ** 32 - 1))
def test_adapter_is_orthogonal_at_serving_width(n_reflectors, seed):
    """Random Householder parameters at D = 384 give an orthogonal R whose rows keep norms (Eq. of 001)."""
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_reflectors, 384)) * rng.uniform(0.01, 100.0)
    V, T = wy.wy_factors(U)
    R = wy.materialize(V, T)
    assert orthogonality_error(R) < 1e-9
    X = rng.standard_normal((8, 384))
    assert np.allclose(np.linalg.norm(wy.wy_apply(X, V, T), axis=1), np.linalg.norm(X, axis=1), rtol=1e-9)
