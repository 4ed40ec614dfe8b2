"""Speed kept by the query-path refactor (issue 16): in-process latency of each policy on SciFact, before
(commit c968252, ``service.retrieval.retrieve``: what its gateway ran) and after (this checkout,
``engine.pipeline.Pipeline`` from plan to render: what the gateway runs now), in one run, as ratios.

Each side builds the same PCA SciFact version with its own trainer (``python -m trainer build``) into its
own home and answers the 300 test queries on the same precomputed query embeddings, one query at a time, one
thread, every policy of the frozen-answer recording.  The sides alternate (old, new, old, new) so a drift of
the shared machine's load hits both; a policy's figure is the median over both rounds of the per-query
latency.  Both sides are timed over the same boundary: the per-request value checks (before: the old
gateway's ``parse_search_request`` checks after its pydantic model and ``_serve``'s; after:
:func:`engine.plan.resolve_plan`), the search, and the response body (before: ``_serve``'s hand-built dict;
after: ``render`` and ``Result.hits``).  Policy ``recall 0.99`` (the new default) has no "before".

    OMP_NUM_THREADS=1 python -m bench.speed_kept            # writes bench/results/speed_kept/summary.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, ROOT, command, machine, write_results
from engine.encoder import OnnxEncoder
from engine.io.beir import load_collection
from trainer.embed_cache import EmbeddingCache, encode_with_cache

BEFORE = "c968252"
POLICIES = {  # name -> request fields beside query and k (the frozen recording's policies, in today's names)
    "full": {"width": "full"},
    "width 64": {"width": 64},
    "width 128": {"width": 128},
    "router rho 0.1": {"width": "auto", "policy": "router", "rho": 0.1},
    "router rho 0.2": {"width": "auto", "policy": "router", "rho": 0.2},
    "router rho 0.3": {"width": "auto", "policy": "router", "rho": 0.3},
    "lexical": {"mode": "lexical"},
    "hybrid": {"mode": "hybrid", "policy": "router"},
    "phrase filter 128": {"width": 128, "phrase": True},
    "recall 0.99": {"width": "auto", "policy": "recall", "recall_target": 0.99},
}

WORKER = r'''
import json, sys, time
import numpy as np
side, version_dir, emb_file, texts_file, policies_json, rounds = sys.argv[1:7]
E = np.load(emb_file); texts = json.load(open(texts_file)); policies = json.loads(policies_json)
lat = {}
if side == "old":
    from service.app import has_lone_surrogate, is_blank
    from service.config import GatewaySettings
    from service.index import IndexVersion
    from service.retrieval import RetrievalOptions, retrieve
    v = IndexVersion.load(version_dir); settings = GatewaySettings(redis_url=None)
    def one(i, f):
        # the old gateway's per-request value checks (parse_search_request after the pydantic model, then
        # _serve), retrieve, and its response assembly: the same boundary as the new side's plan -> render
        q, k, width, rho, mode = texts[f.get("_q", "t")][i], 10, f.get("width", "auto"), f.get("rho"), f.get("mode", "dense")
        if len(q) > settings.max_query_chars or has_lone_surrogate(q) or is_blank(q) or not 1 <= k <= settings.k_max:
            raise ValueError(q)
        if isinstance(width, int) and not isinstance(width, bool) and not 1 <= width <= v.dimension:
            raise ValueError(width)
        if rho is not None and not 0.0 <= float(rho) <= 1.0:
            raise ValueError(rho)
        if width == "auto" and mode != "lexical":
            pair = settings.action_pair or v.default_pair
            if pair is None or tuple(pair) not in v.routers:
                raise ValueError(pair)
        rho = settings.default_rho if rho is None else float(rho)
        opts = RetrievalOptions(mode=mode, filter=None, fusion=settings.hybrid_fusion, alpha=settings.hybrid_alpha,
                                depth=settings.hybrid_depth, principal=None, tenant_field=settings.tenant_field,
                                acl_field=settings.acl_field)
        got, emb = retrieve(v, q, k, width, lambda t: E[i], opts, rho=rho if f.get("rho") is not None else None)
        out = got.outcome
        return {"results": [{"id": d, "score": s} for d, s in zip(out.ids, out.scores)],
                "trace": {"width": out.width, "escalated": out.escalated, "router_score": out.router_score,
                          "index_version": v.version, "coordinates_scored": out.coordinates_scored,
                          "mode": got.mode, "fusion": got.fusion, "allowed_documents": got.allowed_documents,
                          "stage1_work": out.stage1_work, "rescoring_work": out.rescoring_work,
                          "policy": out.policy, "stage1_width": out.stage1_width, "shortlist": out.shortlist,
                          "tier": "mips", "tier_predicted": None, "reranked": 0,
                          "timings_seconds": out.timings_seconds}}
else:
    from engine.index import IndexVersion
    from engine.pipeline import Pipeline, capabilities
    from engine.plan import PlanDefaults, SearchSpec, resolve_plan
    v = IndexVersion.load(version_dir); pipe = Pipeline(); d = PlanDefaults(); caps = capabilities(v)
    def one(i, f):
        fields = {k: x for k, x in f.items() if not k.startswith("_") and k != "phrase"}
        plan = resolve_plan(SearchSpec(query=texts[f.get("_q", "t")][i], k=10, **fields), d, caps)
        r = pipe.run([plan], v, embeddings=E[i:i + 1])[0]
        return {"results": r.hits(), "trace": r.trace}
for name, f in policies.items():
    if side == "old" and f.get("policy") == "recall":
        continue
    f = dict(f, _q="p" if f.get("phrase") else "t")
    for i in range(10):
        one(i, f)  # warm
    out = []
    for _ in range(int(rounds)):
        for i in range(len(E)):
            s = time.perf_counter(); one(i, f); out.append(time.perf_counter() - s)
    lat[name] = out
print(json.dumps(lat))
'''


def phrase_query(text: str) -> str:
    """The query with its longest word quoted (the frozen recording's exact-phrase constraint)."""
    words = sorted(re.findall(r"[A-Za-z]{4,}", text), key=lambda w: (-len(w), w))
    return f'"{words[0]}" {text}' if words else text


def build(tree: Path, home: Path, env: dict) -> Path:
    """``trainer build --rotation pca`` of SciFact with ``tree``'s trainer; the version folder."""
    (home / "models").mkdir(parents=True, exist_ok=True)
    link = home / "models" / "minilm-onnx"
    if not link.exists():
        os.symlink(ROOT / "var" / "models" / "minilm-onnx", link)
    out = subprocess.run([sys.executable, "-m", "trainer", "--home", str(home), "build", "--dataset",
                          str(ROOT / "data" / "scifact"), "--rotation", "pca"], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"build in {tree} failed:\n{out.stderr[-3000:]}")
    return Path(json.loads(out.stdout.strip().splitlines()[-1])["path"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="alternations old/new")
    ap.add_argument("--passes", type=int, default=1, help="passes over the queries per round")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="speed-kept-"))
    old_tree = work / "before"
    subprocess.run(["git", "worktree", "add", "-f", "--detach", str(old_tree), BEFORE], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        (old_tree / "var").mkdir()
        os.symlink(ROOT / "var" / "cache", old_tree / "var" / "cache")
        env = dict(os.environ, OMP_NUM_THREADS="1", ADAWIDTH_EMBEDDING_CACHE=str(ROOT / "var" / "cache" /
                                                                                  "embeddings.sqlite"))
        for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):
            env.pop(name, None)
        dirs = {"old": build(old_tree, work / "home-old", dict(env, PYTHONPATH=str(old_tree))),
                "new": build(ROOT, work / "home-new", dict(env, PYTHONPATH=str(ROOT)))}
        col = load_collection(ROOT / "data" / "scifact", "test")
        qids = sorted(q for q in col.qrels if q in col.queries)
        enc = OnnxEncoder(ROOT / "var" / "models" / "minilm-onnx", threads=1)
        cache = EmbeddingCache(ROOT / "var" / "cache" / "embeddings.sqlite", enc.dimension)
        E, _ = encode_with_cache(enc, [col.queries[q] for q in qids], cache)
        cache.close()
        np.save(work / "emb.npy", E)
        (work / "texts.json").write_text(json.dumps({"t": [col.queries[q] for q in qids],
                                                     "p": [phrase_query(col.queries[q]) for q in qids]}))
        lat = {"old": {}, "new": {}}
        for r in range(args.rounds):
            for side, tree in (("old", old_tree), ("new", ROOT)):
                out = subprocess.run([sys.executable, "-c", WORKER, side, str(dirs[side]), str(work / "emb.npy"),
                                      str(work / "texts.json"), json.dumps(POLICIES), str(args.passes)],
                                     cwd=tree, env=dict(env, PYTHONPATH=str(tree)), capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"{side} worker failed:\n{out.stderr[-3000:]}")
                for name, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                    lat[side].setdefault(name, []).extend(v)
                print(f"round {r + 1} {side} done", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT, capture_output=True)
    rows = []
    for name in POLICIES:
        new = np.array(lat["new"][name]) * 1e3
        old = np.array(lat["old"].get(name, [])) * 1e3
        row = {"policy": name, "new_p50_ms": float(np.median(new)), "new_p95_ms": float(np.percentile(new, 95)),
               "old_p50_ms": float(np.median(old)) if len(old) else None,
               "old_p95_ms": float(np.percentile(old, 95)) if len(old) else None}
        row["p50_ratio_new_over_old"] = row["new_p50_ms"] / row["old_p50_ms"] if len(old) else None
        rows.append(row)
    cmd = command("speed_kept", env="OMP_NUM_THREADS=1")
    payload = {"command": cmd, "machine": machine(), "before": BEFORE, "queries": len(qids),
               "rounds": args.rounds, "passes": args.passes, "rows": rows,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    md = ["# In-process latency per policy, before and after the query-path refactor (issue 16)", "",
          f"Command: `{cmd}`", "",
          f"Machine: {machine()}; one thread; {len(qids)} SciFact test queries x {args.rounds} alternating rounds "
          f"per side, precomputed embeddings (no encoder). Before: commit {BEFORE} (`service.retrieval.retrieve`); "
          "after: `engine.pipeline.Pipeline` from plan to render. Both sides include the per-request value checks and "
          "the response body (see the module docstring). `full` on SciFact's 5,183 documents is one flat scan on "
          "both sides (below `LEVEL_SCAN_MIN_DOCS`).", "",
          "| policy | before p50 ms | after p50 ms | after / before (p50) | before p95 ms | after p95 ms |",
          "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = (lambda x: "–" if x is None else f"{x:.3f}")
        md.append(f"| {r['policy']} | {f(r['old_p50_ms'])} | {f(r['new_p50_ms'])} | "
                  f"{f(r['p50_ratio_new_over_old'])} | {f(r['old_p95_ms'])} | {f(r['new_p95_ms'])} |")
    write_results(RESULTS / "speed_kept" / "summary", payload, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
