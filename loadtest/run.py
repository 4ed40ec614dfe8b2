"""Headless locust run against a gateway; writes p50/p95/p99, throughput and failures to bench/results/.

Usage::

    .venv/bin/python -m loadtest.run --home var --users 8 --spawn-rate 4 --seconds 60
    .venv/bin/python -m loadtest.run --host http://127.0.0.1:8000 --seconds 30     # a gateway already running

Without ``--host`` it starts a gateway (``python -m service``) on the home's live version on a free port,
waits for ``/readyz``, runs ``locust -f loadtest/locustfile.py --headless`` as its own process (locust
monkey-patches with gevent, so it never runs inside this one), stops the gateway, and writes
``bench/results/<stem>.{json,md}`` (default stem ``locust_<collection>``): per request name and in
aggregate, requests, failures, p50/p95/p99 (ms, locust's rounding), requests/s, the failure messages, and
the gateway's own count of 5xx answers (from ``/metrics``).  Exit status 0 when no request failed.

``--writers N`` (default 0: the read-only run) adds N writer users (the locustfile's ``WriterUser``: upserts and
deletes of live documents) beside the ``--users`` search users; they need the gateway's write key
(``--write-key``, default env ``ADAWIDTH_WRITE_API_KEY``; a gateway this command starts gets a generated one).
``--write-log PATH`` appends every acknowledged write to PATH (JSON lines, see the locustfile)::

    .venv/bin/python -m loadtest.run --home var --users 8 --writers 1 --seconds 60 --stem locust_scifact_mixed
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from adawidth_client import Client, ClientError
from bench.common import ROOT
from bench.demo import free_port, start_gateway, wait_ready  # the demo's gateway launcher


def parse_stats(prefix: Path) -> tuple[list[dict], list[dict]]:
    """Rows of locust's ``<prefix>_stats.csv`` and ``<prefix>_failures.csv``."""
    rows = []
    with open(f"{prefix}_stats.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            rows.append({"name": r["Name"], "type": r["Type"], "requests": int(r["Request Count"]),
                         "failures": int(r["Failure Count"]), "p50_ms": float(r["50%"]), "p95_ms": float(r["95%"]),
                         "p99_ms": float(r["99%"]), "mean_ms": float(r["Average Response Time"]),
                         "max_ms": float(r["Max Response Time"]), "rps": float(r["Requests/s"])})
    failures = []
    path = Path(f"{prefix}_failures.csv")
    if path.exists():
        with open(path, newline="") as fh:
            failures = [{"name": r["Name"], "error": r["Error"], "occurrences": int(r["Occurrences"])}
                        for r in csv.DictReader(fh)]
    return rows, failures


SEARCH_USER, WRITER_USER = "SearchUser", "WriterUser"


@dataclass
class LocustRun:
    """One headless locust run: locust's per-name ``rows`` and ``failures`` (:func:`parse_stats`), its exit
    code, its combined output, and the per-request samples file (``name,response_time_ms,ok`` lines)."""

    rows: list[dict]
    failures: list[dict]
    returncode: int
    output: str
    samples: Path


def run_locust(url: str, prefix: Path, *, users: int, spawn_rate: float, seconds: int, queries: Path,
               writers: int = 0, write_key: str | None = None, collection: str | None = None,
               write_collection: str | None = None, write_log: Path | None = None,
               extra_env: dict | None = None) -> LocustRun:
    """Run ``locust -f loadtest/locustfile.py --headless`` against ``url`` for ``seconds`` seconds, as its own
    process, with ``users`` search users and ``writers`` writer users (0: the read-only scenario).

    Writes ``<prefix>_stats.csv``, ``<prefix>_failures.csv`` and ``<prefix>_samples.csv`` (replaced).
    ``collection``: the collection searched (None: ``/v1/search``, the gateway's default); ``write_collection``:
    the one written (default ``collection``, else ``scifact``); ``write_log``: where acknowledged writes are appended; ``extra_env``: more ``ADAWIDTH_LOCUST_*`` variables.

    Raises:
        ValueError: ``writers`` > 0 without ``write_key``.
        RuntimeError: locust wrote no stats (its output is in the message).
    """
    if writers and not write_key:
        raise ValueError("writer users need the gateway's write key")
    samples = Path(f"{prefix}_samples.csv")
    samples.unlink(missing_ok=True)
    env = dict(os.environ, ADAWIDTH_LOCUST_QUERIES=str(queries), ADAWIDTH_LOCUST_SAMPLES=str(samples),
               **(extra_env or {}))
    if collection:
        env["ADAWIDTH_LOCUST_COLLECTION"] = collection
    classes = [SEARCH_USER]
    if writers:
        env.update(ADAWIDTH_LOCUST_WRITE_KEY=write_key, ADAWIDTH_LOCUST_WRITERS=str(writers))
        if write_collection:
            env["ADAWIDTH_LOCUST_WRITE_COLLECTION"] = write_collection
        if write_log is not None:
            env["ADAWIDTH_LOCUST_WRITE_LOG"] = str(write_log)
        classes.append(WRITER_USER)
    cmd = [str(Path(sys.executable).with_name("locust")), "-f", str(ROOT / "loadtest" / "locustfile.py"),
           "--headless", "-u", str(users + writers), "-r", str(spawn_rate), "-t", f"{seconds}s",
           "--host", url, "--csv", str(prefix), "--only-summary", "--stop-timeout", "10", *classes]
    lc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 120)
    if not Path(f"{prefix}_stats.csv").exists():
        raise RuntimeError(f"locust wrote no stats: {lc.stdout[-3000:]}{lc.stderr[-3000:]}")
    rows, failures = parse_stats(prefix)
    return LocustRun(rows, failures, lc.returncode, lc.stdout + lc.stderr, samples)


