"""Which confidence a version serves for a declared recall (engine.recall.RecallPolicy.serving): the per-query
model where its out-of-fold choices save work over one calibrated z, else that z; forced either way on request."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest

from adawidth import levels
from engine.recall import MODEL_MIN_SAVING, RecallPolicy

Z_GRID = np.array([1.0, 2.0, 3.0])
NAMES = [f"f{i}" for i in range(3)]


def policy(coordinates, serve="measured") -> RecallPolicy:
    """Two kinds of calibration query: easy ones (recall 1 at every z, the model predicts 0.99 everywhere) and
    hard ones (recall 0.5 / 0.9 / 1.0, predicted alike); the mean recall per z is (0.75, 0.95, 1.0)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 4))
    booster = lgb.train({"objective": "regression", "verbose": -1, "num_threads": 1},
                        lgb.Dataset(X, rng.random(200), feature_name=NAMES + ["z"]), 5)
    easy, hard = np.array([1.0, 1.0, 1.0]), np.array([0.5, 0.9, 1.0])
    recall = np.array([easy, hard] * 20)
    pred = np.array([[0.99, 0.99, 0.99], [0.5, 0.9, 0.99]] * 20)
    coords = None if coordinates is None else np.tile(np.asarray(coordinates, np.float64), (40, 1))
    return RecallPolicy(booster, NAMES, Z_GRID, "data_aware_doc", pred, recall, coords, serve=serve)


def test_the_model_serves_where_it_saves_work():
    p = policy([100, 200, 400])
    assert p.fixed_z(0.9) == 2.0  # goal 0.9 + 0.025: z = 2 has mean recall 0.95
    assert p.model_saving(0.9) == pytest.approx(0.25)  # easy queries at z = 1 (100), hard at z = 2 (200)
    bound, model, z = p.serving(0.9, 7)
    assert bound == "data_aware_doc" and isinstance(model, levels.ConfidenceModel) and z is None
    assert model.bar == p.bar(0.9) and np.array_equal(model.z_grid, Z_GRID)


def test_one_calibrated_z_serves_where_the_model_saves_too_little():
    p = policy([195, 200, 400])
    assert p.model_saving(0.9) < MODEL_MIN_SAVING
    assert p.serving(0.9, 7) == ("data_aware_doc", None, 2.0)
    # per target: at 0.999 only z = 3 meets the goal for every query, and the model, sending the easy queries to
    # z = 1, saves a quarter of its work
    assert p.fixed_z(0.999) == 3.0 and p.model_saving(0.999) == pytest.approx(1 - 297.5 / 400)
    assert p.serving(0.999, 7)[1] is not None


def test_forced_choices_a_version_without_calibration_work_and_the_exact_target():
    assert policy([100, 200, 400], serve="fixed").serving(0.9, 7) == ("data_aware_doc", None, 2.0)
    assert policy([195, 200, 400], serve="model").serving(0.9, 7)[1] is not None
    old = policy(None)  # built before the calibration work was kept: the per-query model, as it was built
    assert old.model_saving(0.9) is None and old.serving(0.9, 7)[1] is not None
    assert old.serving(1.0, 7) == ("exact", None, None)
    with pytest.raises(ValueError, match="serve"):
        policy(None, serve="sometimes")


def test_a_copy_with_another_choice_decides_afresh():
    import dataclasses

    p = policy([195, 200, 400])
    assert p.serving(0.9, 7)[1] is None  # cached: one calibrated z
    assert dataclasses.replace(p, serve="model").serving(0.9, 7)[1] is not None
