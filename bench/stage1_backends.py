"""Latency and throughput of the Milvus stage-1 backend against faiss (issue 10).

For each corpus the same index version is served twice through
:func:`bench.common.search_one` (the served pipeline: rotation, stage 1, routing /
rescoring; the encoder is left out, it is the same for both): once with faiss in
process (the default), once with Milvus (FLAT, metric IP; Milvus Lite in process
and, with ``--server``, a Milvus Lite server process reached over gRPC like a
Milvus cluster).  It reports per-query latency percentiles (one client), the
throughput of ``--threads`` concurrent clients, the time and memory to write the
version into Milvus, and the share of queries whose top-10 equals faiss's.

Corpora: ``scifact`` (a PCA version of the 5,183 SciFact documents with a
(64,128) router, policy ``auto``) and synthetic corpora of N documents drawn from
a 384-d Gaussian fitted to the SciFact document embeddings (mean and covariance),
L2-normalised, rotated by SciFact's PCA rotation, policy width 128; queries are the
SciFact test queries.  Sizes are tried in the order given; a size whose Milvus
write exceeds ``--write-budget-s`` stops the ladder (reported, with the reason).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.stage1_backends --sizes scifact 100000 1000000 --server

Writes ``bench/results/stage1_backends.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import faiss
import numpy as np

from adawidth.prefix import prefix_normalize
from adawidth.synthetic import fit_gaussian, sample_corpus
from bench.common import ROOT, command, search_one
from engine.encoder import OnnxEncoder
from engine.index import IndexVersion
from engine.io import atomic
from engine.io.beir import load_collection
from engine.stage1 import Stage1Provider
from engine.version import files, store
from engine.version.manifest import CoreSection, read_manifest
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.milvus_stage1 import write_version


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process (this one by default), in bytes (Linux /proc)."""
    with open(f"/proc/{pid or os.getpid()}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its children, in bytes."""
    total = rss_bytes(pid)
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    except OSError:
        kids = []
    return total + sum(tree_rss_bytes(int(k)) for k in kids)


def scifact_inputs(home: Path, encoder_dir: Path):
    """(version dir of a PCA SciFact version with a (64,128) router, test-query embeddings (Q, D), PCA R)."""
    encoder = OnnxEncoder(encoder_dir, threads=1)
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=ROOT / "var" / "cache" / "embeddings.sqlite").resolved()
    path, _ = build_index(BuildOptions(dataset=ROOT / "data" / "scifact", rotation="pca", eval_split=None,
                                       action_pairs=((64, 128),), default_pair=(64, 128), publish=False),
                          settings, encoder)
    col = load_collection(ROOT / "data" / "scifact", "test")
    qids = sorted(col.judged_queries())
    Q = encoder.encode([col.queries[q] for q in qids])
    return path, Q, np.load(path / "rotation.npy")


def synthetic_version(root: Path, n: int, X_fit: np.ndarray, R: np.ndarray, m0: int = 64, seed: int = 0) -> Path:
    """Write an index version of ``n`` documents from the Gaussian fitted to ``X_fit`` ((N, D) unit rows)."""
    D = X_fit.shape[1]
    model = fit_gaussian(X_fit)
    tmp = root / f"synthetic-{n}-parts"
    tmp.mkdir(parents=True, exist_ok=True)
    docs = np.lib.format.open_memmap(tmp / "docs.npy", mode="w+", dtype=np.float32, shape=(n, D))
    sample_corpus(model, n, seed=seed, rotation=R, out=docs)  # rows normalise(x) @ R.T
    index = faiss.IndexFlatIP(m0)
    sq = np.empty(n, np.float32)
    for s in range(0, n, 100_000):
        Xr = np.asarray(docs[s:s + 100_000])
        index.add(prefix_normalize(Xr, m0))
        sq[s:s + len(Xr)] = np.einsum("ij,ij->i", Xr[:, :m0], Xr[:, :m0])
    docs.flush()
    del docs
    core = CoreSection()  # the core files streamed here (the documents are moved, not copied)
    writers = {core.rotation: lambda p: np.save(p, R.astype(np.float32)),
               core.docs: lambda p: os.replace(tmp / "docs.npy", p),
               core.doc_sqnorm_m0: lambda p: np.save(p, sq),
               core.doc_ids: lambda p: p.write_text(json.dumps([f"s{i}" for i in range(n)]))}
    s1, stage1 = files.stage1_files(np.empty((0, m0), np.float32), m0, index=index)
    writers.update(s1)
    manifest = {"collection": "synthetic", "encoder": {"onnx_sha256": "synthetic"}, "dimension": D, "m0": m0,
                "shortlist": 500, "core": core, "stage1": stage1,
                "adapter": {"kind": "pca", "sha256": f"gaussian-{n}-{seed}"}, "router": None,
                "corpus": {"documents": n, "source": "384-d Gaussian fitted to SciFact document embeddings"}}
    return store.write_version(root / "synthetic", f"n{n}", writers, manifest)


