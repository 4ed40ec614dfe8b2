"""The static funnel frontier: NDCG@10 against the work a whole query costs, stage 1 included.

A static funnel scans the corpus on the first ``m1`` rotated coordinates (stage 1), keeps the best
``C`` candidates and rescores them at width ``r``, reusing the stage-1 partial sums.  Its work per
query, in multiply-adds, is ``N·m1 + C·(r − m1)`` for a flat stage-1 scan (the cost model of
``adawidth.funnel.resolve``).  This script sweeps m1 × C × r on each rotation (truncation, PCA, the
orthogonal adapter, the adapter on top of PCA), evaluates every point on labelled queries the rotation
was not trained on, and writes every point, the Pareto frontier per rotation and overall, a Markdown
table and a plot.

Usage::

    .venv/bin/python -m bench.frontier --dataset data/scifact                     # train → test
    .venv/bin/python -m bench.frontier --dataset ../shared/data/cranfield --folds 5  # 5-fold CV over queries

Writes ``bench/results/frontier/frontier_<collection>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from adawidth import stage1_policy as sp
from adawidth.metrics import ranking_metric
from adawidth.prefix import exact_prefix_search
from adawidth.rotation import pca_rotation
from bench.common import ROOT
from bench.funnels import learned_rotation, load_embedded, pareto_indices
from engine.io import atomic


def pareto(points: list[dict], x: str = "work", y: str = "ndcg@10") -> list[dict]:
    """Points not dominated by another (no more work and at least the quality), by work."""
    return [points[i] for i in pareto_indices([p[x] for p in points], [p[y] for p in points])]


def sweep(X_rot: np.ndarray, Q_rot: np.ndarray, judgments: list[dict], doc_ids: list[str]) -> list[dict]:
    """Every static funnel point of :func:`adawidth.stage1_policy.default_grid` (m1 x C x r) on one rotation,
    ranked by the library's :func:`adawidth.stage1_policy.funnel_rankings`, plus the exhaustive full-width
    baseline; X_rot (N, D), Q_rot (Q, D) rotated embeddings.  Each point has its work (multiply-adds per query),
    the per-query NDCG@10 ((Q,) float64) and the mean Recall@100."""
    N, D = X_rot.shape
    grid = sp.default_grid()
    rankings = sp.funnel_rankings(X_rot, Q_rot, grid, k=100)[:, :, :min(100, N)]  # no padding rows
    out = []
    for j, c in enumerate(grid):
        out.append({"stage1_width": c.m1, "shortlist": min(c.shortlist, N), "rescore_width": c.rescore_width,
                    "work": c.work(N), "per_query_ndcg": ranking_metric(rankings[:, j], judgments, "ndcg", 10, doc_ids),
                    "recall@100": float(ranking_metric(rankings[:, j], judgments, "recall", 100, doc_ids).mean())})
    ref = exact_prefix_search(Q_rot, X_rot, D, 100)
    out.append({"stage1_width": D, "shortlist": N, "rescore_width": D, "work": int(N * D),
                "per_query_ndcg": ranking_metric(ref, judgments, "ndcg", 10, doc_ids),
                "recall@100": float(ranking_metric(ref, judgments, "recall", 100, doc_ids).mean()), "exhaustive": True})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--collection")
    p.add_argument("--folds", type=int, default=0, help="K-fold CV over the test queries (0: train → test split)")
    p.add_argument("--rotations", nargs="+", default=["identity", "pca", "adapter", "adapter_on_pca"])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--home", type=Path, default=ROOT / "var")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "frontier")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    emb = load_embedded(args.dataset, args.home, args.collection, use_train=not args.folds)
    name, X, doc_ids = emb.name, emb.X, emb.doc_ids
    test_ids, Qt, Qtr, judg_t, unseen = emb.test_ids, emb.Qt, emb.Qtr, emb.judg_t, emb.unseen
    positives = emb.positives

    R_pca = pca_rotation(X)
    # splits: (indices of evaluation queries, training embeddings, training positives)
    if args.folds:
        fold_of = np.random.default_rng(args.seed).permutation(len(test_ids)) % args.folds
        splits = [(np.flatnonzero(fold_of == f), Qt[fold_of != f], positives([judg_t[i] for i in np.flatnonzero(fold_of != f)]))
                  for f in range(args.folds)]
    else:
        splits = [(np.arange(len(test_ids)), Qtr, positives(emb.judg_tr))]
    results = {}
    t0 = time.time()
    for rot in args.rotations:
        per_query = None
        points = None
        for eval_idx, Qfit, pos in splits:
            R = learned_rotation(rot, X, Qfit, pos, args.epochs, args.seed, R_pca=R_pca)
            pts = sweep((X @ R.T).astype(np.float32), (Qt[eval_idx] @ R.T).astype(np.float32),
                        [judg_t[i] for i in eval_idx], doc_ids)
            if points is None:
                points = pts
                per_query = [np.zeros(len(test_ids)) for _ in pts]
            for k, pt in enumerate(pts):
                per_query[k][eval_idx] = pt["per_query_ndcg"]
                points[k].setdefault("_recall", []).append(pt["recall@100"] * len(eval_idx))
        for k, pt in enumerate(points):
            pt["ndcg@10"] = float(per_query[k].mean())
            if unseen is not None and unseen.any():
                pt["ndcg@10_unseen"] = float(per_query[k][unseen].mean())
            pt["recall@100"] = float(np.sum(pt.pop("_recall")) / len(test_ids))
            pt["rotation"] = rot
            pt.pop("per_query_ndcg")
        results[rot] = points
        print(f"{rot}: {len(points)} points ({time.time() - t0:.0f} s)", file=sys.stderr)

    N, D = X.shape
    all_points = [p for pts in results.values() for p in pts]
    full = next(p for p in all_points if p.get("exhaustive"))
    for p in all_points:
        p["work_ratio_to_full"] = p["work"] / full["work"]
    frontier = pareto([p for p in all_points if not p.get("exhaustive")])
    report = {
        "command": f"python -m bench.frontier --dataset {args.dataset}" + (f" --folds {args.folds}" if args.folds else ""),
        "collection": name, "documents": N, "queries": len(test_ids),
        "protocol": f"{args.folds}-fold cross-validation over the judged test queries" if args.folds
                    else "adapters trained on the train split, scored on the test split",
        "unseen_queries": int(unseen.sum()) if unseen is not None else None,
        "cost_model": "multiply-adds per query = N*m1 (flat stage-1 scan) + C*(r - m1) (rescoring reuses stage-1 sums)",
        "full_width_exhaustive": {"ndcg@10": full["ndcg@10"], "work": full["work"]},
        "frontier": frontier, "points": all_points,
        "frontier_by_rotation": {r: pareto([p for p in pts if not p.get("exhaustive")]) for r, pts in results.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(args.out / f"frontier_{name}.json", json.dumps(report, indent=1))
    md = [f"# Static funnel frontier on {name} ({N} documents, {len(test_ids)} judged queries)", "",
          f"Protocol: {report['protocol']}. Cost model: {report['cost_model']}.", "",
          f"Command: `{report['command']}`", "",
          f"Exhaustive full-width search: NDCG@10 {full['ndcg@10']:.4f} at {full['work']:,} multiply-adds per query.", "",
          "Pareto frontier over all rotations:", "",
          "| rotation | stage-1 width | shortlist | rescore width | multiply-adds / query | × full | NDCG@10 | "
          "NDCG@10 unseen | Recall@100 |", "|---|---|---|---|---|---|---|---|---|"]
    for p in frontier:
        md.append(f"| {p['rotation']} | {p['stage1_width']} | {p['shortlist']} | {p['rescore_width']} | {p['work']:,} | "
                  f"{p['work_ratio_to_full']:.3f} | {p['ndcg@10']:.4f} | "
                  f"{p.get('ndcg@10_unseen', float('nan')):.4f} | {p['recall@100']:.4f} |")
    md += ["", "Best point per rotation within 0.5 % of full-width NDCG@10 (least work):", "",
           "| rotation | stage-1 width | shortlist | rescore width | × full | NDCG@10 |", "|---|---|---|---|---|---|"]
    for rot, pts in results.items():
        ok = [p for p in pts if not p.get("exhaustive") and p["ndcg@10"] >= 0.995 * full["ndcg@10"]]
        if ok:
            b = min(ok, key=lambda p: p["work"])
            md.append(f"| {rot} | {b['stage1_width']} | {b['shortlist']} | {b['rescore_width']} | "
                      f"{b['work_ratio_to_full']:.3f} | {b['ndcg@10']:.4f} |")
        else:
            md.append(f"| {rot} | – | – | – | – | none within 0.5 % |")
    atomic.write_text(args.out / f"frontier_{name}.md", "\n".join(md) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for rot, pts in results.items():
            pts = [p for p in pts if not p.get("exhaustive")]
            ax.scatter([p["work_ratio_to_full"] for p in pts], [p["ndcg@10"] for p in pts], s=10, alpha=0.5, label=rot)
            fr = pareto(pts)
            ax.plot([p["work_ratio_to_full"] for p in fr], [p["ndcg@10"] for p in fr], lw=1)
        ax.axhline(full["ndcg@10"], color="k", ls="--", lw=0.8, label="full width (exhaustive)")
        ax.set_xscale("log")
        ax.set_xlabel("multiply-adds per query / exhaustive full width")
        ax.set_ylabel("NDCG@10")
        ax.set_title(f"Static funnels on {name}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out / f"frontier_{name}.png", dpi=110)
    except ImportError:
        pass
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
