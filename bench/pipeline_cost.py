"""What the query pipeline adds to an ANN search, with warm and with cold caches (issue 19).

``bench.scale`` times faiss's own indexes as one ``index.search`` call on a rotated query, and ours through the
whole :class:`engine.pipeline.Pipeline` (plan, rotation, stage 1, rescoring, render), every method interleaved
query by query, so each starts with caches the others have used.  This script splits the difference, on one HNSW
index (``--kind``, M = 32) over a debdocs prefix (``--n`` passages, 2,000 training and 1,000 test queries, one
thread), per default target at the efSearch tuned on the training queries and with the per-query effort model
(fitted as the build fits it, :func:`trainer.recall_fit.fit_effort_models`).  Fourteen paths, each timed over blocks
of 100 queries, the paths in a fresh random order for every block:

- ``faiss``: ``index.search`` with ``SearchParametersHNSW`` at the tuned efSearch (the benchmark's baselines);
- ``stage_fixed`` / ``stage_per_query``: :meth:`engine.stage1.AnnStage1.search` at that efSearch and
  :meth:`engine.stage1.AnnStage1.per_query` (probe, model, continuation);
- ``pipeline_fixed`` / ``pipeline_per_query``: :meth:`engine.pipeline.Pipeline.search` of the same two through an
  in-memory version, one request at a time, from the query embedding (no encoder), the index in the space a build
  stores it in (:func:`engine.ann.index_space`: as encoded for the kinds without Panorama, so the rotation stage
  computes only the evidence's 64 leading coordinates);
- ``pipeline_per_query_rotated``: the same per-query path on a version that declares its index rotated (as every
  version built before 2026-12-06 does), so the rotation stage computes all D coordinates: what that saves;
- ``stage_per_query_python`` / ``pipeline_per_query_python``: the per-query stage and pipeline with the compiled
  probe-and-choice off (``AnnStage1(fused_choice=False)``: :func:`engine.ann.probe`, then
  :meth:`engine.recall.RecallPolicy.choose`, as every release before 2026-12-06 served it);
- ``stage_per_query_two_calls`` / ``pipeline_per_query_two_calls``: the compiled probe-and-choice, then the
  continuation's Python calls (``AnnStage1(one_call=False)``: :func:`engine.ann.probe_and_choose`, then
  :func:`engine.ann.continue_search`, as served before 2026-12-07), where the served path is one compiled call
  (:func:`engine.ann.serve_per_query`);
- the per-query stage's parts: ``probe_search`` (:func:`engine.ann.search` at the probe's efSearch), ``probe``
  (:func:`engine.ann.probe`: that search and its evidence) and ``choose`` (the model's choice,
  :meth:`engine.recall.RecallPolicy.choose`, on the query's evidence computed beforehand).  ``probe`` less
  ``probe_search`` is what reading the evidence costs; ``choose`` is the model; ``probe_choose``
  (:func:`engine.ann.probe_and_choose`: the probe's search, then evidence and choice in one compiled call) less
  ``probe_search`` is what the two cost compiled.

Each under two conditions: ``warm`` (the queries back to back) and ``cold`` (a 64 MiB buffer summed before every
call, which leaves the last-level cache holding none of the index, the rotation, the model or the interpreter's
working set: what ``bench.scale``'s interleaving with flat scans does, and what a gateway meets when the encoder's
weights pass through the caches between two searches).  Per path and condition the p50 in µs; for the pipeline
paths also the p50 of the trace's stage timings (``rotate``, ``stage1``, ``rescore``) and of what lies outside
them (plan resolution, capabilities, render).  The versions' rotation is the identity matrix: the rotation stage
costs its product and its read of R whatever R holds, and the evidence prefix is then the embedding's own.

Usage::

    OMP_NUM_THREADS=1 python -m bench.pipeline_cost --n 221170 --kind hnsw_fp16

Results: ``bench/results/pipeline_cost/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import time

import numpy as np

from bench.ann_effort_cap import K, corpus_parser, tuned_index, write
from bench.common import machine
from bench.scale import ANN_TARGETS
from engine.ann import ENERGY_PREFIX, index_space, probe, probe_and_choose, search
from engine.index import IndexVersion
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from engine.recall import RecallPolicy
from engine.stage1 import AnnStage1
from trainer.recall_fit import fit_effort_models

PATHS = ("faiss", "stage_fixed", "stage_per_query", "pipeline_fixed", "pipeline_per_query",
         "pipeline_per_query_rotated", "stage_per_query_python", "pipeline_per_query_python",
         "stage_per_query_two_calls", "pipeline_per_query_two_calls", "probe_search", "probe", "choose",
         "probe_choose")
STAGES = ("rotate", "stage1", "rescore")
EVICT_BYTES = 64 << 20
"""The buffer summed before every call of the ``cold`` condition (larger than this machine's last-level cache)."""
BLOCKS = 10
"""The test queries are timed in this many blocks (see :func:`time_paths`)."""


def time_paths(fixed: AnnStage1, model: AnnStage1, python: AnnStage1, two: AnnStage1, versions: dict,
               Q: np.ndarray, target: float, cold: bool) -> dict:
    """One target under one condition: per path the p50 µs; per pipeline path the stages' p50 µs."""
    import faiss

    effort = fixed.effort(target)
    params = faiss.SearchParametersHNSW()
    params.efSearch = int(effort)
    spec = SearchSpec("q", k=K, width="auto", policy="recall", recall_target=target)
    pipe = Pipeline()
    E = np.ascontiguousarray(Q, np.float32)  # the identity rotation: the embedding is the rotated query
    probe_at = model.probe_effort(target)
    policy = model.policy_for(target)
    evidence = [probe(model.index, model.kind, E[i], K, probe_at, prefix=E[i, :ENERGY_PREFIX]) for i in range(len(E))]
    junk = np.ones(EVICT_BYTES // 4, np.float32) if cold else None
    calls = {
        "faiss": lambda i: fixed.index.search(E[i:i + 1], K, params=params),
        "stage_fixed": lambda i: fixed.search(E[i], K, effort),
        "stage_per_query": lambda i: model.per_query(E[i], target, K, prefix=E[i, :ENERGY_PREFIX]),
        "pipeline_fixed": lambda i: pipe.search(versions["fixed"], [spec], embeddings=E[i:i + 1])[0],
        "pipeline_per_query": lambda i: pipe.search(versions["per_query"], [spec], embeddings=E[i:i + 1])[0],
        "pipeline_per_query_rotated": lambda i: pipe.search(versions["per_query_rotated"], [spec],
                                                            embeddings=E[i:i + 1])[0],
        "stage_per_query_python": lambda i: python.per_query(E[i], target, K, prefix=E[i, :ENERGY_PREFIX]),
        "pipeline_per_query_python": lambda i: pipe.search(versions["per_query_python"], [spec],
                                                           embeddings=E[i:i + 1])[0],
        "stage_per_query_two_calls": lambda i: two.per_query(E[i], target, K, prefix=E[i, :ENERGY_PREFIX]),
        "pipeline_per_query_two_calls": lambda i: pipe.search(versions["per_query_two_calls"], [spec],
                                                              embeddings=E[i:i + 1])[0],
        "probe_choose": lambda i: probe_and_choose(model.index, model.kind, E[i], K, probe_at, policy, target,
                                                   prefix=E[i, :ENERGY_PREFIX]),
        "probe_search": lambda i: search(model.index, model.kind, E[i], K, probe_at),
        "probe": lambda i: probe(model.index, model.kind, E[i], K, probe_at, prefix=E[i, :ENERGY_PREFIX]),
        "choose": lambda i: policy.choose(evidence[i], target),
    }
    lat = {p: [] for p in PATHS}
    stages = {p: {s: [] for s in (*STAGES, "outside")} for p in PATHS if p.startswith("pipeline")}
    clock = time.perf_counter
    rng = np.random.default_rng(0)
    # blocks of queries, each path over a whole block in a fresh random order of the paths: within a block a path
    # meets only its own caches (warm; one path's search of a query right after another's would find that
    # query's graph region cached), across blocks every path meets the machine's drift alike
    for block in np.array_split(np.arange(len(E)), BLOCKS):
        for j in rng.permutation(len(PATHS)):
            p = PATHS[j]
            for i in block:
                if junk is not None:
                    junk.sum()
                a = clock()
                got = calls[p](i)
                lat[p].append(clock() - a)
                if p in stages:
                    tm = got.trace["timings_seconds"]
                    for s in STAGES:
                        stages[p][s].append(tm[s])
                    stages[p]["outside"].append(lat[p][-1] - tm["total"])
    us = lambda v: round(float(np.median(v)) * 1e6, 1)  # noqa: E731
    out = {"target": target, "condition": "cold" if cold else "warm", "effort": int(effort),
           "probe": model.probe_effort(target), "p50_us": {p: us(v) for p, v in lat.items()},
           "stage_p50_us": {p: {s: us(v) for s, v in d.items()} for p, d in stages.items()}}
    p50 = out["p50_us"]
    out["ratios"] = {"per_query_over_fixed_stage": round(p50["stage_per_query"] / p50["stage_fixed"], 3),
                     "per_query_over_fixed_pipeline": round(p50["pipeline_per_query"] / p50["pipeline_fixed"], 3),
                     "pipeline_fixed_over_faiss": round(p50["pipeline_fixed"] / p50["faiss"], 3),
                     "rotated_over_served_per_query": round(p50["pipeline_per_query_rotated"]
                                                            / p50["pipeline_per_query"], 3),
                     "pipeline_per_query_over_faiss": round(p50["pipeline_per_query"] / p50["faiss"], 3),
                     "python_per_query_over_fixed_pipeline": round(p50["pipeline_per_query_python"]
                                                                   / p50["pipeline_fixed"], 3),
                     "compiled_over_python_pipeline": round(p50["pipeline_per_query"]
                                                            / p50["pipeline_per_query_python"], 3),
                     "two_calls_per_query_over_fixed_pipeline": round(p50["pipeline_per_query_two_calls"]
                                                                      / p50["pipeline_fixed"], 3),
                     "one_call_over_two_calls_pipeline": round(p50["pipeline_per_query"]
                                                               / p50["pipeline_per_query_two_calls"], 3)}
    out["per_query_parts_us"] = {"probe_search": p50["probe_search"],
                                 "evidence": round(p50["probe"] - p50["probe_search"], 1),
                                 "model": p50["choose"],
                                 "evidence_and_model_compiled": round(p50["probe_choose"] - p50["probe_search"], 1)}
    return out


def markdown(report: dict) -> str:
    lines = [f"# What the query pipeline adds to an ANN search ({report['kind']}, debdocs N = {report['n_docs']:,})",
             "", f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}. {report['test_queries']} test queries in {BLOCKS} blocks, each path over "
             f"a whole block, the paths in a random order per block; `cold`: a {EVICT_BYTES >> 20} MiB buffer summed "
             f"before every call. Run time "
             f"{report['seconds']:.0f} s. p50 in µs.", "",
             "| target | caches | efSearch | probe | faiss | stage fixed | stage per-query | pipeline fixed | "
             "pipeline per-query | same, two calls | same, rotated index | same, Python choice | "
             "per-query / fixed (stage) | per-query / fixed (pipeline) | same, two calls | same, Python choice | "
             "pipeline per-query / faiss |", "|" + "---|" * 17]
    for r in report["rows"]:
        p, q = r["p50_us"], r["ratios"]
        lines.append(f"| {r['target']:g} | {r['condition']} | {r['effort']} | {r['probe']} | {p['faiss']:.0f} | "
                     f"{p['stage_fixed']:.0f} | {p['stage_per_query']:.0f} | {p['pipeline_fixed']:.0f} | "
                     f"{p['pipeline_per_query']:.0f} | {p['pipeline_per_query_two_calls']:.0f} | "
                     f"{p['pipeline_per_query_rotated']:.0f} | "
                     f"{p['pipeline_per_query_python']:.0f} | {q['per_query_over_fixed_stage']:.2f}x | "
                     f"{q['per_query_over_fixed_pipeline']:.2f}x | {q['two_calls_per_query_over_fixed_pipeline']:.2f}x | "
                     f"{q['python_per_query_over_fixed_pipeline']:.2f}x | {q['pipeline_per_query_over_faiss']:.2f}x |")
    lines += ["", "Pipeline stages (p50 µs of the trace's timings; `outside`: plan, capabilities and render, the "
                  "call's time less the trace's total):", "",
              "| target | caches | path | rotate | stage1 | rescore | outside |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        for p, s in r["stage_p50_us"].items():
            lines.append(f"| {r['target']:g} | {r['condition']} | {p} | {s['rotate']:.0f} | {s['stage1']:.0f} | "
                         f"{s['rescore']:.0f} | {s['outside']:.0f} |")
    lines += ["", "The per-query stage's parts (p50 µs): the probe's search at its efSearch, reading the evidence "
                  "(`probe` less `probe_search`), the model's choice (`choose`), both in the compiled call (`probe_choose` "
                  "less `probe_search`):", "",
              "| target | caches | probe efSearch | probe search | evidence | model | both, compiled | stage fixed |",
              "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        q = r["per_query_parts_us"]
        lines.append(f"| {r['target']:g} | {r['condition']} | {r['probe']} | {q['probe_search']:.0f} | "
                     f"{q['evidence']:.0f} | {q['model']:.0f} | {q['evidence_and_model_compiled']:.0f} | "
                     f"{r['p50_us']['stage_fixed']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = corpus_parser(__doc__, "pipeline_cost")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    c = tuned_index(args)
    X, QT, QE, params, index, tt, curve = (c[k] for k in ("X", "QT", "QE", "params", "index", "tt", "curve"))
    # the identity rotation: the evidence prefix is the embedding's own leading coordinates
    # as the build fits them: an index over the documents as encoded without the energy features, so its
    # queries rotate nothing (engine.ann.ENERGY_FEATURES)
    fits = fit_effort_models(index, params, X, QT, curve, k=K, truth=tt, targets=ANN_TARGETS,
                             prefixes=QT[:, :ENERGY_PREFIX], energy=index_space(args.kind) == "rotated")
    policies = {t: RecallPolicy(f.booster, f.table.feature_names, f.table.z_grid, "ann", f.oof, f.table.recall, k=K)
                for f in fits for t in f.targets}
    # as bench.scale's ours_fixed_r* (the efSearch tuned to the target) and ours_recall_* (the models)
    space = index_space(args.kind)
    fixed = AnnStage1(index, params, curve, margin_share=0.0, space=space)
    model = AnnStage1(index, params, curve, margin_share=0.25, target_policies=policies, space=space)
    rotated = AnnStage1(index, params, curve, margin_share=0.25, target_policies=policies, space="rotated")
    python = AnnStage1(index, params, curve, margin_share=0.25, target_policies=policies, space=space,
                       fused_choice=False)
    two = AnnStage1(index, params, curve, margin_share=0.25, target_policies=policies, space=space, one_call=False)
    R = np.eye(X.shape[1], dtype=np.float32)
    ids = [str(i) for i in range(len(X))]
    versions = {"fixed": IndexVersion.in_memory(X, R, ids, ann=fixed),
                "per_query": IndexVersion.in_memory(X, R, ids, ann=model),
                "per_query_rotated": IndexVersion.in_memory(X, R, ids, ann=rotated),
                "per_query_python": IndexVersion.in_memory(X, R, ids, ann=python),
                "per_query_two_calls": IndexVersion.in_memory(X, R, ids, ann=two)}
    rows = []
    for cold in (False, True):
        for t in ANN_TARGETS:
            rows.append(time_paths(fixed, model, python, two, versions, QE, t, cold))
            print(rows[-1]["condition"], t, rows[-1]["p50_us"], rows[-1]["ratios"], flush=True)
    report = {"kind": args.kind, "n_docs": len(X), "test_queries": len(QE),
              "command": f"OMP_NUM_THREADS=1 python -m bench.pipeline_cost --n {args.n} --kind {args.kind}",
              "machine": f"{machine()}, 1 thread", "seconds": time.perf_counter() - t0, "rows": rows}
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
