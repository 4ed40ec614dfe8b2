"""Per-query ANN effort against one tuned effort, at equal realised recall (issue 19), counted in work.

For one corpus: an HNSW index (M = 32, efConstruction 80; ``--kind hnsw``) or an IVF-Flat index (nlist = 4 sqrt(N);
``--kind ivf``) over the PCA-rotated documents; every training and test query probed at the grid's cheapest effort
(efSearch 10, nprobe 1) and searched at every effort of :func:`engine.ann.effort_grid`, ranked by faiss's
full-width scores (:func:`trainer.recall_fit.effort_table`; the whole grid, not the served cap of
:func:`engine.ann.model_efforts`).  The per-query model (LightGBM over the
probe's evidence, :data:`engine.ann.EFFORT_FEATURES`) is fitted on the training queries; on the test queries
the script reports

* the **fixed** curve: recall@10 against exhaustive search, mean and median multiply-adds, per effort
  (one effort for every query, no probe);
* the **per-query** curve: the same per bar τ (the cheapest effort predicted to reach τ, searched on from the
  probe as served, :func:`engine.ann.continue_search`: IVF resumes the probe's lists, HNSW its search
  (:class:`engine.ann.ResumableHnsw`); the probe's work included);
* per curve point of the per-query policy, the fixed effort's median work at the same recall (linear
  interpolation of the fixed curve) and the ratio: the p50 saving the issue asks >= 25 % of.

Work (distance computations × D) is the measure, not time: it is what a latency at one thread follows, and it
does not move with the load of a shared machine.  Results: ``bench/results/ann_effort/<corpus>.json`` and
``summary.md``.

Usage::

    OMP_NUM_THREADS=1 python -m bench.ann_effort --corpus scifact
    OMP_NUM_THREADS=1 python -m bench.ann_effort --corpus synthetic --n 200000
    OMP_NUM_THREADS=1 python -m bench.ann_effort --corpus debdocs --kind hnsw
    OMP_NUM_THREADS=1 python -m bench.ann_effort --corpus debdocs --kind ivf

``debdocs`` is the largest encoded prefix of its seeded permutation (as :mod:`bench.scale`), with 2,000 training
and 1,000 test queries.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adawidth import recall_policy
from adawidth.rotation import pca_rotation
from bench import scale
from bench.common import machine
from engine import ann
from trainer.recall_fit import effort_table, fit_recall_policy

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "ann_effort"


def corpus(name: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(X (N, D), training queries, test queries, note) float32 embeddings of the corpus."""
    if name == "debdocs":
        d = scale.load_debdocs(ROOT / "var", ROOT.parent / "shared" / "data" / "debdocs", 10_000, 2000, 1000)
        return d["X"], d["Q_train"], d["Q_test"], f"debdocs: {d['note']}"
    d = scale.load_scifact(ROOT / "var", ROOT / "data" / "scifact")
    if name == "scifact":
        return d["X"], d["Q_train"], d["Q_test"], "SciFact: 5,183 documents, 809 training and 300 test queries"
    from adawidth.synthetic import fit_gaussian, sample_corpus

    g = fit_gaussian(d["X"])
    Q = sample_corpus(g, 1100, seed=1)
    return (sample_corpus(g, n, seed=0), Q[:800], Q[800:],
            f"synthetic: {n:,} documents and 1,100 queries from a Gaussian fitted to SciFact (seeds 0, 1)")


def interpolate(recall: np.ndarray, work: np.ndarray, at: float) -> float | None:
    """Work of the fixed curve at recall ``at`` (linear between its points; None beyond its last one)."""
    order = np.argsort(recall, kind="stable")
    r, w = recall[order], work[order]
    if at > r[-1]:
        return None
    return float(np.interp(at, r, w))


