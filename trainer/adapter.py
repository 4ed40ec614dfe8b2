"""Training the orthogonal prefix adapter (§3.1 and Algorithm 2 of 001) with torch.

The adapter is ``F`` Householder reflections in compact WY form; only the free
parameters ``U`` (F, D) are learned, the encoder is frozen.  The loss is
Eq. (10): ``L_rank + λ1 L_score + λ2 L_geom`` (Eqs. (6), (8), (9)) with the
difficulty weights of Eq. (7), over the widths M = {64, 128, 256}.  The
numpy twin in :mod:`adawidth.wy` verifies and materialises the result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from adawidth import wy
from adawidth.prefix import prefix_normalize, top_k

log = logging.getLogger(__name__)


@dataclass
class AdapterConfig:
    """Hyper-parameters; defaults are the spec of §3.1 / §5 of 001 unless noted."""

    reflections: int = 64                     # F
    widths: tuple[int, ...] = (64, 128, 256)  # M
    lambda_score: float = 2.0                 # λ1
    lambda_geom: float = 8.0                  # λ2
    theta: float = 0.05                       # contrastive temperature θ
    theta_b: float = 0.05                     # difficulty-weight temperature θ_b
    candidates: int = 32                      # c, drawn per query from its shortlist
    shortlist: int = 500                      # shortlist the candidates are drawn from
    shortlist_width: int = 64                 # width the shortlist is mined at (frozen encoder)
    batch_size: int = 64                      # B (not given by the paper)
    epochs: int = 100                         # not given by the paper; FINDINGS.md: 100 at lr 1e-2
    learning_rate: float = 1e-2               # not given by the paper; FINDINGS.md
    weight_decay: float = 0.0                 # U is scale-free (rows are normalised)
    grad_clip: float = 5.0                    # clip ||∇||_2 at 5
    seed: int = 0
    history: list = field(default_factory=list)

    def as_manifest(self) -> dict:
        """The configuration as the manifest records it (``adapter.training.config``), without the loss history."""
        d = asdict(self)
        d.pop("history")
        d["widths"] = list(self.widths)
        return d


def wy_factors_torch(U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable WYFactors (Algorithm 1 of 001).  U: (F, D) -> V (D, F), T (F, F).

    Column j of T is ``[-2 T[:j, :j] Γ[:j, j]; 2; 0...]`` (line 11), built from the
    columns before it, without in-place writes so autograd sees every step.
    """
    V = (U / U.norm(dim=1, keepdim=True)).T
    gram = V.T @ V
    F = U.shape[0]
    two = torch.full((1,), 2.0, dtype=U.dtype)
    cols: list[torch.Tensor] = []
    for j in range(F):
        upper = (-2.0 * (torch.stack(cols, 1)[:j, :j] @ gram[:j, j])) if j else torch.zeros(0, dtype=U.dtype)
        cols.append(torch.cat([upper, two, torch.zeros(F - j - 1, dtype=U.dtype)]))
    return V, torch.stack(cols, 1)


