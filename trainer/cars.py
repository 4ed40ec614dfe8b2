"""Fit Shared (M = PᵀP) and Dual (M = AᵀB) rank-r adapters on frozen embeddings and select one by CARS.

Scoring: ``s(q, d) = qᵀ (I + M) d`` (a residual low-rank correction of the frozen inner product; 002's
rank experiment, where rank 4..32 barely moves NDCG@10 at about the frozen encoder's level, implies the
adapter corrects the frozen geometry rather than replacing it).  Training: (query, positive, negative)
triples, positives from the qrels, negatives drawn from the frozen encoder's top-``negatives_pool`` non-
positives; loss ``softplus(−(s⁺ − s⁻) / τ)`` plus ``weight_decay · (||P||² | ||A||² + ||B||²)``; full-batch
Adam; torch with one thread.

Selection (:func:`select_by_cars`): for ``splits`` random halvings of the training queries, fit both
geometries on each half and score :func:`adawidth.cars.cars_split`; Dual iff the mean score is positive.
Then both are refitted on all training queries and the selected one is served through
:func:`adawidth.cars.serving_maps`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from adawidth import cars
from adawidth.prefix import top_k
from engine.version.files import cars_files
from trainer.evaluate import QuerySet


@dataclass
class CarsConfig:
    """Hyperparameters (ours; 002 gives none for this residual form)."""

    rank: int = 16
    negatives_per_positive: int = 8
    negatives_pool: int = 50
    temperature: float = 0.05
    weight_decay: float = 1e-3
    prior_queries: float = 0.0  # > 0: weight decay = prior_queries / n training queries (a fixed-strength prior)
    steps: int = 200
    learning_rate: float = 1e-2
    init_scale: float = 0.01
    splits: int = 3


def make_triples(Q: np.ndarray, X: np.ndarray, positives: list[np.ndarray], cfg: CarsConfig,
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index triples (query, positive row, negative row).

    Args:
        Q: (n, p) query embeddings; X: (N, p) document embeddings (frozen).
        positives: per query, an int array of relevant rows.

    Returns:
        three (T,) int64 arrays; negatives come from the query's top ``negatives_pool`` frozen-encoder
        documents that are not positives.
    """
    rng = np.random.default_rng(seed)
    S = Q @ X.T
    pool = min(cfg.negatives_pool + 20, X.shape[0])
    qi, pi, ni = [], [], []
    for i, pos in enumerate(positives):
        if len(pos) == 0:
            continue
        top = top_k(S[i], pool)
        neg = np.array([r for r in top if r not in set(pos.tolist())][:cfg.negatives_pool], dtype=np.int64)
        if len(neg) == 0:
            continue
        for p in pos:
            pick = rng.choice(neg, size=min(cfg.negatives_per_positive, len(neg)), replace=False)
            qi += [i] * len(pick)
            pi += [int(p)] * len(pick)
            ni += pick.tolist()
    return np.array(qi, np.int64), np.array(pi, np.int64), np.array(ni, np.int64)


def fit_operator(Q: np.ndarray, X: np.ndarray, triples, geometry: str, cfg: CarsConfig, seed: int) -> dict:
    """Fit one geometry on triples; returns ``{"M": (p, p) float64, "factors": ..., "loss": [first, last]}``.

    Raises:
        ValueError: for an unknown geometry or no triples.
    """
    if geometry not in ("shared", "dual"):
        raise ValueError(f"geometry must be 'shared' or 'dual', got {geometry!r}")
    qi, pi, ni = triples
    if len(qi) == 0:
        raise ValueError("no training triples")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    p = Q.shape[1]
    q = torch.as_tensor(Q[qi], dtype=torch.float32)
    diff = torch.as_tensor(X[pi] - X[ni], dtype=torch.float32)
    base = (q * diff).sum(1)
    decay = cfg.prior_queries / len(np.unique(qi)) if cfg.prior_queries > 0 else cfg.weight_decay
    init = torch.randn(cfg.rank, p, generator=g) * cfg.init_scale
    A = init.clone().requires_grad_(True)
    params = [A]
    if geometry == "dual":
        B = (init.clone() + torch.randn(cfg.rank, p, generator=g) * cfg.init_scale).requires_grad_(True)
        params.append(B)
    opt = torch.optim.Adam(params, lr=cfg.learning_rate)
    losses = []
    for _ in range(cfg.steps):
        opt.zero_grad()
        right = B if geometry == "dual" else A
        gap = base + ((q @ A.T) * (diff @ right.T)).sum(1)
        loss = torch.nn.functional.softplus(-gap / cfg.temperature).mean() + \
            decay * sum((t ** 2).sum() for t in params)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    A_ = A.detach().double().numpy()
    B_ = B.detach().double().numpy() if geometry == "dual" else A_
    return {"M": A_.T @ B_, "geometry": geometry, "loss": [losses[0], losses[-1]]}