def time_backend(version, Q: np.ndarray, width, threads: int, rounds: int = 1) -> dict:
    """Latency percentiles of one client and throughput of ``threads`` clients over the queries ``Q``."""
    for q in Q[:5]:
        search_one(version, q, 10, width, policy="router")  # warm
    lat, stage1 = [], []
    ids = []
    for _ in range(rounds):
        for q in Q:
            t = time.perf_counter()
            out = search_one(version, q, 10, width, policy="router")
            lat.append(time.perf_counter() - t)
            stage1.append(out.trace["timings_seconds"].get("stage1", 0.0))
            ids.append(out.ids)
    lat_ms = np.array(lat) * 1e3
    idx = iter(range(len(Q) * rounds))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(idx, None)
            if i is None:
                return
            search_one(version, Q[i % len(Q)], 10, width, policy="router")

    t = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    wall = time.perf_counter() - t
    return {"p50_ms": round(float(np.percentile(lat_ms, 50)), 3), "p95_ms": round(float(np.percentile(lat_ms, 95)), 3),
            "p99_ms": round(float(np.percentile(lat_ms, 99)), 3), "mean_ms": round(float(lat_ms.mean()), 3),
            "stage1_p50_ms": round(float(np.percentile(np.array(stage1) * 1e3, 50)), 3),
            "qps_1_client": round(1e3 / float(lat_ms.mean()), 1),
            f"qps_{threads}_clients": round(len(Q) * rounds / wall, 1), "_ids": ids[:len(Q)]}


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    """A Milvus Lite gRPC server process on a free port; returns (process, uri)."""
    from pymilvus import MilvusClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(workdir), "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            c = MilvusClient(uri=uri, timeout=2)
            c.list_collections()
            c.close()
            return proc, uri
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("Milvus Lite server did not start")
            time.sleep(0.2)


