"""The per-query ANN effort model's cap against its p50 and p95 work (issue 19): ``cap=`` of
:func:`trainer.recall_fit.fit_effort_models`, default :data:`engine.ann.MODEL_EFFORT_CAP`.

The model chooses among efforts from its probe up to the first grid effort at least ``cap`` x the tuned effort of
0.99 (:func:`engine.ann.model_efforts`).  A lower cap bounds what the hardest queries cost (the p95), and makes
the calibrated bar send more of the others higher (the p50).  For one HNSW index (``--kind``, M = 32,
efConstruction 80) over a debdocs prefix (``--n`` passages of :func:`bench.scale.load_debdocs`' seeded
permutation; 2,000 training and 1,000 test queries), per cap: the models fitted on the training queries as the
build fits them (:func:`trainer.recall_fit.fit_effort_models`, one probe per target), the bar calibrated for each
target (:meth:`engine.recall.RecallPolicy.bar`), and on the **test** queries the served choice's realised
recall@10 against exhaustive search, its median and 95th-percentile work, and the share of queries the probe
settles; beside it the tuned fixed effort's (:func:`engine.ann.effort_for`, no margin).

Work (distance computations x D, the probe's included) is the measure, not time: it is what one thread's
latency follows, and it does not move with the load of a shared machine.  Time does not follow it one to one:
each per-query search also pays a second faiss call and the model (see ``docs/SCALING.md``).

Usage::

    OMP_NUM_THREADS=1 python -m bench.ann_effort_cap --n 221170

Results: ``bench/results/ann_effort_cap/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adawidth import recall_policy
from bench.common import machine
from bench.scale import ANN_TARGETS, ROOT, load_debdocs
from engine import ann
from engine.recall import RecallPolicy
from trainer.recall_fit import effort_tables, fit_effort_models

K = 10


def fixed_rows(index, params, Q: np.ndarray, truth: np.ndarray, curve: list[dict]) -> dict[float, dict]:
    """Per target, the tuned fixed effort on the test queries: effort, recall, p50 / p95 work."""
    out = {}
    for t in ANN_TARGETS:
        e = ann.effort_for(curve, t)
        rec, work = [], []
        for i, q in enumerate(Q):
            h = ann.search(index, params.kind, q, K, e)
            rec.append(len(set(h.rows.tolist()) & set(truth[i].tolist())) / K)
            work.append(h.work)
        out[t] = {"effort": int(e), "recall": float(np.mean(rec)), "p50_work": float(np.median(work)),
                  "p95_work": float(np.percentile(work, 95)), "mean_work": float(np.mean(work))}
    return out


def fixed_line(target: float, f: dict) -> str:
    """The Markdown row of a target's fixed effort (:func:`fixed_rows`) in the effort benchmarks' tables: target,
    choice, probe, recall, median work, ratio, mean work, ratio, share at the probe (the ratios 1.00x)."""
    return (f"| {target:g} | — | fixed efSearch {f['effort']} | {f['recall']:.4f} | {f['p50_work']:,.0f} | 1.00x | "
            f"{f['mean_work']:,.0f} | 1.00x | — |")


def cap_rows(index, params, X, QT, tt, QE, te, curve, cap: float) -> list[dict]:
    """The served per-query choices on the test queries under one cap (see the module docstring)."""
    fits = fit_effort_models(index, params, X, QT, curve, k=K, truth=tt, targets=ANN_TARGETS, cap=cap)
    rows = []
    for f in fits:
        policy = RecallPolicy(f.booster, f.table.feature_names, f.table.z_grid, "ann", f.oof, f.table.recall, k=K)
        grid = tuple(int(z) for z in f.table.z_grid)
        tab = effort_tables(index, params, X, QE, k=K, truth=te, efforts=grid, probes=(f.probe,))[f.probe]
        pred = f.booster.predict(recall_policy.design(tab.features, tab.z_grid)).reshape(len(QE), -1)
        for t in f.targets:
            pick = recall_policy.choose(pred, policy.bar(t))
            at = np.arange(len(QE))
            rec, work = tab.recall[at, pick], tab.coordinates[at, pick]
            rows.append({"cap": cap, "target": t, "probe": f.probe, "grid_top": grid[-1],
                         "recall": float(rec.mean()), "p50_work": float(np.median(work)),
                         "p95_work": float(np.percentile(work, 95)), "settled_at_probe": float(np.mean(pick == 0))})
    return rows


def markdown(report: dict) -> str:
    lines = [f"# Per-query ANN effort: the cap against p50 and p95 work ({report['kind']}, debdocs "
             f"N = {report['n_docs']:,})", "", f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}. Work = distance computations x D on the {report['test_queries']} test "
             f"queries (the probe's included); ratios against the tuned fixed effort of the same target. "
             f"Run time {report['seconds']:.0f} s.", "",
             "| cap | target | probe | grid top | recall@10 | p50 work | p50 / fixed | p95 work | p95 / fixed "
             "| settled at the probe |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t, f in report["fixed"].items():
        lines.append(f"| fixed | {t} | — | {f['effort']} | {f['recall']:.4f} | {f['p50_work']:,.0f} | 1.00x | "
                     f"{f['p95_work']:,.0f} | 1.00x | — |")
    for r in report["rows"]:
        f = report["fixed"][str(r["target"])]
        lines.append(f"| {r['cap']:g} | {r['target']:g} | {r['probe']} | {r['grid_top']} | {r['recall']:.4f} | "
                     f"{r['p50_work']:,.0f} | {r['p50_work'] / f['p50_work']:.2f}x | {r['p95_work']:,.0f} | "
                     f"{r['p95_work'] / f['p95_work']:.2f}x | {r['settled_at_probe']:.2f} |")
    return "\n".join(lines) + "\n"


def add_corpus_args(ap: argparse.ArgumentParser) -> None:
    """The debdocs prefix and index options this script and :mod:`bench.ann_effort_time` share."""
    ap.add_argument("--n", type=int, default=221_170, help="debdocs passages (a prefix of the seeded permutation)")
    ap.add_argument("--kind", default="hnsw", choices=("hnsw", "hnsw_fp16"))
    ap.add_argument("--home", type=Path, default=ROOT / "var")
    ap.add_argument("--debdocs", type=Path, default=ROOT.parent / "shared" / "data" / "debdocs")


def corpus_parser(doc: str, results: str) -> argparse.ArgumentParser:
    """The argument parser of a benchmark over a debdocs prefix: ``doc``'s first paragraph as its description,
    :func:`add_corpus_args`, and ``--out`` (default ``bench/results/<results>``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_corpus_args(ap)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / results)
    return ap


