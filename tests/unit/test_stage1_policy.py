"""The per-query funnel policy's pure parts: work accounting, evidence, choice rules."""

import numpy as np
import pytest

from adawidth import stage1_policy as sp
from adawidth.blocked import BlockedCorpus
from adawidth.funnel import exact_stage1, resolve
from adawidth.prefix import prefix_normalize
from adawidth.router import router_features


def _data(seed=0, n=700, d=64):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32) * np.linspace(2, 0.2, d, dtype=np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    q = X[3] + 0.3 * rng.standard_normal(d).astype(np.float32)
    return X, (q / np.linalg.norm(q)).astype(np.float32)


def test_config_work_counts_stage1_and_rescoring_and_caps_the_shortlist():
    c = sp.Config(32, 500, 256)
    assert c.work(10_000) == 10_000 * 32 + 500 * (256 - 32)
    assert c.work(100) == 100 * 32 + 100 * (256 - 32)  # the shortlist cannot exceed the corpus
    grid = sp.default_grid()
    assert len(grid) == 48 and len(set(grid)) == 48


def test_evidence_matches_the_router_features_of_an_exact_16_coordinate_stage1():
    X, q = _data()
    bc = BlockedCorpus(X, sp.BLOCK)
    feats, state = sp.evidence(bc, q)
    assert feats.shape == (len(sp.EVIDENCE_NAMES),) and np.all(np.isfinite(feats))
    assert state.width == sp.BLOCK and state.work == X.shape[0] * sp.BLOCK
    _, cos = exact_stage1(q, prefix_normalize(X, 16), 16, sp.EVIDENCE_SHORTLIST)
    assert np.allclose(feats[:18], router_features(cos), atol=1e-4)
    assert feats[18] == pytest.approx(float(q[:16] @ q[:16]), rel=1e-5)
    assert 0.0 <= feats[21] <= 1.0


def test_extending_the_evidence_scan_gives_the_static_funnel_ranking():
    """The adaptive path (scan 16, extend to m1, shortlist C, rescore r) ranks like the static funnel."""
    X, q = _data(1)
    bc = BlockedCorpus(X, sp.BLOCK)
    _, state = sp.evidence(bc, q)
    m1, C, r = 48, 200, 64
    state = bc.extend(state, q, m1)
    rows, _ = bc.shortlist(state, C)
    blocked = bc.partial_scores(state, rows).extend(q, bc.matrix, r)
    top_blocked = rows[np.argsort(-blocked.cosine(), kind="stable")][:10]
    srows, ssc = exact_stage1(q, prefix_normalize(X, m1), m1, C)
    static = resolve(q, X, np.einsum("ij,ij->i", X[:, :m1], X[:, :m1]), srows, ssc, m0=m1, k=10, width=r)
    assert top_blocked.tolist() == static.rows.tolist()


def test_design_rows_are_query_major():
    grid = sp.default_grid()[:3]
    f = np.arange(2 * len(sp.EVIDENCE_NAMES), dtype=float).reshape(2, -1)
    d = sp.design(f, grid, 1000, 1000 * 384.0)
    assert d.shape == (6, len(sp.EVIDENCE_NAMES) + len(sp.CONFIG_NAMES))
    assert np.array_equal(d[4, : f.shape[1]], f[1]) and d[4, f.shape[1]] == grid[1].m1


def test_choose_threshold_takes_the_cheapest_configuration_that_clears_tau():
    work = np.array([30.0, 10.0, 20.0])
    pred = np.array([[0.99, 0.5, 0.95],   # 10 fails, 20 clears
                     [0.2, 0.1, 0.3]])    # none clears: highest prediction
    assert sp.choose_threshold(pred, work, 0.9).tolist() == [2, 2]
    assert sp.choose_threshold(pred, work, 0.0).tolist() == [1, 1]


def test_choose_tradeoff_penalises_work():
    work = np.array([10.0, 100.0])
    pred = np.array([[0.5, 0.6]])
    assert sp.choose_tradeoff(pred, work, 100.0, 0.0).tolist() == [1]
    assert sp.choose_tradeoff(pred, work, 100.0, 1.0).tolist() == [0]


def test_top10_agreement():
    ref = np.arange(10)[None, :]
    rk = np.stack([np.arange(10), np.arange(5, 15)])[None, :, :]
    assert sp.top10_agreement(rk, ref).tolist() == [[1.0, 0.5]]
