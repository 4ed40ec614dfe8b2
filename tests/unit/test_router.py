import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adawidth.router import FEATURE_NAMES, mean_width, router_feature_matrix, router_features, threshold_for_rate


def test_eighteen_features_hand_computed():
    s = np.linspace(1.0, 0.0, 500)  # sigma_i = 1 - (i-1)/499
    f = dict(zip(FEATURE_NAMES, router_features(s[::-1].copy(), theta=0.05)))  # order must not matter
    step = 1 / 499
    sig = lambda i: 1 - (i - 1) * step  # noqa: E731
    assert len(FEATURE_NAMES) == 18
    assert f["s1"] == pytest.approx(1.0) and f["s11"] == pytest.approx(sig(11))
    assert f["gap_1_10"] == pytest.approx(9 * step) and f["gap_10_15"] == pytest.approx(5 * step)
    p = np.array([sig(i) for i in range(1, 51)])
    eta = np.exp(p / 0.05) / np.exp(p / 0.05).sum()
    H = -(eta * np.log(eta)).sum()
    assert f["entropy_top50"] == pytest.approx(H) and f["exp_entropy_top50"] == pytest.approx(math.exp(H))
    assert f["zscore_s1_top50"] == pytest.approx((1 - p.mean()) / p.std())
    top100 = np.array([sig(i) for i in range(1, 101)])
    assert f["cv_top100"] == pytest.approx(top100.std() / abs(top100.mean()))
    assert f["mean_top10"] == pytest.approx(np.mean([sig(i) for i in range(1, 11)]))


def test_short_and_constant_vectors_give_finite_features():
    for s in (np.array([0.3]), np.full(46, 0.7), np.zeros(500)):
        f = router_features(s)
        assert f.shape == (18,) and np.all(np.isfinite(f))
    with pytest.raises(ValueError):
        router_features(np.array([]))
    with pytest.raises(ValueError):
        router_features(np.array([0.1, np.nan]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=600))
def test_features_finite_on_arbitrary_score_vectors(scores):
    f = router_features(np.array(scores))
    assert f.shape == (18,) and np.all(np.isfinite(f))


def test_threshold_escalates_the_target_fraction():
    rng = np.random.default_rng(0)
    cal = rng.standard_normal(1000)
    for rho in (0.1, 0.2, 0.3, 0.55):
        assert np.mean(cal >= threshold_for_rate(cal, rho)) == pytest.approx(rho, abs=1e-3)
    assert threshold_for_rate(cal, 0.0) == math.inf and threshold_for_rate(cal, 1.0) == -math.inf
    with pytest.raises(ValueError):
        threshold_for_rate(cal, 1.5)


def test_mean_width_eq11():
    assert mean_width(np.array([True, False, False, False]), 64, 128) == 64 * 0.75 + 128 * 0.25
    assert router_feature_matrix([]).shape == (0, 18)
