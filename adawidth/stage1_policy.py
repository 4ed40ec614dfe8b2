"""Per-query funnel policy: stage-1 width, shortlist depth and rescoring width from cheap early evidence.

A static funnel (what users of other engines build) scans the whole corpus on the first ``m1``
rotated coordinates, keeps the best ``C`` and rescores them at width ``r``.  Its work per query, in
multiply-adds, is ``N·m1 + C·(r − m1)`` for a flat scan (rescoring reuses the stage-1 partial sums,
§3.2.1 of 001_63bafbdb24f0770e.txt).  The adaptive policy scans the first coordinate block of every
query (``BLOCK`` = 16 coordinates; :class:`adawidth.blocked.BlockedCorpus`), reads cheap evidence
from it and then picks one configuration (m1, C, r) of a grid per query.  Because the blocked layout
keeps the partial sums, extending stage 1 from 16 to m1 costs N·(m1 − 16) more, never a rescan.

Evidence (:data:`EVIDENCE_NAMES`, 22 values): the 18 order statistics of §3.2.2 of 001 over the top-500
first-block cosines, the query's energy in its first 16/32/64 rotated coordinates, and the stability
of the first-block top-10 when the top-100 are rescored at 32 coordinates (100 × 16 extra multiply-adds).

A learned model predicts, for each (evidence, configuration) row, a target in [0, 1]:
``agreement`` — the fraction of the exhaustive full-width top-10 the configuration's top-10 keeps
(label-free, so every query, judged or not, is training data), or ``ndcg`` — its NDCG@10 (needs qrels).
:func:`choose_threshold` picks the cheapest configuration whose predicted target clears τ;
:func:`choose_tradeoff` maximises predicted target − λ · work / full work.  Glossary: N documents, D
coordinates, Q queries, K configurations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adawidth.blocked import BlockedCorpus, ScanState
from adawidth.funnel import Resolution, exact_stage1_batch, resolve
from adawidth.prefix import prefix_normalize, top_k
from adawidth.router import FEATURE_NAMES, router_features

BLOCK = 16
STAGE1_WIDTHS = (16, 32, 48, 64)
SHORTLISTS = (100, 200, 500, 1000)
RESCORE_WIDTHS = (128, 256, 384)
EVIDENCE_SHORTLIST = 500
EVIDENCE_RESCORED = 100
EVIDENCE_NAMES: tuple[str, ...] = FEATURE_NAMES + ("energy_16", "energy_32", "energy_64", "top10_stability_32")
CONFIG_NAMES: tuple[str, ...] = ("m1", "shortlist", "rescore_width", "work_ratio")


@dataclass(frozen=True)
class Config:
    """One funnel configuration: stage-1 width m1, shortlist size C, rescoring width r (coordinates)."""

    m1: int
    shortlist: int
    rescore_width: int

    def work(self, n_docs: int) -> int:
        """Multiply-adds per query of a flat stage 1 plus rescoring: N·m1 + C'·(r − m1), C' = min(C, N)."""
        return int(n_docs * self.m1 + min(self.shortlist, n_docs) * max(self.rescore_width - self.m1, 0))


def default_grid() -> list[Config]:
    """The sweep of the static frontier: m1 {16,32,48,64} × C {100,200,500,1000} × r {128,256,384}."""
    return [Config(m, c, r) for m in STAGE1_WIDTHS for c in SHORTLISTS for r in RESCORE_WIDTHS]


def evidence_work() -> int:
    """Multiply-adds the evidence adds beyond the first block's scan (which every m1 >= 16 reuses)."""
    return EVIDENCE_RESCORED * BLOCK


def evidence(corpus: BlockedCorpus, query: np.ndarray, theta: float = 0.05) -> tuple[np.ndarray, ScanState]:
    """Scan the first block and compute the 22 evidence values.

    Args:
        corpus: the rotated corpus in blocks of :data:`BLOCK` coordinates.
        query: rotated query, (>= 64,) float32.
        theta: entropy temperature of the router features (§3.2.2 of 001).

    Returns:
        (features (22,) float64 in the order of :data:`EVIDENCE_NAMES`, the scan state at width 16,
        to be extended by :meth:`BlockedCorpus.extend`).
    """
    state = corpus.extend(corpus.start(), query, BLOCK)
    rows, cos = corpus.shortlist(state, EVIDENCE_SHORTLIST)
    head = rows[:EVIDENCE_RESCORED]
    p32 = corpus.partial_scores(state, head).extend(query, corpus.matrix, 2 * BLOCK)
    top32 = set(head[top_k(p32.cosine(), 10)].tolist())
    stability = len(top32 & set(rows[:10].tolist())) / 10.0
    energy = [float(query[:w] @ query[:w]) for w in (16, 32, 64)]
    return np.concatenate([router_features(cos, theta), energy, [stability]]), state


def design(features: np.ndarray, grid: list[Config], n_docs: int, full_work: float) -> np.ndarray:
    """Model input rows: every query's evidence beside every configuration's parameters.

    Args:
        features: (Q, 22) evidence.

    Returns:
        (Q·K, 26) float64, query-major (row q·K + j is query q under configuration j).
    """
    features = np.atleast_2d(features)
    cfg = np.array([[c.m1, c.shortlist, c.rescore_width, c.work(n_docs) / full_work] for c in grid])
    return np.concatenate([np.repeat(features, len(grid), 0), np.tile(cfg, (features.shape[0], 1))], axis=1)


