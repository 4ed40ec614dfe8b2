"""Contrastive objectives for encoder fine-tuning (DART, 000 §4.1 and §5.1; negatives per 003 §20.1, §20.3).

Every loss here takes the same inputs:

* ``scores``: float tensor (B, P), similarity of each of B queries to each of P pool passages (cosines of
  unit vectors; higher is better). The pool is the batch's positives plus its mined hard negatives, shared by
  every query of the batch (in-batch negatives).
* ``positive``: int64 tensor (B,), the column of query i's chosen positive in the pool.
* ``valid``: bool tensor (B, P), which columns enter query i's softmax denominator. Built by
  :func:`denominator_mask`; the chosen positive is always valid. ``None`` means every column.

and returns the batch-mean loss (a 0-d tensor), lower is better. Temperatures are in cosine units.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

__all__ = [
    "denominator_mask", "info_nce", "at_dw_info_nce", "focal_info_nce", "cosine_temperature",
    "normalized_density", "relevant_counts",
]


def denominator_mask(positives: Sequence[set[str] | frozenset[str]], chosen: Sequence[int],
                     pool_ids: Sequence[str]) -> torch.Tensor:
    """Which pool columns may act as negatives for each query (003 §20.1: mask known shared positives and duplicates).

    Column j is valid for query i when j is i's chosen positive, or when the passage ``pool_ids[j]``

    * is not a known positive of query i (another query's positive that i also cites is a false negative),
    * is not the same passage as i's chosen positive (a duplicate of it),
    * is the first occurrence of its passage id in the pool (a duplicate passage counts once).

    Args:
        positives: length B, the set of relevant passage ids of each query (from the qrels, label > 0).
        chosen: length B, the pool column of each query's chosen positive.
        pool_ids: length P, the passage id of each pool column.

    Returns:
        bool tensor (B, P).

    Raises:
        ValueError: on mismatched lengths, a chosen column out of range, or a chosen column whose passage is
            not one of the query's positives.
    """
    B, P = len(positives), len(pool_ids)
    if len(chosen) != B:
        raise ValueError(f"chosen has {len(chosen)} entries for {B} queries")
    first: dict[str, int] = {}
    for j, pid in enumerate(pool_ids):
        first.setdefault(pid, j)
    valid = torch.zeros((B, P), dtype=torch.bool)
    for i in range(B):
        c = int(chosen[i])
        if not 0 <= c < P:
            raise ValueError(f"chosen column {c} of query {i} outside a pool of {P}")
        if pool_ids[c] not in positives[i]:
            raise ValueError(f"query {i}: chosen passage {pool_ids[c]!r} is not among its positives")
        for j, pid in enumerate(pool_ids):
            if j == c:
                valid[i, j] = True
            elif pid in positives[i] or pid == pool_ids[c] or first[pid] != j:
                continue
            else:
                valid[i, j] = True
    return valid


def _log_softmax_at_positive(scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None,
                             tau: torch.Tensor | float) -> torch.Tensor:
    """log p_i(positive) under a softmax over the valid columns at temperature tau (scalar or (B,)); shape (B,)."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be (B, P), got shape {tuple(scores.shape)}")
    if positive.shape != (scores.shape[0],):
        raise ValueError(f"positive must be ({scores.shape[0]},), got {tuple(positive.shape)}")
    tau_t = torch.as_tensor(tau, dtype=scores.dtype, device=scores.device)
    if torch.any(tau_t <= 0):
        raise ValueError("temperatures must be positive")
    logits = scores / (tau_t.unsqueeze(-1) if tau_t.dim() == 1 else tau_t)
    if valid is not None:
        if valid.shape != scores.shape:
            raise ValueError(f"valid must match scores {tuple(scores.shape)}, got {tuple(valid.shape)}")
        if not bool(valid.gather(1, positive.unsqueeze(1)).all()):
            raise ValueError("every query's positive column must be valid")
        logits = logits.masked_fill(~valid, float("-inf"))
    return torch.log_softmax(logits, dim=1).gather(1, positive.unsqueeze(1)).squeeze(1)


def info_nce(scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None = None, *,
             tau: float = 0.05) -> torch.Tensor:
    """InfoNCE with in-batch and hard negatives: mean_i −log softmax_{j valid}(s_ij / τ)[positive_i].

    ``tau`` is a positive float (cosine units). Raises ValueError on bad shapes or an invalid positive.
    """
    return -_log_softmax_at_positive(scores, positive, valid, tau).mean()


def normalized_density(relevant_counts: Sequence[int] | torch.Tensor, k_max: int | None = None) -> torch.Tensor:
    """ρ̃_i = k_i / k_max of Eq. (1) of 000: relevant documents of query i over the maximum (float32, (B,)).

    ``k_max`` defaults to the maximum of ``relevant_counts``; pass the training set's maximum so that a batch
    is normalised like the whole set. Raises ValueError when a count is negative or k_max is not positive.
    """
    k = torch.as_tensor(relevant_counts, dtype=torch.float32)
    if torch.any(k < 0):
        raise ValueError("relevant counts must be non-negative")
    kmax = float(k.max()) if k_max is None else float(k_max)
    if kmax <= 0:
        raise ValueError("k_max must be positive")
    return k / kmax


def at_dw_info_nce(scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None, rho_tilde: torch.Tensor,
                   *, alpha: float = 2.0, tau0: float = 0.07) -> torch.Tensor:
    """AT-DW-InfoNCE, Eq. (1) of 000: −(1/|B|) Σ_i w_i log softmax(s_i· / τ_i)[i⁺], w_i = 1 + α ρ̃_i, τ_i = τ0 / w_i.

    ``rho_tilde``: float tensor (B,) in [0, 1] (:func:`normalized_density`). At α = 0 this is
    :func:`info_nce` at τ = τ0. Raises ValueError on bad shapes or α < 0.
    """
    if alpha < 0:
        raise ValueError("alpha must be >= 0")
    rho = torch.as_tensor(rho_tilde, dtype=scores.dtype, device=scores.device)
    if rho.shape != (scores.shape[0],):
        raise ValueError(f"rho_tilde must be ({scores.shape[0]},), got {tuple(rho.shape)}")
    w = 1.0 + alpha * rho
    return -(w * _log_softmax_at_positive(scores, positive, valid, tau0 / w)).mean()


def focal_info_nce(scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None = None, *,
                   tau: float = 0.05, gamma: float = 2.0) -> torch.Tensor:
    """Focal contrastive loss (the focal baseline of 000 §5.1): mean_i −(1 − p_i)^γ log p_i, p_i the softmax
    probability of the positive among the valid columns at temperature τ. At γ = 0 this is :func:`info_nce`.
    """
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    logp = _log_softmax_at_positive(scores, positive, valid, tau)
    return -(((1.0 - logp.exp()).clamp(min=0.0) ** gamma) * logp).mean()


def cosine_temperature(step: int, total_steps: int, *, start: float = 0.10, end: float = 0.02) -> float:
    """Cosine temperature schedule (the baseline of 000 §5.1): τ(t) = end + (start − end)(1 + cos(π t / T)) / 2.

    τ(0) = start, τ(T) = end; steps past T stay at ``end``. Raises ValueError when total_steps < 1 or step < 0.
    """
    if total_steps < 1 or step < 0:
        raise ValueError("need total_steps >= 1 and step >= 0")
    t = min(step, total_steps) / total_steps
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * t))


def relevant_counts(qrels: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """k_i of Eq. (1) of 000: number of documents judged relevant (label > 0) per query id."""
    return {qid: sum(1 for v in judged.values() if v > 0) for qid, judged in qrels.items()}