def bench_corpus(label: str, path: Path, Q: np.ndarray, width, args, work: Path) -> dict:
    row = {"corpus": label, "documents": read_manifest(path).corpus.documents, "width": width,
           "queries": len(Q)}
    base_rss = rss_bytes()
    vf = IndexVersion.load(path)
    faiss_res = time_backend(vf, Q, width, args.threads)
    ref = faiss_res.pop("_ids")
    row["faiss"] = faiss_res
    row["faiss"]["process_rss_bytes"] = rss_bytes()
    del vf
    modes = ["lite"] + (["server"] if args.server and row["documents"] <= args.server_max_n else [])
    modes += ["remote"] if args.milvus_uri else []  # a Milvus standalone or cluster
    for mode in modes:
        proc = None
        if mode == "lite":
            provider = Stage1Provider("milvus", str(work / f"{label}-lite.db"), milvus_timeout_s=args.milvus_timeout_s)
        elif mode == "remote":
            provider = Stage1Provider("milvus", args.milvus_uri, args.milvus_token,
                                      milvus_timeout_s=args.milvus_timeout_s)
        else:
            proc, uri = start_server(work / f"{label}-server")
            provider = Stage1Provider("milvus", uri, milvus_timeout_s=args.milvus_timeout_s)
        before = rss_bytes() if mode == "lite" else tree_rss_bytes(proc.pid) if proc else 0
        t = time.perf_counter()
        result: dict = {}
        done = threading.Event()

        def write():
            try:
                result["write"] = write_version(provider.client, path)
            except Exception as e:  # noqa: BLE001 - reported in the results
                result["error"] = f"{type(e).__name__}: {e}"
            done.set()

        th = threading.Thread(target=write, daemon=True)
        th.start()
        if not done.wait(args.write_budget_s):
            row[f"milvus_{mode}"] = {"feasible": False, "reason": f"writing {row['documents']} rows took more than "
                                                                  f"{args.write_budget_s} s"}
            if proc is not None:
                proc.kill()
            return row | {"stop": True}
        if "error" in result:
            row[f"milvus_{mode}"] = {"feasible": False, "reason": result["error"]}
            return row | {"stop": True}
        write_s = time.perf_counter() - t
        after = rss_bytes() if mode == "lite" else tree_rss_bytes(proc.pid) if proc else 0
        vm = IndexVersion.load(path, stage1=provider)
        res = time_backend(vm, Q, width, args.threads)
        ids = res.pop("_ids")
        res.update(feasible=True, write_seconds=round(write_s, 1),
                   rows_per_s_written=round(row["documents"] / write_s, 1),
                   milvus_rss_growth_bytes=int(after - before),
                   top10_equal_to_faiss=round(float(np.mean([a == b for a, b in zip(ids, ref)])), 4),
                   p50_ratio_to_faiss=round(res["p50_ms"] / row["faiss"]["p50_ms"], 2),
                   qps_ratio_to_faiss=round(res["qps_1_client"] / row["faiss"]["qps_1_client"], 3))
        row[f"milvus_{mode}"] = res
        provider.close()
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    row["bench_process_rss_bytes_before"] = base_rss
    return row


READING = """How to read it. Milvus Lite 3.x (the `milvus-lite` wheel, what `pymilvus[milvus_lite]` installs) is a pure-Python
implementation of the Milvus protocol and engine: it measures the integration (the same client, schema, FLAT/IP
search and output fields a Milvus cluster serves), not a Milvus cluster's speed (C++ query nodes, SIMD scans, shards
in parallel), which could not be run here (no container runtime). Its search costs tens of milliseconds per query
even at 5,183 documents, almost all of it inside the engine (profiled: the client's share is a few milliseconds), and grows
with N. The machine's other jobs (see the load average) slow every backend alike. faiss in process is therefore
much faster on one machine (the ratios above); the Milvus backend is for corpora that do not fit one gateway's memory, not for speed on one machine.
Both backends return the same top-10 for every query (FLAT is exact; the congruence tests check this on SciFact)."""


