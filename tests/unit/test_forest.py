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
