"""Microbenchmark of the certified-width kernel (adawidth.levels) against faiss, one query at a time.

Every method answers the same queries, round-robin (query by query, methods in a rotating order), so load
on the machine hits every method alike; figures are also given as ratios within the run.

Methods (k = 10):

* ``faiss_flat``: ``IndexFlatIP`` over the rotated corpus (exhaustive; the reference of recall@10);
* ``faiss_panorama_L{n}``: ``IndexFlatIPPanorama(D, n, 1024)`` on the same rotation (exact; its work is
  ``faiss.cvar.indexPanorama_stats.ratio_dims_scanned``);
* ``static_funnel_m{m}_c{C}``: ``IndexRefine`` over an ``IndexFlatIP`` of the m-prefix (a contiguous copy
  through ``RemapDimensionsTransform``), the C = 10 * k_factor best rescored at full width by the same
  ``IndexFlatIP`` (work N m + C D);
* ``ours_exact_fp32`` / ``ours_exact_fp16``: :func:`adawidth.levels.search`, Cauchy-Schwarz bound (certified),
  the default layout without / with its float16 leading levels (the first 64 coordinates read by every
  document, :attr:`adawidth.levels.LevelLayout.exact_first_levels`);
* ``ours_<bound>_z{z}``: the data-aware bound ``data_aware`` or ``data_aware_doc`` at confidence z
  (default layout, float16; pruning from the first level, 32 coordinates, on).

Corpora: SciFact (5,183 documents, the 300 test queries; frozen encoder through the embedding cache) and a
synthetic corpus of ``--synthetic-n`` documents drawn from a Gaussian fitted to SciFact's document embeddings
(:mod:`adawidth.synthetic`), queries drawn from the same Gaussian (seed 1).  Rotation: PCA of the document
second moment (fitted on SciFact's documents), and the identity for the rotation comparison.

Latency: wall-clock p50/p95 per query, and the process CPU time per query (``time.process_time``; with one
thread the better measure on a shared machine, where the process may not hold a whole core).  Threads: 1 and
2 (faiss ``omp_set_num_threads``, ours ``threads=``).  ``--layouts`` instead sweeps level layouts for the
exact mode on the synthetic corpus (the choice of :meth:`adawidth.levels.LevelLayout.default`).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/levels_micro.py --home var --synthetic-n 1000000
    OMP_NUM_THREADS=1 .venv/bin/python bench/levels_micro.py --home var --synthetic-n 1000000 --layouts

Writes ``bench/results/levels/levels_micro.{json,md}`` (or ``levels_layouts.{json,md}``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adawidth import levels as lv  # noqa: E402
from adawidth.rotation import pca_rotation  # noqa: E402
from adawidth.synthetic import fit_gaussian, sample_corpus  # noqa: E402

K = 10
Z_GRID = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0)


# ------------------------------------------------------------------------------------------------ methods


class Method:
    """A named search: ``run(q) -> (rows, coordinates)``; ``threads`` is applied before each call."""

    def __init__(self, name: str, family: str, run, threads_setter, params: dict | None = None):
        self.name, self.family, self.run, self.set_threads, self.params = name, family, run, threads_setter, params or {}


def faiss_methods(X: np.ndarray, panorama_levels, funnels, faiss):
    """faiss flat, Panorama and static funnels over X (the flat index is also the funnels' refine index)."""
    N, D = X.shape
    flat = faiss.IndexFlatIP(D)
    flat.add(X)
    methods, keep = [], [flat]

    def set_omp(t):
        faiss.omp_set_num_threads(t)

    def flat_run(q):
        return flat.search(q[None], K)[1][0], N * D

    methods.append(Method("faiss_flat", "faiss_flat", flat_run, set_omp))
    for n_levels in panorama_levels:
        pan = faiss.IndexFlatIPPanorama(D, n_levels, 1024)
        pan.add(X)
        keep.append(pan)

        def pan_run(q, pan=pan):
            stats = faiss.cvar.indexPanorama_stats
            stats.reset()
            rows = pan.search(q[None], K)[1][0]
            return rows, stats.ratio_dims_scanned * N * D

        methods.append(Method(f"faiss_panorama_L{n_levels}", "faiss_flat_panorama", pan_run, set_omp,
                              {"n_levels": n_levels, "batch_size": 1024}))
    bases = {}
    for m, k_factor in funnels:
        if m not in bases:
            rt = faiss.RemapDimensionsTransform(D, m, faiss.swig_ptr(np.arange(m, dtype=np.int32)))
            base = faiss.IndexPreTransform(rt, faiss.IndexFlatIP(m))
            base.add(X)
            bases[m] = base
            keep.append(base)
        funnel = faiss.IndexRefine(bases[m], flat)
        funnel.k_factor = float(k_factor)
        keep.append(funnel)

        def funnel_run(q, funnel=funnel, m=m, C=K * k_factor):
            return funnel.search(q[None], K)[1][0], N * m + C * D

        methods.append(Method(f"static_funnel_m{m}_c{K * k_factor}", "static_funnel", funnel_run, set_omp,
                              {"prefix": m, "shortlist": K * k_factor}))
    return methods, keep


def our_methods(store16: lv.LevelStore, z_grid, bounds=("data_aware", "data_aware_doc")):
    """Ours exact (float32 levels only, and with the float16 leading levels) and the data-aware bounds."""
    layout32 = lv.LevelLayout(store16.layout.widths, 0)
    store32 = lv.LevelStore(layout32, store16.levels32, (), store16.tail_norms, store16.second_moment,
                            store16.max_norm)  # the same arrays, no float16 copy
    box = {"threads": 1}

    def set_threads(t):
        box["threads"] = t

    def make(store, **kw):
        def run(q):
            r = lv.search(store, q, K, threads=box["threads"], **kw)
            return r.rows, r.coordinates
        return run

    methods = [Method("ours_exact_fp32", "ours_exact", make(store32), set_threads, {"fp16": False}),
               Method("ours_exact_fp16", "ours_exact", make(store16), set_threads, {"fp16": True})]
    for bound in bounds:
        for z in z_grid:
            methods.append(Method(f"ours_{bound}_z{z:g}", f"ours_{bound}", make(store16, bound=bound, z=z),
                                  set_threads, {"bound": bound, "z": z}))
    return methods


def measure(methods, Q: np.ndarray, threads: int, reference: list[np.ndarray] | None, N: int, D: int) -> list[dict]:
    """Round-robin over queries; per method: recall@10 vs ``reference``, coordinates, wall and CPU percentiles."""
    rec = {m.name: {"wall": [], "cpu": [], "coords": [], "recall": []} for m in methods}
    for m in methods:  # warm-up (page in the arrays)
        m.set_threads(threads)
        m.run(Q[0])
    for i, q in enumerate(Q):
        for j in range(len(methods)):
            m = methods[(i + j) % len(methods)]
            m.set_threads(threads)
            c0, w0 = time.process_time(), time.perf_counter()
            rows, coords = m.run(q)
            w1, c1 = time.perf_counter(), time.process_time()
            r = rec[m.name]
            r["wall"].append(w1 - w0)
            r["cpu"].append(c1 - c0)
            r["coords"].append(coords)
            if reference is not None:
                r["recall"].append(len(set(np.asarray(rows).tolist()) & set(reference[i].tolist())) / K)
    out = []
    for m in methods:
        r = rec[m.name]
        out.append({"method": m.name, "family": m.family, "params": m.params, "threads": threads,
                    "recall_at_10": float(np.mean(r["recall"])) if r["recall"] else None,
                    "coordinate_share": float(np.mean(r["coords"]) / (N * D)),
                    "p50_ms": float(np.percentile(r["wall"], 50) * 1e3),
                    "p95_ms": float(np.percentile(r["wall"], 95) * 1e3),
                    "cpu_p50_ms": float(np.percentile(r["cpu"], 50) * 1e3), "n_queries": len(Q)})
    return out


def exhaustive(X: np.ndarray, Q: np.ndarray) -> list[np.ndarray]:
    """Top-10 rows of every query by float32 inner product, ties to the lower row (chunked over queries)."""
    out = []
    for s in range(0, len(Q), 64):
        S = Q[s:s + 64] @ X.T
        for row in S:
            top = np.argpartition(-row, K)[:K + 1] if len(row) > K + 1 else np.arange(len(row))
            cand = np.flatnonzero(row >= row[top].min())
            out.append(cand[np.lexsort((cand, -row[cand]))][:K])
    return out


# ------------------------------------------------------------------------------------------------ corpora


def scifact_embeddings(home: Path, dataset: Path):
    sys.path.insert(0, str(ROOT / "bench"))
    from funnels import load_embedded

    e = load_embedded(dataset, home, use_train=False)
    return e.X.astype(np.float32), e.Qt.astype(np.float32)


def run_corpus(name: str, data: dict, rotation: str, args, faiss, full: bool = True) -> dict:
    """Build every index over ``data["X"]`` (already rotated; popped, and freed once the indexes hold it) and
    measure ``data["Q"]`` at 1 and 2 threads."""
    X, Q = data.pop("X"), data.pop("Q")
    N, D = X.shape
    t = time.perf_counter()
    store = lv.LevelStore.build(X)
    build_s = time.perf_counter() - t
    ref = None
    fm, keep = faiss_methods(X, args.panorama_levels if full else (8,), args.funnels if full else (), faiss)
    flat = keep[0]
    ref = [flat.search(Q[i:i + 1], K)[1][0] for i in range(len(Q))] if N > 200_000 else exhaustive(X, Q)
    methods = fm + our_methods(store, Z_GRID if full else (), () if not full else ("data_aware", "data_aware_doc"))
    del X
    gc.collect()
    rows = []
    for threads in args.threads:
        rows += measure(methods, Q, threads, ref, N, D)
        print(json.dumps({"corpus": name, "rotation": rotation, "threads": threads, "done": True}), flush=True)
    for r in rows:
        r.update({"corpus": name, "n_docs": N, "rotation": rotation})
    meta = {"corpus": name, "n_docs": N, "rotation": rotation, "level_store_build_s": build_s,
            "level_store_bytes": store.nbytes, "layout": {"bounds": store.layout.bounds,
                                                          "fp16_levels": store.layout.fp16_levels}}
    del methods, keep, store
    gc.collect()
    return {"rows": rows, "meta": meta}


def synthetic(args, R: np.ndarray, X_fit: np.ndarray, rotated: bool) -> tuple[np.ndarray, np.ndarray]:
    model = fit_gaussian(X_fit)
    rot = R if rotated else None
    X = sample_corpus(model, args.synthetic_n, seed=0, rotation=rot)
    Q = sample_corpus(model, args.synthetic_queries, seed=1, rotation=rot)
    return X, Q


# ------------------------------------------------------------------------------------------------ layouts


LAYOUT_Z = (3.5, 4.0)
LAYOUTS = {
    "default 32,64,96,128,192,256 fp16<=128": ((0, 32, 64, 96, 128, 192, 256, 384), 4),
    "same, no fp16": ((0, 32, 64, 96, 128, 192, 256, 384), 0),
    "same, all fp16": ((0, 32, 64, 96, 128, 192, 256, 384), 7),
    "64,96,128,192,256 fp16<=128": ((0, 64, 96, 128, 192, 256, 384), 3),
    "16,32,48,64,96,128,192,256 fp16<=128": ((0, 16, 32, 48, 64, 96, 128, 192, 256, 384), 6),
    "uniform 16 fp16<=128": (tuple(range(0, 385, 16)), 8),
    "uniform 32 fp16<=128": (tuple(range(0, 385, 32)), 4),
    "uniform 48 (Panorama-like 8 levels) fp16<=96": (tuple(range(0, 385, 48)), 2),
    "64,128,192,256,320 fp16<=128": ((0, 64, 128, 192, 256, 320, 384), 2),
    "64,80,96,112,128,160,192,256 fp16<=128": ((0, 64, 80, 96, 112, 128, 160, 192, 256, 384), 5),
    "80,112,144,192,256 fp16<=144": ((0, 80, 112, 144, 192, 256, 384), 3),
}


def run_layouts(args, X: np.ndarray, Q: np.ndarray, faiss) -> dict:
    N, D = X.shape
    faiss.omp_set_num_threads(1)
    flat = faiss.IndexFlatIP(D)
    flat.add(X)
    ref = [flat.search(Q[i:i + 1], K)[1][0] for i in range(len(Q))]
    rows = []
    for name, (bounds, n16) in LAYOUTS.items():
        store = lv.LevelStore.build(X, lv.LevelLayout.from_bounds(bounds, n16))

        def ours(q, store=store, **kw):
            r = lv.search(store, q, K, **kw)
            return r.rows, r.coordinates

        params = {"bounds": bounds, "fp16_levels": n16, "exact_first_levels": store.layout.exact_first_levels}
        methods = [Method("faiss_flat", "faiss_flat", lambda q: (flat.search(q[None], K)[1][0], N * D), lambda t: None),
                   Method(f"{name}: exact", "ours_exact", ours, lambda t: None, params)]
        for z in LAYOUT_Z:
            methods.append(Method(f"{name}: data_aware_doc z={z:g}", "ours_data_aware_doc",
                                  lambda q, ours=ours, z=z: ours(q, bound="data_aware_doc", z=z), lambda t: None, params))
        res = measure(methods, Q, 1, ref, N, D)
        f = res[0]
        for r in res[1:]:
            r.update({"ratio_to_flat_p50": r["p50_ms"] / f["p50_ms"], "ratio_to_flat_cpu": r["cpu_p50_ms"] / f["cpu_p50_ms"],
                      "flat_p50_ms": f["p50_ms"], "store_bytes": store.nbytes})
            rows.append(r)
            print(json.dumps({k: r[k] for k in ("method", "p50_ms", "ratio_to_flat_p50", "ratio_to_flat_cpu",
                                                "coordinate_share", "recall_at_10")}), flush=True)
        del store, methods
        gc.collect()
    return {"rows": rows}


# ------------------------------------------------------------------------------------------------ report


def targets(rows: list[dict]) -> list[dict]:
    """Where the synthetic 1-thread PCA rows stand against the issue's targets (wall p50 and CPU p50)."""
    out = []
    for corpus in sorted({r["corpus"] for r in rows}):
        sel = [r for r in rows if r["corpus"] == corpus and r["threads"] == 1 and r["rotation"] == "pca"]
        if not sel:
            continue
        by = {r["method"]: r for r in sel}
        flat = by.get("faiss_flat")
        pans = [r for r in sel if r["family"] == "faiss_flat_panorama"]
        ours = by.get("ours_exact_fp16")
        for metric in ("p50_ms", "cpu_p50_ms"):
            if flat and ours:
                out.append({"corpus": corpus, "metric": metric, "target": "ours exact <= 0.25 x faiss IndexFlatIP",
                            "ratio": ours[metric] / flat[metric], "limit": 0.25})
            if pans and ours:
                best = min(pans, key=lambda r: r[metric])
                out.append({"corpus": corpus, "metric": metric,
                            "target": f"ours exact <= 0.8 x IndexFlatIPPanorama (best: {best['method']})",
                            "ratio": ours[metric] / best[metric], "limit": 0.8})
            good_ours = [r for r in sel if r["family"].startswith("ours_data") and r["recall_at_10"] >= 0.99]
            good_fun = [r for r in sel if r["family"] == "static_funnel" and r["recall_at_10"] >= 0.99]
            if good_ours and good_fun:
                o = min(good_ours, key=lambda r: r[metric])
                f = min(good_fun, key=lambda r: r[metric])
                out.append({"corpus": corpus, "metric": metric,
                            "target": f"recall >= 0.99: ours ({o['method']}, {o['recall_at_10']:.3f}) <= 0.5 x static "
                                      f"funnel ({f['method']}, {f['recall_at_10']:.3f})",
                            "ratio": o[metric] / f[metric], "limit": 0.5})
    for t in out:
        t["met"] = t["ratio"] <= t["limit"]
    return out


def markdown(report: dict) -> str:
    lines = [f"# {report['title']}\n", f"Command: `{report['command']}`\n",
             f"Machine: {report['machine']}. Kernel SIMD: `{report['isa']}`. {report['note']}\n"]
    rows = report["rows"]
    if report.get("targets"):
        lines += ["## Targets (1 thread, PCA rotation)\n", "| corpus | metric | target | ratio | met |", "|---|---|---|---|---|"]
        for t in report["targets"]:
            lines.append(f"| {t['corpus']} | {t['metric']} | {t['target']} | {t['ratio']:.3f} (limit {t['limit']}) | "
                         f"{'yes' if t['met'] else 'no'} |")
        lines.append("")
    groups = sorted({(r["corpus"], r.get("rotation", "pca"), r["threads"]) for r in rows}, key=lambda g: (g[0], g[1], g[2]))
    for corpus, rotation, threads in groups:
        sel = [r for r in rows if r["corpus"] == corpus and r.get("rotation", "pca") == rotation and r["threads"] == threads]
        flat = next((r for r in sel if r["method"] == "faiss_flat"), None)
        lines += [f"## {corpus} (N = {sel[0]['n_docs']:,}), rotation {rotation}, {threads} thread{'s' if threads > 1 else ''}\n",
                  "| method | recall@10 | coordinates / N·D | p50 ms | p95 ms | CPU p50 ms | p50 / flat | CPU / flat |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sel:
            rec = "—" if r["recall_at_10"] is None else f"{r['recall_at_10']:.4f}"
            ratio = f"{r['p50_ms'] / flat['p50_ms']:.3f}" if flat else "—"
            cratio = f"{r['cpu_p50_ms'] / flat['cpu_p50_ms']:.3f}" if flat else "—"
            lines.append(f"| {r['method']} | {rec} | {r['coordinate_share']:.4f} | {r['p50_ms']:.3f} | {r['p95_ms']:.3f} | "
                         f"{r['cpu_p50_ms']:.3f} | {ratio} | {cratio} |")
        lines.append("")
    if report.get("meta"):
        lines += ["## Builds\n", "| corpus | rotation | level store build s | level store MiB | layout |", "|---|---|---|---|---|"]
        for m in report["meta"]:
            lines.append(f"| {m['corpus']} | {m['rotation']} | {m['level_store_build_s']:.1f} | "
                         f"{m['level_store_bytes'] / 2 ** 20:.0f} | {m['layout']} |")
        lines.append("")
    return "\n".join(lines)


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average at start " \
           f"{os.getloadavg()[0]:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", type=Path, default=ROOT / "var")
    p.add_argument("--dataset", type=Path, default=ROOT / "data" / "scifact")
    p.add_argument("--synthetic-n", type=int, default=1_000_000)
    p.add_argument("--synthetic-queries", type=int, default=200)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--panorama-levels", type=int, nargs="+", default=[8, 16, 24])
    p.add_argument("--funnels", type=str, nargs="+", default=["32:10", "32:20", "32:50", "32:100", "32:200", "48:20",
                                                                "48:50", "48:100", "64:10", "64:20", "64:50", "64:100"],
                   help="prefix:k_factor")
    p.add_argument("--skip-scifact", action="store_true")
    p.add_argument("--skip-identity", action="store_true")
    p.add_argument("--layouts", action="store_true", help="sweep level layouts (exact mode, synthetic corpus)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "levels")
    args = p.parse_args(argv)
    args.funnels = [tuple(int(x) for x in f.split(":")) for f in args.funnels]
    import faiss

    faiss.omp_set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "OMP_NUM_THREADS=1 .venv/bin/python bench/levels_micro.py " + " ".join(
        a if not a.startswith("/") else os.path.relpath(a, ROOT) for a in (argv if argv is not None else sys.argv[1:]))
    X_sf, Q_sf = scifact_embeddings(args.home, args.dataset)
    R = pca_rotation(X_sf)
    note = ("Timings are one query at a time, methods interleaved query by query; the machine was shared with "
            "other jobs (a background encoder at nice 19 and other test runs), so absolute times vary between runs "
            "and only the ratios within a run are meaningful.")
    if args.layouts:
        X, Q = synthetic(args, R, X_sf, rotated=True)
        res = run_layouts(args, X, Q[: min(len(Q), 80)], faiss)
        for r in res["rows"]:
            r.update({"corpus": "synthetic", "n_docs": len(X), "rotation": "pca"})
        report = {"title": "Level layouts (synthetic, PCA, 1 thread)", "command": command,
                  "machine": machine(), "isa": lv._kernel.isa(), "note": note, "rows": res["rows"]}
        (args.out / "levels_layouts.json").write_text(json.dumps(report, indent=1))
        md = "\n".join([f"# {report['title']}\n", f"Command: `{command}`\n",
                        f"Machine: {report['machine']}. Kernel SIMD: `{report['isa']}`. {note} Each layout is timed "
                        f"in its own round-robin with faiss IndexFlatIP (1M x 384, {len(Q)} queries).\n",
                        "| layout: mode | recall@10 | coordinates / N·D | p50 / flat | CPU / flat | p50 ms | MiB |",
                        "|---|---|---|---|---|---|---|"] + [
            f"| {r['method']} | {r['recall_at_10']:.4f} | {r['coordinate_share']:.4f} | {r['ratio_to_flat_p50']:.3f} | "
            f"{r['ratio_to_flat_cpu']:.3f} | {r['p50_ms']:.1f} | {r['store_bytes'] / 2 ** 20:.0f} |" for r in res["rows"]]) + "\n"
        (args.out / "levels_layouts.md").write_text(md)
        return 0

    rows, meta = [], []
    if not args.skip_scifact:
        for rotation, Rm in (("pca", R), ("identity", None)):
            if rotation == "identity" and args.skip_identity:
                continue
            Xr = (X_sf @ Rm.T).astype(np.float32) if Rm is not None else X_sf
            Qr = (Q_sf @ Rm.T).astype(np.float32) if Rm is not None else Q_sf
            res = run_corpus("scifact", {"X": Xr, "Q": Qr}, rotation, args, faiss, full=rotation == "pca")
            rows += res["rows"]
            meta.append(res["meta"])
    if args.synthetic_n:
        for rotation in ("pca", "identity"):
            if rotation == "identity" and args.skip_identity:
                continue
            X, Q = synthetic(args, R, X_sf, rotated=rotation == "pca")
            data = {"X": X, "Q": Q}
            del X, Q
            res = run_corpus("synthetic", data, rotation, args, faiss, full=rotation == "pca")
            rows += res["rows"]
            meta.append(res["meta"])
            gc.collect()
    report = {"title": "Certified-width kernel against faiss (one query at a time)", "command": command,
              "machine": machine(), "isa": lv._kernel.isa(), "note": note,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "load_average_end": os.getloadavg()[0], "rows": rows, "meta": meta, "targets": targets(rows)}
    (args.out / "levels_micro.json").write_text(json.dumps(report, indent=1))
    md = markdown(report) + f"\nPeak RSS of the run: {report['peak_rss_mib']:.0f} MiB; load average at the end " \
                            f"{report['load_average_end']:.1f}.\n"
    (args.out / "levels_micro.md").write_text(md)
    print(json.dumps(report["targets"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