def wy_apply_torch(X: torch.Tensor, V: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """Apply (Algorithm 1 of 001): rows of X (n, D) -> rows of X R^T, i.e. R x."""
    return X - ((X @ V) @ T) @ V.T


def _prefix_cos(Qr: torch.Tensor, Cr: torch.Tensor, m: int) -> torch.Tensor:
    """Prefix cosines at width m.  Qr (B, D), Cr (B, c, D) -> (B, c)."""
    q = torch.nn.functional.normalize(Qr[:, :m], dim=-1)
    c = torch.nn.functional.normalize(Cr[:, :, :m], dim=-1)
    return torch.einsum("bd,bcd->bc", q, c)


def adapter_loss(Qr: torch.Tensor, Cr: torch.Tensor, Q: torch.Tensor, G: torch.Tensor,
                 P: torch.Tensor, cfg: AdapterConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. (10) of 001 for one minibatch.

    Args:
        Qr: rotated queries (B, D).  Cr: rotated candidates (B, c, D).
        Q: frozen queries (B, D) (for L_geom's target Q Q^T).
        G: frozen full-width scores (B, c), the teacher of Eqs. (7)-(8).
        P: positive mask (B, c), bool, at least one True per row.

    Returns:
        (scalar loss, {"rank", "score", "geom"} floats for logging).
    """
    W = torch.exp(-(G.max(dim=1, keepdim=True).values - G) / cfg.theta_b).detach()  # Eq. (7)
    target_gram = Q @ Q.T
    rank = score = geom = 0.0
    for m in cfg.widths:
        S = _prefix_cos(Qr, Cr, m)
        logits = S / cfg.theta
        rank = rank + (torch.logsumexp(logits, 1)
                       - torch.logsumexp(logits.masked_fill(~P, float("-inf")), 1)).mean()  # Eq. (6)
        score = score + ((W * (S - G).abs()).sum(1) / W.sum(1)).mean()  # Eq. (8)
        Pi = torch.nn.functional.normalize(Qr[:, :m], dim=-1)
        geom = geom + (Pi @ Pi.T - target_gram).abs().mean()  # Eq. (9)
    n = len(cfg.widths)
    rank, score, geom = rank / n, score / n, geom / n
    loss = rank + cfg.lambda_score * score + cfg.lambda_geom * geom
    return loss, {"rank": float(rank.detach()), "score": float(score.detach()), "geom": float(geom.detach())}


def mine_shortlists(Q: np.ndarray, X: np.ndarray, width: int, size: int) -> np.ndarray:
    """Top-``size`` documents of each query by the width-prefix cosine of the frozen embeddings.

    Q: (n, D), X: (N, D) -> (n, min(size, N)) int64 row numbers, best first.
    """
    Xp = prefix_normalize(X, width)
    Qp = prefix_normalize(Q, width)
    size = min(size, X.shape[0])
    out = np.empty((Q.shape[0], size), dtype=np.int64)
    for s in range(0, Q.shape[0], 256):
        out[s:s + 256] = top_k(Qp[s:s + 256] @ Xp.T, size)
    return out


def _draw_candidates(rng: np.random.Generator, shortlist: np.ndarray, positives: list[np.ndarray],
                     c: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query: all positives (up to c) plus non-positives drawn uniformly from its shortlist."""
    n = shortlist.shape[0]
    J = np.empty((n, c), dtype=np.int64)
    P = np.zeros((n, c), dtype=bool)
    for i in range(n):
        pos = positives[i][:c]
        pool = shortlist[i][~np.isin(shortlist[i], positives[i])]
        neg = rng.choice(pool, size=c - len(pos), replace=len(pool) < c - len(pos))
        J[i, : len(pos)] = pos
        J[i, len(pos):] = neg
        P[i, : len(pos)] = True
    return J, P


def train_adapter(Q: np.ndarray, X: np.ndarray, positives: list[np.ndarray], cfg: AdapterConfig,
                  *, progress: bool = True) -> tuple[np.ndarray, dict]:
    """Algorithm 2 of 001: learn U, run Verify, return the materialised rotation.

    Args:
        Q: frozen training-query embeddings, (n, D), unit rows.
        X: frozen document embeddings, (N, D), unit rows (already base-rotated if a
           base rotation is used; the caller composes the result with it).
        positives: n arrays of row numbers of relevant documents (each non-empty).
        cfg: hyper-parameters.

    Returns:
        (R of shape (D, D) float64, report dict with the verification errors,
        final loss terms and training seconds).

    Raises:
        adawidth.wy.AdapterVerificationError: if Verify fails.
        ValueError: if a query has no positive or shapes disagree.
    """
    if Q.shape[1] != X.shape[1]:
        raise ValueError(f"query width {Q.shape[1]} != document width {X.shape[1]}")
    if any(len(p) == 0 for p in positives):
        raise ValueError("every training query needs at least one relevant document")
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    D = Q.shape[1]
    shortlist = mine_shortlists(Q, X, cfg.shortlist_width, cfg.shortlist)
    U = torch.nn.Parameter(torch.tensor(wy.paired_identity_init(cfg.reflections, D, cfg.seed), dtype=torch.float32))
    opt = torch.optim.AdamW([U], lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    Qt = torch.tensor(Q, dtype=torch.float32)
    Xt = torch.tensor(X, dtype=torch.float32)
    n = Q.shape[0]
    cfg.history = []
    bar = tqdm(range(cfg.epochs), desc="adapter", unit="epoch", disable=not progress)
    for epoch in bar:
        J, P = _draw_candidates(rng, shortlist, positives, cfg.candidates)
        perm = rng.permutation(n)
        totals = {"loss": 0.0, "rank": 0.0, "score": 0.0, "geom": 0.0}
        batches = 0
        for s in range(0, n, cfg.batch_size):
            b = perm[s:s + cfg.batch_size]
            Qb, Cb = Qt[b], Xt[torch.as_tensor(J[b])]
            Pb = torch.as_tensor(P[b])
            G = torch.einsum("bd,bcd->bc", Qb, Cb)
            V, T = wy_factors_torch(U)
            Qr = wy_apply_torch(Qb, V, T)
            Cr = wy_apply_torch(Cb.reshape(-1, D), V, T).reshape(Cb.shape)
            loss, parts = adapter_loss(Qr, Cr, Qb, G, Pb, cfg)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([U], cfg.grad_clip)
            opt.step()
            totals["loss"] += float(loss.detach())
            for key in parts:
                totals[key] += parts[key]
            batches += 1
        epoch_stats = {k: v / batches for k, v in totals.items()}
        cfg.history.append(epoch_stats)
        bar.set_postfix(loss=f"{epoch_stats['loss']:.4f}")
    U_np = U.detach().double().numpy()
    V, T = wy.wy_factors(U_np)
    check = wy.verify(V, T, U_np)
    R = wy.materialize(V, T)
    report = {"verify": check, "final_loss": cfg.history[-1] if cfg.history else None,
              "train_seconds": time.perf_counter() - t0, "train_queries": n}
    return R, report
