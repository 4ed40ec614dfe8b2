"""Shared vs Dual low-rank bilinear scoring: degrees of freedom, the SURE rule of the local Gaussian model,
the CARS split-half selection statistic, and the serving maps of a fitted operator.

Source: Sun, Yuan, Huang, Han (2026), "When Does Dense Retrieval Need Asymmetric Geometry? A Bias-Variance
Theory of Shared and Dual Projections" (``shared/seeds/002_3761db4d8411f366.txt``; "002" below).

Scoring (our residual form, docs/METHOD.md): ``s(q, d) = qᵀ (I + M) d`` with a rank-r correction
``M = PᵀP`` (Shared, symmetric PSD) or ``M = AᵀB`` (Dual, any rank-r matrix); P, A, B are (r, p).

Pure numpy; the fitting (torch) is :mod:`trainer.cars`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def dual_only_dof(p: int, r: int) -> int:
    """k = r (2p − r − 1) / 2: directions of the rank-r Dual tangent space that the Shared (symmetric)
    tangent space lacks at a rank-r symmetric operator (002: skew motion inside the active r-plane plus
    unmatched left/right cross-subspace motion).

    Raises:
        ValueError: unless 1 <= r <= p.
    """
    if not 1 <= r <= p:
        raise ValueError(f"need 1 <= r <= p, got r={r}, p={p}")
    return r * (2 * p - r - 1) // 2


def skew(Y: np.ndarray) -> np.ndarray:
    """(Y − Yᵀ) / 2 of a square (p, p) matrix."""
    return 0.5 * (Y - Y.T)


def tangent_projection(Y: np.ndarray, U: np.ndarray) -> np.ndarray:
    """Projection of (p, p) ``Y`` onto the tangent space of rank-r matrices at an operator whose row and
    column spaces are both span(U): ``UUᵀY + YUUᵀ − UUᵀYUUᵀ``.

    Args:
        Y: (p, p).
        U: (p, r) with orthonormal columns.
    """
    Pu = U @ U.T
    return Pu @ Y + Y @ Pu - Pu @ Y @ Pu


def dual_only_energy(Y: np.ndarray, S0: np.ndarray, U: np.ndarray) -> float:
    """Observed energy of ``Y`` on the k Dual-only directions at the rank-r Shared operator S0 = UΛUᵀ.

    The Dual tangent space at a symmetric point is closed under transposition, so its symmetric half is
    the Shared tangent space and the Dual-only half is the tangent projection of the skew part:
    ``|| P_T(skew(Y − S0)) ||_F²``.  Under pure isotropic noise of variance v per entry its expectation
    is v·k (k = :func:`dual_only_dof`), which the tests check.

    Args:
        Y: (p, p) observed operator.
        S0: (p, p) symmetric rank-r operator (the local centre).
        U: (p, r) orthonormal basis of S0's range.
    """
    return float(np.sum(tangent_projection(skew(Y - S0), U) ** 2))


@dataclass(frozen=True)
class SureDecision:
    """SURE comparison in the local Gaussian model (002, Theorem 3).

    Attributes:
        choice: "dual" or "shared".
        energy: observed Dual-only energy ||z||².
        noise_var: per-direction noise variance v (σ²/n in 002's scaling).
        dof: k.
        risk_shared: SURE estimate of Shared's excess risk on those directions, ||z||² − v k (the bias δ²).
        risk_dual: Dual's risk there, v k (it fits the noise in all k directions).
    """

    choice: str
    energy: float
    noise_var: float
    dof: int
    risk_shared: float
    risk_dual: float


def sure_select(energy: float, noise_var: float, dof: int) -> SureDecision:
    """SURE rule: choose Dual iff the observed Dual-only energy exceeds 2 v k (002: "selects Dual iff the
    observed Dual-only energy exceeds 2σ²k"); with no directional signal the chance of choosing Dual is at
    most (2/e)^{k/2}.

    Raises:
        ValueError: for a negative variance or energy, or dof < 1.
    """
    if noise_var < 0 or energy < 0 or dof < 1:
        raise ValueError("need energy >= 0, noise_var >= 0, dof >= 1")
    risk_shared = energy - noise_var * dof
    risk_dual = noise_var * dof
    return SureDecision("dual" if energy > 2.0 * noise_var * dof else "shared", float(energy), float(noise_var),
                        int(dof), float(risk_shared), float(risk_dual))


def null_dual_probability_bound(dof: int) -> float:
    """(2/e)^{k/2}: bound of 002 on the chance SURE picks Dual when there is no directional signal."""
    return float((2.0 / np.e) ** (dof / 2.0))


@dataclass(frozen=True)
class CarsSplit:
    """CARS statistic of one split of the training pairs into halves a and b.

    With Δ_h = M_dual,h − M_shared,h the Dual-versus-Shared structure fitted on half h, the cross term
    ⟨Δ_a, Δ_b⟩ keeps only what repeats across halves (independent noise averages out: an unbiased
    estimate of δ²), and ||Δ_a − Δ_b||² / 4 charges the halves' disagreement as the sampling variance of
    the full-data fit (each half carries twice the full data's variance).  ``score = signal − variance``
    estimates (δ² − σ²k) / n, the local boundary of 002; positive favours Dual.
    """

    signal: float
    variance: float

    @property
    def score(self) -> float:
        return self.signal - self.variance


def cars_split(delta_a: np.ndarray, delta_b: np.ndarray) -> CarsSplit:
    """:class:`CarsSplit` of two (p, p) Dual-minus-Shared operators fitted on disjoint halves."""
    return CarsSplit(float(np.sum(delta_a * delta_b)), float(np.sum((delta_a - delta_b) ** 2) / 4.0))


def cars_select(splits: list[CarsSplit]) -> tuple[str, float]:
    """("dual" | "shared", mean score) over repeated random splits; Dual iff the mean score is positive."""
    if not splits:
        raise ValueError("CARS needs at least one split")
    score = float(np.mean([s.score for s in splits]))
    return ("dual" if score > 0.0 else "shared"), score


def serving_maps(M: np.ndarray, *, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Query and document maps of the operator W = I + M, so that ``(Q q) · (D d) = qᵀ W d``.

    Dual: W = U Σ Vᵀ (SVD), Q = Σ^{1/2} Uᵀ, D = Σ^{1/2} Vᵀ.  Shared: W is symmetric positive definite
    (I + PᵀP), W = E Λ Eᵀ, and Q = D = Λ^{1/2} Eᵀ, so queries and documents share one map.  Either way
    the mapped coordinates come in decreasing order of singular value.

    Args:
        M: (p, p) low-rank correction.
        symmetric: True for a Shared operator.

    Returns:
        (query map (p, p) float64, document map (p, p) float64).

    Raises:
        ValueError: if a Shared W is not positive definite.
    """
    W = np.eye(M.shape[0]) + np.asarray(M, dtype=np.float64)
    if symmetric:
        lam, E = np.linalg.eigh(0.5 * (W + W.T))
        if lam.min() <= 0:
            raise ValueError("a Shared operator I + PᵀP must be positive definite")
        order = np.argsort(-lam)
        Q = np.sqrt(lam[order])[:, None] * E[:, order].T
        return Q, Q.copy()
    U, s, Vt = np.linalg.svd(W)
    root = np.sqrt(s)[:, None]
    return root * U.T, root * Vt