def run(name: str, n: int, kind: str = "hnsw") -> dict:
    X, QT, QE, note = corpus(name, n)
    R = pca_rotation(X).astype(np.float32)
    Xr = np.ascontiguousarray(X @ R.T, np.float32)
    QTr, QEr = (np.ascontiguousarray(Q @ R.T, np.float32) for Q in (QT, QE))
    params = ann.default_params(kind, len(Xr), M=32)
    effort = ann.EFFORT_NAME[kind]
    t = time.perf_counter()
    index = ann.build_index(Xr, params)
    build_s = time.perf_counter() - t
    train = effort_table(index, params, Xr, QTr, k=10)
    test = effort_table(index, params, Xr, QEr, k=10)
    booster, _ = fit_recall_policy(train)
    pred = booster.predict(recall_policy.design(test.features, test.z_grid)).reshape(test.recall.shape)
    rows = np.arange(len(test.recall))
    truth = ann.exhaustive_top_k(Xr, QEr, 10)
    fixed = []
    for e in test.z_grid:  # one effort for every query: a plain search, no probe
        got = [ann.search(index, kind, q, 10, int(e)) for q in QEr]
        rec = ann.recall_at([ann.ranked(h.rows, h.scores, 10)[0] for q, h in zip(QEr, got)], truth)
        w = np.array([h.work for h in got], dtype=np.float64)
        fixed.append({"effort": int(e), "effort_name": effort, "recall": float(rec.mean()),
                      "mean_work": float(w.mean()), "p50_work": float(np.median(w))})
    fr = np.array([f["recall"] for f in fixed])
    fw = np.array([f["p50_work"] for f in fixed])
    per_query = []
    for bar in np.round(np.arange(0.80, 1.0001, 0.01), 3):
        pick = recall_policy.choose(pred, float(bar))
        r, w = test.recall[rows, pick], test.coordinates[rows, pick]
        same = interpolate(fr, fw, float(r.mean()))
        per_query.append({"bar": float(bar), "recall": float(r.mean()), "mean_work": float(w.mean()),
                          "p50_work": float(np.median(w)), "fixed_p50_work_at_same_recall": same,
                          "p50_ratio": None if same is None else float(np.median(w) / same)})
    return {"corpus": name, "kind": kind, "n_docs": len(Xr), "note": note, "index": params.as_dict(), "build_s": round(build_s, 1),
            "dimension": int(Xr.shape[1]), "fixed": fixed, "per_query": per_query}


def markdown(results: list[dict], command: str) -> str:
    out = ["# Per-query ANN effort against one tuned effort (issue 19)", "", f"Command: `{command}`", "",
           f"Machine: {machine()}; one thread.  Work = distance computations x D (multiply-adds) per query, on the "
           "test queries; the per-query policy's work includes its probe (the grid's cheapest effort: efSearch 10, "
           "nprobe 1).  A p50 ratio below 0.75 is the issue's >= 25 % saving.", ""]
    for r in results:
        kind = r.get("kind", "hnsw")
        index = (f"HNSW M {r['index']['M']}" if kind == "hnsw" else f"IVF-Flat nlist {r['index']['nlist']}")
        out += [f"## {r['corpus']}, {kind} (N = {r['n_docs']:,})", "", r["note"] + f"; {index} built in {r['build_s']} s.",
                "", "| policy | recall@10 | mean work | p50 work | fixed p50 work at that recall | p50 ratio |",
                "|---|---|---|---|---|---|"]
        for f in r["fixed"]:
            out.append(f"| fixed {f.get('effort_name', 'efSearch')} {f.get('effort', f.get('efSearch'))} | {f['recall']:.4f} | {f['mean_work']:,.0f} | "
                       f"{f['p50_work']:,.0f} | | |")
        for p in r["per_query"][::2]:
            same = "—" if p["fixed_p50_work_at_same_recall"] is None else f"{p['fixed_p50_work_at_same_recall']:,.0f}"
            ratio = "—" if p["p50_ratio"] is None else f"{p['p50_ratio']:.3f}"
            out.append(f"| per-query, bar {p['bar']:.2f} | {p['recall']:.4f} | {p['mean_work']:,.0f} | "
                       f"{p['p50_work']:,.0f} | {same} | {ratio} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=["scifact", "synthetic", "debdocs"], default="scifact")
    ap.add_argument("--kind", choices=["hnsw", "ivf"], default="hnsw", help="the ANN index")
    ap.add_argument("--n", type=int, default=200_000, help="synthetic documents")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    res = run(args.corpus, args.n, args.kind)
    cmd = "OMP_NUM_THREADS=1 python -m bench.ann_effort --corpus " + args.corpus + (
        f" --n {args.n}" if args.corpus == "synthetic" else "") + (f" --kind {args.kind}" if args.kind != "hnsw" else "")
    res["command"] = cmd
    name = args.corpus + ("" if args.kind == "hnsw" else f"_{args.kind}")
    (args.out / f"{name}.json").write_text(json.dumps(res, indent=1))
    results = [json.loads(p.read_text()) for p in sorted(args.out.glob("*.json"))]
    (args.out / "summary.md").write_text(markdown(results, "; ".join(r["command"] for r in results)))
    print(markdown([res], cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
