"""Work and latency of the adaptive funnel at large N, on synthetic corpora (no labels: no quality).

At N = 5,183 (SciFact) rescoring a shortlist costs as much as the stage-1 scan; at N = 10^6 the scan
is everything.  This benchmark replays, on synthetic corpora of N documents, the configurations the
adaptive policy chose on SciFact's test queries (``bench/adaptive.py``, one τ) and the static funnel
that matched its quality there, and measures per-query latency in process, single thread:

* ``exhaustive``  — faiss ``IndexFlatIP`` over all 384 coordinates (the full-width baseline);
* ``static``      — faiss flat over the normalised m1-prefix, shortlist rescored at r (the static funnel);
* ``static_blocked`` — the same funnel through the coordinate-blocked scan (numpy), to separate the
  layout's cost from the policy's;
* ``adaptive``    — first-block scan, evidence, LightGBM-free replay of the chosen configuration,
  extension of the scan to m1, shortlist, rescoring (``adawidth.blocked``; the policy's model costs
  about 0.2 ms a query and is not replayed here).

Documents and queries are drawn from Gaussians fitted to SciFact's rotated document and query
embeddings (mean and full covariance), then scaled to unit norm, so the spectrum follows real
embeddings.  Work is in multiply-adds per query (N·m1 + C·(r − m1), evidence included).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.adaptive_scale --policy bench/results/adaptive/scifact_pca.json

Writes ``bench/results/adaptive/scale_<rotation>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from adawidth import stage1_policy as sp
from adawidth.blocked import BlockedCorpus
from adawidth.funnel import resolve
from adawidth.prefix import prefix_normalize, top_k
from bench.common import ROOT
from bench.funnels import learned_rotation, load_embedded
from engine.io import atomic


def gaussian_like(E: np.ndarray, n: int, rng: np.random.Generator, chunk: int = 200_000) -> np.ndarray:
    """n unit-norm rows drawn from the Gaussian (mean, full covariance) fitted to E (M, D); (n, D) float32."""
    mu = E.mean(0)
    L = np.linalg.cholesky(np.cov(E, rowvar=False) + 1e-6 * np.eye(E.shape[1]))
    out = np.empty((n, E.shape[1]), dtype=np.float32)
    for s in range(0, n, chunk):
        z = rng.standard_normal((min(chunk, n - s), E.shape[1])) @ L.T + mu
        out[s:s + len(z)] = z / np.linalg.norm(z, axis=1, keepdims=True)
    return out


def percentiles(xs) -> dict:
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)), "mean_ms": float(a.mean())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", type=Path, default=ROOT / "bench" / "results" / "adaptive" / "scifact_pca.json")
    p.add_argument("--tau", type=float, help="threshold point of the policy to replay (default: least work within "
                                             "0.5 %% of the best static NDCG@10)")
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--dataset", type=Path, default=ROOT / "data" / "scifact")
    p.add_argument("--home", type=Path, default=ROOT / "var")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "adaptive")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    faiss.omp_set_num_threads(1)
    pol = json.loads(args.policy.read_text())
    grid = [sp.Config(**c) for c in pol["grid"]]
    pts = pol["threshold_policy"]
    if args.tau is None:
        best = max(s["ndcg@10"] for s in pol["static"])
        ok = [q for q in pts if q["ndcg@10"] >= 0.995 * best] or pts
        point = min(ok, key=lambda q: q["work"])
    else:
        point = next(q for q in pts if abs(q["tau"] - args.tau) < 1e-9)
    picks = np.repeat(np.arange(len(grid)), point["picks"])
    static_cfg = sp.Config(**point["static_equal_quality"]["config"]) if point.get("static_equal_quality") else \
        sp.Config(**point["static_equal_work"]["config"])

    emb = load_embedded(args.dataset, args.home)
    R = learned_rotation(pol["rotation"], emb.X, None, None) if pol["rotation"] in ("identity", "pca") else None
    if R is None:
        raise SystemExit("replay a label-free rotation (identity or pca)")
    rng = np.random.default_rng(args.seed)
    Xs, Qs = emb.X @ R.T, emb.Qt @ R.T
    rows_out = []
    for N in args.sizes:
        t0 = time.time()
        X = gaussian_like(Xs, N, rng)
        Q = gaussian_like(Qs, args.queries, rng)
        D = X.shape[1]
        order = rng.permutation(np.resize(picks, args.queries))
        bc = BlockedCorpus(X, sp.BLOCK)
        flat = faiss.IndexFlatIP(D)
        flat.add(X)
        pre = faiss.IndexFlatIP(static_cfg.m1)
        pre.add(prefix_normalize(X, static_cfg.m1))
        sq = np.einsum("ij,ij->i", X[:, :static_cfg.m1], X[:, :static_cfg.m1])
        print(f"N={N:,}: corpus ready ({time.time() - t0:.0f} s)", file=sys.stderr)
        lat = {"exhaustive": [], "static": [], "static_blocked": [], "adaptive": []}
        work = {"exhaustive": N * D, "static": static_cfg.work(N), "static_blocked": static_cfg.work(N), "adaptive": []}
        for i, q in enumerate(Q):
            t = time.perf_counter()
            flat.search(q[None, :], 10)
            lat["exhaustive"].append(time.perf_counter() - t)

            t = time.perf_counter()
            C = min(static_cfg.shortlist, N)
            cos, rows = pre.search(prefix_normalize(q[None, :], static_cfg.m1), C)
            resolve(q, X, sq, rows[0], cos[0], m0=static_cfg.m1, k=10, width=static_cfg.rescore_width)
            lat["static"].append(time.perf_counter() - t)

            t = time.perf_counter()
            s = bc.extend(bc.start(), q, static_cfg.m1)
            r_, c_ = bc.shortlist(s, C)
            bc.partial_scores(s, r_).extend(q, bc.matrix, static_cfg.rescore_width)
            lat["static_blocked"].append(time.perf_counter() - t)

            c = grid[order[i]]
            t = time.perf_counter()
            _, s = sp.evidence(bc, q)
            s = bc.extend(s, q, c.m1)
            r_, _ = bc.shortlist(s, min(c.shortlist, N))
            ps = bc.partial_scores(s, r_).extend(q, bc.matrix, c.rescore_width)
            top_k(ps.cosine(), 10)
            lat["adaptive"].append(time.perf_counter() - t)
            work["adaptive"].append(c.work(N) + sp.evidence_work())
        base = np.percentile(lat["exhaustive"], 50)
        for name in lat:
            w = float(np.mean(work[name]))
            rows_out.append({"documents": N, "path": name, **percentiles(lat[name]),
                             "p50_ratio_to_exhaustive": float(np.percentile(lat[name], 50) / base),
                             "work": w, "work_ratio_to_exhaustive": w / (N * D)})
        del X, bc, flat, pre
    out = {"command": f"python -m bench.adaptive_scale --policy {args.policy.relative_to(ROOT) if args.policy.is_absolute() else args.policy}"
                      + (f" --tau {args.tau}" if args.tau is not None else ""),
           "policy_point": {"tau": point["tau"], "scifact_ndcg@10": point["ndcg@10"],
                            "scifact_work_ratio": point["work_ratio_to_full"]},
           "static_config": vars(static_cfg), "rotation": pol["rotation"], "queries": args.queries,
           "threads": 1, "machine": platform.processor() or platform.machine(), "rows": rows_out}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"scale_{pol['rotation']}"
    atomic.write_text(args.out / f"{stem}.json", json.dumps(out, indent=1))
    md = [f"# Adaptive funnel at scale (synthetic corpora, rotation `{pol['rotation']}`)", "",
          f"Replays the adaptive policy's SciFact choices at τ = {point['tau']} (SciFact NDCG@10 "
          f"{point['ndcg@10']:.4f}) and the static funnel m1 = {static_cfg.m1}, C = {static_cfg.shortlist}, "
          f"r = {static_cfg.rescore_width} that matched it there; {args.queries} synthetic queries, one thread, "
          "in process.", "", f"Command: `{out['command']}`", "",
          "| N | path | p50 ms | p95 ms | p50 × exhaustive | work × exhaustive |", "|---|---|---|---|---|---|"]
    for r in rows_out:
        md.append(f"| {r['documents']:,} | {r['path']} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | "
                  f"{r['p50_ratio_to_exhaustive']:.3f} | {r['work_ratio_to_exhaustive']:.4f} |")
    atomic.write_text(args.out / f"{stem}.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
