"""``python -m trainer serve`` as a real process: capacity gauges on /metrics, rebuild on new data, rollback respected.

The dataset is a copy of LIMIT-small (46 documents) cut to 200 queries, so each build takes seconds; the
embedding cache of the checkout is shared.
"""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, VAR, free_port

pytestmark = pytest.mark.integration

LIMIT = ROOT / "data" / "limit-small"  # bundled (data/limit-small/SOURCE.md)


def make_dataset(folder: Path, n_queries: int = 200) -> int:
    """A LIMIT-small copy with the first ``n_queries`` queries; returns the number of judged pairs."""
    src = LIMIT
    (folder / "qrels").mkdir(parents=True)
    with gzip.open(src / "corpus.jsonl.gz", "rb") as fh:
        (folder / "corpus.jsonl").write_bytes(fh.read())
    with gzip.open(src / "queries.jsonl.gz", "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()[:n_queries]
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    keep = {json.loads(l)["_id"] for l in lines}
    qrels = (src / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()
    rows = [r for r in qrels[1:] if r.split("\t")[0] in keep]
    (folder / "qrels" / "test.tsv").write_text("\n".join([qrels[0], *rows]) + "\n", encoding="utf-8")
    return len(rows)


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(metric name, version or '') -> value of the adawidth series."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in fam.samples:
            if s.name.startswith("adawidth_"):
                out[(s.name, s.labels.get("version", s.labels.get("outcome", "")))] = s.value
    return out


def wait_for(url: str, proc: subprocess.Popen, pred, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"trainer exited: {log.read_text()[-3000:]}")
        try:
            last = scrape(url)
            if pred(last):
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"condition not met in {timeout_s} s; last scrape {last}; log {log.read_text()[-3000:]}")


def versions(m: dict) -> set[str]:
    return {v for (name, v) in m if name == "adawidth_capacity_delta"}


def test_trainer_serve_rebuilds_on_new_data_and_exports_capacity(tmp_path):
    ds = tmp_path / "limit200"
    pairs = make_dataset(ds)
    home = tmp_path / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = dict(os.environ, ADAWIDTH_ENCODER_DIR=str(VAR / "models" / "minilm-onnx"),
               ADAWIDTH_EMBEDDING_CACHE=str(VAR / "cache" / "embeddings.sqlite"))
    log = tmp_path / "trainer.log"
    cmd = [sys.executable, "-m", "trainer", "--home", str(home), "serve", "--dataset", str(ds), "--collection",
           "limit", "--rotation", "pca", "--port", str(port), "--poll-seconds", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        m = wait_for(url, proc, lambda m: len(versions(m)) == 1, 300, log)
        (v1,) = versions(m)
        assert m[("adawidth_capacity_delta", v1)] == pytest.approx(pairs / 46)
        assert m[("adawidth_capacity_regime_code", v1)] == 2  # moderate: delta = 400/46
        assert m[("adawidth_capacity_warren_dstar_coordinates", v1)] == 16  # ceil(8.70 ln 46 / ln 8.70) = ceil(15.4)
        assert m[("adawidth_capacity_cus_width_coordinates", v1)] == 16
        assert 0.0 <= m[("adawidth_capacity_cus_label_free_ratio", v1)] <= 1.0
        assert m[("adawidth_trainer_builds_total", "success")] == 1
        # new data: one more document -> a rebuild, published, and only the new version's series remain
        with open(ds / "corpus.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"_id": "Ada Newcomer", "title": "", "text": "Ada Newcomer likes Quokkas and Tapirs."})
                     + "\n")
        m = wait_for(url, proc, lambda m: versions(m) and versions(m) != {v1}, 300, log)
        (v2,) = versions(m)
        assert m[("adawidth_capacity_delta", v2)] == pytest.approx(pairs / 47)
        assert m[("adawidth_trainer_builds_total", "success")] == 2
        assert not [k for k in m if k[1] == v1]
        live = json.loads((home / "indexes" / "limit" / "LIVE").read_text())["version"]
        assert live == v2
        # rollback by an operator: the daemon follows the registry's live version and does not rebuild
        r = subprocess.run([sys.executable, "-m", "trainer", "--home", str(home), "rollback", "limit"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        m = wait_for(url, proc, lambda m: versions(m) == {v1}, 60, log)
        time.sleep(3)
        m = scrape(url)
        assert versions(m) == {v1} and m[("adawidth_trainer_builds_total", "success")] == 2
        assert m[("adawidth_trainer_polls_total", "")] >= 3
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-2000:]
