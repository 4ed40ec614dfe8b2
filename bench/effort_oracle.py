"""How far the per-query ANN effort model is from an oracle's choices (issue 19).

For one HNSW index (``--kind``, M = 32) over a debdocs prefix (``--n`` passages, 2,000 training and 1,000 test
queries, one thread), per default target: the models fitted as the build fits them
(:func:`trainer.recall_fit.fit_effort_models`), and on the **test** queries, each searched once through the
model's grid from its probe (:func:`trainer.recall_fit.effort_tables`: the served path's answers at every effort),

- ``model``: the served choice (the first effort whose predicted recall clears the calibrated bar);
- ``oracle``: the cheapest choices that reach the same mean recall knowing every query's realised recall at every
  effort (greedy by recall gained per multiply-add, each query's steps to any later effort considered): a lower
  bound on the work of any per-query policy over this grid at that recall, which no model can reach;
- ``fixed``: the efSearch tuned on the training queries (:func:`engine.ann.effort_for`), searched fresh.

Reported: realised recall@10 against exhaustive search, median and mean work (distance computations x D, the
probe's included) and the share of queries left at the probe.  Work, not time: see
:mod:`bench.pipeline_cost` for what the pipeline adds.

Usage::

    OMP_NUM_THREADS=1 python -m bench.effort_oracle --n 221170 --kind hnsw_fp16

Results: ``bench/results/effort_oracle/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from adawidth import recall_policy
from bench.ann_effort_cap import K, corpus_parser, fixed_line, tuned_index, write
from bench.common import machine
from bench.scale import ANN_TARGETS
from engine import ann
from engine.recall import RecallPolicy
from trainer.recall_fit import effort_tables, fit_effort_models


def oracle(recall: np.ndarray, work: np.ndarray, goal: float) -> np.ndarray:
    """(Q,) grid positions of least total work whose mean realised recall reaches ``goal`` (greedy on the best
    recall gained per multiply-add from each query's current position to any later one); recall, work (Q, Z)."""
    Q, Z = recall.shape
    at = np.zeros(Q, np.int64)

    def best(i):
        gain = (recall[i, at[i] + 1:] - recall[i, at[i]]) / np.maximum(work[i, at[i] + 1:] - work[i, at[i]], 1)
        if not len(gain) or gain.max() <= 0:
            return None
        j = int(np.argmax(gain))
        return -float(gain[j]), i, at[i] + 1 + j

    heap = [h for h in (best(i) for i in range(Q)) if h]
    heapq.heapify(heap)
    total = float(recall[np.arange(Q), at].sum())
    while total < goal * Q - 1e-9 and heap:
        _, i, j = heapq.heappop(heap)
        if j <= at[i]:
            continue
        total += recall[i, j] - recall[i, at[i]]
        at[i] = j
        h = best(i)
        if h:
            heapq.heappush(heap, h)
    return at


def markdown(report: dict) -> str:
    lines = [f"# The per-query effort model against an oracle ({report['kind']}, debdocs N = {report['n_docs']:,})", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}. {report['test_queries']} test queries; work = distance computations x D "
             f"(the probe's included). Run time {report['seconds']:.0f} s.", "",
             "| target | probe | choice | recall@10 | median work | / fixed | mean work | / fixed | left at the probe |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        f = report["fixed"][str(r["target"])]
        lines.append(fixed_line(r["target"], f))
        for who in ("model", "oracle"):
            c = r[who]
            lines.append(f"| {r['target']:g} | {r['probe']} | {who} | {c['recall']:.4f} | {c['p50_work']:,.0f} | "
                         f"{c['p50_work'] / f['p50_work']:.2f}x | {c['mean_work']:,.0f} | "
                         f"{c['mean_work'] / f['mean_work']:.2f}x | {c['at_probe']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = corpus_parser(__doc__, "effort_oracle").parse_args(argv)
    t0 = time.perf_counter()
    c = tuned_index(args)
    X, QT, QE, params, index, tt, te, curve, fixed = (c[k] for k in ("X", "QT", "QE", "params", "index", "tt", "te",
                                                                     "curve", "fixed"))
    fits = fit_effort_models(index, params, X, QT, curve, k=K, truth=tt, targets=ANN_TARGETS,
                             energy=ann.index_space(args.kind) == "rotated")
    rows = []
    for f in fits:
        policy = RecallPolicy(f.booster, f.table.feature_names, f.table.z_grid, "ann", f.oof, f.table.recall, k=K)
        grid = tuple(int(z) for z in f.table.z_grid)
        tab = effort_tables(index, params, X, QE, k=K, truth=te, efforts=grid, probes=(f.probe,),
                            energy=ann.index_space(args.kind) == "rotated")[f.probe]
        pred = f.booster.predict(recall_policy.design(tab.features, tab.z_grid)).reshape(len(QE), -1)
        at = np.arange(len(QE))
        for t in f.targets:
            pick = recall_policy.choose(pred, policy.bar(t))
            best = oracle(tab.recall, tab.coordinates, float(tab.recall[at, pick].mean()))

            def row(p):
                w = tab.coordinates[at, p]
                return {"recall": float(tab.recall[at, p].mean()), "p50_work": float(np.median(w)),
                        "mean_work": float(w.mean()), "at_probe": float(np.mean(p == 0))}

            rows.append({"target": t, "probe": f.probe, "model": row(pick), "oracle": row(best)})
            print(rows[-1], flush=True)
    report = {"kind": args.kind, "n_docs": len(X), "test_queries": len(QE),
              "command": f"OMP_NUM_THREADS=1 python -m bench.effort_oracle --n {args.n} --kind {args.kind}",
              "machine": f"{machine()}, 1 thread", "seconds": time.perf_counter() - t0,
              "fixed": {str(t): v for t, v in fixed.items()}, "rows": sorted(rows, key=lambda r: r["target"])}
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
