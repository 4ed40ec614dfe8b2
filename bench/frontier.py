"""The static funnel frontier: NDCG@10 against the work a whole query costs, stage 1 included.

A static funnel scans the corpus on the first ``m1`` rotated coordinates (stage 1), keeps the best
``C`` candidates and rescores them at width ``r``, reusing the stage-1 partial sums.  Its work per
query, in multiply-adds, is ``N·m1 + C·(r − m1)`` for a flat stage-1 scan (the cost model of
``adawidth.funnel.resolve``).  This script sweeps m1 × C × r on each rotation (truncation, PCA, the
orthogonal adapter, the adapter on top of PCA), evaluates every point on labelled queries the rotation
was not trained on, and writes every point, the Pareto frontier per rotation and overall, a Markdown
table and a plot.

Usage::

    .venv/bin/python bench/frontier.py --dataset data/scifact                     # train → test
    .venv/bin/python bench/frontier.py --dataset ../shared/data/cranfield --folds 5  # 5-fold CV over queries

Writes ``bench/results/frontier/frontier_<collection>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adawidth.funnel import exact_stage1_batch, resolve  # noqa: E402
from adawidth.metrics import ndcg_at_k, recall_at_k  # noqa: E402
from adawidth.prefix import exact_prefix_search, prefix_normalize  # noqa: E402
from adawidth.rotation import pca_rotation  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from funnels import learned_rotation, load_embedded, pareto_indices  # noqa: E402

STAGE1_WIDTHS = (16, 32, 48, 64)
SHORTLISTS = (100, 200, 500, 1000)
RESCORE_WIDTHS = (128, 256, 384)


def pareto(points: list[dict], x: str = "work", y: str = "ndcg@10") -> list[dict]:
    """Points not dominated by another (no more work and at least the quality), by work."""
    return [points[i] for i in pareto_indices([p[x] for p in points], [p[y] for p in points])]


def sweep(X_rot: np.ndarray, Q_rot: np.ndarray, judgments: list[dict], doc_ids: list[str],
          unseen: np.ndarray | None) -> list[dict]:
    """Every static funnel point on one rotation; X_rot (N, D), Q_rot (Q, D) rotated embeddings."""
    N, D = X_rot.shape
    out = []
    for m1 in STAGE1_WIDTHS:
        Xp = prefix_normalize(X_rot, m1)
        sq = np.einsum("ij,ij->i", X_rot[:, :m1], X_rot[:, :m1])
        rows_all, sc_all = exact_stage1_batch(Q_rot, Xp, m1, max(SHORTLISTS))
        for C in SHORTLISTS:
            C_eff = min(C, N)
            for r in RESCORE_WIDTHS:
                nd, rc = [], []
                for i in range(len(Q_rot)):
                    res = resolve(Q_rot[i], X_rot, sq, rows_all[i, :C_eff], sc_all[i, :C_eff], m0=m1, k=100, width=r)
                    ranked = [doc_ids[j] for j in res.rows]
                    nd.append(ndcg_at_k(ranked, judgments[i], 10))
                    rc.append(recall_at_k(ranked, judgments[i], 100))
                nd = np.array(nd)
                out.append({"stage1_width": m1, "shortlist": C_eff, "rescore_width": r,
                            "work": int(N * m1 + C_eff * (r - m1)), "per_query_ndcg": nd,
                            "recall@100": float(np.mean(rc))})
    # the exhaustive full-width baseline
    ref = exact_prefix_search(Q_rot, X_rot, D, 100)
    nd = np.array([ndcg_at_k([doc_ids[j] for j in ref[i]], judgments[i], 10) for i in range(len(Q_rot))])
    rc = [recall_at_k([doc_ids[j] for j in ref[i]], judgments[i], 100) for i in range(len(Q_rot))]
    out.append({"stage1_width": D, "shortlist": N, "rescore_width": D, "work": int(N * D), "per_query_ndcg": nd,
                "recall@100": float(np.mean(rc)), "exhaustive": True})
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
                        [judg_t[i] for i in eval_idx], doc_ids, None)
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
        "command": f"python bench/frontier.py --dataset {args.dataset}" + (f" --folds {args.folds}" if args.folds else ""),
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
    (args.out / f"frontier_{name}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
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
    (args.out / f"frontier_{name}.md").write_text("\n".join(md) + "\n", encoding="utf-8")
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
