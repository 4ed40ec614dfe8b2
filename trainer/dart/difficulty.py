"""The DART difficulty head, Eq. (2) of 000: a 3-way linear head on the query embedding, trained jointly with
the retrieval loss (L_total = L_retrieval + λ·CE(t̂, t*), λ = 0.1) or post hoc on frozen embeddings (ablation).

Oracle labels t* come from :func:`adawidth.tiers.oracle_tier` (cheapest tier whose ranking is best).
"""

from __future__ import annotations

import numpy as np
import torch

from adawidth.tiers import TIERS


class DifficultyHead(torch.nn.Module):
    """W_t ∈ R^{T×D} (no bias, as in §4.2 of 000): ``forward(h (B, D) float) -> logits (B, T)``."""

    def __init__(self, dim: int, n_tiers: int = len(TIERS)):
        super().__init__()
        self.linear = torch.nn.Linear(dim, n_tiers, bias=False)
        torch.nn.init.zeros_(self.linear.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h)

    def weights(self) -> np.ndarray:
        """(T, D) float32 numpy copy, for :func:`adawidth.tiers.predict_tier`."""
        return self.linear.weight.detach().cpu().numpy().astype(np.float32)


def joint_loss(retrieval_loss: torch.Tensor, head_logits: torch.Tensor, t_star: torch.Tensor,
               lam: float = 0.1, class_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. (2) of 000: L_total = L_retrieval + λ · CE(head_logits, t*).

    Args:
        retrieval_loss: 0-d tensor (e.g. AT-DW-InfoNCE of the batch).
        head_logits: (B, T) float; t_star: (B,) int64 in [0, T).
        lam: λ >= 0 (0.1 in the paper).
        class_weight: optional (T,) weights of the cross-entropy (rare tiers).
    """
    if lam < 0:
        raise ValueError("lambda must be >= 0")
    return retrieval_loss + lam * torch.nn.functional.cross_entropy(head_logits, t_star, weight=class_weight)


def fit_posthoc(Q: np.ndarray, t_star: np.ndarray, *, epochs: int = 200, lr: float = 0.05,
                weight_decay: float = 1e-4, balanced: bool = True, seed: int = 0) -> np.ndarray:
    """Post-hoc head (the ablation): multinomial logistic regression of t* on frozen query embeddings.

    Args:
        Q: (n, D) float32 query embeddings; t_star: (n,) int64 oracle tiers.
        balanced: weight classes by inverse frequency (the cheapest tier usually dominates).

    Returns:
        W of shape (T, D) float32.
    """
    torch.manual_seed(seed)
    X = torch.as_tensor(np.asarray(Q, dtype=np.float32))
    y = torch.as_tensor(np.asarray(t_star, dtype=np.int64))
    head = DifficultyHead(X.shape[1])
    w = None
    if balanced:
        counts = torch.bincount(y, minlength=len(TIERS)).float()
        w = torch.where(counts > 0, counts.sum() / (len(TIERS) * counts.clamp(min=1)), torch.zeros_like(counts))
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(X), y, weight=w)
        loss.backward()
        opt.step()
    return head.weights()
