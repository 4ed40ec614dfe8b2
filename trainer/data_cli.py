"""Trainer commands over a BEIR folder's data: shipped embeddings and TREC run files.

  ship-embeddings   write <dataset>/embeddings/<hash>.npz: every document and query vector of the encoder
  seed-embeddings   check the shipped file against the encoder (sample re-encoded) and seed the embedding cache
  evaluate          rank a split's judged queries with an index version under one or more width policies;
                    print NDCG@10 / Recall@100 and write TREC run files (--run-file)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from adawidth.metrics import ndcg_at_k, recall_at_k
from engine.encoder import OnnxEncoder
from engine.index import IndexVersion
from engine.version.store import resolve_version_path
from engine.io.beir import DatasetFormatError, load_collection
from engine.pipeline import Pipeline
from engine.plan import PlanError, SearchSpec
from engine.version import store
from engine.version.manifest import Expect
from trainer.embed_cache import EmbeddingCache, encode_with_cache
from trainer.export_onnx import export_encoder
from trainer.shipped_embeddings import MIN_COSINE, SAMPLE_DOCUMENTS, SAMPLE_QUERIES, seed_cache, write_shipped
from trainer.trec_run import run_from_lists, write_trec_run

COMMANDS = ("ship-embeddings", "seed-embeddings", "evaluate")


def _width(text: str) -> str | int:
    if text in ("auto", "full"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"width must be 'auto', 'full' or an integer, got {text!r}") from None


def add_commands(sub) -> None:
    """Register the commands on the trainer's subparsers."""
    f = argparse.ArgumentDefaultsHelpFormatter
    s = sub.add_parser("ship-embeddings", formatter_class=f,
                       help="write a BEIR folder's document and query embeddings for the repository")
    s.add_argument("--dataset", type=Path, required=True)
    s.add_argument("--out", type=Path, help="output file (default <dataset>/embeddings/<fingerprint hash>.npz)")

    d = sub.add_parser("seed-embeddings", formatter_class=f,
                       help="check a BEIR folder's shipped embeddings and seed the embedding cache with them")
    d.add_argument("--dataset", type=Path, required=True)
    d.add_argument("--file", type=Path, help="a shipped file (default: the one of this encoder under <dataset>/embeddings)")
    d.add_argument("--sample-documents", type=int, default=SAMPLE_DOCUMENTS, help="documents re-encoded by the check")
    d.add_argument("--sample-queries", type=int, default=SAMPLE_QUERIES, help="queries re-encoded by the check")
    d.add_argument("--seed", type=int, default=0, help="seed of the sample")
    d.add_argument("--min-cosine", type=float, default=MIN_COSINE, help="smallest cosine the sample may show")

    e = sub.add_parser("evaluate", formatter_class=f,
                       help="rank a split's judged queries with an index version; TREC run files out")
    e.add_argument("--dataset", type=Path, required=True, help="BEIR folder (queries and qrels)")
    e.add_argument("--collection", help="collection of the index version (default: the folder name)")
    e.add_argument("--version", help="index version (default: the collection's live one)")
    e.add_argument("--split", default="test", help="qrels split whose judged queries are ranked")
    e.add_argument("--width", type=_width, nargs="+", default=["auto"],
                   help="policies: 'auto' (the version's default policy, or --policy), 'full', or prefix widths")
    e.add_argument("--policy", choices=("recall", "router", "funnel"), help="policy of 'auto' (default: the version's)")
    e.add_argument("--recall-target", type=float, help="recall@k target of policy 'recall' (default 0.99)")
    e.add_argument("--rho", type=float, help="escalation fraction of policy 'router' (default: the version's)")
    e.add_argument("--k", type=int, default=100, help="documents per query in the ranking and the run file")
    e.add_argument("--run-file", type=Path, help="TREC run file; with several policies, <stem>.<policy><suffix>")
    e.add_argument("--tag", help="run tag (default adawidth-<policy>)")
    e.add_argument("--json", type=Path, help="also write the summary (metrics per policy) here")


def run(args, settings) -> int:
    """Run one of :data:`COMMANDS`; returns the exit status."""
    try:
        if args.command == "ship-embeddings":
            return _ship(args, settings)
        if args.command == "seed-embeddings":
            return _seed(args, settings)
        return _evaluate(args, settings)
    except DatasetFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _encoder(settings):
    export_encoder(settings.encoder_dir)
    return OnnxEncoder(settings.encoder_dir, threads=settings.encoder_threads)


def _ship(args, settings) -> int:
    encoder = _encoder(settings)
    cache = EmbeddingCache(settings.embedding_cache, encoder.dimension)
    try:
        path, meta = write_shipped(args.dataset, encoder, cache, args.out,
                                   command=f"python -m trainer ship-embeddings --dataset {args.dataset}")
    finally:
        cache.close()
    print(json.dumps({"file": str(path), "bytes": path.stat().st_size,
                      **{k: meta[k] for k in ("documents", "queries", "fingerprint")}}))
    return 0