def gateway_5xx(url: str) -> float | None:
    try:
        with Client(url, timeout_s=5) as client:
            text = client.metrics()
    except ClientError:
        return None
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("adawidth_http_requests_total{") and 'status="5xx"' in line)


def render(r: dict) -> str:
    writers = f" + {r['writers']} writer users" if r.get("writers") else ""
    L = [f"# Locust: {r['users']} users{writers}, {r['seconds']} s against {r['target']}", "",
         f"Command: `{r['command']}`", "", f"{r['date']}; {r['machine']}. Traffic: `loadtest/locustfile.py` "
         f"(queries from `{r['queries_file']}`; mixed k, auto / auto+ρ / default / fixed widths / full, 5 % invalid "
         "requests that must get their documented 4xx code and then count as successes"
         + ("; writers: two upserts of a few SciFact documents, then a delete of 2, each a 202 or a failure"
            if writers else "")
         + ").", "",
         "| request | requests | failures | p50 ms | p95 ms | p99 ms | mean ms | max ms | req/s |",
         "|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        L.append(f"| {row['name']} | {row['requests']:,} | {row['failures']} | {row['p50_ms']:.0f} | {row['p95_ms']:.0f} | "
                 f"{row['p99_ms']:.0f} | {row['mean_ms']:.1f} | {row['max_ms']:.0f} | {row['rps']:.1f} |")
    agg = r["aggregate"]
    L += ["", f"Throughput {agg['rps']:.1f} requests/s, failure ratio {r['failure_ratio']:.2%}, "
              f"gateway 5xx answers: {r['gateway_5xx']}."]
    if r["failures"]:
        L += ["", "Failures:", ""] + [f"- {f['name']}: {f['error']} (× {f['occurrences']})" for f in r["failures"]]
    L += ["", "Latency is client-side (locust over loopback, encoding included); locust rounds percentiles "
              "(to 1 ms below 100 ms, to 10 ms above). The machine is shared with other jobs."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", help="URL of a running gateway (default: start one)")
    p.add_argument("--home", type=Path, default=Path(os.environ.get("ADAWIDTH_HOME", ROOT / "var")))
    p.add_argument("--collection", default="scifact")
    p.add_argument("--queries", type=Path, default=ROOT / "data" / "scifact" / "queries.jsonl.gz")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--spawn-rate", type=float, default=4)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--encoder-threads", type=int, default=1, help="ADAWIDTH_ENCODER_THREADS of the started gateway")
    p.add_argument("--writers", type=int, default=0, help="writer users beside --users (0: read-only)")
    p.add_argument("--write-key", default=os.environ.get("ADAWIDTH_WRITE_API_KEY"),
                   help="the gateway's write API key (a started gateway gets a generated one)")
    p.add_argument("--write-log", type=Path, help="append every acknowledged write here (JSON lines)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--stem")
    args = p.parse_args(argv)
    if args.writers < 0 or args.users < 1:
        p.error("--users must be >= 1 and --writers >= 0")

    workdir = args.home.resolve() / "locust"  # logs and locust CSVs (var/ is not committed)
    workdir.mkdir(parents=True, exist_ok=True)
    proc, url = None, args.host
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        os.environ["ADAWIDTH_ENCODER_THREADS"] = str(args.encoder_threads)
        settings = None
        if args.writers:
            args.write_key = args.write_key or f"wrt-{secrets.token_urlsafe(18)}"
            settings = {"WRITE_API_KEY": args.write_key}
        proc = start_gateway(args.home.resolve(), args.collection, port, workdir / "gateway.log", settings)
    try:
        if proc is not None:
            wait_ready(url, proc)
        prefix = workdir / "run"
        t0 = time.time()
        try:
            lc = run_locust(url, prefix, users=args.users, spawn_rate=args.spawn_rate, seconds=args.seconds,
                            queries=args.queries, writers=args.writers, write_key=args.write_key,
                            write_collection=args.collection, write_log=args.write_log)
        except (RuntimeError, ValueError) as e:
            print(e, file=sys.stderr)
            return 2
        (workdir / "locust.log").write_text(lc.output)
        errors_5xx = gateway_5xx(url)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    rows, failures = lc.rows, lc.failures
    agg = next(r for r in rows if r["name"] == "Aggregated")
    given = list(argv if argv is not None else sys.argv[1:])
    shown = " ".join("***" if i and given[i - 1] == "--write-key" else (
        "--write-key=***" if a.startswith("--write-key=") else a) for i, a in enumerate(given))  # never the key
    result = {"command": f".venv/bin/python -m loadtest.run {shown}".strip(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "target": url if args.host else "a gateway "
              f"started on {args.collection} (encoder threads {args.encoder_threads})", "users": args.users,
              "spawn_rate": args.spawn_rate, "seconds": args.seconds, "writers": args.writers, "queries_file": str(args.queries.relative_to(ROOT)
                                                                                       if args.queries.is_relative_to(ROOT) else args.queries),
              "rows": [r for r in rows if r["name"] != "Aggregated"], "aggregate": agg, "failures": failures,
              "failure_ratio": agg["failures"] / max(agg["requests"], 1), "gateway_5xx": errors_5xx,
              "locust_exit_code": lc.returncode}
    stem = args.stem or f"locust_{args.collection}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    md = render(result)
    (args.out / f"{stem}.md").write_text(md, encoding="utf-8")
    print(md)
    return 0 if agg["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
