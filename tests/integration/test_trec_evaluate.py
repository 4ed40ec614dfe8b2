"""``python -m trainer evaluate --run-file``: TREC run files of SciFact's test queries under three policies,
scored by pytrec_eval to the NDCG@10 the command reports (adawidth.metrics) for the same rankings."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytrec_eval

from engine.version import store
from engine.version.manifest import read_manifest
from engine.io.beir import load_qrels
from adawidth.metrics import ndcg_at_k
from tests.conftest import SCIFACT, VAR, build_home

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pca_home(tmp_path_factory, encoder_dir, encoder):
    """A SciFact PCA version with its router (no adapter training: seconds from the cached embeddings)."""
    return build_home(tmp_path_factory.mktemp("trec-home"), encoder_dir, encoder, rotation="pca",
                      action_pairs=((64, 128),), default_pair=(64, 128), capacity=False, lexical=False)


def test_run_files_score_in_pytrec_eval_as_in_our_metrics(pca_home, tmp_path):
    run_file = tmp_path / "scifact.trec"
    env = dict(os.environ, ADAWIDTH_EMBEDDING_CACHE=str(VAR / "cache" / "embeddings.sqlite"),
               ADAWIDTH_ENCODER_THREADS="2")
    for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-m", "trainer", "--home", str(pca_home), "evaluate", "--dataset",
                          str(SCIFACT), "--width", "full", "64", "auto", "--run-file", str(run_file),
                          "--json", str(tmp_path / "summary.json")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["policy"] for p in summary["policies"]] == ["full", "64", "auto"]
    qrels = load_qrels(SCIFACT, "test")
    judged = {q for q, j in qrels.items() if any(g > 0 for g in j.values())}
    by_policy = {}
    for p in summary["policies"]:
        path = Path(p["run_file"])
        assert path.name == f"scifact.{p['policy']}.trec" and p["queries"] == len(judged) == 300
        lines = [line.split() for line in path.read_text().splitlines()]
        assert all(len(f) == 6 and f[1] == "Q0" and f[5] == f"adawidth-{p['policy']}" for f in lines)
        run = {}
        for qid, _, doc, rank, score, _ in lines:
            run.setdefault(qid, []).append((doc, int(rank), float(score)))
        assert set(run) == judged
        for ranked in run.values():  # ranks 1..k in file order, scores strictly decreasing
            assert [r for _, r, _ in ranked] == list(range(1, len(ranked) + 1)) and len(ranked) == 100
            assert all(a[2] > b[2] for a, b in zip(ranked, ranked[1:]))
        ours = [ndcg_at_k([d for d, _, _ in run[q]], qrels[q], 10) for q in sorted(judged)]
        with open(path) as fh:
            theirs = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(pytrec_eval.parse_run(fh))
        assert sum(ours) / len(ours) == pytest.approx(p["ndcg@10"], abs=1e-12)
        assert sum(v["ndcg_cut_10"] for v in theirs.values()) / len(theirs) == pytest.approx(p["ndcg@10"], abs=1e-9)
        by_policy[p["policy"]] = p["ndcg@10"]
    # the rankings are the served ones: full width is the frozen encoder's exact search (the build's offline row)
    coll = pca_home / "indexes" / "scifact"
    manifest = read_manifest(coll / store.read_live_pointer(coll))
    exact = manifest.evaluation["static"]["exact/identity/384"]["all"]["ndcg@10"]
    assert by_policy["full"] == pytest.approx(exact, abs=2e-3)
    assert by_policy["64"] < by_policy["full"] and 0.5 < by_policy["auto"] < 0.7