def markdown(report: dict) -> str:
    qk = f"qps_{report['threads']}_clients"
    lines = [f"# Stage 1 on Milvus against faiss\n\nCommand: `{report['command']}`\n",
             f"Machine: {report['machine']}. {report['note']}\n",
             "| corpus | N | backend | p50 ms | p95 ms | stage-1 p50 ms | qps (1 client) | qps "
             f"({report['threads']} clients) | p50 / faiss | top-10 = faiss | write s | Milvus memory growth |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        f = r["faiss"]
        lines.append(f"| {r['corpus']} | {r['documents']:,} | faiss (in process) | {f['p50_ms']} | {f['p95_ms']} | "
                     f"{f['stage1_p50_ms']} | {f['qps_1_client']} | {f[qk]} | 1 | 1 | | |")
        for mode in ("lite", "server", "remote"):
            m = r.get(f"milvus_{mode}")
            if m is None:
                continue
            name = {"lite": "Milvus Lite in process", "server": "Milvus Lite server (gRPC)",
                    "remote": "Milvus (--milvus-uri)"}[mode]
            if not m.get("feasible"):
                lines.append(f"| {r['corpus']} | {r['documents']:,} | {name} | not measured: {m['reason']} "
                             "| | | | | | | | |")
                continue
            lines.append(f"| {r['corpus']} | {r['documents']:,} | {name} | {m['p50_ms']} | {m['p95_ms']} | "
                         f"{m['stage1_p50_ms']} | {m['qps_1_client']} | {m[qk]} | "
                         f"{m['p50_ratio_to_faiss']} | {m['top10_equal_to_faiss']} | {m['write_seconds']} | "
                         f"{m['milvus_rss_growth_bytes'] / 2**20:.0f} MiB |")
    lines.append("")
    lines.append(report["conclusion"])
    lines.append("")
    lines.append(READING)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["scifact", "100000", "1000000"])
    p.add_argument("--queries", type=int, default=300, help="SciFact test queries used (at most 300)")
    p.add_argument("--threads", type=int, default=4, help="concurrent clients of the throughput run")
    p.add_argument("--server", action="store_true", help="also measure a Milvus Lite server process over gRPC")
    p.add_argument("--milvus-uri", help="also measure this Milvus (http://host:19530: standalone or a cluster)")
    p.add_argument("--milvus-token", help="its credentials")
    p.add_argument("--milvus-timeout-s", type=float, default=60.0,
                   help="longest wait for one Milvus call (the gateway's default, 2 s, is below Milvus Lite's 1M scan)")
    p.add_argument("--server-max-n", type=int, default=100_000, help="largest corpus measured with the server")
    p.add_argument("--write-budget-s", type=float, default=900.0, help="largest time to write one corpus to Milvus")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "stage1_backends")
    p.add_argument("--workdir", type=Path, help="scratch folder (default a temporary one)")
    args = p.parse_args(argv)
    faiss.omp_set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="stage1-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    encoder_dir = ROOT / "var" / "models" / "minilm-onnx"
    sci_path, Q_emb, R = scifact_inputs(work / "home", encoder_dir)
    Q_emb = Q_emb[:args.queries]
    X_fit = np.load(sci_path / "docs.npy") @ R  # back to encoder coordinates (R is orthogonal)
    rows = []
    for size in args.sizes:
        if size == "scifact":
            row = bench_corpus("scifact", sci_path, Q_emb, "auto", args, work)
        else:
            n = int(size)
            t = time.perf_counter()
            path = synthetic_version(work / "synthetic", n, X_fit, R)
            gen = time.perf_counter() - t
            row = bench_corpus(f"gaussian-{n}", path, Q_emb, 128, args, work)
            row["generate_seconds"] = round(gen, 1)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items()}, default=str), flush=True)
        if row.pop("stop", False):
            break
    report = {"command": command("stage1_backends", env="OMP_NUM_THREADS=1"), "threads": args.threads,
              "machine": f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
                         f"load average {os.getloadavg()[0]:.1f} at the end (a shared machine)",
              "note": "Latency is the served pipeline without the encoder: rotation, stage 1, routing and rescoring "
                      "of the shortlist (500) at the policy's width; faiss with one OpenMP thread. Milvus: FLAT index, "
                      "metric IP on the normalised 64-prefixes; the shortlist comes back with its 384-d rescoring "
                      "vectors in the same search.",
              "rows": rows, "conclusion": ""}
    report["conclusion"] = conclusion(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(args.out.with_suffix(".json"), json.dumps(report, indent=2, default=str))
    atomic.write_text(args.out.with_suffix(".md"), markdown(report))
    print(markdown(report))
    return 0


def conclusion(rows: list[dict]) -> str:
    out = []
    for r in rows:
        m = r.get("milvus_lite") or {}
        if m.get("feasible"):
            out.append(f"{r['corpus']}: Milvus Lite p50 {m['p50_ms']} ms vs faiss {r['faiss']['p50_ms']} ms "
                       f"(×{m['p50_ratio_to_faiss']}); top-10 equal to faiss on {m['top10_equal_to_faiss']:.0%} "
                       f"of queries; writing {r['documents']:,} rows took {m['write_seconds']} s "
                       f"({m['rows_per_s_written']:,.0f} rows/s, {m['milvus_rss_growth_bytes'] / 2**30:.2f} GiB "
                       f"resident memory).")
        elif m:
            out.append(f"{r['corpus']}: Milvus Lite not measured ({m['reason']}).")
    return "Summary: " + " ".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
