"""Shared vs Dual (002): degrees of freedom, SURE in the local Gaussian model, the CARS statistic, serving maps,
and the torch fit recovering an asymmetric operator."""

from __future__ import annotations

import numpy as np
import pytest

from adawidth import cars
from trainer.cars import CarsConfig, fit_operator, make_triples, select_by_cars


def test_dual_only_dof_counts_tangent_dimensions():
    p, r = 6, 2
    assert cars.dual_only_dof(p, r) == r * (2 * p - r - 1) // 2 == 9
    # numerically: rank of the Dual-only projector at a random symmetric rank-r point
    U = np.linalg.qr(np.random.default_rng(0).standard_normal((p, r)))[0]
    basis = []
    for i in range(p):
        for j in range(p):
            E = np.zeros((p, p))
            E[i, j] = 1
            basis.append(cars.tangent_projection(cars.skew(E), U).ravel())
    assert np.linalg.matrix_rank(np.array(basis), tol=1e-9) == 9
    with pytest.raises(ValueError):
        cars.dual_only_dof(3, 4)


def _local_model(p, r, rng):
    U = np.linalg.qr(rng.standard_normal((p, r)))[0]
    S0 = U @ np.diag(rng.uniform(1, 2, r)) @ U.T
    return U, S0


def test_dual_only_energy_under_noise_has_mean_vk():
    rng = np.random.default_rng(1)
    p, r, v = 10, 3, 0.04
    U, S0 = _local_model(p, r, rng)
    k = cars.dual_only_dof(p, r)
    e = [cars.dual_only_energy(S0 + np.sqrt(v) * rng.standard_normal((p, p)), S0, U) for _ in range(4000)]
    assert np.mean(e) == pytest.approx(v * k, rel=0.03)


def test_sure_null_rate_below_bound_and_picks_dual_with_signal():
    rng = np.random.default_rng(2)
    p, r, v = 8, 2, 0.01
    U, S0 = _local_model(p, r, rng)
    k = cars.dual_only_dof(p, r)
    picks = [cars.sure_select(cars.dual_only_energy(S0 + np.sqrt(v) * rng.standard_normal((p, p)), S0, U), v, k).choice
             for _ in range(3000)]
    rate = np.mean([c == "dual" for c in picks])
    assert rate <= cars.null_dual_probability_bound(k)
    # a skew departure inside the tangent space with energy well above 2 v k: Dual
    W = np.zeros((p, p))
    W[:, :r] = rng.standard_normal((p, r))
    delta = cars.tangent_projection(cars.skew(U @ W[:, :r].T), U)
    delta *= np.sqrt(6 * v * k) / np.linalg.norm(delta)
    d = cars.sure_select(cars.dual_only_energy(S0 + delta + np.sqrt(v) * rng.standard_normal((p, p)), S0, U), v, k)
    assert d.choice == "dual" and d.risk_shared > d.risk_dual


def test_cars_statistic_keeps_repeating_structure_and_charges_disagreement():
    rng = np.random.default_rng(3)
    p = 12
    signal = rng.standard_normal((p, p))
    signal *= 1.0 / np.linalg.norm(signal)
    noise = lambda s: s * rng.standard_normal((p, p)) / p  # ||noise||_F ~ s
    strong = [cars.cars_split(signal + noise(0.3), signal + noise(0.3)) for _ in range(200)]
    assert np.mean([s.signal for s in strong]) == pytest.approx(1.0, abs=0.05)
    assert cars.cars_select(strong)[0] == "dual"
    null = [cars.cars_split(noise(1.0), noise(1.0)) for _ in range(200)]
    assert abs(np.mean([s.signal for s in null])) < 0.1  # unbiased: no repeated structure
    assert cars.cars_select(null)[0] == "shared"  # variance charged, no signal


def test_serving_maps_reproduce_the_bilinear_score():
    rng = np.random.default_rng(4)
    p, r = 9, 3
    P = 0.3 * rng.standard_normal((r, p))
    A, B = 0.3 * rng.standard_normal((r, p)), 0.3 * rng.standard_normal((r, p))
    q, d = rng.standard_normal(p), rng.standard_normal(p)
    Qs, Ds = cars.serving_maps(P.T @ P, symmetric=True)
    assert np.array_equal(Qs, Ds)
    assert (Qs @ q) @ (Ds @ d) == pytest.approx(q @ (np.eye(p) + P.T @ P) @ d)
    Qd, Dd = cars.serving_maps(A.T @ B, symmetric=False)
    assert (Qd @ q) @ (Dd @ d) == pytest.approx(q @ (np.eye(p) + A.T @ B) @ d)


def test_fit_prefers_dual_on_a_strongly_asymmetric_task():
    """Queries are a rotation of their positives (directional mismatch): with plenty of pairs the Dual fit
    ranks held-out queries better than the Shared one and CARS picks Dual; with 16 pairs it picks Shared."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    p, N = 16, 400
    X = rng.standard_normal((N, p))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    theta = 1.2
    G = np.eye(p)
    G[:2, :2] = [[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]]
    G[2:4, 2:4] = G[:2, :2]

    def queries(n):
        pos = rng.integers(0, N, n)
        Q = X[pos] @ G.T + 0.05 * rng.standard_normal((n, p))
        return Q / np.linalg.norm(Q, axis=1, keepdims=True), [np.array([r]) for r in pos]

    cfg = CarsConfig(rank=4, steps=150, negatives_pool=20, negatives_per_positive=4, splits=2, weight_decay=1e-4)
    Qtr, pos_tr = queries(600)
    Qte, pos_te = queries(300)
    tr = make_triples(Qtr, X, pos_tr, cfg, 0)
    mrr = {}
    for g in ("shared", "dual"):
        M = fit_operator(Qtr, X, tr, g, cfg, 0)["M"]
        S = Qte @ (np.eye(p) + M) @ X.T
        ranks = [(S[i] > S[i, pos_te[i][0]]).sum() + 1 for i in range(len(Qte))]
        mrr[g] = float(np.mean(1.0 / np.array(ranks)))
    assert mrr["dual"] > mrr["shared"] + 0.05
    assert select_by_cars(Qtr, X, pos_tr, cfg, 0)["choice"] == "dual"
    small = select_by_cars(Qtr[:16], X, pos_tr[:16], cfg, 0)
    assert small["choice"] == "shared" and small["train_queries"] == 16
