"""The per-query effort model against a sequential stop that reads fresh evidence at every step (issue 19).

The served model (LAET's way, SIGMOD 2020) reads the probe's evidence once and predicts each effort's recall,
then widens the search to the cheapest effort whose prediction clears a calibrated bar.  DARTH (SIGMOD 2026)
instead checks as it goes: at intervals it predicts the recall of the answer it holds from that moment's
evidence and stops once the prediction clears the target.  This benchmark measures the second rule on our
resumable HNSW search (:class:`engine.ann.ResumableHnsw`), with the same grid, model family and calibration, so
the two differ only in the rule:

- ``one-shot``: the models as the build fits them (:func:`trainer.recall_fit.fit_effort_models`, its probe per
  target), their choices on the test queries' tables (:func:`trainer.recall_fit.effort_tables`);
- ``sequential``: from ``--start`` (an effort of the grid, :func:`engine.ann.model_efforts`), the search widened
  through the grid; at each step the evidence of the answer it holds (:data:`engine.ann.EFFORT_FEATURES`: its
  top-k scores, candidates, distance computations; no energy features, as an index over the documents as encoded
  is fitted) plus how it changed since the step before (top-k rows kept, the change of s_1 and s_k, the step's
  distance computations; before the start, a search at efSearch k) and the effort; LightGBM with the build's
  parameters predicts the recall of that answer; the first step whose prediction clears the bar stops.  The bar
  is calibrated out of fold (4 folds) on the training queries to the same goal as the one-shot model's
  (:meth:`engine.recall.RecallPolicy.goal`).

Reported on the test queries: realised recall@10 against exhaustive search, median and mean work (distance
computations x D, the start included), the share stopped at the start; and the frontier, each rule's bar swept
on the test queries (a diagnostic only: nothing is chosen from it), read at the recalls the calibrated rules
realised.  Work, not time: a sequential step also walks the forest once (about 7 µs warm, 17 µs with cold
caches, docs/SCALING.md), which this count leaves out, in the sequential rule's favour.

Usage::

    OMP_NUM_THREADS=1 python -m bench.effort_sequential --n 221170 --kind hnsw_fp16

Results: ``bench/results/effort_sequential/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import time

import lightgbm as lgb
import numpy as np

from adawidth import recall_policy
from bench.ann_effort_cap import K, corpus_parser, fixed_line, tuned_index, write
from bench.common import machine
from bench.scale import ANN_TARGETS
from engine import ann
from engine.recall import RecallPolicy
from trainer.recall_fit import effort_tables, fit_effort_models
from trainer.router_fit import LGB_PARAMS, NUM_ROUNDS

STEP_FEATURES = ("kept_rows", "delta_s1", "delta_sk", "step_distances", "effort")
"""What a sequential step adds to the answer's own evidence: the top-k rows kept since the step before, the change
of its best and k-th score, the step's distance computations, and the effort reached."""
FOLDS = 4
BARS = np.arange(0.80, 1.0 + 1e-9, 0.0025)


def step_tables(graph, Q: np.ndarray, truth: np.ndarray, grid: tuple[int, ...]):
    """Each query searched once, widened through ``grid``: (Q, S, F) float64 the evidence at every step
    (:data:`engine.ann.EFFORT_FEATURES` then :data:`STEP_FEATURES`, energy and centroid features NaN), (Q, S) its
    recall@K, (Q, S) int64 the work so far."""
    d = Q.shape[1]
    energy = [ann.EFFORT_FEATURES.index(n) for n in ann.ENERGY_FEATURES]
    F = np.zeros((len(Q), len(grid), len(ann.EFFORT_FEATURES) + len(STEP_FEATURES)))
    R = np.zeros((len(Q), len(grid)))
    W = np.zeros((len(Q), len(grid)), np.int64)
    for i, q in enumerate(Q):
        t = set(truth[i].tolist())
        s = ann.ResumableHnsw(graph, q, K)
        h = s.hits(K)
        rows, s1, sk, work = set(h.rows.tolist()), float(h.scores[0]), float(h.scores[-1]), h.work
        for j, e in enumerate(grid):
            h = s.hits(e)
            ev = ann._evidence(h, K, e, d, q)
            v = ev.vector.copy()
            v[energy] = np.nan
            now = ev.rows.tolist()
            F[i, j] = np.concatenate([v, [len(rows.intersection(now)), float(ev.scores[0]) - s1,
                                          float(ev.scores[-1]) - sk, (h.work - work) / d, float(e)]])
            R[i, j] = len(t.intersection(now)) / len(t)
            W[i, j] = h.work
            rows, s1, sk, work = set(now), float(ev.scores[0]), float(ev.scores[-1]), h.work
    return F, R, W


def _fit(F: np.ndarray, R: np.ndarray) -> lgb.Booster:
    Q, S, n = F.shape
    return lgb.train(dict(LGB_PARAMS, seed=0), lgb.Dataset(F.reshape(Q * S, n), R.reshape(-1)), NUM_ROUNDS)


def _predict(b: lgb.Booster, F: np.ndarray) -> np.ndarray:
    Q, S, n = F.shape
    return b.predict(F.reshape(Q * S, n)).reshape(Q, S)


def out_of_fold(F: np.ndarray, R: np.ndarray) -> np.ndarray:
    fold = np.random.default_rng(7).permutation(len(F)) % FOLDS
    oof = np.zeros(R.shape)
    for f in range(FOLDS):
        oof[fold == f] = _predict(_fit(F[fold != f], R[fold != f]), F[fold == f])
    return oof