def tuned_index(args) -> dict:
    """The debdocs prefix (2,000 training and 1,000 test queries), its HNSW index (M = 32, one thread), the
    training (``tt``) and test (``te``) queries' exhaustive top-k, the effort curve tuned on the training queries
    as :mod:`bench.scale` tunes it, and the tuned fixed efforts on the test queries (``fixed``, :func:`fixed_rows`)."""
    import faiss
    faiss.omp_set_num_threads(1)
    data = load_debdocs(args.home, args.debdocs, args.n, 2000, 1000)
    X = np.ascontiguousarray(data["X"][:args.n], np.float32)
    QT = np.ascontiguousarray(data["Q_train"], np.float32)
    params = ann.default_params(args.kind, len(X), M=32)
    index = ann.build_index(X, params)
    tt = ann.exhaustive_top_k(X, QT, K)
    curve = ann.tune_effort(index, params, X, QT, k=K, truth=tt, stop_at=0.997, refine_for=ANN_TARGETS)
    QE = np.ascontiguousarray(data["Q_test"], np.float32)
    te = ann.exhaustive_top_k(X, QE, K)
    return {"X": X, "QT": QT, "QE": QE, "params": params, "index": index, "tt": tt, "te": te, "curve": curve,
            "fixed": fixed_rows(index, params, QE, te, curve)}


def write(out: Path, report: dict, md: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(report, indent=1))
    (out / "summary.md").write_text(md)
    print(md)


def main(argv=None) -> None:
    ap = corpus_parser(__doc__, "ann_effort_cap")
    ap.add_argument("--caps", type=float, nargs="+", default=[2.0, 1.5, 1.25])
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    c = tuned_index(args)
    X, QT, QE, params, index, tt, te, curve, fixed = (c[k] for k in ("X", "QT", "QE", "params", "index", "tt", "te",
                                                                     "curve", "fixed"))
    print("fixed:", fixed, flush=True)
    rows = []
    for cap in args.caps:
        rows += cap_rows(index, params, X, QT, tt, QE, te, curve, cap)
        print(f"cap {cap:g}:", rows[-len(ANN_TARGETS):], flush=True)
    report = {"kind": args.kind, "n_docs": len(X), "test_queries": len(QE), "training_queries": len(QT),
              "command": f"OMP_NUM_THREADS=1 python -m bench.ann_effort_cap --n {args.n} --kind {args.kind} "
                         f"--caps {' '.join(f'{c:g}' for c in args.caps)}",
              "machine": f"{machine()}, 1 thread",
              "seconds": time.perf_counter() - t0, "fixed": {str(t): v for t, v in fixed.items()}, "rows": rows}
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