def choose_threshold(pred: np.ndarray, work: np.ndarray, tau: float) -> np.ndarray:
    """Per query, the least-work configuration whose predicted target is at least ``tau``.

    Args:
        pred: (Q, K) predicted target (higher is better).
        work: (K,) multiply-adds of each configuration.
        tau: the bar; a query no configuration clears gets the configuration of highest prediction.

    Returns:
        (Q,) int64 configuration indices.
    """
    pred = np.atleast_2d(pred)
    order = np.argsort(work, kind="stable")
    ok = pred[:, order] >= tau
    first = np.argmax(ok, axis=1)
    pick = order[first]
    none = ~ok.any(axis=1)
    pick[none] = np.argmax(pred[none], axis=1)
    return pick.astype(np.int64)


def choose_tradeoff(pred: np.ndarray, work: np.ndarray, full_work: float, lam: float) -> np.ndarray:
    """Per query, the configuration maximising predicted target − λ · work / full work; (Q,) int64."""
    return np.argmax(np.atleast_2d(pred) - lam * np.asarray(work)[None, :] / full_work, axis=1).astype(np.int64)


def top10_agreement(rankings: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Fraction of each reference top-10 found in the ranking's top-10.

    Args:
        rankings: (Q, K, >=10) rows, best first, for K configurations.
        reference: (Q, >=10) the exhaustive full-width ranking.

    Returns:
        (Q, K) float64 in [0, 1] (higher is better).
    """
    Q, K = rankings.shape[:2]
    out = np.empty((Q, K))
    for i in range(Q):
        ref = set(reference[i, :10].tolist())
        for j in range(K):
            out[i, j] = len(ref.intersection(rankings[i, j, :10].tolist())) / 10.0
    return out


def evidence_matrix(X_rot: np.ndarray, Q_rot: np.ndarray, theta: float = 0.05) -> np.ndarray:
    """(Q, 22) first-block evidence of every query; X_rot (N, D), Q_rot (Q, D) rotated, float32."""
    bc = BlockedCorpus(X_rot, BLOCK)
    return np.array([evidence(bc, q, theta)[0] for q in Q_rot]).reshape(len(Q_rot), len(EVIDENCE_NAMES))


def funnel_rankings(X_rot: np.ndarray, Q_rot: np.ndarray, grid: list[Config], k: int = 10) -> np.ndarray:
    """Top-k rows of every query under every static configuration (flat stage 1, rescoring by resolve).

    Returns:
        (Q, K, k) int64 rows, best first (padded with 0 when N < k).
    """
    N = X_rot.shape[0]
    out = np.zeros((len(Q_rot), len(grid), k), dtype=np.int64)
    by_m1 = {}
    for m1 in sorted({c.m1 for c in grid}):
        sq = np.einsum("ij,ij->i", X_rot[:, :m1], X_rot[:, :m1])
        rows, sc = exact_stage1_batch(Q_rot, prefix_normalize(X_rot, m1), m1, max(c.shortlist for c in grid))
        by_m1[m1] = (sq, rows, sc)
    for j, c in enumerate(grid):
        sq, rows, sc = by_m1[c.m1]
        C = min(c.shortlist, N)
        for i in range(len(Q_rot)):
            res = resolve(Q_rot[i], X_rot, sq, rows[i, :C], sc[i, :C], m0=c.m1, k=k, width=c.rescore_width)
            out[i, j, : len(res.rows)] = res.rows
    return out


def resolve_adaptive(corpus: BlockedCorpus, query: np.ndarray, predict, grid: list[Config], tau: float, k: int,
                     theta: float = 0.05, work: np.ndarray | None = None) -> tuple[Resolution, Config]:
    """Serve one query through the per-query funnel.

    Scans the first block, reads the evidence, predicts every configuration's target with
    ``predict`` ((K, 26) design rows -> (K,) predictions), takes the cheapest configuration clearing
    ``tau`` (:func:`choose_threshold`), extends the scan to its m1 (reusing the partial sums), keeps
    its shortlist and rescores it at its r.

    Args:
        corpus: the rotated corpus in blocks of :data:`BLOCK`.
        query: rotated query, (D,) float32.
        k: results wanted (the shortlist grows to k when k exceeds it).
        work: (K,) ``Config.work(N)`` of the grid, if the caller keeps it (computed here otherwise).

    Returns:
        (:class:`adawidth.funnel.Resolution` whose ``stage1_work`` includes the evidence and whose
        ``router_score`` is the chosen configuration's predicted agreement, the configuration).
    """
    feats, state = evidence(corpus, query, theta)
    N, D = corpus.N, corpus.D
    if work is None:
        work = np.array([c.work(N) for c in grid], dtype=np.float64)
    pred = np.asarray(predict(design(feats[None, :], grid, N, float(N * D))), dtype=np.float64)
    j = int(choose_threshold(pred[None, :], work, tau)[0])
    cfg = grid[j]
    state = corpus.extend(state, query, cfg.m1)
    rows, _ = corpus.shortlist(state, min(max(cfg.shortlist, k), N))
    partial = corpus.partial_scores(state, rows).extend(query, corpus.matrix, cfg.rescore_width)
    cos = partial.cosine()
    pos = top_k(cos, k)
    stage1 = state.work + evidence_work()
    rescoring = len(rows) * (cfg.rescore_width - cfg.m1)
    return Resolution(rows=partial.candidates[pos], scores=cos[pos], width=cfg.rescore_width, escalated=False,
                      router_score=float(pred[j]), coordinates_scored=int(stage1 + rescoring),
                      stage1_work=int(stage1), rescoring_work=int(rescoring)), cfg
