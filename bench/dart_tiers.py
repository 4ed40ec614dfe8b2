"""DART tiered routing through the gateway (Algorithm 1 of 000): NDCG@10 and latency of each tier against MIPS.

Usage (after ``python -m trainer.dart.cross_encoder --dataset data/scifact`` and
``python -m trainer build --dataset data/scifact --tiers``)::

    python -m bench.dart_tiers --home var --collection scifact --out bench/results/dart/tiers

Every evaluation query is sent to an in-process gateway (FastAPI TestClient, the served code path, default
settings) once per tier: ``mips`` (the adaptive-width funnel, width 'auto'), ``maxsim`` and ``cross_encoder``
(the top 50 of that funnel reranked), and ``auto`` (the version's difficulty head picks). NDCG@10 comes from
the answers; latency is the trace's in-process ``total`` (encode to ranked answer, no HTTP). MaxSim runs twice:
with its document-token cache off (cold: every candidate is encoded), and on the first ``--warm-queries`` again
after one pass over them has filled a cache large enough for the corpus (warm: no document is encoded); the
``auto`` pass runs with that cache. Also reported: the oracle routing (the best tier per query, using the query's labels) and a
random routing that sends the same share of queries to each tier as the head does (mean of 200 draws).
Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from tqdm.auto import tqdm

from adawidth.metrics import ranking_metric
from adawidth.tiers import TIERS, oracle_tier
from bench.common import ROOT, command
from bench.funnels import bootstrap_ci
from engine.io import atomic
from engine.io.beir import load_collection
from service.app import create_app
from service.config import GatewaySettings


def _client(home: Path, collection: str, **settings):
    return TestClient(create_app(GatewaySettings(home=home, collection=collection, redis_url=None, **settings),
                                 CollectorRegistry()))


def _run(client, queries: list[str], tier: str, k: int = 10, desc: str = ""):
    ids, lat, traces = [], [], []
    for q in tqdm(queries, desc=desc or tier, unit="query"):
        r = client.post("/v1/search", json={"query": q, "k": k, "tier": tier})
        r.raise_for_status()
        body = r.json()
        ids.append([h["id"] for h in body["results"]])
        lat.append(body["trace"]["timings_seconds"]["total"])
        traces.append(body["trace"])
    return ids, np.array(lat), traces


def _pct(x: np.ndarray) -> dict:
    return {"p50_ms": float(np.percentile(x, 50) * 1e3), "p95_ms": float(np.percentile(x, 95) * 1e3),
            "mean_ms": float(x.mean() * 1e3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", type=Path, default=ROOT / "var")
    ap.add_argument("--collection", default="scifact")
    ap.add_argument("--dataset", type=Path, default=ROOT / "data" / "scifact")
    ap.add_argument("--split", default="test")
    ap.add_argument("--queries", type=int, default=None, help="first N judged queries only")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dart" / "tiers")
    ap.add_argument("--warm-queries", type=int, default=100, help="queries of the warm-cache MaxSim measurement")
    ap.add_argument("--cache-documents", type=int, default=6000, help="MaxSim cache of the warm and auto passes")
    args = ap.parse_args(argv)

    col = load_collection(args.dataset, args.split)
    qids = sorted(col.judged_queries())[:args.queries]
    texts = [col.queries[q] for q in qids]
    ndcg = lambda runs: ranking_metric(runs, [col.qrels[q] for q in qids[:len(runs)]], "ndcg", 10)  # noqa: E731

    res, lat = {}, {}
    with _client(args.home, args.collection, maxsim_cache_documents=0) as c:
        version = c.app.state.gw.live
        tiers = version.manifest.tiers.model_dump(mode="json") if version.manifest.tiers is not None else {}
        for tier in ("mips", "maxsim", "cross_encoder"):
            ids, l, _ = _run(c, texts, tier, desc=f"{tier}" + (" (cold)" if tier == "maxsim" else ""))
            res[tier], lat[tier if tier != "maxsim" else "maxsim_cold"] = ndcg(ids), l
    with _client(args.home, args.collection, maxsim_cache_documents=args.cache_documents) as c:
        warm = texts[:args.warm_queries]
        _run(c, warm, "maxsim", desc="maxsim (filling the cache)")
        _, lat["maxsim_warm"], _ = _run(c, warm, "maxsim", desc="maxsim (warm)")
        ids, lat["auto"], traces = _run(c, texts, "auto")
        res["auto"] = ndcg(ids)
    pred = np.array([TIERS.index(t["tier_predicted"]) for t in traces])
    Q = np.stack([res[t] for t in TIERS], axis=1)
    t_star = oracle_tier(Q)
    idx = np.arange(len(qids))
    share = np.bincount(pred, minlength=len(TIERS)) / len(pred)
    rng = np.random.default_rng(0)
    random_routed = float(np.mean([Q[idx, rng.choice(len(TIERS), len(idx), p=share)].mean() for _ in range(200)]))
    out = {
        "collection": args.collection, "version": version.version, "split": args.split, "queries": len(qids),
        "ndcg10": {t: float(v.mean()) for t, v in res.items()},
        "oracle_routed_ndcg10": float(Q[idx, t_star].mean()),
        "random_routed_same_shares_ndcg10": random_routed,
        "head_shares": {t: float(s) for t, s in zip(TIERS, share)},
        "oracle_shares": {t: float(np.mean(t_star == j)) for j, t in enumerate(TIERS)},
        "head_accuracy_vs_oracle": float(np.mean(pred == t_star)),
        "auto_equals_offline_routing": bool(np.allclose(res["auto"], Q[idx, pred])),
        "delta_vs_mips": {t: {"mean": float((res[t] - res["mips"]).mean()),
                              "ci95": bootstrap_ci(res[t] - res["mips"])} for t in ("maxsim", "cross_encoder", "auto")},
        "latency": {k: _pct(v) for k, v in lat.items()},
        "latency_ratio_p50_to_mips": {k: float(np.percentile(v, 50) / np.percentile(lat["mips"], 50))
                                      for k, v in lat.items()},
        "head": tiers.get("head"),
        "cross_encoder": tiers.get("cross_encoder"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "providers": c.app.state.gw.encoder.providers},
        "command": command("dart_tiers", argv),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(args.out.with_suffix(".json"), json.dumps(out, indent=2))
    L = out["latency"]
    rows = [("MIPS (adaptive width, auto)", "mips", "mips"), ("MaxSim, top 50, cold cache", "maxsim", "maxsim_cold"),
            (f"MaxSim, top 50, warm cache (latency on {args.warm_queries} queries)", "maxsim", "maxsim_warm"),
            ("cross-encoder, top 50", "cross_encoder", "cross_encoder"), ("auto (difficulty head)", "auto", "auto")]
    md = [f"# DART tiers through the gateway ({args.collection}, {args.split}, {len(qids)} queries)", "",
          f"Command: `{out['command']}` ({out['date']}; {out['machine']['cpus']} CPUs, "
          f"providers {', '.join(out['machine']['providers'])}). Version `{version.version}`.", "",
          "| tier | NDCG@10 | Δ vs MIPS [95 % CI] | p50 ms | p95 ms | p50 / MIPS |", "|---|---|---|---|---|---|"]
    for name, t, lk in rows:
        d = out["delta_vs_mips"].get(t)
        dd = f"{d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]" if d and lk != "maxsim_warm" else ""
        md.append(f"| {name} | {out['ndcg10'][t]:.4f} | {dd} | {L[lk]['p50_ms']:.1f} | {L[lk]['p95_ms']:.1f} | "
                  f"{out['latency_ratio_p50_to_mips'][lk]:.1f} × |")
    md += ["", f"Oracle routing (best tier per query, from its labels): {out['oracle_routed_ndcg10']:.4f}. "
           f"Random routing with the head's shares: {random_routed:.4f}.",
           "Head shares: " + ", ".join(f"{t} {s:.0%}" for t, s in out["head_shares"].items())
           + "; oracle shares: " + ", ".join(f"{t} {s:.0%}" for t, s in out["oracle_shares"].items())
           + f"; head accuracy against the oracle {out['head_accuracy_vs_oracle']:.2f}.",
           f"The gateway's auto answers equal the offline routing of the per-tier answers: "
           f"{out['auto_equals_offline_routing']}."]
    atomic.write_text(args.out.with_suffix(".md"), "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
