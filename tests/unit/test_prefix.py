import numpy as np
import pytest

from adawidth.funnel import exact_stage1, exact_stage1_batch, resolve
from adawidth.prefix import PartialScores, exact_prefix_search, partial_scores_from_cosines, prefix_normalize, top_k
from tests.hybrid_support import unit_data


def _data(seed=0, n=200, d=32):
    return unit_data(seed, n, d)


def test_extend_reuses_partial_sums_and_equals_direct_cosine():
    X, q = _data()
    cand = np.arange(50)
    m0 = 8
    cos0 = prefix_normalize(X[cand], m0) @ prefix_normalize(q[None], m0)[0]
    p0 = partial_scores_from_cosines(cand, cos0, q, np.einsum("ij,ij->i", X[:, :m0], X[:, :m0]), m0)
    assert np.allclose(p0.cosine(), cos0, atol=1e-6)
    for m in (8, 9, 16, 32):
        direct = prefix_normalize(X[cand], m) @ prefix_normalize(q[None], m)[0]
        assert np.allclose(p0.extend(q, X, m).cosine(), direct, atol=1e-5)
    p16 = p0.extend(q, X, 16)
    assert np.allclose(p16.extend(q, X, 32).cosine(), p0.extend(q, X, 32).cosine(), atol=1e-12)
    with pytest.raises(ValueError):
        p16.extend(q, X, 8)
    with pytest.raises(ValueError):
        p16.extend(q, X, 33)


def test_top_k_order_and_ties():
    s = np.array([0.1, 0.5, 0.5, 0.9, -1.0])
    assert top_k(s, 3).tolist() == [3, 1, 2]
    assert top_k(s, 10).tolist() == [3, 1, 2, 0, 4]
    assert top_k(s, 0).size == 0


def test_exact_stage1_batch_matches_single():
    X, _ = _data(1)
    rng = np.random.default_rng(2)
    Q = rng.standard_normal((7, 32)).astype(np.float32)
    Xp = prefix_normalize(X, 8)
    rows, sc = exact_stage1_batch(Q, Xp, 8, 20)
    for i in range(7):
        r, s = exact_stage1(Q[i], Xp, 8, 20)
        assert rows[i].tolist() == r.tolist()
        assert np.allclose(sc[i], s)


def test_resolve_at_full_width_over_all_docs_equals_exact_search():
    X, q = _data(3)
    D = X.shape[1]
    m0 = 8
    Xp = prefix_normalize(X, m0)
    rows, sc = exact_stage1(q, Xp, m0, X.shape[0])  # shortlist = whole corpus
    res = resolve(q, X, np.einsum("ij,ij->i", X[:, :m0], X[:, :m0]), rows, sc, m0=m0, k=10, width=D)
    assert res.rows.tolist() == exact_prefix_search(q[None], X, D, 10)[0].tolist()
    assert res.coordinates_scored == X.shape[0] * m0 + X.shape[0] * (D - m0)
    assert (res.stage1_work, res.rescoring_work) == (X.shape[0] * m0, X.shape[0] * (D - m0))
    narrow = resolve(q, X, np.einsum("ij,ij->i", X[:, :m0], X[:, :m0]), rows, sc, m0=m0, k=10, width=4)
    assert narrow.rows.tolist() == exact_prefix_search(q[None], X, 4, 10)[0].tolist()


def test_resolve_auto_escalates_by_threshold():
    X, q = _data(4)
    m0 = 8
    sq = np.einsum("ij,ij->i", X[:, :m0], X[:, :m0])
    rows, sc = exact_stage1(q, prefix_normalize(X, m0), m0, 100)
    hi = resolve(q, X, sq, rows, sc, m0=m0, k=5, width=None, action_pair=(8, 16), predict_gain=lambda f: 0.3,
                 threshold=0.1)
    lo = resolve(q, X, sq, rows, sc, m0=m0, k=5, width=None, action_pair=(8, 16), predict_gain=lambda f: 0.0,
                 threshold=0.1)
    assert (hi.width, hi.escalated, hi.router_score) == (16, True, 0.3)
    assert (lo.width, lo.escalated) == (8, False)
    with pytest.raises(ValueError):
        resolve(q, X, sq, rows, sc, m0=m0, k=5, width=None)
    with pytest.raises(ValueError):
        resolve(q, X, sq, rows, sc, m0=m0, k=5, width=33)


def test_partial_scores_is_not_mutated():
    X, q = _data(5)
    p = PartialScores(np.arange(3), np.zeros(3), np.zeros(3), 0.0, 0)
    p.extend(q, X, 4)
    assert p.width == 0 and np.all(p.dot == 0)


def test_top_k_breaks_ties_by_position_also_at_the_cutoff():
    """One top-k for vectors and matrices: best first, equal scores in position order, and among equal scores
    competing for the last places the lowest positions are kept (argpartition alone keeps arbitrary ones)."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        C, Q, k = int(rng.integers(1, 40)), int(rng.integers(1, 6)), int(rng.integers(0, 45))
        S = rng.integers(0, 3, size=(Q, C)).astype(np.float32)  # many ties
        want = np.array([sorted(range(C), key=lambda j: (-S[i, j], j))[:min(k, C)] for i in range(Q)],
                        dtype=np.int64).reshape(Q, min(k, C))
        got = top_k(S, k)
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert all(np.array_equal(top_k(S[i], k), want[i]) for i in range(Q))
    assert top_k(np.ones(5), 2).tolist() == [0, 1] and top_k(np.ones((2, 5)), 0).shape == (2, 0)
    with pytest.raises(ValueError):
        top_k(np.ones((2, 2, 2)), 1)
    # the short rows' stable sort and the long rows' partition agree on either side of the switch, -0.0 included
    from adawidth.prefix import SMALL_ROW
    for C in (SMALL_ROW - 1, SMALL_ROW, SMALL_ROW + 1, 4 * SMALL_ROW):
        for k in (1, 10, C):
            s = rng.integers(-2, 3, size=C).astype(np.float32) * rng.choice([1.0, -0.0], size=C).astype(np.float32)
            want = np.array(sorted(range(C), key=lambda j: (-s[j], j))[:k], dtype=np.int64)
            assert np.array_equal(top_k(s, k), want)
