"""The HNSW probe's efSearch against the per-query effort's p50 through the served pipeline (issue 19).

The build picks each target's probe by the calibration queries' median *work*
(:func:`trainer.recall_fit.fit_effort_models`); the issue's target is a p50 in *time*, and time does not follow
work one to one (a search's descent and first cache misses do not shrink with its beam; a query the probe does
not settle pays a second call).  This script asks whether a probe chosen by time would meet the issue's 0.75x of
the fixed efSearch where the build's does not.  For one HNSW index (``--kind``, M = 32, one thread) over a
debdocs prefix (``--n`` passages, 2,000 training and 1,000 test queries, as :mod:`bench.pipeline_cost`), per
probe of :func:`engine.ann.probe_candidates`: the model fitted with that probe alone (``fit_effort_models(...,
probes=(p,))``), served for both default targets through :class:`engine.pipeline.Pipeline` (plan, rotation of
the evidence prefix, stage 1, rescoring, render; from the query embedding, no encoder), against the efSearch
tuned to each target on the training queries.  Every path is timed over blocks of 100 test queries, the paths in
a fresh random order per block, ``warm`` (queries back to back) and ``cold`` (a 64 MiB buffer summed before each
call, as :mod:`bench.pipeline_cost`; what ``bench.scale``'s interleaving with other methods does).  Per path:
the p50 µs of the call and of the trace's ``stage1``, the ratio to the fixed efSearch's p50, the realised
recall@10 against exhaustive search, and the share of test queries the probe settles.  The models read the
energy features off the rotated prefix, as the build fitted them until 2026-12-07 (a build over the documents as
encoded now fits them without, ``engine.ann.ENERGY_FEATURES``; the committed run is the earlier fit): the
probes are compared under one fit either way.

Usage::

    OMP_NUM_THREADS=1 python -m bench.probe_sweep --n 221170 --kind hnsw_fp16

Results: ``bench/results/probe_sweep/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import time

import numpy as np

from bench.ann_effort_cap import K, corpus_parser, tuned_index, write
from bench.common import machine
from bench.scale import ANN_TARGETS
from engine import ann
from engine.ann import ENERGY_PREFIX, index_space
from engine.index import IndexVersion
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from engine.recall import RecallPolicy
from engine.stage1 import AnnStage1
from trainer.recall_fit import fit_effort_models

EVICT_BYTES = 64 << 20
"""The buffer summed before every call of the ``cold`` condition (as :data:`bench.pipeline_cost.EVICT_BYTES`)."""
BLOCKS = 10
MARGIN = {"margin_rule": "standard_error", "margin_share": 0.25}
"""The build's calibration rule on training queries (``trainer.build._ann_effort_model``)."""


def stages_by_probe(c: dict, kind: str) -> tuple[AnnStage1, dict[int, AnnStage1], dict[int, dict]]:
    """The fixed-efSearch stage, and per probe effort the per-query stage whose model (both targets) probes at it,
    with the calibration's median work per target (multiply-adds, lower is cheaper: what the build chooses on)."""
    X, QT, params, index, tt, curve = (c[k] for k in ("X", "QT", "params", "index", "tt", "curve"))
    space = index_space(kind)
    fixed = AnnStage1(index, params, curve, margin_share=0.0, space=space)
    per_probe, work = {}, {}
    for p in ann.probe_candidates(params, curve, 0.0):
        t0 = time.perf_counter()
        (f,) = fit_effort_models(index, params, X, QT, curve, k=K, truth=tt, targets=ANN_TARGETS,
                                 prefixes=QT[:, :ENERGY_PREFIX], rule_share=MARGIN["margin_share"], probes=(p,))
        policy = RecallPolicy(f.booster, list(f.table.feature_names), np.asarray(f.table.z_grid, np.float64), "ann",
                              f.oof, f.table.recall, f.table.coordinates, k=K, **MARGIN)
        per_probe[p] = AnnStage1(index, params, curve, margin_share=0.25, effort_policy=policy,
                                 target_policies={t: policy for t in ANN_TARGETS}, space=space)
        work[p] = f.probes[str(p)]["p50_work"]
        print(f"probe {p}: fitted in {time.perf_counter() - t0:.0f} s, median calibrated work {work[p]}", flush=True)
    return fixed, per_probe, work