def outcome(recall: np.ndarray, work: np.ndarray, pick: np.ndarray) -> dict:
    at = np.arange(len(pick))
    w = work[at, pick].astype(np.float64)
    return {"recall": float(recall[at, pick].mean()), "p50_work": float(np.median(w)), "mean_work": float(w.mean()),
            "at_start": float(np.mean(pick == 0))}


def frontier(pred: np.ndarray, recall: np.ndarray, work: np.ndarray, at_recall: float) -> dict:
    """The bar swept over :data:`BARS` on these queries; median and mean work interpolated at ``at_recall``."""
    pts = sorted((o["recall"], o["p50_work"], o["mean_work"])
                 for o in (outcome(recall, work, recall_policy.choose(pred, b)) for b in BARS))
    r = np.array([p[0] for p in pts])
    return {"recall": at_recall, "p50_work": float(np.interp(at_recall, r, [p[1] for p in pts])),
            "mean_work": float(np.interp(at_recall, r, [p[2] for p in pts]))}


def markdown(report: dict) -> str:
    lines = [f"# One-shot effort model against a sequential stop ({report['kind']}, debdocs N = {report['n_docs']:,})",
             "", f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}. {report['test_queries']} test queries, {report['training_queries']} "
             f"training queries; work = distance computations x D (lower is cheaper). Run time "
             f"{report['seconds']:.0f} s.", "",
             "Calibrated on the training queries (the protocol a build follows):", "",
             "| target | start | rule | recall@10 | median work | / fixed | mean work | / fixed | stopped at the start |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        f = report["fixed"][str(r["target"])]
        lines.append(fixed_line(r["target"], f))
        for c in r["rules"]:
            lines.append(f"| {r['target']:g} | {c['start']} | {c['rule']} | {c['recall']:.4f} | {c['p50_work']:,.0f} | "
                         f"{c['p50_work'] / f['p50_work']:.2f}x | {c['mean_work']:,.0f} | "
                         f"{c['mean_work'] / f['mean_work']:.2f}x | {c['at_start']:.2f} |")
    lines += ["", "Frontier (each rule's bar swept on the test queries; a diagnostic, nothing chosen from it), work at "
              "the one-shot model's realised recall:", "",
              "| target | start | rule | recall@10 | median work | mean work |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        for c in r["rules"]:
            g = c["frontier"]
            lines.append(f"| {r['target']:g} | {c['start']} | {c['rule']} | {g['recall']:.4f} | {g['p50_work']:,.0f} | "
                         f"{g['mean_work']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = corpus_parser(__doc__, "effort_sequential")
    ap.add_argument("--starts", type=int, nargs="+", default=[16, 24],
                    help="efforts of the grid the sequential rule starts at")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    c = tuned_index(args)
    X, QT, QE, params, index, tt, te, curve, fixed = (c[k] for k in ("X", "QT", "QE", "params", "index", "tt", "te",
                                                                     "curve", "fixed"))
    energy = ann.index_space(args.kind) == "rotated"
    fits = fit_effort_models(index, params, X, QT, curve, k=K, truth=tt, targets=ANN_TARGETS, energy=energy)
    rows = {}
    for f in fits:
        policy = RecallPolicy(f.booster, f.table.feature_names, f.table.z_grid, "ann", f.oof, f.table.recall, k=K)
        tab = effort_tables(index, params, X, QE, k=K, truth=te, efforts=tuple(int(z) for z in f.table.z_grid),
                            probes=(f.probe,), energy=energy)[f.probe]
        pred = f.booster.predict(recall_policy.design(tab.features, tab.z_grid)).reshape(len(QE), -1)
        for t in f.targets:
            got = outcome(tab.recall, tab.coordinates, recall_policy.choose(pred, policy.bar(t)))
            rows[t] = {"target": t, "goal": policy.goal(t), "rules": [
                {"rule": "one-shot", "start": f.probe, "bar": policy.bar(t), **got,
                 "frontier": frontier(pred, tab.recall, tab.coordinates, got["recall"])}]}
            print(rows[t], flush=True)
    graph = ann.resumable_graph(index)
    full = ann.model_efforts(params, curve)
    for start in args.starts:
        grid = tuple(e for e in full if e >= start)
        FT, RT, WT = step_tables(graph, QT, tt, grid)
        FE, RE, WE = step_tables(graph, QE, te, grid)
        oof, pe = out_of_fold(FT, RT), _predict(_fit(FT, RT), FE)
        for t, row in rows.items():
            bar = recall_policy.calibrate_bar(oof, RT, row["goal"])
            at = row["rules"][0]["recall"]
            row["rules"].append({"rule": "sequential", "start": start, "bar": bar,
                                 **outcome(RE, WE, recall_policy.choose(pe, bar)),
                                 "frontier": frontier(pe, RE, WE, at)})
            print(row["rules"][-1], flush=True)
    report = {"kind": args.kind, "n_docs": len(X), "test_queries": len(QE), "training_queries": len(QT),
              "command": f"OMP_NUM_THREADS=1 python -m bench.effort_sequential --n {args.n} --kind {args.kind}",
              "machine": f"{machine()}, 1 thread", "seconds": time.perf_counter() - t0,
              "step_features": list(STEP_FEATURES), "fixed": {str(t): v for t, v in fixed.items()},
              "rows": [rows[t] for t in sorted(rows)]}
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
