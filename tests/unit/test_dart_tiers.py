"""Oracle tier, difficulty head (Eq. 2 of 000) and MaxSim, on hand-made inputs."""

import math

import numpy as np
import pytest
import torch

from adawidth.tiers import TIERS, maxsim, oracle_tier, predict_tier
from trainer.dart.difficulty import DifficultyHead, fit_posthoc, joint_loss
from trainer.dart.tier_head import fit_head


def test_oracle_tier_is_the_cheapest_best():
    quality = np.array([[0.5, 0.7, 0.7],    # maxsim ties the cross-encoder: cheaper wins
                        [0.2, 0.1, 0.9],    # only the cross-encoder is best
                        [0.6, 0.6, 0.6],    # all equal: mips
                        [0.0, 0.0, 0.0],    # nothing found anywhere: mips
                        [0.3, 0.31, 0.2]])
    assert oracle_tier(quality).tolist() == [1, 2, 0, 0, 1]
    assert oracle_tier(quality, tol=0.02).tolist() == [1, 2, 0, 0, 0]
    with pytest.raises(ValueError):
        oracle_tier(np.array([0.1, 0.2]))
    with pytest.raises(ValueError):
        oracle_tier(np.array([[np.nan, 0.2, 0.1]]))


def test_predict_tier_is_argmax_of_w_h():
    W = np.array([[1, 0], [0, 1], [-1, -1]], dtype=np.float32)
    assert int(predict_tier(W, np.array([0.9, 0.1]))) == 0
    assert predict_tier(W, np.array([[0.1, 0.9], [-0.7, -0.7]])).tolist() == [1, 2]
    with pytest.raises(ValueError):
        predict_tier(W, np.ones(3))


def test_maxsim_hand_computed():
    q = np.array([[1, 0], [0, 1]], dtype=np.float32)
    d1 = np.array([[1, 0], [0.6, 0.8]], dtype=np.float32)   # max per query token: 1, 0.8
    d2 = np.array([[0, 1]], dtype=np.float32)               # 0, 1
    s = maxsim(q, [d1, d2, np.zeros((0, 2), np.float32)])
    assert s[0] == pytest.approx(1.8) and s[1] == pytest.approx(1.0) and s[2] == -np.inf


def test_joint_loss_eq2():
    logits = torch.tensor([[2.0, 0.0, 0.0]])
    t = torch.tensor([1])
    ce = -math.log(1 / (math.exp(2) + 2))
    got = joint_loss(torch.tensor(0.5), logits, t, lam=0.1)
    assert float(got) == pytest.approx(0.5 + 0.1 * ce, rel=1e-6)
    assert len(TIERS) == DifficultyHead(4)(torch.zeros(1, 4)).shape[1]


def test_posthoc_head_learns_a_separable_rule():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16)).astype(np.float32) * 3
    y = rng.integers(0, 3, size=300)
    Q = centres[y] + rng.normal(size=(300, 16)).astype(np.float32)
    W = fit_posthoc(Q, y, epochs=200)
    assert W.shape == (3, 16)
    assert np.mean(predict_tier(W, Q) == y) > 0.95


def test_the_served_head_learns_separable_oracle_tiers_and_reports_them():
    rng = np.random.default_rng(0)
    centers = np.eye(3, 8, dtype=np.float32) * 3
    t_true = np.repeat(np.arange(3), 20)
    Q = (centers[t_true] + 0.1 * rng.normal(size=(60, 8))).astype(np.float32)
    ndcg = np.full((60, 3), 0.2)
    ndcg[np.arange(60), t_true] = 0.9            # each query's best tier is its cluster's
    W, rep = fit_head(Q, ndcg)
    assert W.shape == (3, 8)
    assert rep["oracle_counts"] == {"mips": 20, "maxsim": 20, "cross_encoder": 20}
    assert rep["in_sample_accuracy"] == 1.0 and rep["head_routed_ndcg10"] == pytest.approx(0.9)
    assert rep["tier_ndcg10"]["mips"] == pytest.approx((20 * 0.9 + 40 * 0.2) / 60)
    assert predict_tier(W, Q).tolist() == t_true.tolist()
