"""Shared vs Dual low-rank adapters on SciFact by number of training queries, and what CARS picks (002).

For n in {32, 128, 512, all} training queries (a seeded random subset of SciFact train; 3 seeds), fit
Shared (M = PᵀP) and Dual (M = AᵀB) rank-16 adapters with :func:`trainer.cars.fit_operator`, score the 300
test queries by exact full-corpus search under ``qᵀ (I + M) d``, and run CARS
(:func:`trainer.cars.select_by_cars`) on the same n queries only.  Reported: NDCG@10 of each geometry on
all test queries and on the "unseen" ones (no relevant document cited by any training query — SciFact's
memorisation caveat, README), CARS's pick, whether it picked the better geometry (on all test queries),
and its regret.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.cars --out bench/results/cars
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from adawidth.metrics import ranking_metric
from adawidth.prefix import top_k
from bench.common import ROOT
from engine.encoder import OnnxEncoder
from engine.io import atomic
from engine.io.beir import load_collection, load_qrels
from trainer.cars import CarsConfig, fit_operator, make_triples, select_by_cars
from trainer.embed_cache import EmbeddingCache, encode_with_cache


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["32", "128", "512", "all"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prior-queries", type=float, default=0.0,
                    help="weight decay = this / n (0: the fixed CarsConfig.weight_decay)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cars")
    ap.add_argument("--cache", type=Path, default=ROOT / "var" / "cache" / "embeddings.sqlite")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = ROOT / "data" / "scifact"
    encoder = OnnxEncoder(ROOT / "var" / "models" / "minilm-onnx", threads=1)
    cache = EmbeddingCache(args.cache, encoder.dimension)
    col = load_collection(data, "test")
    X, _ = encode_with_cache(encoder, [d.encoder_text() for d in col.corpus], cache)
    ids = [d.doc_id for d in col.corpus]
    row = {d: i for i, d in enumerate(ids)}
    train = load_qrels(data, "train")
    tq = sorted(q for q, j in train.items() if any(g > 0 for g in j.values()))
    te = sorted(q for q, j in col.qrels.items() if any(g > 0 for g in j.values()))
    Qtr, _ = encode_with_cache(encoder, [col.queries[q] for q in tq], cache)
    Qte, _ = encode_with_cache(encoder, [col.queries[q] for q in te], cache)
    cache.close()
    positives = [np.array([row[d] for d, g in train[q].items() if g > 0], dtype=np.int64) for q in tq]
    cfg = CarsConfig(rank=args.rank, prior_queries=args.prior_queries)

    def evaluate(W: np.ndarray, cited: set) -> dict:
        nd = ranking_metric(top_k((Qte @ W) @ X.T, 10), [col.qrels[q] for q in te], "ndcg", 10, ids)
        unseen = np.array([not any(d in cited for d, g in col.qrels[q].items() if g > 0) for q in te])
        return {"all": float(nd.mean()), "unseen": float(nd[unseen].mean()), "unseen_queries": int(unseen.sum())}

    frozen = evaluate(np.eye(X.shape[1]), {d for q in tq for d, g in train[q].items() if g > 0})
    print("frozen", frozen, flush=True)
    runs = []
    for size in args.sizes:
        for seed in args.seeds:
            t0 = time.perf_counter()
            n = len(tq) if size == "all" else int(size)
            pick = np.sort(np.random.default_rng(seed).permutation(len(tq))[:n])
            cited = {d for i in pick for d, g in train[tq[i]].items() if g > 0}
            Q, pos = Qtr[pick], [positives[i] for i in pick]
            triples = make_triples(Q, X, pos, cfg, seed)
            res = {}
            for g in ("shared", "dual"):
                M = fit_operator(Q, X, triples, g, cfg, seed)["M"]
                res[g] = evaluate(np.eye(X.shape[1]) + M, cited)
            sel = select_by_cars(Q, X, pos, cfg, seed)
            better = "dual" if res["dual"]["all"] > res["shared"]["all"] else "shared"
            run = {"n": n, "size": size, "seed": seed, "shared": res["shared"], "dual": res["dual"],
                   "cars_choice": sel["choice"], "cars_score": sel["score"], "cars_splits": sel["splits"],
                   "better": better, "cars_correct": sel["choice"] == better,
                   "regret": float(res[better]["all"] - res[sel["choice"]]["all"]),
                   "seconds": round(time.perf_counter() - t0, 1)}
            runs.append(run)
            print({k: v for k, v in run.items() if k != "cars_splits"}, flush=True)
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.cars" + (
        f" --sizes {' '.join(args.sizes)}" if args.sizes != ["32", "128", "512", "all"] else "") + (
        f" --seeds {' '.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else "") + (
        f" --prior-queries {args.prior_queries:g} --out {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}"
        if args.prior_queries else "")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(args.out / "cars.json", {"command": command, "config": asdict(cfg), "frozen": frozen,
                                               "runs": runs}, sort_keys=False)
    atomic.write_text(args.out / "cars.md", to_markdown(runs, frozen, cfg, command))
    print((args.out / "cars.md").read_text())
    return 0


def to_markdown(runs: list[dict], frozen: dict, cfg, command: str) -> str:
    out = ["# CARS on SciFact: Shared vs Dual rank-{} adapters by number of training queries".format(cfg.rank), "",
           f"Command: `{command}`", "",
           f"Frozen all-MiniLM-L6-v2 (no adapter): NDCG@10 {frozen['all']:.4f} on all 300 test queries. Scoring "
           "`qᵀ(I + M)d`, exact full-corpus search; 'unseen' = test queries none of whose relevant documents is "
           "cited by the n training queries used. CARS sees only the n training queries.", "",
           "| n | seed | Shared NDCG@10 | Dual NDCG@10 | Dual − Shared | Shared / Dual (unseen) | better | CARS pick "
           "(score) | correct | regret |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        out.append(f"| {r['n']} | {r['seed']} | {r['shared']['all']:.4f} | {r['dual']['all']:.4f} | "
                   f"{r['dual']['all'] - r['shared']['all']:+.4f} | {r['shared']['unseen']:.4f} / "
                   f"{r['dual']['unseen']:.4f} ({r['shared']['unseen_queries']}) | {r['better']} | "
                   f"{r['cars_choice']} ({r['cars_score']:+.3g}) | {'yes' if r['cars_correct'] else 'no'} | "
                   f"{r['regret']:.4f} |")
    out += ["", "| n | mean Shared | mean Dual | Shared wins | CARS correct | CARS picks Dual | mean regret |",
            "|---|---|---|---|---|---|---|"]
    for n in dict.fromkeys(r["n"] for r in runs):
        rs = [r for r in runs if r["n"] == n]
        out.append(f"| {n} | {np.mean([r['shared']['all'] for r in rs]):.4f} | "
                   f"{np.mean([r['dual']['all'] for r in rs]):.4f} | {sum(r['better'] == 'shared' for r in rs)}/{len(rs)}"
                   f" | {sum(r['cars_correct'] for r in rs)}/{len(rs)} | "
                   f"{sum(r['cars_choice'] == 'dual' for r in rs)}/{len(rs)} | {np.mean([r['regret'] for r in rs]):.4f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
