"""Searches with and without concurrent writes (issue 18): the locust search users alone, then the same search
users beside writer users, against one gateway serving SciFact.

Usage::

    OMP_NUM_THREADS=1 python -m bench.mixed_rw [--users 8] [--writers 1] [--seconds 60] [--warmup-seconds 10]

1. In a temporary home: ``python -m trainer build --dataset data/scifact --rotation pca`` (the ``make demo``
   build; corpus embeddings from ``var/cache/embeddings.sqlite``, the encoder of ``var/models``).
2. One gateway (``python -m service``) on it with a generated write key, ``--encoder-threads`` ONNX threads,
   ``--query-cache-entries`` (the query-embedding cache; default the gateway's) and the online-CUS sampler off (it skips queries while the delta segment is not empty, so it would do less work
   in the mixed run than in the read-only one).
3. A discarded read-only warm-up run (``--warmup-seconds``), then the **read-only** run and the **mixed** run
   (``--repeat`` such pairs, alternating, their samples pooled: background load that drifts hits both alike),
   each ``--seconds`` long with the same ``--users`` search users; the mixed run adds ``--writers`` writer users
   (``loadtest/locustfile.py``'s ``WriterUser``: two upserts of ``--batch`` SciFact documents, then a delete of
   two of them, ``--write-wait`` seconds apart).  Each run is its own headless locust process
   (:func:`loadtest.run.run_locust`).
4. After the mixed run every acknowledged write is checked: each live upserted document is the top-1 of its own
   text at width ``full`` and no deleted one is returned.

Per run, from locust's per-request samples (exact percentiles, not locust's rounded ones): searches sent (every
search request but the deliberately invalid ones), failed searches (all search requests, the invalid ones must
get their documented 4xx), p50/p95/p99 of the searches, writes and failed writes, write p50/p99, documents
upserted and deleted; the gateway's CPU seconds per wall second and the machine's busy share of its cores
(``/proc``); and p99(mixed) / p99(read-only) against the issue's target of 1.5.  Written to
``bench/results/mixed_rw/<stem>.{json,md}`` (``--stem``, default ``summary``) with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.common import RESULTS, ROOT, command, machine, write_results
from bench.demo import free_port, start_gateway, wait_ready
from engine.version import store
from loadtest import DELETE_NAME, UPSERT_NAME, acknowledged_state
from loadtest.run import gateway_5xx, run_locust

OUT = RESULTS / "mixed_rw"
SCIFACT = ROOT / "data" / "scifact"
VAR = ROOT / "var"
INVALID = "/v1/search invalid (4xx expected)"
TARGET = 1.5


def build_home(home: Path) -> str:
    """Build the SciFact PCA version into ``home`` with the trainer CLI; returns the live version."""
    (home / "models").mkdir(parents=True)
    os.symlink(VAR / "models" / "minilm-onnx", home / "models" / "minilm-onnx")
    env = dict(os.environ, ADAWIDTH_HOME=str(home), ADAWIDTH_EMBEDDING_CACHE=str(VAR / "cache" / "embeddings.sqlite"),
               OMP_NUM_THREADS="1", ADAWIDTH_ENCODER_THREADS="1")
    for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "trainer", "build", "--dataset", str(SCIFACT), "--rotation", "pca"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"trainer build failed: {r.stderr[-3000:]}")
    return store.read_live_pointer(home / "indexes" / "scifact")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores (``/proc/stat``; idle and iowait are not busy)."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def read_samples(path: Path) -> list[tuple[str, float, bool]]:
    """(name, response time ms, ok) of every request of a run (``loadtest/locustfile.py``'s samples file)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        head, ms, ok = line.rsplit(",", 2)
        out.append((json.loads(head), float(ms), ok == "1"))
    return out


def _pct(xs: list[float]) -> dict:
    if not xs:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    a = np.asarray(xs)
    return {f"p{q}_ms": round(float(np.percentile(a, q)), 1) for q in (50, 95, 99)}


def summarize(samples: list[tuple[str, float, bool]], seconds: float) -> dict:
    """The figures of one run (module docstring) from its samples."""
    searches = [(n, ms, ok) for n, ms, ok in samples if n.startswith("/v1/search")]
    valid = [ms for n, ms, ok in searches if n != INVALID]
    writes = [(n, ms, ok) for n, ms, ok in samples if n in (UPSERT_NAME, DELETE_NAME)]
    return {"searches": len(valid), "searches_invalid": len(searches) - len(valid),
            "failed_searches": sum(not ok for _, _, ok in searches), **_pct(valid),
            "searches_per_s": round(len(valid) / seconds, 1),
            "writes": len(writes), "failed_writes": sum(not ok for _, _, ok in writes),
            "upserts": sum(n == UPSERT_NAME for n, _, _ in writes), "deletes": sum(n == DELETE_NAME for n, _, _ in writes),
            "write_p50_ms": _pct([ms for _, ms, _ in writes])["p50_ms"],
            "write_p99_ms": _pct([ms for _, ms, _ in writes])["p99_ms"]}


def measured_run(url: str, gateway_pid: int, prefix: Path, args, writers: int, write_key: str,
                 write_log: Path | None = None, text_offset: int = 0) -> tuple[dict, list]:
    """One locust run with CPU accounting; returns (:func:`summarize` plus CPU shares and locust's exit code,
    the run's samples)."""
    cpu0, (busy0, total0), kids0, t0 = _proc_cpu_s(gateway_pid), _machine_ticks(), \
        resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    run = run_locust(url, prefix, users=args.users, spawn_rate=args.spawn_rate, seconds=args.seconds,
                     queries=SCIFACT / "queries.jsonl.gz", writers=writers, write_key=write_key,
                     write_collection="scifact", write_log=write_log,
                     extra_env={"ADAWIDTH_LOCUST_WRITE_BATCH": str(args.batch),
                                "ADAWIDTH_LOCUST_WRITE_WAIT": args.write_wait,
                                "ADAWIDTH_LOCUST_TEXT_OFFSET": str(text_offset)})
    wall = time.monotonic() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, total1 = _machine_ticks()
    samples = read_samples(run.samples)
    out = summarize(samples, args.seconds)
    out.update(gateway_cpu_per_s=round((_proc_cpu_s(gateway_pid) - cpu0) / wall, 2),
               locust_cpu_per_s=round((kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime) / wall, 2),
               machine_busy_share=round((busy1 - busy0) / max(total1 - total0, 1), 3),
               locust_exit_code=run.returncode, locust_failures=run.failures)
    return out, samples


def verify_writes(url: str, write_log: Path) -> dict:
    """Every acknowledged write of the mixed run as searches see it: live upserts top-1 of their own text at
    width ``full``, deleted ids in no top-10."""
    alive, deleted = acknowledged_state(json.loads(x) for x in write_log.read_text().splitlines())
    found = gone = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        for i, text in alive.items():
            hits = http.post("/v1/search", json={"query": text, "k": 10, "width": "full"}).json()["results"]
            found += bool(hits) and hits[0]["id"] == i
        for i, text in deleted.items():
            hits = http.post("/v1/search", json={"query": text, "k": 10, "width": "full"}).json()["results"]
            gone += i not in {h["id"] for h in hits}
    return {"live_upserts": len(alive), "top1_of_own_text": found, "deleted": len(deleted), "not_returned": gone}


def render(r: dict) -> str:
    ro, mx = r["runs"]["read_only"], r["runs"]["mixed"]
    rows = [("search requests", "searches"), ("failed searches", "failed_searches"), ("search p50 ms", "p50_ms"),
            ("search p95 ms", "p95_ms"), ("search p99 ms", "p99_ms"), ("searches/s", "searches_per_s"),
            ("writes (upserts + deletes)", None), ("failed writes", "failed_writes"), ("write p50 ms", "write_p50_ms"),
            ("write p99 ms", "write_p99_ms"), ("gateway CPU s per s", "gateway_cpu_per_s"),
            ("locust CPU s per s", "locust_cpu_per_s"), ("machine busy share", "machine_busy_share")]
    cache = ("the gateway's query-embedding cache on (10,000 entries: SciFact's 1,409 queries repeat, so most "
             "searches skip the encoder)" if r["query_cache_entries"] is None else
             f"query-embedding cache of {r['query_cache_entries']} entries" + (" (off: every search is encoded)"
                                                                                 if r["query_cache_entries"] == 0 else ""))
    L = [f"`{r['command']}`", "", f"{r['date']}; machine: {r['machine']}; {cache}; load average (1, 5, 15 min) before the runs "
         f"{r['loadavg_before']}, after {r['loadavg_after']}. {r['note']}", "",
         f"**p99(mixed) / p99(read-only) = {r['p99_ratio']:.2f}** (target <= {TARGET}: "
         f"{'met' if r['p99_ratio'] <= TARGET else 'missed'}); failed searches {mx['failed_searches']} "
         f"(read-only {ro['failed_searches']}), failed writes {mx['failed_writes']}.", "",
         f"| {r['users']} search users, {r['seconds']} s{' x ' + str(r['repeat']) + ' (pooled)' if r['repeat'] > 1 else ''}"
         f" | read-only | mixed (+ {r['writers']} writer) |", "|---|---|---|"]
    for label, key in rows:
        if key is None:
            L.append(f"| {label} | {ro['writes']} | {mx['writes']} ({mx['upserts']} + {mx['deletes']}; "
                     f"{mx['upserts'] * r['batch']} documents upserted) |")
        else:
            L.append(f"| {label} | {ro[key] if ro[key] is not None else '—'} | {mx[key]} |")
    v = r["verify"]
    L += ["", f"After the mixed run: {v['top1_of_own_text']} of {v['live_upserts']} live upserted documents are the "
              f"top-1 of their own text at width full; {v['not_returned']} of {v['deleted']} deleted ids are "
              f"returned by no search. Gateway 5xx answers: {r['gateway_5xx']}.", "",
          "Searches: every search request but the deliberately invalid ones (those count as failed only when they do "
          "not get their documented 4xx). Latency is client-side (locust over loopback, encoding included), exact "
          "percentiles of every request. The gateway, locust and the writes' encoding share the machine's cores."]
    if r["repeat"] > 1:
        L += ["", "Each pair (read-only run, then mixed run): "
              + "; ".join(f"p99 {q['read_only']['p99_ms']} -> {q['mixed']['p99_ms']} ms ({q['p99_ratio']:.2f}x), "
                          f"{q['mixed']['writes']} writes" for q in r["pairs"]) + "."]
    L += ["", f"CPU (mean of the runs): the gateway used {ro['gateway_cpu_per_s']} CPU seconds per second read-only and "
              f"{mx['gateway_cpu_per_s']} mixed, locust {ro['locust_cpu_per_s']} and {mx['locust_cpu_per_s']}; the "
              f"machine's cores were {ro['machine_busy_share']:.0%} and {mx['machine_busy_share']:.0%} busy."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=8, help="search users (both runs)")
    p.add_argument("--writers", type=int, default=1, help="writer users of the mixed run")
    p.add_argument("--seconds", type=int, default=60, help="length of each measured run")
    p.add_argument("--warmup-seconds", type=int, default=10, help="discarded read-only run first (0: none)")
    p.add_argument("--repeat", type=int, default=1, help="read-only + mixed pairs, alternating; figures pooled")
    p.add_argument("--spawn-rate", type=float, default=4)
    p.add_argument("--batch", type=int, default=4, help="documents per upsert")
    p.add_argument("--write-wait", default="0.5,1.0", help="seconds between a writer's writes, 'lo,hi'")
    p.add_argument("--encoder-threads", type=int, default=1, help="the gateway's ADAWIDTH_ENCODER_THREADS")
    p.add_argument("--query-cache-entries", type=int,
                   help="the gateway's ADAWIDTH_QUERY_CACHE_ENTRIES (default: the gateway's, 10,000; SciFact's 1,409 "
                        "queries then repeat from the cache, 0: every search is encoded)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--stem", default="summary", help="result files <out>/<stem>.{json,md}")
    p.add_argument("--note", default="", help="a sentence on the run's conditions, recorded with it")
    p.add_argument("--keep", type=Path, help="keep the home, gateway log and locust files in this new folder")
    args = p.parse_args(argv)
    if min(args.users, args.writers, args.seconds, args.batch, args.repeat) < 1:
        p.error("--users, --writers, --seconds, --batch and --repeat must be >= 1")

    if args.keep is not None:
        args.keep.mkdir(parents=True)
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench-mixed-rw-"))
    proc = None
    try:
        home = tmp / "home"
        version = build_home(home)
        key = f"wrt-{secrets.token_urlsafe(18)}"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        settings = {"WRITE_API_KEY": key, "ENCODER_THREADS": args.encoder_threads, "ONLINE_CUS_SAMPLE_RATE": 0}
        if args.query_cache_entries is not None:
            settings["QUERY_CACHE_ENTRIES"] = args.query_cache_entries
        proc = start_gateway(home, "scifact", port, tmp / "gateway.log", settings)
        wait_ready(url, proc)
        loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg())
        if args.warmup_seconds:
            warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup_seconds})
            measured_run(url, proc.pid, tmp / "warmup", warm, 0, key)
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        write_log = tmp / "writes.jsonl"
        pairs, pooled = [], {"read_only": [], "mixed": []}
        for n in range(args.repeat):  # read-only then mixed, alternating: drifting background load hits both
            ro, ro_samples = measured_run(url, proc.pid, tmp / f"read-{n}", args, 0, key)
            mx, mx_samples = measured_run(url, proc.pid, tmp / f"mixed-{n}", args, args.writers, key, write_log,
                                          text_offset=n * 1_000_000)  # each run writes texts of its own
            pooled["read_only"] += ro_samples
            pooled["mixed"] += mx_samples
            pairs.append({"read_only": ro, "mixed": mx, "p99_ratio": round(mx["p99_ms"] / ro["p99_ms"], 3)})
        if args.repeat == 1:
            read_only, mixed = pairs[0]["read_only"], pairs[0]["mixed"]
        else:
            read_only, mixed = ({**summarize(pooled[k], args.seconds * args.repeat),
                                 **{c: round(float(np.mean([q[k][c] for q in pairs])), 3) for c in
                                    ("gateway_cpu_per_s", "locust_cpu_per_s", "machine_busy_share")}}
                                for k in ("read_only", "mixed"))
        loadavg_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
        verify = verify_writes(url, write_log)
        errors_5xx = gateway_5xx(url)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    ratio = mixed["p99_ms"] / read_only["p99_ms"]
    given = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)]
    result = {"command": command("mixed_rw", given, env="OMP_NUM_THREADS=1" if os.environ.get("OMP_NUM_THREADS") == "1"
                                 else ""),
              "date": date, "machine": machine(), "loadavg_before": loadavg, "loadavg_after": loadavg_after, "note": args.note, "version": version,
              "users": args.users, "writers": args.writers, "seconds": args.seconds, "batch": args.batch,
              "write_wait": args.write_wait, "encoder_threads": args.encoder_threads, "target": TARGET,
              "query_cache_entries": args.query_cache_entries,
              "p99_ratio": round(ratio, 3), "target_met": ratio <= TARGET,
              "repeat": args.repeat, "runs": {"read_only": read_only, "mixed": mixed}, "pairs": pairs,
              "verify": verify, "gateway_5xx": errors_5xx}
    md = render(result)
    write_results(args.out / args.stem, result, md)
    print(md)
    ok = (read_only["failed_searches"] == mixed["failed_searches"] == mixed["failed_writes"] == 0
          and verify["top1_of_own_text"] == verify["live_upserts"] and verify["not_returned"] == verify["deleted"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