def _seed(args, settings) -> int:
    encoder = _encoder(settings)
    cache = EmbeddingCache(settings.embedding_cache, encoder.dimension)
    try:
        report = seed_cache(args.dataset, encoder, cache, sample_documents=args.sample_documents,
                            sample_queries=args.sample_queries, seed=args.seed, min_cosine=args.min_cosine,
                            path=args.file)
    finally:
        cache.close()
    if report.fallback:  # loud on the terminal too, not only in the log
        print(f"WARNING: {report.message}", file=sys.stderr)
    print(json.dumps(report.as_dict()))
    return 0


def policy_label(width, rho: float | None = None, recall_target: float | None = None, policy: str | None = None) -> str:
    """File-name-safe label of a policy: ``full``, ``64``, ``auto`` (the default policy), ``router-rho0.2``,
    ``recall-0.99``."""
    if width != "auto":
        return str(width)
    if rho is not None or policy == "router":
        return "router" if rho is None else f"router-rho{rho:g}"
    if recall_target is not None or policy == "recall":
        return "recall" if recall_target is None else f"recall-{recall_target:g}"
    return policy or "auto"


def rank_with_version(version, embeddings, k: int, width, rho: float | None = None, *,
                      policy: str | None = None, recall_target: float | None = None, texts=None):
    """Rank encoded queries through the gateway's pipeline (:class:`engine.pipeline.Pipeline`) on a version.

    Args:
        version: a loaded :class:`engine.index.IndexVersion`.
        embeddings: (Q, D) float32 unit-norm query embeddings.
        k: documents per query.
        width: "auto", "full" or an int prefix width.
        rho: escalation fraction of the router (implies policy "router").
        policy, recall_target: the "auto" policy and the recall target (None: the version's defaults).
        texts: the query texts (Q,), or None (dense ranking needs none).

    Returns:
        (ranked document ids per query, their scores per query; higher is better).

    Raises:
        engine.plan.PlanError: a policy the version cannot serve.
    """
    if rho is not None:
        policy = "router"
    texts = texts or ["query"] * len(embeddings)
    specs = [SearchSpec(query=t, k=k, width=width, policy=policy, rho=rho, recall_target=recall_target)
             for t in texts]
    results = Pipeline().search(version, specs, embeddings=np.asarray(embeddings, dtype=np.float32))
    return [list(r.ids) for r in results], [[float(s) for s in r.scores] for r in results]


def _evaluate(args, settings) -> int:
    col = load_collection(args.dataset, args.split)
    collection = args.collection or col.name
    encoder = _encoder(settings)
    try:
        path = resolve_version_path(settings.index_root, collection, args.version)
        version = IndexVersion.load(path, expect=Expect.of_encoder(encoder, collection=collection))
    except store.IndexVersionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    judged = col.judged_queries()
    qids = sorted(judged)
    cache = EmbeddingCache(settings.embedding_cache, encoder.dimension)
    try:
        emb, _ = encode_with_cache(encoder, [judged[q] for q in qids], cache, desc=f"encoding {col.name} queries")
    finally:
        cache.close()
    rows = []
    for w in args.width:
        label = policy_label(w, args.rho, args.recall_target, args.policy)
        try:
            ids, scores = rank_with_version(version, emb, args.k, w, args.rho if w == "auto" else None,
                                            policy=args.policy if w == "auto" else None,
                                            recall_target=args.recall_target if w == "auto" else None,
                                            texts=[judged[q] for q in qids])
        except PlanError as e:
            print(f"error: [{e.code}] {e.message}", file=sys.stderr)
            return 2
        row = {"policy": label, "queries": len(qids),
               "ndcg@10": float(np.mean([ndcg_at_k(r, col.qrels[q], 10) for q, r in zip(qids, ids)])),
               "recall@100": float(np.mean([recall_at_k(r, col.qrels[q], 100) for q, r in zip(qids, ids)]))}
        if args.run_file is not None:
            out = args.run_file if len(args.width) == 1 else \
                args.run_file.with_name(f"{args.run_file.stem}.{label}{args.run_file.suffix}")
            row["run_file"] = str(out)
            row["scores_adjusted"] = write_trec_run(out, run_from_lists(qids, ids, scores),
                                                    args.tag or f"adawidth-{label}")
        rows.append(row)
    summary = {"collection": collection, "version": version.version, "split": args.split, "k": args.k,
               "rotation": version.manifest.adapter.kind if version.manifest.adapter else None, "policies": rows}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return 0
