"""Shared pieces of the funnel benchmarks (``bench/frontier.py``, ``bench/adaptive.py``).

* :func:`load_embedded` — a BEIR folder encoded with the cached ONNX encoder: corpus, judged test
  queries, training queries (when the folder has a train split) and the "unseen" subset (test queries
  none of whose relevant documents any training query cites; FINDINGS.md).
* :func:`pareto_indices` — the Pareto frontier of (work, quality) points.
* :func:`bootstrap_ci` — a percentile bootstrap over queries of a paired difference.
* :func:`learned_rotation` — the rotations compared everywhere: identity (truncation), PCA, the
  orthogonal adapter (§3.1 of 001) and the adapter on top of PCA.

Glossary (docs/METHOD.md): N documents, D = 384 coordinates, Q queries, m1 stage-1 width, C shortlist
size, r rescoring width.  Work is counted in multiply-adds per query.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adawidth.rotation import pca_rotation
from bench.common import ROOT
from engine.encoder import OnnxEncoder
from engine.io.beir import available_splits, load_collection, load_qrels
from trainer.adapter import AdapterConfig, train_adapter
from trainer.embed_cache import EmbeddingCache, encode_with_cache
from trainer.export_onnx import export_encoder


@dataclass
class Embedded:
    """One collection, encoded.

    Attributes:
        name: collection name.
        X: (N, D) float32 unit-norm document embeddings.
        doc_ids: N document ids.
        test_ids, Qt, judg_t: judged test queries, their (Qtest, D) embeddings and qrels.
        train_ids, Qtr, judg_tr: training queries with a positive judgment (empty without a train split).
        unseen: (Qtest,) bool, or None without a train split.
    """

    name: str
    X: np.ndarray
    doc_ids: list[str]
    test_ids: list[str]
    Qt: np.ndarray
    judg_t: list[dict]
    train_ids: list[str]
    Qtr: np.ndarray
    judg_tr: list[dict]
    unseen: np.ndarray | None

    def positives(self, judgments: list[dict]) -> list[np.ndarray]:
        """Rows of the relevant documents of each judgment, for adapter training."""
        row_of = {d: i for i, d in enumerate(self.doc_ids)}
        return [np.array([row_of[d] for d, g in j.items() if g > 0 and d in row_of], dtype=np.int64) for j in judgments]


def load_embedded(dataset: Path, home: Path, name: str | None = None, use_train: bool = True) -> Embedded:
    """Encode a BEIR folder with the cached ONNX encoder (``home/models``, ``home/cache``)."""
    name = name or Path(dataset).name
    encoder = OnnxEncoder(export_encoder(Path(home) / "models" / "minilm-onnx"))
    col = load_collection(dataset, "test")
    doc_ids = [d.doc_id for d in col.corpus]
    cache = EmbeddingCache(Path(home) / "cache" / "embeddings.sqlite", encoder.dimension)
    try:
        X, _ = encode_with_cache(encoder, [d.encoder_text() for d in col.corpus], cache, desc=f"{name} corpus")
        test_ids = sorted(col.judged_queries())
        train_qrels = load_qrels(dataset, "train") if use_train and "train" in available_splits(dataset) else {}
        train_ids = sorted(q for q, j in train_qrels.items() if q in col.queries and any(v > 0 for v in j.values()))
        E, _ = encode_with_cache(encoder, [col.queries[q] for q in test_ids + train_ids], cache, desc=f"{name} queries")
    finally:
        cache.close()
    judg_t = [col.qrels[q] for q in test_ids]
    judg_tr = [train_qrels[q] for q in train_ids]
    unseen = None
    if train_qrels:
        cited = {d for j in train_qrels.values() for d, g in j.items() if g > 0}
        unseen = np.array([not any(d in cited for d, g in j.items() if g > 0) for j in judg_t])
    return Embedded(name, X.astype(np.float32), doc_ids, test_ids, E[: len(test_ids)].astype(np.float32), judg_t,
                    train_ids, E[len(test_ids):].astype(np.float32), judg_tr, unseen)


def add_run_arguments(parser, out: Path) -> None:
    """The arguments every funnel benchmark takes: ``--crossfit-folds``, ``--epochs`` (adapter training),
    ``--home`` (encoder and embedding cache), ``--out`` (results folder, default ``out``) and ``--seed``."""
    parser.add_argument("--crossfit-folds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--home", type=Path, default=ROOT / "var")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--seed", type=int, default=0)


def learned_rotation(kind: str, X: np.ndarray, Q_fit: np.ndarray | None, positives: list[np.ndarray] | None,
                     epochs: int = 100, seed: int = 0, R_pca: np.ndarray | None = None) -> np.ndarray:
    """A (D, D) orthogonal rotation of the given kind.

    Args:
        kind: "identity" (prefix truncation), "pca", "adapter" (from R = I) or "adapter_on_pca".
        X: (N, D) documents (PCA is fitted on them; label-free).
        Q_fit, positives: training queries (Qfit, D) and their relevant rows (adapters only).

    Raises:
        ValueError: for an adapter without training queries, or an unknown kind.
    """
    D = X.shape[1]
    if kind == "identity":
        return np.eye(D)
    R_pca = pca_rotation(X) if R_pca is None and kind in ("pca", "adapter_on_pca") else R_pca
    if kind == "pca":
        return R_pca
    if kind not in ("adapter", "adapter_on_pca"):
        raise ValueError(f"unknown rotation {kind!r}")
    if Q_fit is None or len(Q_fit) == 0:
        raise ValueError(f"rotation {kind!r} needs training queries; use pca or identity")
    base = R_pca if kind == "adapter_on_pca" else np.eye(D)
    R_l, _ = train_adapter(Q_fit @ base.T, X @ base.T, positives, AdapterConfig(epochs=epochs, seed=seed), progress=False)
    return R_l @ base


def pareto_indices(work: np.ndarray, quality: np.ndarray) -> list[int]:
    """Indices of the points no other point dominates (no more work and at least the quality), by work."""
    work, quality = np.asarray(work, float), np.asarray(quality, float)
    order = np.lexsort((-quality, work))
    out, best = [], -np.inf
    for i in order:
        if quality[i] > best:
            out.append(int(i))
            best = quality[i]
    return out


def bootstrap_ci(diff: np.ndarray, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of a paired per-query difference."""
    diff = np.asarray(diff, float)
    idx = np.random.default_rng(seed).integers(0, len(diff), (n, len(diff)))
    means = diff[idx].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
