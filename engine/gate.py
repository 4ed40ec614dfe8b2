"""Quality gate before a promotion: shadow-evaluate a candidate against the live version.

Configured per collection by an optional file ``<index_root>/<collection>/gate.json``
(no file: no gate), e.g.::

    {"dataset": "/data/scifact", "split": "test", "max_queries": 200, "width": "auto",
     "ndcg_margin": 0.01, "overlap_margin": 0.3, "top1_margin": 0.3}

The held-out queries are the BEIR folder's ``queries.jsonl`` restricted to the
queries judged in ``qrels/<split>.tsv``.  With labels (``split`` given) the
decision is NDCG@10: refuse when ``ndcg_candidate < ndcg_live - ndcg_margin``.
Without labels (``split`` null: every query of ``queries.jsonl``, up to
``max_queries``) the decision is label-free agreement with live: refuse when the
mean top-10 overlap ``|top10_c ∩ top10_live| / 10`` is below ``1 - overlap_margin``
or the top-1 agreement rate is below ``1 - top1_margin`` (live agrees with
itself at 1.0, so the margins are how much worse than live is tolerated).
Both versions answer through :class:`engine.pipeline.Pipeline` at the
configured width policy, on the same query embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from adawidth.metrics import per_query
from engine.io.beir import load_qrels, load_queries
from engine.pipeline import Pipeline
from engine.plan import PlanError, SearchSpec

GATE_FILE = "gate.json"


class GateConfig(BaseModel):
    """The per-collection gate (``gate.json``)."""

    model_config = ConfigDict(extra="forbid")

    dataset: Path = Field(description="BEIR folder with queries.jsonl (and qrels/<split>.tsv); relative paths are "
                                      "relative to the collection directory.")
    split: str | None = Field("test", description="qrels split giving labels; null: label-free agreement with live.")
    max_queries: int = Field(200, ge=1, description="Held-out queries evaluated (the first ones, by query id order).")
    width: Literal["auto", "full"] | int = Field("auto", description="Width policy both versions answer with.")
    ndcg_margin: float = Field(0.01, ge=0, description="Largest NDCG@10 drop below live tolerated (absolute).")
    overlap_margin: float = Field(0.3, ge=0, le=1, description="Label-free: refuse when mean top-10 overlap < 1 - this.")
    top1_margin: float = Field(0.3, ge=0, le=1, description="Label-free: refuse when top-1 agreement < 1 - this.")


def load_gate_config(collection_dir: Path | str) -> GateConfig | None:
    """The collection's gate, or None when it has no ``gate.json``.

    Raises:
        ValueError: the file is not a valid gate configuration.
    """
    path = Path(collection_dir) / GATE_FILE
    if not path.is_file():
        return None
    cfg = GateConfig.model_validate(json.loads(path.read_text(encoding="utf-8")))
    if not cfg.dataset.is_absolute():
        cfg = cfg.model_copy(update={"dataset": (Path(collection_dir) / cfg.dataset).resolve()})
    return cfg


@dataclass
class HeldOut:
    """Held-out queries: ids, texts, and judgments (empty dicts when label-free)."""

    ids: list[str]
    texts: list[str]
    qrels: dict[str, dict[str, int]]


def held_out_queries(cfg: GateConfig) -> HeldOut:
    """Read the gate's queries (and labels).  Raises :class:`engine.io.beir.DatasetFormatError`."""
    queries = load_queries(cfg.dataset)
    qrels = load_qrels(cfg.dataset, cfg.split) if cfg.split else {}
    ids = sorted(q for q in (qrels if cfg.split else queries) if q in queries
                 and (not cfg.split or any(g > 0 for g in qrels[q].values())))[: cfg.max_queries]
    return HeldOut(ids, [queries[q] for q in ids], {q: qrels[q] for q in ids} if cfg.split else {})


def evaluate_gate(cfg: GateConfig, live, candidate, embeddings: np.ndarray, held: HeldOut) -> dict:
    """Shadow-evaluate ``candidate`` against ``live``; returns the report recorded in the registry history.

    Args:
        cfg: the gate.
        live, candidate: loaded :class:`engine.index.IndexVersion` objects.
        embeddings: unit-norm query embeddings, float32, shape (n, D), in ``held.ids`` order.
        held: the held-out queries.

    Returns:
        ``{"passed": bool, "reason": str, "metric": "ndcg@10"|"agreement", "queries": n, "width": ...,
        "live": {...}, "candidate": {...}, "top10_overlap": float, "top1_agreement": float}``;
        scores are means over the queries (NDCG@10 in [0, 1], higher is better).
    """
    if len(held.ids) == 0:
        return {"passed": False, "reason": "quality_gate: no held-out queries", "queries": 0}
    width = cfg.width
    runs = {}
    pipe = Pipeline()
    for name, v in (("live", live), ("candidate", candidate)):
        try:
            results = pipe.search(v, [SearchSpec(query=t, k=10, width=width) for t in held.texts],
                                  embeddings=embeddings)
        except PlanError as e:
            return {"passed": False, "reason": f"quality_gate: {name} version {v.version} cannot serve width "
                                               f"{width!r} ({e.code}: {e})", "queries": len(held.ids)}
        runs[name] = {q: r.ids for q, r in zip(held.ids, results)}
    overlap = float(np.mean([len(set(runs["live"][q]) & set(runs["candidate"][q])) / 10 for q in held.ids]))
    top1 = float(np.mean([runs["live"][q][:1] == runs["candidate"][q][:1] for q in held.ids]))
    report = {"queries": len(held.ids), "width": width, "top10_overlap": round(overlap, 6),
              "top1_agreement": round(top1, 6), "live_version": live.version, "candidate_version": candidate.version}
    if held.qrels:
        nd = {n: float(np.mean(list(per_query(runs[n], held.qrels, "ndcg", 10).values()))) for n in runs}
        passed = nd["candidate"] >= nd["live"] - cfg.ndcg_margin
        report.update(metric="ndcg@10", live=round(nd["live"], 6), candidate=round(nd["candidate"], 6),
                      margin=cfg.ndcg_margin, passed=passed,
                      reason=("quality_gate: passed" if passed else
                              f"quality_gate: NDCG@10 {nd['candidate']:.4f} is worse than live {nd['live']:.4f} by "
                              f"more than {cfg.ndcg_margin} on {len(held.ids)} held-out queries"))
    else:
        passed = overlap >= 1 - cfg.overlap_margin and top1 >= 1 - cfg.top1_margin
        report.update(metric="agreement", overlap_margin=cfg.overlap_margin, top1_margin=cfg.top1_margin,
                      passed=passed,
                      reason=("quality_gate: passed" if passed else
                              f"quality_gate: top-10 overlap {overlap:.3f} (min {1 - cfg.overlap_margin:.3f}) / "
                              f"top-1 agreement {top1:.3f} (min {1 - cfg.top1_margin:.3f}) with live on "
                              f"{len(held.ids)} label-free queries"))
    return report


def run_gate(collection_dir: Path | str, live, candidate, encoder) -> dict | None:
    """Load the collection's gate and evaluate it (None when no gate is configured).

    Raises:
        ValueError / engine.io.beir.DatasetFormatError: invalid gate configuration or query files.
    """
    cfg = load_gate_config(collection_dir)
    if cfg is None:
        return None
    held = held_out_queries(cfg)
    emb = encoder.encode(held.texts) if held.texts else np.empty((0, 0), dtype=np.float32)
    return evaluate_gate(cfg, live, candidate, np.asarray(emb, dtype=np.float32), held)
