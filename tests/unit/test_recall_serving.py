"""Which confidence a version serves for a declared recall (engine.recall.RecallPolicy.serving): the per-query
model where its out-of-fold choices save work over one calibrated z, else that z; forced either way on request."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adawidth import levels, recall_policy
from engine.recall import MODEL_MIN_SAVING, RecallPolicy

Z_GRID = np.array([1.0, 2.0, 3.0])
MEAN = np.array([0.75, 0.95, 1.0])  # the calibration queries' mean recall per z (policy() below)
NAMES = [f"f{i}" for i in range(3)]


def policy(coordinates, serve="measured", margin_rule="share") -> RecallPolicy:
    """Two kinds of calibration query: easy ones (recall 1 at every z, the model predicts 0.99 everywhere) and
    hard ones (recall 0.5 / 0.9 / 1.0, predicted alike); the mean recall per z is (0.75, 0.95, 1.0).  Margin rule
    ``share`` by default (goal 0.9 + 0.025 for a target of 0.9), whose goals are round numbers."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 4))
    booster = lgb.train({"objective": "regression", "verbose": -1, "num_threads": 1},
                        lgb.Dataset(X, rng.random(200), feature_name=NAMES + ["z"]), 5)
    easy, hard = np.array([1.0, 1.0, 1.0]), np.array([0.5, 0.9, 1.0])
    recall = np.array([easy, hard] * 20)
    pred = np.array([[0.99, 0.99, 0.99], [0.5, 0.9, 0.99]] * 20)
    coords = None if coordinates is None else np.tile(np.asarray(coordinates, np.float64), (40, 1))
    return RecallPolicy(booster, NAMES, Z_GRID, "data_aware_doc", pred, recall, coords, serve=serve,
                        margin_rule=margin_rule)


def test_the_model_serves_where_it_saves_work():
    p = policy([100, 200, 400])
    # goal 0.925: the mean recall curve (0.75, 0.95, 1.0) crosses it between z = 1 and 2
    z = p.fixed_z(0.9)
    assert 1.0 < z < 2.0 and z == pytest.approx(recall_policy.interpolated_confidence(Z_GRID, MEAN, 0.925))
    # its work read off the work curve (100, 200, 400) at z; the model sends easy queries to z = 1 (100), hard to 2
    assert p.model_saving(0.9) == pytest.approx(1 - 150 / (100 + (z - 1) * 100))
    bound, model, z = p.serving(0.9, 7)
    assert bound == "data_aware_doc" and isinstance(model, levels.ConfidenceModel) and z is None
    assert model.bar == p.bar(0.9) and np.array_equal(model.z_grid, Z_GRID)


def test_one_calibrated_z_serves_where_the_model_saves_too_little():
    p = policy([195, 200, 400])
    assert p.model_saving(0.9) < MODEL_MIN_SAVING
    assert p.serving(0.9, 7) == ("data_aware_doc", None, p.fixed_z(0.9))
    # per target: at 0.999 (goal 0.99925) the curve reaches the goal short of z = 3, and the model, sending the
    # easy queries to z = 1, saves about a quarter of that z's work
    z = p.fixed_z(0.999)
    assert 2.0 < z < 3.0 and p.model_saving(0.999) == pytest.approx(1 - 297.5 / (200 + (z - 2) * 200))
    assert p.serving(0.999, 7)[1] is not None


def test_forced_choices_a_version_without_calibration_work_and_the_exact_target():
    fixed = policy([100, 200, 400], serve="fixed")
    assert fixed.serving(0.9, 7) == ("data_aware_doc", None, fixed.fixed_z(0.9))
    assert policy([195, 200, 400], serve="model").serving(0.9, 7)[1] is not None
    old = policy(None)  # built before the calibration work was kept: the per-query model, as it was built
    assert old.model_saving(0.9) is None and old.serving(0.9, 7)[1] is not None
    assert old.serving(1.0, 7) == ("exact", None, None)
    with pytest.raises(ValueError, match="serve"):
        policy(None, serve="sometimes")
    with pytest.raises(ValueError, match="margin_rule"):
        policy(None, margin_rule="generous")


def test_the_standard_error_margin_is_the_calibration_means_sampling_error():
    p = policy([100, 200, 400], margin_rule="standard_error")
    # the first z whose mean meets 0.9 is z = 2, where the 40 queries' recalls are 1.0 and 0.9 alternately
    se = np.std([1.0, 0.9] * 20, ddof=1) / np.sqrt(40)
    assert p.goal(0.9) == pytest.approx(0.9 + se) and p.goal(0.9) < policy(None).goal(0.9) == pytest.approx(0.925)
    assert p.fixed_z(0.9) == pytest.approx(recall_policy.interpolated_confidence(Z_GRID, MEAN, 0.9 + se))
    assert p.fixed_z(0.9) < policy(None).fixed_z(0.9)
    assert p.goal(1.0) == 1.0  # never above 1


def test_a_copy_with_another_choice_decides_afresh():
    import dataclasses

    p = policy([195, 200, 400])
    assert p.serving(0.9, 7)[1] is None  # cached: one calibrated z
    assert dataclasses.replace(p, serve="model").serving(0.9, 7)[1] is not None