def time_target(versions: dict, E: np.ndarray, truth: np.ndarray, target: float, cold: bool) -> dict:
    """One target under one condition: per path p50 µs (call and ``stage1``), recall@10, probe-settled share."""
    spec = SearchSpec("q", k=K, width="auto", policy="recall", recall_target=target)
    pipe, names = Pipeline(), list(versions)
    probe_of = {v: versions[v].ann.probe_effort(target) for v in names if v != "fixed"}
    lat = {v: np.empty(len(E)) for v in names}
    st1 = {v: np.empty(len(E)) for v in names}
    settled = {v: np.zeros(len(E), bool) for v in names}
    rows = {v: [None] * len(E) for v in names}
    junk = np.ones(EVICT_BYTES // 4, np.float32) if cold else None
    rng = np.random.default_rng(0)
    clock = time.perf_counter
    for block in np.array_split(np.arange(len(E)), BLOCKS):
        for j in rng.permutation(len(names)):
            v = names[j]
            for i in block:
                if junk is not None:
                    junk.sum()
                a = clock()
                got = pipe.search(versions[v], [spec], embeddings=E[i:i + 1])[0]
                lat[v][i] = clock() - a
                st1[v][i] = got.trace["timings_seconds"]["stage1"]
                rows[v][i] = got.rows
                settled[v][i] = got.trace["effort"] == probe_of.get(v)
    base = float(np.median(lat["fixed"]))
    return {"target": target, "condition": "cold" if cold else "warm",
            "paths": {v: {"p50_us": round(float(np.median(lat[v])) * 1e6, 1),
                          "stage1_p50_us": round(float(np.median(st1[v])) * 1e6, 1),
                          "over_fixed": round(float(np.median(lat[v])) / base, 3),
                          "recall_at_10": round(float(ann.recall_at(rows[v], truth).mean()), 4),
                          "settled_at_probe": None if v == "fixed" else round(float(settled[v].mean()), 3)}
                      for v in names}}


def markdown(report: dict) -> str:
    probes = [p for p in report["rows"][0]["paths"] if p != "fixed"]  # "probe_<efSearch>"
    lines = [f"# The HNSW probe's efSearch against the per-query p50 ({report['kind']}, debdocs N = "
             f"{report['n_docs']:,})", "", f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}. {report['test_queries']} test queries, {BLOCKS} blocks, the paths in a "
             f"random order per block; `cold`: a {EVICT_BYTES >> 20} MiB buffer summed before every call. Run time "
             f"{report['seconds']:.0f} s. Per probe: the pipeline's p50 over the fixed efSearch's (lower is better), "
             "realised recall@10, share of test queries the probe settles. The build's choice (median calibrated "
             "work) is marked *.", "",
             "| target | caches | fixed efSearch: p50 µs, recall | " + " | ".join(f"probe {p.removeprefix('probe_')}" for p in probes) + " |",
             "|" + "---|" * (3 + len(probes))]
    for r in report["rows"]:
        f = r["paths"]["fixed"]
        cells = []
        for p in probes:
            x = r["paths"][p]
            star = "*" if int(p.removeprefix("probe_")) == report["build_choice"][f"{r['target']:g}"] else ""
            cells.append(f"{x['over_fixed']:.2f}x{star}, {x['recall_at_10']:.4f}, {x['settled_at_probe']:.0%}")
        lines.append(f"| {r['target']:g} | {r['condition']} | {f['p50_us']:.0f}, {f['recall_at_10']:.4f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Median calibrated work per probe (multiply-adds, the build's criterion):", "",
              "| probe | " + " | ".join(f"{t:g}" for t in ANN_TARGETS) + " |", "|" + "---|" * (1 + len(ANN_TARGETS))]
    for p, w in report["calibrated_p50_work"].items():
        lines.append(f"| {p} | " + " | ".join(f"{w[f'{t:g}']:,.0f}" for t in ANN_TARGETS) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = corpus_parser(__doc__, "probe_sweep")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    c = tuned_index(args)
    fixed, per_probe, work = stages_by_probe(c, args.kind)
    X, QE = c["X"], c["QE"]
    R = np.eye(X.shape[1], dtype=np.float32)  # the identity rotation: the evidence prefix is the embedding's own
    ids = [str(i) for i in range(len(X))]
    versions = {"fixed": IndexVersion.in_memory(X, R, ids, ann=fixed)}
    versions |= {f"probe_{p}": IndexVersion.in_memory(X, R, ids, ann=s) for p, s in per_probe.items()}
    truth = ann.exhaustive_top_k(X, QE, K)
    rows = []
    for cold in (True, False):
        for t in ANN_TARGETS:
            rows.append(time_target(versions, QE, truth, t, cold))
            print(rows[-1]["condition"], t, {v: (x["over_fixed"], x["recall_at_10"], x["settled_at_probe"])
                                             for v, x in rows[-1]["paths"].items()}, flush=True)
    choice = {f"{t:g}": min(work, key=lambda p: (work[p][f"{t:g}"], p)) for t in ANN_TARGETS}
    report = {"kind": args.kind, "n_docs": len(X), "test_queries": len(QE),
              "command": f"OMP_NUM_THREADS=1 python -m bench.probe_sweep --n {args.n} --kind {args.kind}",
              "machine": f"{machine()}, 1 thread", "seconds": time.perf_counter() - t0,
              "efforts": {f"{t:g}": int(fixed.effort(t)) for t in ANN_TARGETS},
              "calibrated_p50_work": {str(p): w for p, w in work.items()}, "build_choice": choice, "rows": rows}
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
