"""adawidth.capacity against hand-computed values and brute-force references (000 §2, §3, §5.5; 001 §4, §5.1)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adawidth import capacity as cap
from adawidth.prefix import exact_prefix_search, prefix_normalize


def unit(rng, n, d):
    X = rng.standard_normal((n, d)).astype(np.float32)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


# ---- density, Warren's bound, regime ------------------------------------------------------------

def test_warren_bound_by_hand():
    # 000 §2: product search delta 1.43 gives d* about 50 -> ln n = 50 ln 1.43 / 1.43 = 12.50, n = 2.7e5
    assert cap.warren_lower_bound(1.43, 270_000) == math.ceil(1.43 * math.log(270_000) / math.log(1.43)) == 51
    # LIMIT-small: 2000 pairs over 46 documents
    assert cap.warren_lower_bound(2000 / 46, 46, 1000) == math.ceil(43.478 * math.log(46) / math.log(43.478)) == 45
    # vacuous: LIMIT (delta 0.04) gives d* = 1 as in 000 §2
    assert cap.warren_lower_bound(0.04, 50_000) == 1
    assert cap.warren_lower_bound(1.0, 1000) == 1
    # delta -> 1+ diverges: clamped to min(m, n)
    assert cap.warren_lower_bound(1.0001, 1000, 300) == 300
    with pytest.raises(ValueError):
        cap.warren_lower_bound(0.0, 10)


@pytest.mark.parametrize("delta,regime", [(0.04, "vacuous"), (0.1, "vacuous"), (0.18, "intermediate"),
                                          (0.99, "intermediate"), (1.0, "moderate"), (43.5, "moderate")])
def test_regimes(delta, regime):
    assert cap.density_regime(delta) == regime


def test_qrels_density_counts_only_relevant_pairs_in_corpus():
    judg = [{"a": 1, "b": 2, "zz": 1}, {"a": 0}, {"c": 1, "d": -1}]
    dens = cap.qrels_density(judg, ["a", "b", "c", "e"])
    assert (dens.pairs, dens.documents, dens.queries) == (3, 4, 2)
    assert dens.delta == 0.75 and dens.warren_dstar == 1 and dens.regime == "intermediate"
    with pytest.raises(ValueError):
        cap.qrels_density([{"x": 1}], ["a"])


# ---- search, AUC ---------------------------------------------------------------------------------

def test_prefix_topk_equals_the_reference_search():
    rng = np.random.default_rng(0)
    Q, X = unit(rng, 7, 24), unit(rng, 50, 24)
    for m in (1, 5, 24):
        rows, scores = cap.prefix_topk(Q, X, m, 10)
        assert np.array_equal(rows, exact_prefix_search(Q, X, m, 10))
        S = prefix_normalize(Q, m) @ prefix_normalize(X, m).T
        assert np.allclose(scores, np.take_along_axis(S, rows, 1))
    rows, _ = cap.prefix_topk(Q, X, 24, 500)
    assert rows.shape == (7, 50)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=2, max_size=40))
def test_roc_auc_equals_pair_counting(pairs):
    s = np.array([p[0] for p in pairs], dtype=float)
    y = np.array([p[1] for p in pairs])
    got = cap.roc_auc(s, y)
    pos, neg = s[y], s[~y]
    if pos.size == 0 or neg.size == 0:
        assert math.isnan(got)
        return
    want = np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])
    assert got == pytest.approx(want)


def test_roc_auc_extremes():
    assert cap.roc_auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([True, True, False, False])) == 1.0
    assert cap.roc_auc(np.array([0.1, 0.2, 0.9, 0.8]), np.array([True, True, False, False])) == 0.0


def test_top1_stability():
    by_width = np.array([[1, 2, 3], [1, 2, 0], [0, 2, 0]])
    assert np.allclose(cap.top1_stability(by_width, np.array([1, 2, 3])), [2 / 3, 1.0, 1 / 3])


# ---- prefix sufficiency ---------------------------------------------------------------------------

def brute_counts(Q, X, rel, widths, masks):
    out = []
    for r in range(masks.shape[0]):
        rows = []
        for q, rr in enumerate(rel):
            for d in rr:
                z = []
                for w in widths:
                    s = prefix_normalize(Q[q:q + 1], w) @ prefix_normalize(X, w).T
                    comp = [j for j in range(X.shape[0]) if masks[r, j] and j not in set(rr)]
                    z.append(sum(s[0, j] >= s[0, d] for j in comp))
                rows.append(z)
        out.append(rows)
    return np.array(out)


def test_competitor_counts_equal_brute_force_eq14():
    rng = np.random.default_rng(3)
    Q, X = unit(rng, 5, 16), unit(rng, 40, 16)
    rel = [np.array([0, 7]), np.array([], dtype=np.int64), np.array([3]), np.array([10, 11, 12]), np.array([39])]
    widths = np.array([1, 2, 4, 9, 16])
    masks, size_of = cap.positive_preserving_masks(40, [10, 40], 2, rng)
    assert masks.shape == (4, 40) and list(size_of) == [10, 10, 40, 40] and masks.sum(1).tolist() == [10, 10, 40, 40]
    Z, pq, pd = cap.competitor_counts(Q, X, rel, widths, masks)
    assert pq.tolist() == [0, 0, 2, 3, 3, 3, 4] and pd.tolist() == [0, 7, 3, 10, 11, 12, 39]
    assert np.array_equal(Z, brute_counts(Q, X, rel, widths, masks))


def test_first_sufficient_width_enters_and_stays():
    widths = np.array([8, 16, 32, 64])
    # one subsample; pairs: q0 has two positives, q1 one, q2 one that never makes it
    Z = np.array([[[0, 3, 0, 0],    # q0 d1: in top-1 at 8, out at 16, back from 32 -> 32
                   [5, 0, 0, 0],    # q0 d2: from 16 on -> 16 (min over positives: 16)
                   [2, 1, 0, 0],    # q1: top-1 from 32, top-2 from 16, top-3 from 8
                   [9, 9, 9, 4]]])  # q2: never in the top-3 at full width
    pq = np.array([0, 0, 1, 2])
    got1 = cap.first_sufficient_width(Z, pq, 3, widths, k=1)
    got3 = cap.first_sufficient_width(Z, pq, 3, widths, k=3)
    assert got1[0, :2].tolist() == [16, 32] and np.isinf(got1[0, 2])
    assert got3[0, :2].tolist() == [16, 8] and np.isinf(got3[0, 2])  # q0: d1 leaves the top-3 at 16
    assert cap.first_sufficient_width(Z, pq, 3, widths, k=5)[0].tolist() == [8, 8, 64]


def test_log_scaling_fit_recovers_an_exact_surface_and_signs():
    N = np.repeat([500, 1000, 2000, 4000], 3).astype(float)
    k = np.tile([1, 5, 20], 4).astype(float)
    y = 12.0 + 9.0 * np.log(N) - 4.0 * np.log(k)
    fit = cap.fit_log_scaling(N, k, y)
    assert fit["a"] == pytest.approx(12.0) and fit["b"] == pytest.approx(9.0) and fit["c"] == pytest.approx(-4.0)
    assert fit["r2_mean"] == pytest.approx(1.0) and fit["b_positive"] and fit["c_negative"]
    noisy = cap.fit_log_scaling(N, k, y + np.random.default_rng(0).normal(0, 8, y.size))
    assert 0 < noisy["r2_mean"] < 1
    assert math.isnan(cap.fit_log_scaling(N[:3], k[:3], y[:3])["r2_mean"])


def test_capacity_report_on_a_planted_collection():
    """Queries near their relevant document: every query solvable, CUS 1 at full width, sensible shapes."""
    rng = np.random.default_rng(1)
    D, N, Qn = 48, 400, 60
    X = unit(rng, N, D)
    X[:, :8] *= 4  # leading coordinates carry most of the signal
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    target = rng.choice(N, Qn, replace=False)
    Q = X[target] + 0.25 * unit(rng, Qn, D)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    ids = [f"d{i}" for i in range(N)]
    judg = [{ids[t]: 1} for t in target]
    opts = cap.CapacityOptions(cliff_widths=(4, 8, 16, 32), r_floor=8, scaling_ks=(1, 2, 5), min_size=20)
    rep = cap.capacity_report(Q.astype(np.float32), X.astype(np.float32), judg, ids, options=opts)
    assert rep["density"]["delta"] == pytest.approx(60 / 400) and rep["density"]["regime"] == "intermediate"
    assert rep["cus"]["r_star"] == 8
    assert rep["cliff"]["widths"] == [4, 8, 16, 32, 48]
    assert rep["cus"]["by_width"]["labelled"][-1] == 1.0 and rep["cus"]["by_width"]["label_free"][-1] == 1.0
    nd = rep["cliff"]["ndcg@10"]
    assert nd["easiest_decile"][0] >= nd["hardest_decile"][0]
    assert rep["failure_prediction"]["failures"] == int(np.sum(np.array(rep["per_query"]["failure"])))
    s = rep["scaling"]
    assert s["workload_queries"] >= 10 and len(s["points"]) >= 4
    assert all(p["q90_mean"] <= D for p in s["points"])
    # deeper retrieval never needs more width, at every corpus size
    for n in s["sizes"]:
        q = [p["q90_mean"] for p in s["points"] if p["N"] == n]
        assert q == sorted(q, reverse=True)
