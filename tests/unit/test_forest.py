"""The flattened forest predicts what LightGBM predicts (adawidth.forest)."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest

from adawidth.forest import Forest


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_lightgbm_with_missing_values_and_zeros(seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((600, 6))
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.1] = 0.0
    y = np.nan_to_num(X[:, 0]) * 2 + np.nan_to_num(X[:, 3]) ** 2 + np.isnan(X[:, 1])
    params = {"objective": "regression", "verbose": -1, "num_leaves": 15, "min_data_in_leaf": 5,
              "zero_as_missing": seed == 2, "deterministic": True, "num_threads": 1}
    booster = lgb.train(params, lgb.Dataset(X, y), 60)
    forest = Forest.from_dump(booster.dump_model())
    T = rng.standard_normal((200, 6))
    T[rng.random(T.shape) < 0.15] = np.nan
    T[rng.random(T.shape) < 0.1] = 0.0
    np.testing.assert_allclose(forest.predict(T), booster.predict(T), rtol=0, atol=1e-12)
    assert forest.predict(T[0]).shape == (1,)


def test_single_leaf_trees_and_bad_input():
    X = np.zeros((50, 3))
    booster = lgb.train({"objective": "regression", "verbose": -1}, lgb.Dataset(X, np.ones(50)), 3)
    forest = Forest.from_dump(booster.dump_model())
    np.testing.assert_allclose(forest.predict(np.ones((4, 3))), booster.predict(np.ones((4, 3))), atol=1e-12)
    with pytest.raises(ValueError):
        forest.predict(np.ones((2, 4)))
    with pytest.raises(ValueError):
        Forest.from_dump({"num_class": 3, "tree_info": []})
    with pytest.raises(ValueError):
        Forest.from_dump({"objective": "binary sigmoid:1", "tree_info": []})


def test_first_at_least_is_the_first_row_whose_prediction_clears_the_bar():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((400, 4))
    booster = lgb.train({"objective": "regression", "verbose": -1, "num_leaves": 7, "deterministic": True,
                         "num_threads": 1}, lgb.Dataset(X, X[:, 0] + 0.5 * X[:, 2]), 40)
    forest = Forest.from_dump(booster.dump_model())
    rows = np.sort(rng.standard_normal((12, 4)), axis=0)  # predictions rise down the rows
    pred = forest.predict(rows)
    for bar in (-10.0, *np.quantile(pred, [0.1, 0.5, 0.9]).tolist(), 10.0):
        want = next((i for i, p in enumerate(pred) if p >= bar), -1)
        assert forest.first_at_least(rows, bar) == want
    with pytest.raises(ValueError):
        forest.first_at_least(np.ones((2, 5)), 0.0)


def test_a_model_fitted_monotone_in_z_is_searched_by_bisection_and_finds_the_same_row():
    """LightGBM's +1 monotone constraint on the last column (the recall policy's z): along a grid of z with the
    other columns fixed the prediction never falls, so the bisection (monotone=True) finds the row the scan finds."""
    rng = np.random.default_rng(11)
    X = rng.standard_normal((2000, 4))
    X[:, 3] = rng.uniform(1, 10, 2000)  # the "z" column
    y = 1 / (1 + np.exp(-(X[:, 3] - 5 + X[:, 0] - 0.5 * X[:, 1]))) + 0.05 * rng.standard_normal(2000)
    base = {"objective": "regression", "verbose": -1, "num_leaves": 15, "deterministic": True, "num_threads": 1}
    free = Forest.from_dump(lgb.train(base, lgb.Dataset(X, y), 60).dump_model())
    forest = Forest.from_dump(lgb.train(dict(base, monotone_constraints=[0, 0, 0, 1]), lgb.Dataset(X, y),
                                        60).dump_model())
    assert free.monotone == () and not free.increasing_in(3)
    assert forest.monotone == (0, 0, 0, 1) and forest.increasing_in(3) and not forest.increasing_in(0)
    z = np.linspace(1, 10, 17)
    for q in rng.standard_normal((100, 3)):
        rows = np.column_stack([np.tile(q, (len(z), 1)), z])
        pred = forest.predict(rows)
        assert np.all(np.diff(pred) >= 0)
        for bar in (-1.0, *np.quantile(pred, [0.0, 0.3, 0.7, 1.0]).tolist(), pred[-1] + 1e-9, 2.0):
            want = next((i for i, p in enumerate(pred) if p >= bar), -1)
            assert forest.first_at_least(rows, bar, monotone=True) == forest.first_at_least(rows, bar) == want