def select_by_cars(Q: np.ndarray, X: np.ndarray, positives: list[np.ndarray], cfg: CarsConfig,
                   seed: int = 0) -> dict:
    """Fit both geometries, run CARS, and return the evidence with both full-data fits.

    Returns:
        ``{"choice", "score", "splits": [{"signal", "variance", "score"}], "fits": {"shared", "dual"}, ...}``.
    """
    t0 = time.perf_counter()
    n = len(positives)
    rng = np.random.default_rng(seed)
    split_stats = []
    for s in range(cfg.splits):
        perm = rng.permutation(n)
        halves = (perm[: n // 2], perm[n // 2:])
        deltas = []
        for h in halves:
            tr = make_triples(Q[h], X, [positives[i] for i in h], cfg, seed + 17 * s)
            dual = fit_operator(Q[h], X, tr, "dual", cfg, seed + s)
            shared = fit_operator(Q[h], X, tr, "shared", cfg, seed + s)
            deltas.append(dual["M"] - shared["M"])
        split_stats.append(cars.cars_split(*deltas))
    choice, score = cars.cars_select(split_stats)
    tr = make_triples(Q, X, positives, cfg, seed)
    fits = {g: fit_operator(Q, X, tr, g, cfg, seed) for g in ("shared", "dual")}
    return {"choice": choice, "score": score, "rule": "Dual iff mean over splits of <Δa,Δb> − ||Δa−Δb||²/4 > 0 "
                                                      "(Δ = M_dual − M_shared fitted on each half; 002, CARS)",
            "splits": [{"signal": s.signal, "variance": s.variance, "score": s.score} for s in split_stats],
            "fits": fits, "train_queries": n, "triples": int(len(tr[0])), "config": asdict(cfg),
            "seconds": round(time.perf_counter() - t0, 2)}


def apply_cars(overrides: dict, X: np.ndarray, train, test, row_of: dict, seed: int):
    """Build hook: select by CARS on the training queries, then map documents and queries.

    Args:
        overrides: fields of :class:`CarsConfig`.
        X: (N, D) frozen document embeddings; train/test: ``trainer.evaluate.QuerySet`` (test may be None).
        row_of: document id -> row.

    Returns:
        (mapped X, mapped train, mapped test, artifact writers, the manifest's ``cars`` entry).

    Raises:
        ValueError: without training queries.
    """
    if train is None or not train.ids:
        raise ValueError("CARS needs training qrels")
    cfg = CarsConfig(**overrides)
    positives = [np.array([row_of[d] for d, g in j.items() if g > 0 and d in row_of], dtype=np.int64)
                 for j in train.judgments]
    ev = select_by_cars(train.emb, X, positives, cfg, seed)
    chosen = ev["fits"][ev["choice"]]
    Qm, Dm = cars.serving_maps(chosen["M"], symmetric=ev["choice"] == "shared")
    Xm = np.ascontiguousarray(X @ Dm.T, dtype=np.float32)

    def mapped(qs):
        return None if qs is None else QuerySet(qs.ids, (qs.emb @ Qm.T).astype(np.float32), qs.judgments)

    Qm32, Dm32 = Qm.astype(np.float32), Dm.astype(np.float32)
    writers, names = cars_files(Qm32, Dm32)
    meta = {"selected": ev["choice"], "score": ev["score"], "rule": ev["rule"], "splits": ev["splits"],
            "rank": cfg.rank, "config": ev["config"], "train_queries": ev["train_queries"], "triples": ev["triples"],
            "loss": {g: f["loss"] for g, f in ev["fits"].items()},
            "operator_norms": {g: float(np.linalg.norm(f["M"])) for g, f in ev["fits"].items()},
            **names,
            "query_map_sha256": hashlib.sha256(Qm32.tobytes()).hexdigest(),
            "scoring": "s(q, d) = (Q q) . (D d) = q^T (I + M) d; the rotation and the prefix funnel act on the "
                       "mapped vectors (docs/METHOD.md)", "seconds": ev["seconds"]}
    return Xm, mapped(train), mapped(test), writers, meta
