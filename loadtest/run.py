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
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import subprocess
import sys
import time
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


def gateway_5xx(url: str) -> float | None:
    try:
        with Client(url, timeout_s=5) as client:
            text = client.metrics()
    except ClientError:
        return None
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("adawidth_http_requests_total{") and 'status="5xx"' in line)


def render(r: dict) -> str:
    L = [f"# Locust: {r['users']} users, {r['seconds']} s against {r['target']}", "",
         f"Command: `{r['command']}`", "", f"{r['date']}; {r['machine']}. Traffic: `loadtest/locustfile.py` "
         f"(queries from `{r['queries_file']}`; mixed k, auto / auto+ρ / default / fixed widths / full, 5 % invalid "
         "requests that must get their documented 4xx code and then count as successes).", "",
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
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--stem")
    args = p.parse_args(argv)

    workdir = args.home.resolve() / "locust"  # logs and locust CSVs (var/ is not committed)
    workdir.mkdir(parents=True, exist_ok=True)
    proc, url = None, args.host
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        os.environ["ADAWIDTH_ENCODER_THREADS"] = str(args.encoder_threads)
        proc = start_gateway(args.home.resolve(), args.collection, port, workdir / "gateway.log")
    try:
        if proc is not None:
            wait_ready(url, proc)
        prefix = workdir / "run"
        env = dict(os.environ, ADAWIDTH_LOCUST_QUERIES=str(args.queries))
        cmd = [str(Path(sys.executable).with_name("locust")), "-f", str(ROOT / "loadtest" / "locustfile.py"),
               "--headless", "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{args.seconds}s",
               "--host", url, "--csv", str(prefix), "--only-summary", "--stop-timeout", "10"]
        t0 = time.time()
        lc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.seconds + 120)
        (workdir / "locust.log").write_text(lc.stdout + lc.stderr)
        if not Path(f"{prefix}_stats.csv").exists():
            print(lc.stdout[-3000:] + lc.stderr[-3000:], file=sys.stderr)
            return 2
        errors_5xx = gateway_5xx(url)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    rows, failures = parse_stats(prefix)
    agg = next(r for r in rows if r["name"] == "Aggregated")
    shown = " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
    result = {"command": f".venv/bin/python -m loadtest.run {shown}".strip(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "target": url if args.host else "a gateway "
              f"started on {args.collection} (encoder threads {args.encoder_threads})", "users": args.users,
              "spawn_rate": args.spawn_rate, "seconds": args.seconds, "queries_file": str(args.queries.relative_to(ROOT)
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
