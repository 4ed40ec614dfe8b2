"""The served difficulty head of a version (``trainer build --tiers``): oracle tier labels on held-out training
queries, then the post-hoc head of Eq. (2) of 000 on the frozen query embeddings.

Labels (documented in docs/METHOD.md, "DART tiers"):

* the candidates of a query are the frozen bi-encoder's exact full-width top 50 (``RERANK_DEPTH``);
* the three tiers rank them: ``mips`` keeps the bi-encoder's order, ``maxsim`` reorders by late interaction over
  the served encoder's token embeddings, ``cross_encoder`` by the fine-tuned cross-encoder's score (the same
  :mod:`engine.scorers` scorers the gateway runs);
* t* is the cheapest tier whose NDCG@10 is best (:func:`adawidth.tiers.oracle_tier`, exact ties go to the cheaper
  tier, so a query every tier answers equally well is labelled ``mips``);
* only training queries the cross-encoder was **not** trained on are labelled (its export lists them): on its own
  training queries the cross-encoder looks better than it is, and the head would over-route to it.

The joint variant of Eq. (2) (the head trained with the encoder's loss) lives in ``trainer.dart.finetune``; the
served encoder here is frozen, so the served head is the post-hoc one (the ablation of §4.2).
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from adawidth.metrics import ranking_metric
from adawidth.tiers import RERANK_DEPTH, TIERS, oracle_tier, predict_tier
from engine.scorers import MaxSimScorer, rerank_order
from trainer.dart.difficulty import fit_posthoc
from trainer.dart.finetune import rank

log = logging.getLogger(__name__)


def tier_quality(encoder, cross_encoder, X: np.ndarray, doc_texts: Sequence[str], doc_ids: Sequence[str],
                 query_texts: Sequence[str], Q: np.ndarray, judgments: Sequence[Mapping[str, int]], *,
                 depth: int = RERANK_DEPTH, progress: bool = True, candidates: np.ndarray | None = None) -> dict:
    """NDCG@10 of each tier on each query, and the rankings behind it.

    Args:
        encoder: :class:`engine.encoder.OnnxEncoder` (token embeddings for MaxSim).
        cross_encoder: :class:`engine.scorers.CrossEncoderScorer`.
        X: (N, D) float32 unit document embeddings; Q: (B, D) float32 unit query embeddings.
        doc_texts, doc_ids: N encoder texts and ids; query_texts: B texts; judgments: B qrels dicts.
        candidates: (B, depth) int64 rows the tiers rerank, best first: the served first stage's top-``depth``
            (the build passes the pipeline's, so labels rerank what serving reranks); None: the exact
            full-width top-``depth`` of ``Q`` over ``X``.

    Returns:
        ``{"ndcg10": (B, T) float64 in TIERS order, "rankings": {tier: (B, depth) int64 rows}}``.
    """
    cand = (rank(np.asarray(Q, dtype=np.float32), np.asarray(X, dtype=np.float32), depth) if candidates is None
            else np.asarray(candidates, dtype=np.int64))
    maxsim = MaxSimScorer(encoder, cache_documents=len(np.unique(cand)))
    ranks = {t: np.empty_like(cand) for t in TIERS}
    for i in tqdm(range(len(query_texts)), desc="tier labels", unit="query", disable=not progress):
        rows = cand[i]
        texts = [doc_texts[r] for r in rows]
        ranks["mips"][i] = rows
        ranks["maxsim"][i] = rows[rerank_order(maxsim.score(query_texts[i], "labels", rows, texts))]
        ranks["cross_encoder"][i] = rows[rerank_order(cross_encoder.score(query_texts[i], texts))]
    ndcg = np.stack([ranking_metric(ranks[t], judgments, "ndcg", 10, doc_ids) for t in TIERS], axis=1)
    return {"ndcg10": ndcg.reshape(len(query_texts), len(TIERS)), "rankings": ranks}


def fit_head(Q: np.ndarray, ndcg: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Oracle labels and the post-hoc head (class-balanced multinomial logistic regression, no bias).

    Args:
        Q: (B, D) float32 query embeddings; ndcg: (B, T) per-tier NDCG@10 (TIERS order).

    Returns:
        (W of shape (T, D) float32, a report: label counts, per-tier mean NDCG@10, in-sample accuracy and the
        in-sample NDCG@10 of head routing and of oracle routing).
    """
    t_star = oracle_tier(ndcg)
    W = fit_posthoc(Q, t_star, seed=seed)
    pred = predict_tier(W, Q)
    idx = np.arange(len(t_star))
    report = {
        "classes": list(TIERS),
        "queries": int(len(t_star)),
        "oracle_counts": {t: int((t_star == j).sum()) for j, t in enumerate(TIERS)},
        "predicted_counts": {t: int((pred == j).sum()) for j, t in enumerate(TIERS)},
        "tier_ndcg10": {t: float(ndcg[:, j].mean()) for j, t in enumerate(TIERS)},
        "head_routed_ndcg10": float(ndcg[idx, pred].mean()),
        "oracle_routed_ndcg10": float(ndcg[idx, t_star].mean()),
        "in_sample_accuracy": float((pred == t_star).mean()),
        "oracle": "cheapest tier whose NDCG@10 on the top-50 is best (exact ties: the cheaper tier)",
        "fit": "post hoc: class-balanced multinomial logistic regression on frozen query embeddings (Eq. 2 of 000)",
    }
    return W, report
