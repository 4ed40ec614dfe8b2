"""Record every SciFact test query's answer over HTTP, per policy, before the query-path refactor (issue 16).

Run once at commit c968252 (before the refactor; re-recorded there after `make embeddings` seeded the cache from
the shipped SciFact embeddings, as CI does) on the PCA build below; the file it writes,
``pca_scifact.json.gz``, is frozen.  ``tests/integration/test_frozen_answers.py`` rebuilds the same version
with today's trainer, sends the same requests (mapped onto today's request fields) and asserts identical ids
and scores within 1e-6.

    .venv/bin/python tests/data/frozen_answers/record.py
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from engine.encoder import OnnxEncoder
from engine.io.beir import load_collection
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).with_name("pca_scifact.json.gz")

# name -> request fields beside "query" and "k" (the pre-refactor API)
POLICIES = {
    "full": {"width": "full"},
    "width_64": {"width": 64},
    "width_128": {"width": 128},
    "router_rho_0.1": {"width": "auto", "rho": 0.1},
    "router_rho_0.2": {"width": "auto", "rho": 0.2},
    "router_rho_0.3": {"width": "auto", "rho": 0.3},
    "lexical": {"mode": "lexical"},
    "hybrid": {"mode": "hybrid"},
    "phrase_filter_128": {"width": 128, "phrase": True},
}


def phrase_query(text: str) -> str:
    """The query with its longest word quoted (an exact-phrase constraint: the allowed set before the top-k)."""
    words = sorted(re.findall(r"[A-Za-z]{4,}", text), key=lambda w: (-len(w), w))
    return f'"{words[0]}" {text}' if words else text


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="frozen-home-"))
    enc_dir = ROOT / "var" / "models" / "minilm-onnx"
    settings = TrainerSettings(home=home, encoder_dir=enc_dir, redis_url=None,
                               embedding_cache=ROOT / "var" / "cache" / "embeddings.sqlite").resolved()
    encoder = OnnxEncoder(enc_dir, threads=2)
    path, manifest = build_index(BuildOptions(dataset=ROOT / "data" / "scifact", rotation="pca"), settings, encoder)
    (home / "models").mkdir(exist_ok=True)
    os.symlink(enc_dir, home / "models" / "minilm-onnx")
    col = load_collection(ROOT / "data" / "scifact", "test")
    qids = sorted(q for q in col.qrels if q in col.queries)
    port = 8765
    env = dict(os.environ, ADAWIDTH_HOME=str(home), ADAWIDTH_PORT=str(port), ADAWIDTH_COLLECTION="scifact")
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        out = {"commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip(),
               "build": {"rotation": "pca", "version": manifest.version}, "k": 10, "policies": {}}
        with httpx.Client(timeout=30) as client:
            for name, fields in POLICIES.items():
                answers = {}
                for q in qids:
                    body = {k: v for k, v in fields.items() if k != "phrase"}
                    text = phrase_query(col.queries[q]) if fields.get("phrase") else col.queries[q]
                    r = client.post(f"{base}/v1/search", json={"query": text, "k": 10, **body})
                    r.raise_for_status()
                    data = r.json()
                    answers[q] = {"query": text, "ids": [h["id"] for h in data["results"]],
                                  "scores": [h["score"] for h in data["results"]],
                                  "width": data["trace"]["width"], "escalated": data["trace"]["escalated"]}
                out["policies"][name] = {"request": {k: v for k, v in fields.items()}, "answers": answers}
                print(name, len(answers), flush=True)
        with gzip.open(OUT, "wt", encoding="utf-8") as fh:
            json.dump(out, fh, sort_keys=True)
        print("wrote", OUT)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
