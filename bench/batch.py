"""Batch search and the query-embedding cache over HTTP (issue 17): throughput of batches against single
requests at the same client concurrency, and latency with repeated queries, cache on against off.

Usage::

    OMP_NUM_THREADS=1 python -m bench.batch [--home DIR] [--clients 4] [--sizes 1 8 32 128]

``--home`` must hold a live SciFact index (default ``var/bench-batch``: a PCA version is built there with the
trainer from the embedding cache when none is live).  Two gateways are started in turn (``bench.demo``'s
``start_gateway``), each on a free port:

1. **Throughput**, cache off: the SciFact test queries (300) sent by ``--clients`` concurrent clients, as
   single requests (``POST /v1/search``) and as batches of each size
   (``POST /v1/collections/{name}/search/batch``); queries per second of wall time, best of ``--repeats``.
2. **Cache**: one client sends a stream of ``--stream`` requests of which ``--repeat-rate`` repeat an earlier
   query drawn Zipf-like (rank r with weight 1 / r^``--zipf``) from those already sent, the rest fresh SciFact
   queries, once to a gateway with the cache off and once with it on; client-side p50 / p95 latency and the
   hit rate read from ``/metrics``.

Writes ``bench/results/batch/summary.{json,md}`` with the command line at the top.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from adawidth_client import Client, SearchResponse
from bench.common import RESULTS, ROOT, command, machine, write_results
from bench.demo import free_port, start_gateway, wait_ready
from engine.encoder import OnnxEncoder
from engine.io.beir import load_qrels, load_queries
from engine.version import store
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

SCIFACT = ROOT / "data" / "scifact"
OUT = RESULTS / "batch"


def ensure_home(home: Path, collection: str) -> Path:
    """``home`` with a live ``collection`` index; builds a SciFact PCA version there (trainer, embedding cache
    of ``var/cache``) when it has none.  Returns ``home``."""
    coll = home / "indexes" / collection
    if coll.is_dir() and store.read_live_pointer(coll):
        return home
    encoder_dir = ROOT / "var" / "models" / "minilm-onnx"
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=ROOT / "var" / "cache" / "embeddings.sqlite").resolved()
    build_index(BuildOptions(dataset=SCIFACT, collection=collection, rotation="pca", capacity=False), settings,
                OnnxEncoder(encoder_dir, threads=1))
    (home / "models").mkdir(exist_ok=True)
    link = home / "models" / "minilm-onnx"
    if not link.exists():
        os.symlink(encoder_dir.resolve(), link)
    return home


class Gateway:
    """A gateway process for the duration of a ``with`` block; ``.url`` is its base URL."""

    def __init__(self, home: Path, collection: str, settings: dict):
        self.home, self.collection, self.settings = home, collection, settings

    def __enter__(self) -> "Gateway":
        port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="bench-batch-gateway-", suffix=".log")[1])
        self.proc = start_gateway(self.home, self.collection, port, self.log, self.settings)
        self.url = f"http://127.0.0.1:{port}"
        wait_ready(self.url, self.proc)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 -- a stuck gateway is killed
            self.proc.kill()


def throughput(url: str, collection: str, queries: list[str], batch: int | None, clients: int, fields: dict,
               repeats: int) -> dict:
    """Queries per second sending ``queries`` from ``clients`` concurrent clients, single requests (``batch``
    None) or batches of ``batch``; the best of ``repeats`` passes (each pass sends every query once)."""
    units = [queries[i:i + (batch or 1)] for i in range(0, len(queries), batch or 1)]

    def client_work(share: list[list[str]]) -> tuple[int, float, float]:
        n, encode_s, rest_s = 0, 0.0, 0.0
        with Client(url, timeout_s=120) as c:
            for unit in share:
                out = [c.search(unit[0], **fields)] if batch is None else \
                    c.search_batch(unit, collection=collection, **fields)
                assert all(isinstance(x, SearchResponse) for x in out)
                # a batch's encode time is shared by its items (one encoder call): count it once
                encode_s += out[0].trace.timings_seconds.get("encode", 0.0)
                rest_s += sum(x.trace.timings_seconds["total"] - x.trace.timings_seconds.get("encode", 0.0)
                              for x in out)
                n += len(out)
        return n, encode_s, rest_s

    best = None
    for _ in range(repeats):
        shares = [units[i::clients] for i in range(clients)]
        t = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            parts = list(pool.map(client_work, shares))
        wall = time.perf_counter() - t
        sent = sum(p[0] for p in parts)
        assert sent == len(queries)
        row = {"batch": batch, "qps": sent / wall, "queries": sent,
               "encode_ms_per_query": 1000.0 * sum(p[1] for p in parts) / sent,
               "search_ms_per_query": 1000.0 * sum(p[2] for p in parts) / sent}
        best = row if best is None or row["qps"] > best["qps"] else best
    return best


def zipf_stream(queries: list[str], n: int, repeat_rate: float, s: float, seed: int) -> tuple[list[str], int]:
    """``n`` query texts: with probability ``repeat_rate`` an earlier one (rank r of the distinct queries sent,
    most frequent first, weight 1 / r^s), else the next fresh query.  Returns the stream and its repeats."""
    rng = np.random.default_rng(seed)
    fresh = iter(queries)
    seen: list[str] = []
    counts: dict[str, int] = {}
    out, repeats = [], 0
    for _ in range(n):
        if seen and rng.random() < repeat_rate:
            ranked = sorted(seen, key=lambda q: -counts[q])
            w = 1.0 / np.arange(1, len(ranked) + 1) ** s
            q = ranked[rng.choice(len(ranked), p=w / w.sum())]
            repeats += 1
        else:
            q = next(fresh)
            seen.append(q)
        counts[q] = counts.get(q, 0) + 1
        out.append(q)
    return out, repeats


def metric(text: str, name: str) -> float:
    """Value of an unlabelled series in a Prometheus exposition (0 when absent)."""
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")), 0.0)


def latencies(url: str, stream: list[str], fields: dict) -> dict:
    """Send ``stream`` one request at a time; client-side latency percentiles (ms) and the cache counters."""
    lat = []
    with Client(url, timeout_s=60) as c:
        for q in stream[:20]:  # warm-up: the same texts as the stream's start are not sent again before it
            c.search("warm up " + q, **fields)
        before = c.metrics()
        for q in stream:
            t = time.perf_counter()
            c.search(q, **fields)
            lat.append((time.perf_counter() - t) * 1000.0)
        after = c.metrics()
    hits = metric(after, "adawidth_query_cache_hits_total") - metric(before, "adawidth_query_cache_hits_total")
    misses = metric(after, "adawidth_query_cache_misses_total") - metric(before, "adawidth_query_cache_misses_total")
    lat_sorted = sorted(lat)
    return {"p50_ms": statistics.median(lat), "p95_ms": lat_sorted[int(0.95 * (len(lat) - 1))],
            "mean_ms": statistics.fmean(lat), "hits": hits, "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0}


def render(r: dict) -> str:
    """The Markdown summary."""
    lines = [f"`{r['command']}`", "", f"{r['machine']}; {r['note']} (search_deadline_s {r['deadline_s']:g}, "
             f"encoder_threads {r['encoder_threads']})", "",
             f"## Throughput ({r['clients']} concurrent clients, {r['queries']} SciFact test queries, "
             f"fields {r['fields']}, cache off, best of {r['repeats']})", "",
             "| requests | queries/s | vs single | encode ms / query (server) | rest of the search ms / query |",
             "|---|---|---|---|---|"]
    single = r["throughput"][0]["qps"]
    for row in r["throughput"]:
        label = "single" if row["batch"] is None else f"batch {row['batch']}"
        lines.append(f"| {label} | {row['qps']:.1f} | {row['qps'] / single:.2f}x | {row['encode_ms_per_query']:.2f} "
                     f"| {row['search_ms_per_query']:.2f} |")
    lines += ["", f"Batch 32 / single: **{r['ratio_batch32']:.2f}x** (issue target >= 3x).", "",
              f"## Query cache ({r['stream']['requests']} sequential requests, {r['stream']['repeats']} repeats "
              f"= {r['stream']['repeats'] / r['stream']['requests']:.0%}, Zipf s = {r['stream']['zipf']})", "",
              "| cache | p50 ms | p95 ms | mean ms | hit rate |", "|---|---|---|---|---|"]
    for name in ("off", "on"):
        c = r["cache"][name]
        lines.append(f"| {name} | {c['p50_ms']:.2f} | {c['p95_ms']:.2f} | {c['mean_ms']:.2f} | {c['hit_rate']:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", type=Path, default=ROOT / "var" / "bench-batch")
    p.add_argument("--collection", default="scifact")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--width", default="auto", help="width of every request ('auto', 'full' or an integer)")
    p.add_argument("--stream", type=int, default=400, help="requests of the cache stream")
    p.add_argument("--repeat-rate", type=float, default=0.3)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=60.0,
                   help="gateway search_deadline_s (a batch has one fixed deadline; the default 10 s is too short "
                        "for 4 concurrent batches of 128 on a loaded 2-core machine)")
    p.add_argument("--encoder-threads", type=int, default=0,
                   help="gateway encoder_threads (0: ONNX Runtime's default, the gateway's default)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    home = ensure_home(args.home, args.collection)
    queries = load_queries(SCIFACT)
    test = [queries[q] for q in sorted(load_qrels(SCIFACT, "test"))]
    others = [t for qid, t in sorted(queries.items()) if t not in set(test)]
    width = args.width if args.width in ("auto", "full") else int(args.width)
    fields = {"k": 10, "width": width}

    rows = []
    deadline = {"SEARCH_DEADLINE_S": args.deadline_s, "ENCODER_THREADS": args.encoder_threads}
    with Gateway(home, args.collection, {"QUERY_CACHE_ENTRIES": 0, **deadline}) as gw:
        throughput(gw.url, args.collection, test[:40], None, args.clients, fields, 1)  # warm-up
        rows.append(throughput(gw.url, args.collection, test, None, args.clients, fields, args.repeats))
        for size in args.sizes:
            rows.append(throughput(gw.url, args.collection, test, size, args.clients, fields, args.repeats))
            print(f"batch {size}: {rows[-1]['qps']:.1f} q/s", file=sys.stderr)
        print(f"single: {rows[0]['qps']:.1f} q/s", file=sys.stderr)
        stream, repeats = zipf_stream(others, args.stream, args.repeat_rate, args.zipf, args.seed)
        off = latencies(gw.url, stream, fields)
    with Gateway(home, args.collection, deadline) as gw:
        on = latencies(gw.url, stream, fields)
    by = {row["batch"]: row["qps"] for row in rows}
    result = {"command": command("batch", argv, env="OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "")),
              "machine": machine(),
              "note": "other jobs shared this 2-core machine during the run; the gateway and the clients share "
                      "its cores; gateway settings default except the cache, search_deadline_s and encoder_threads",
              "deadline_s": args.deadline_s, "encoder_threads": args.encoder_threads,
              "clients": args.clients, "queries": len(test), "fields": fields, "repeats": args.repeats,
              "throughput": rows, "ratio_batch32": by.get(32, float("nan")) / by[None],
              "stream": {"requests": len(stream), "repeats": repeats, "repeat_rate": args.repeat_rate,
                         "zipf": args.zipf, "seed": args.seed},
              "cache": {"off": off, "on": on}}
    write_results(args.out / "summary", result, render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