def test_interpolated_confidence_reads_the_curve_between_grid_points():
    z, m = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5, 0.8, 0.95, 0.99])
    zi = recall_policy.interpolated_confidence(z, m, 0.9)
    # between the bracketing points, and on the concave side of the chord (which crosses 0.9 at 2 + 0.1 / 0.15)
    assert 2.0 < zi < 2 + 0.1 / 0.15
    from scipy.interpolate import PchipInterpolator

    assert PchipInterpolator(z, m)(zi) == pytest.approx(0.9, abs=1e-9)  # on the curve, at the goal
    assert recall_policy.interpolated_confidence(z, m, 0.95) == 3.0  # on a grid point
    assert recall_policy.interpolated_confidence(z, m, 0.4) == 1.0  # below the first point: the first z
    assert recall_policy.interpolated_confidence(z, m, 0.995) is None  # the grid never reaches it
    flat = np.array([0.5, 0.9, 0.9, 0.99])  # a flat step: the first point that meets the goal
    assert recall_policy.interpolated_confidence(z, flat, 0.9) == 2.0
    dip = np.array([0.5, 0.9, 0.88, 0.99])  # a dip (noise) is read as flat, never as falling
    assert recall_policy.interpolated_confidence(z, dip, 0.9) == 2.0
    assert 3.0 < recall_policy.interpolated_confidence(z, dip, 0.95) < 4.0


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.2, 3.0), goal=st.floats(0.05, 0.999), other=st.floats(0.05, 0.999))
def test_on_a_smooth_curve_the_interpolated_confidence_lands_near_its_goal(rate, goal, other):
    """On a smooth saturating curve (recall rising ever more slowly towards 1) the z read off the grid lands the
    curve itself within 0.01 of the goal, closer than the chord's z does, and a higher goal never gets a smaller z."""
    z = np.asarray(recall_policy.DEFAULT_Z_GRID)
    curve = lambda x: 1.0 - np.exp(-rate * x)  # noqa: E731
    zi = recall_policy.interpolated_confidence(z, curve(z), goal)
    if zi is None:
        assert curve(z[-1]) < goal
        return
    assert z[0] <= zi <= z[-1] and abs(curve(zi) - goal) <= 0.01 or (zi == z[0] and curve(z[0]) >= goal)
    j = int(np.argmax(curve(z) >= goal))
    if j > 0:
        chord = z[j - 1] + (goal - curve(z[j - 1])) / (curve(z[j]) - curve(z[j - 1])) * (z[j] - z[j - 1])
        assert abs(curve(zi) - goal) <= abs(curve(chord) - goal) + 1e-12
    zo = recall_policy.interpolated_confidence(z, curve(z), other)
    if zo is not None and other > goal:
        assert zo >= zi


def test_calibration_goal_rules_and_errors():
    realised = np.array([[0.5, 0.9, 1.0], [0.7, 1.0, 1.0], [0.6, 0.8, 1.0], [0.8, 1.0, 1.0]])
    se = np.std([0.9, 1.0, 0.8, 1.0], ddof=1) / 2  # the first column whose mean (0.925) meets 0.9
    assert recall_policy.calibration_goal(0.9, realised) == pytest.approx(0.9 + se)
    assert recall_policy.calibration_goal(0.9, realised, "share", 0.5) == pytest.approx(0.95)
    # a target no column meets (means 0.65, 0.925): the safest column's error; never above 1
    assert recall_policy.calibration_goal(0.93, realised[:, :2]) == pytest.approx(0.93 + se)
    assert recall_policy.calibration_goal(0.999, realised[:, :2]) == 1.0
    for bad, match in (({"rule": "loose"}, "margin rule"), ({"target": 0.0}, "target"),
                       ({"realised": np.zeros((0, 3))}, "calibration queries")):
        kw = {"target": 0.9, "realised": realised, **bad}
        with pytest.raises(ValueError, match=match):
            recall_policy.calibration_goal(**kw)


def test_a_policy_serves_the_calibration_of_its_kernel_threads():
    base = policy([100, 200, 400])
    # on two threads the hard queries realise 0.7 / 0.95 / 1.0: the mean curve (0.85, 0.975, 1.0) reaches the goal
    # 0.925 sooner, so the one z and the bar move; the model and its predictions stay
    two = np.array([[1.0, 1.0, 1.0], [0.7, 0.95, 1.0]] * 20)
    work = np.tile([110.0, 210.0, 420.0], (40, 1))
    p = RecallPolicy(base.booster, NAMES, Z_GRID, "data_aware_doc", base.calibration_pred, base.calibration_recall,
                     base.calibration_coordinates, margin_rule="share", calibration_by_threads={2: (two, work)})
    assert p.at_threads(1) is p and p.at_threads(0) is p and p.calibration_threads == 1
    at2 = p.at_threads(2)
    assert at2 is p.at_threads(2) is p.at_threads(16)  # cached; more threads than calibrated: the largest below
    assert at2.calibration_threads == 2 and at2.calibration_recall is two and at2.calibration_coordinates is work
    assert at2.fixed_z(0.9) == pytest.approx(recall_policy.interpolated_confidence(Z_GRID, two.mean(axis=0), 0.925))
    assert at2.fixed_z(0.9) < p.fixed_z(0.9)
    assert at2.calibration_pred is p.calibration_pred and at2.forest.reads(0) == p.forest.reads(0)
    # a policy without a calibration above one thread serves its own at any thread count
    assert base.at_threads(4) is base
    with pytest.raises(ValueError, match="calibration_by_threads"):
        RecallPolicy(base.booster, NAMES, Z_GRID, "data_aware_doc", base.calibration_pred, base.calibration_recall,
                     calibration_by_threads={2: (two[:3], None)})
    with pytest.raises(ValueError, match="calibration_by_threads"):
        RecallPolicy(base.booster, NAMES, Z_GRID, "data_aware_doc", base.calibration_pred, base.calibration_recall,
                     calibration_by_threads={1: (two, None)})
