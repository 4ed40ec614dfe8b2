"""Dense, lexical (BM25) and hybrid NDCG@10 / Recall@100 through the served code path, per collection.

For each collection an index version is built by the real trainer (PCA rotation, no adapter or router, so
the classic collections without a training split are treated alike), loaded with
:class:`engine.index.IndexVersion`, and every judged test query is answered by
:class:`engine.pipeline.Pipeline` — what the gateway runs — in each lane:

* dense at ``width: "full"`` (the frozen encoder, exact) and at width 128 (stage 1 at 64, rescoring);
* lexical (bm25s, k1 = 0.9, b = 0.4, the reference figures' parameters and analyzer family);
* hybrid RRF (k = 60) and hybrid convex (alpha = 0.5), both over dense at full width, depth 100.

Query quote characters are removed first: these collections' queries are not written in our exact-phrase
syntax.  The BM25 reference of shared/data/SOURCES.md is printed beside ours; for Cranfield (graded) the
table also gives NDCG@10 with gain 2^rel − 1, the convention of that reference.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.hybrid --out bench/results/hybrid
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from adawidth.metrics import ranking_metric
from bench.common import ROOT
from engine.encoder import OnnxEncoder
from engine.index import IndexVersion
from engine.io import atomic
from engine.io.beir import load_collection
from engine.pipeline import Pipeline
from engine.plan import PlanDefaults, SearchSpec
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.embed_cache import EmbeddingCache, encode_with_cache

DATA = Path(os.environ.get("ADAWIDTH_SHARED_DATA", ROOT.parent.parent / "shared" / "data"))
COLLECTIONS = {"scifact": ROOT / "data" / "scifact", "cranfield": None, "cisi": None, "medline": None, "cacm": None,
               "npl": None}
BM25_REFERENCE = {"cranfield": (0.3113, 0.6858), "cisi": (0.2304, 0.3573), "medline": (0.6630, 0.7731),
                  "cacm": (0.3461, 0.5504), "npl": (0.3741, 0.4775)}
"""SOURCES.md: nDCG@10 (gain 2^rel − 1 on graded Cranfield) and R@100 of a BM25 (k1 0.9, b 0.4, lower-case
alphanumeric tokens, no stemming, no stop words)."""

LANES = {
    "dense full": dict(mode="dense", width="full"),
    "dense 128": dict(mode="dense", width=128),
    "lexical": dict(mode="lexical", width="full"),
    "hybrid rrf": dict(mode="hybrid", width="full", fusion="rrf"),
    "hybrid convex": dict(mode="hybrid", width="full", fusion="convex"),
    "hybrid rrf 128": dict(mode="hybrid", width=128, fusion="rrf"),
}


def run_collection(name: str, folder: Path, encoder, home: Path, cache_path: Path) -> dict:
    settings = TrainerSettings(home=home, encoder_dir=ROOT / "var" / "models" / "minilm-onnx", redis_url=None,
                               embedding_cache=cache_path).resolved()
    t0 = time.perf_counter()
    path, manifest = build_index(BuildOptions(dataset=folder, collection=name, train_split=None, rotation="pca",
                                              action_pairs=((64, 128),), capacity=False, publish=False),
                                 settings, encoder)
    build_s = time.perf_counter() - t0
    version = IndexVersion.load(path)
    col = load_collection(folder, "test")
    judged = col.judged_queries()
    texts = {q: t.replace('"', " ").replace("\u201c", " ").replace("\u201d", " ") for q, t in judged.items()}
    quoted = sum(texts[q] != judged[q] for q in judged)
    cache = EmbeddingCache(cache_path, encoder.dimension)
    qids = sorted(judged)
    emb, _ = encode_with_cache(encoder, [texts[q] for q in qids], cache, desc=f"{name} queries")
    cache.close()
    emb_of = {texts[q]: e for q, e in zip(qids, emb)}
    graded = any(g > 1 for j in col.qrels.values() for g in j.values())
    rows = {}
    for lane, cfg in LANES.items():
        pipe, defaults = Pipeline(), PlanDefaults(hybrid_alpha=0.5, hybrid_depth=100)
        ranked, secs = [], []
        for q in qids:
            s = time.perf_counter()
            spec = SearchSpec(query=texts[q], k=100, width=cfg["width"], mode=cfg["mode"],
                              fusion=cfg.get("fusion", "rrf"))
            got = pipe.search(version, [spec], embeddings=emb_of[texts[q]][None, :], defaults=defaults)[0]
            secs.append(time.perf_counter() - s)
            ranked.append(got.ids)
        judged = [col.qrels[q] for q in qids]
        nd, rc = ranking_metric(ranked, judged, "ndcg", 10), ranking_metric(ranked, judged, "recall", 100)
        nd_exp = ranking_metric(ranked, [{d: 2 ** g - 1 for d, g in j.items()} for j in judged], "ndcg", 10)
        rows[lane] = {"ndcg@10": float(np.mean(nd)), "recall@100": float(np.mean(rc)),
                      "ndcg@10_exp_gain": float(np.mean(nd_exp)) if graded else None,
                      "ms_per_query": 1000 * float(np.mean(secs)), "per_query_ndcg@10": [float(x) for x in nd]}
    # where each lane wins: per-query NDCG@10 comparison of dense full vs lexical
    d, lx = np.array(rows["dense full"]["per_query_ndcg@10"]), np.array(rows["lexical"]["per_query_ndcg@10"])
    return {"collection": name, "documents": version.size, "queries": len(qids), "graded": graded,
            "queries_with_quotes_removed": quoted, "version": manifest.version, "build_seconds": round(build_s, 1),
            "lanes": rows, "dense_better_queries": int((d > lx).sum()), "lexical_better_queries": int((lx > d).sum()),
            "bm25_reference": BM25_REFERENCE.get(name)}


def to_markdown(results: list[dict], command: str) -> str:
    lanes = list(LANES)
    out = ["# Dense, lexical and hybrid lanes through the served code path", "",
           f"Command: `{command}`", "",
           "Every figure comes from `engine.pipeline.Pipeline` (what `POST /v1/search` runs) on an index version "
           "built by the trainer (PCA rotation, no adapter/router). Judged test queries; NDCG@10 uses the label as "
           "gain (trec_eval's `ndcg_cut`). Ratios are against `dense full` (the frozen encoder, exact).", "",
           "## NDCG@10", "",
           "| collection | docs | queries | " + " | ".join(lanes) + " | BM25 reference (SOURCES.md) |",
           "|---|---|---|" + "---|" * len(lanes) + "---|"]
    for r in results:
        base = r["lanes"]["dense full"]["ndcg@10"]
        cells = [f"{r['lanes'][l]['ndcg@10']:.4f} ({r['lanes'][l]['ndcg@10'] / base:.2f}×)" if l != "dense full"
                 else f"{base:.4f}" for l in lanes]
        ref = r["bm25_reference"]
        out.append(f"| {r['collection']} | {r['documents']:,} | {r['queries']} | " + " | ".join(cells) +
                   f" | {ref[0]:.4f} |" if ref else f"| {r['collection']} | {r['documents']:,} | {r['queries']} | "
                   + " | ".join(cells) + " | — |")
    out += ["", "## Recall@100", "", "| collection | " + " | ".join(lanes) + " | BM25 reference |",
            "|---|" + "---|" * len(lanes) + "---|"]
    for r in results:
        ref = r["bm25_reference"]
        out.append(f"| {r['collection']} | " + " | ".join(f"{r['lanes'][l]['recall@100']:.4f}" for l in lanes) +
                   f" | {ref[1]:.4f} |" if ref else f"| {r['collection']} | " +
                   " | ".join(f"{r['lanes'][l]['recall@100']:.4f}" for l in lanes) + " | — |")
    out += ["", "## Notes per collection", "",
            "| collection | lexical NDCG@10 with gain 2^rel−1 (reference's convention) | queries dense > lexical | "
            "lexical > dense | queries whose quotes were removed | ms/query dense full / lexical / hybrid rrf |",
            "|---|---|---|---|---|---|"]
    for r in results:
        lx = r["lanes"]["lexical"]["ndcg@10_exp_gain"]
        ms = " / ".join(f"{r['lanes'][l]['ms_per_query']:.1f}" for l in ("dense full", "lexical", "hybrid rrf"))
        out.append(f"| {r['collection']} | {lx:.4f} |" if lx is not None else f"| {r['collection']} | (binary: as above) |")
        out[-1] += f" {r['dense_better_queries']} | {r['lexical_better_queries']} | {r['queries_with_quotes_removed']} | {ms} |"
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hybrid")
    ap.add_argument("--cache", type=Path, default=ROOT / "var" / "cache" / "embeddings.sqlite")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    encoder = OnnxEncoder(ROOT / "var" / "models" / "minilm-onnx", threads=1)
    results = []
    with tempfile.TemporaryDirectory() as home:
        for name in args.collections:
            folder = COLLECTIONS.get(name) or DATA / name
            r = run_collection(name, folder, encoder, Path(home), args.cache)
            print(name, {k: round(v["ndcg@10"], 4) for k, v in r["lanes"].items()}, flush=True)
            results.append(r)
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.hybrid" + (
        f" --collections {' '.join(args.collections)}" if args.collections != list(COLLECTIONS) else "")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(args.out / "hybrid.json", json.dumps({"command": command, "results": results}, indent=1))
    atomic.write_text(args.out / "hybrid.md", to_markdown(results, command))
    print((args.out / "hybrid.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
