"""DART losses (trainer/dart/losses.py) against values computed by hand on tiny tensors."""

import math

import pytest
import torch

from trainer.dart.losses import (at_dw_info_nce, cosine_temperature, denominator_mask, focal_info_nce, info_nce,
                                 normalized_density, relevant_counts)

S = torch.tensor([[0.5, 0.1], [0.2, 0.4]], dtype=torch.float64)
POS = torch.tensor([0, 1])


def test_info_nce_hand_computed():
    # row 0: -log(e^5 / (e^5 + e^1)) = log(1 + e^-4); row 1: log(1 + e^-2)
    expected = (math.log1p(math.exp(-4)) + math.log1p(math.exp(-2))) / 2
    assert float(info_nce(S, POS, tau=0.1)) == pytest.approx(expected, rel=1e-12)


def test_at_dw_info_nce_hand_computed():
    rho = torch.tensor([1.0, 0.0], dtype=torch.float64)
    # query 0: w = 1 + 2*1 = 3, tau = 0.1/3 -> logits 15, 3; query 1: w = 1, tau = 0.1 -> logits 2, 4
    expected = (3 * math.log1p(math.exp(-12)) + 1 * math.log1p(math.exp(-2))) / 2
    got = at_dw_info_nce(S, POS, None, rho, alpha=2.0, tau0=0.1)
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_at_dw_reduces_to_info_nce_at_alpha_zero():
    g = torch.Generator().manual_seed(0)
    s = torch.rand((6, 9), generator=g, dtype=torch.float64) * 2 - 1
    pos = torch.tensor([0, 3, 1, 8, 2, 5])
    rho = torch.rand(6, generator=g, dtype=torch.float64)
    valid = torch.rand((6, 9), generator=g) > 0.3
    valid[torch.arange(6), pos] = True
    a = at_dw_info_nce(s, pos, valid, rho, alpha=0.0, tau0=0.07)
    b = info_nce(s, pos, valid, tau=0.07)
    assert float(a) == pytest.approx(float(b), rel=1e-12)
    # and with alpha > 0 the density-weighted loss differs
    assert float(at_dw_info_nce(s, pos, valid, rho, alpha=2.0, tau0=0.07)) != pytest.approx(float(b), rel=1e-3)


def test_focal_hand_computed_and_gamma_zero():
    p0 = 1 / (1 + math.exp(-4))
    p1 = 1 / (1 + math.exp(-2))
    expected = ((1 - p0) ** 2 * -math.log(p0) + (1 - p1) ** 2 * -math.log(p1)) / 2
    assert float(focal_info_nce(S, POS, tau=0.1, gamma=2.0)) == pytest.approx(expected, rel=1e-10)
    assert float(focal_info_nce(S, POS, tau=0.1, gamma=0.0)) == pytest.approx(float(info_nce(S, POS, tau=0.1)))


def test_cosine_temperature_schedule():
    assert cosine_temperature(0, 100) == pytest.approx(0.10)
    assert cosine_temperature(50, 100) == pytest.approx(0.06)
    assert cosine_temperature(100, 100) == pytest.approx(0.02)
    assert cosine_temperature(250, 100) == pytest.approx(0.02)
    # 0.02 + 0.08 * (1 + cos(pi/4)) / 2
    assert cosine_temperature(25, 100) == pytest.approx(0.02 + 0.04 * (1 + math.sqrt(0.5)))
    with pytest.raises(ValueError):
        cosine_temperature(1, 0)


def test_false_negative_masking():
    # pool: a (q0's chosen), b (q1's chosen), a again (duplicate), c (q0 also cites c)
    pool = ["a", "b", "a", "c"]
    valid = denominator_mask([{"a", "c"}, {"b"}], [0, 1], pool)
    assert valid.tolist() == [[True, True, False, False],
                              [True, True, False, True]]
    s = torch.tensor([[0.6, 0.2, 0.6, 0.9], [0.3, 0.5, 0.3, 0.1]], dtype=torch.float64)
    pos = torch.tensor([0, 1])
    got = info_nce(s, pos, valid, tau=0.1)
    # q0: softmax over {a: 6, b: 2}; q1: over {a: 3, b: 5, c: 1}
    l0 = -math.log(math.exp(6) / (math.exp(6) + math.exp(2)))
    l1 = -math.log(math.exp(5) / (math.exp(3) + math.exp(5) + math.exp(1)))
    assert float(got) == pytest.approx((l0 + l1) / 2, rel=1e-12)
    # unmasked, c (a true positive of q0 scored 0.9) would dominate q0's loss as a false negative
    assert float(info_nce(s, pos, None, tau=0.1)) > float(got) + 1.0


def test_mask_rejects_bad_input():
    with pytest.raises(ValueError):
        denominator_mask([{"a"}], [1], ["a", "b"])  # chosen passage is not a positive
    with pytest.raises(ValueError):
        denominator_mask([{"a"}], [5], ["a", "b"])
    with pytest.raises(ValueError):
        info_nce(S, POS, torch.tensor([[False, True], [True, True]]), tau=0.1)  # positive masked out
    with pytest.raises(ValueError):
        info_nce(S, POS, tau=0.0)


def test_normalized_density():
    counts = relevant_counts({"q1": {"d1": 1, "d2": 1, "d3": 0}, "q2": {"d4": 2}, "q3": {"d1": 1, "d5": 1, "d6": 1,
                                                                                        "d7": 1}})
    assert counts == {"q1": 2, "q2": 1, "q3": 4}
    assert normalized_density([2, 1, 4]).tolist() == [0.5, 0.25, 1.0]
    assert normalized_density([2, 1], k_max=4).tolist() == [0.5, 0.25]
    with pytest.raises(ValueError):
        normalized_density([0, 0])


def test_losses_have_gradients():
    s = S.clone().requires_grad_(True)
    at_dw_info_nce(s, POS, None, torch.tensor([0.5, 1.0], dtype=torch.float64)).backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
