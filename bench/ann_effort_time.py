"""The per-query ANN effort against the tuned fixed effort in time, at the stage-1 call (issue 19).

``bench.scale`` times both through the whole query pipeline (rotation, plan, trace, rescoring) with every method
interleaved query by query, so each method starts each query with caches the others have used.  This script
times only what differs between the two: :meth:`engine.stage1.AnnStage1.search` at the tuned effort against
:meth:`engine.stage1.AnnStage1.per_query` (the probe, the model's choice, the continuation), the two alternated
query by query on one HNSW index (``--kind``, M = 32) over a debdocs prefix (``--n`` passages, 2,000 training
and 1,000 test queries, each test query timed ``--repeats`` times, one thread), with the models fitted as the
build fits them (:func:`trainer.recall_fit.fit_effort_models`).  Per target it reports both p50s and their
ratio, the median work of each, the per-query path's parts (probe, choice, continuation) and, per served effort,
the share of queries and their p50.

Usage::

    OMP_NUM_THREADS=1 python -m bench.ann_effort_time --n 221170

Results: ``bench/results/ann_effort_time/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import time

import numpy as np

from bench.ann_effort_cap import K, corpus_parser, tuned_index, write
from bench.common import machine
from bench.scale import ANN_TARGETS
from engine import ann
from engine.recall import RecallPolicy
from engine.stage1 import AnnStage1
from trainer.recall_fit import fit_effort_models



def time_target(fixed: AnnStage1, model: AnnStage1, kind: str, Q: np.ndarray, target: float, repeats: int) -> dict:
    """One target's timings (microseconds) and work (multiply-adds) on the queries Q, the two paths alternated."""
    policy = model.policy_for(target)
    effort = fixed.effort(target)
    probe = int(policy.z_grid[0])
    t_fixed, t_model, w_fixed, w_model, served = [], [], [], [], []
    t_probe, t_choose, t_cont = [], [], []
    clock = time.perf_counter
    for _ in range(repeats):
        for q in Q:
            a = clock()
            h = fixed.search(q, K, effort)
            b = clock()
            h2, e, _ = model.per_query(q, target, K)
            c = clock()
            t_fixed.append(b - a), t_model.append(c - b), w_fixed.append(h.work), w_model.append(h2.work)
            served.append(e)
            a = clock()  # the same path in its parts
            ev = ann.probe(model.index, kind, q, K, probe)
            b = clock()
            _, z = policy.choose(ev, target)
            c = clock()
            ann.continue_search(model.index, kind, q, K, ev, max(int(z), probe))
            d = clock()
            t_probe.append(b - a), t_choose.append(c - b), t_cont.append(d - c)
    us = lambda v: float(np.median(v) * 1e6)  # noqa: E731
    served, tm = np.asarray(served), np.asarray(t_model)
    by_effort = {int(e): {"share": float(np.mean(served == e)), "p50_us": us(tm[served == e])}
                 for e in np.unique(served)}
    return {"target": target, "fixed_effort": int(effort), "probe": probe,
            "fixed_p50_us": us(t_fixed), "per_query_p50_us": us(t_model), "ratio": us(t_model) / us(t_fixed),
            "fixed_p50_work": float(np.median(w_fixed)), "per_query_p50_work": float(np.median(w_model)),
            "probe_p50_us": us(t_probe), "choose_p50_us": us(t_choose), "continuation_mean_us":
            float(np.mean(t_cont) * 1e6), "settled_at_probe": float(np.mean(served == probe)), "by_effort": by_effort}


def markdown(report: dict) -> str:
    lines = [f"# Per-query ANN effort in time at the stage-1 call ({report['kind']}, debdocs N = "
             f"{report['n_docs']:,})", "", f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}. {report['test_queries']} test queries x {report['repeats']}, the two "
             "paths alternated query by query; no rotation, plan, trace or rescoring (those are the same for both "
             f"and are in `bench/results/scale`). Run time {report['seconds']:.0f} s.", "",
             "| target | fixed effort | fixed p50 µs | probe | per-query p50 µs | ratio | work ratio (p50) | probe p50 µs "
             "| choice p50 µs | settled at the probe |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['target']:g} | {r['fixed_effort']} | {r['fixed_p50_us']:.0f} | {r['probe']} | "
                     f"{r['per_query_p50_us']:.0f} | **{r['ratio']:.2f}x** | "
                     f"{r['per_query_p50_work'] / r['fixed_p50_work']:.2f}x | {r['probe_p50_us']:.0f} | "
                     f"{r['choose_p50_us']:.0f} | {r['settled_at_probe']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = corpus_parser(__doc__, "ann_effort_time")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    c = tuned_index(args)
    X, QT, QE, params, index, tt, curve = (c[k] for k in ("X", "QT", "QE", "params", "index", "tt", "curve"))
    fits = fit_effort_models(index, params, X, QT, curve, k=K, truth=tt, targets=ANN_TARGETS)
    policies = {t: RecallPolicy(f.booster, f.table.feature_names, f.table.z_grid, "ann", f.oof, f.table.recall, k=K)
                for f in fits for t in f.targets}
    fixed = AnnStage1(index, params, curve, margin_share=0.0)
    model = AnnStage1(index, params, curve, margin_share=0.25, target_policies=policies)
    rows = []
    for t in ANN_TARGETS:
        rows.append(time_target(fixed, model, args.kind, QE, t, args.repeats))
        print({k: v for k, v in rows[-1].items() if k != "by_effort"}, flush=True)
    report = {"kind": args.kind, "n_docs": len(X), "test_queries": len(QE), "repeats": args.repeats,
              "command": f"OMP_NUM_THREADS=1 python -m bench.ann_effort_time --n {args.n} --kind {args.kind}",
              "machine": f"{machine()}, 1 thread", "seconds": time.perf_counter() - t0, "rows": rows}
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
