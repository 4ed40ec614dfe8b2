"""End to end over HTTP: the trainer's SciFact index served by a real gateway process, scored on the test split."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import pytrec_eval

from adawidth.metrics import per_query
from adawidth.prefix import exact_prefix_search
from engine.io.beir import load_collection
from tests.conftest import SCIFACT, VAR
from trainer.embed_cache import EmbeddingCache, encode_with_cache

pytestmark = pytest.mark.e2e

PUBLISHED_NDCG10 = 0.64508  # all-MiniLM-L6-v2 on BEIR SciFact test


@pytest.fixture(scope="module")
def scifact():
    return load_collection(SCIFACT, "test")


def run_http(url, queries, width, k=100, rho=None):
    rankings, scores, traces = {}, {}, []
    with httpx.Client(timeout=30) as client:
        for qid, text in queries.items():
            body = {"query": text, "k": k, "width": width}
            if rho is not None:
                body.update(policy="router", rho=rho)
            r = client.post(f"{url}/v1/search", json=body)
            assert r.status_code == 200, r.text
            data = r.json()
            rankings[qid] = [h["id"] for h in data["results"]]
            scores[qid] = [h["score"] for h in data["results"]]
            traces.append(data["trace"])
    return rankings, scores, traces


@pytest.fixture(scope="module")
def full_run(gateway_url, scifact):
    return run_http(gateway_url, scifact.judged_queries(), "full")


def test_full_width_ndcg_matches_published_figure(full_run, scifact):
    rankings, _, traces = full_run
    ndcg = np.mean(list(per_query(rankings, scifact.qrels, "ndcg", 10).values()))
    assert len(rankings) == 300
    assert abs(ndcg - PUBLISHED_NDCG10) <= 0.003, ndcg
    assert all(t["width"] == 384 for t in traces)


def test_metrics_equal_pytrec_eval_on_the_served_run(full_run, scifact):
    rankings, scores, _ = full_run
    trec_run = {q: {d: float(len(r) - i) for i, d in enumerate(r)} for q, r in rankings.items()}
    ref = pytrec_eval.RelevanceEvaluator(scifact.qrels, {"ndcg_cut.10", "recall.100"}).evaluate(trec_run)
    nd = per_query(rankings, scifact.qrels, "ndcg", 10)
    rc = per_query(rankings, scifact.qrels, "recall", 100)
    assert max(abs(nd[q] - ref[q]["ndcg_cut_10"]) for q in nd) <= 1e-6
    assert max(abs(rc[q] - ref[q]["recall_100"]) for q in rc) <= 1e-6
    assert abs(np.mean(list(nd.values())) - np.mean([v["ndcg_cut_10"] for v in ref.values()])) <= 1e-6


def test_full_width_through_the_adapter_is_the_frozen_encoders_ranking(full_run, scifact, encoder):
    """Endpoint invariance (Eq. (4) of 001): rotated full-width search ranks exactly as the frozen encoder."""
    rankings, scores, _ = full_run
    qids = list(rankings)
    cache = EmbeddingCache(VAR / "cache" / "embeddings.sqlite", 384)
    X, _ = encode_with_cache(encoder, [d.encoder_text() for d in scifact.corpus], cache)
    Q, _ = encode_with_cache(encoder, [scifact.queries[q] for q in qids], cache)
    ref = exact_prefix_search(Q, X, 384, 10)
    doc_ids = [d.doc_id for d in scifact.corpus]
    frozen_scores = Q @ X.T
    mismatched = 0
    for i, q in enumerate(qids):
        ours = rankings[q][:10]
        theirs = [doc_ids[j] for j in ref[i]]
        if ours != theirs:
            # only a float tie may swap neighbours: equal frozen scores within 1e-6
            row = {doc_ids[j]: frozen_scores[i, j] for j in range(len(doc_ids))}
            assert sorted(ours) == sorted(theirs) or abs(row[ours[-1]] - row[theirs[-1]]) < 1e-6
            assert all(abs(row[a] - row[b]) < 1e-6 for a, b in zip(ours, theirs) if a != b)
            mismatched += 1
    assert mismatched <= 3
    cache.close()


def test_auto_policy_over_http(gateway_url, scifact):
    queries = scifact.judged_queries()
    rates, widths, ndcgs = [], [], []
    for rho in (0.1, 0.3):
        rankings, _, traces = run_http(gateway_url, queries, "auto", rho=rho)
        esc = np.array([t["escalated"] for t in traces])
        w = np.array([t["width"] for t in traces])
        assert set(np.unique(w)) <= {64, 128}
        assert np.all((w == 128) == esc)
        rates.append(esc.mean())
        widths.append(w.mean())
        ndcgs.append(np.mean(list(per_query(rankings, scifact.qrels, "ndcg", 10).values())))
        assert len({t["index_version"] for t in traces}) == 1
    # calibration on held-out (cross-fitted) predictions keeps the realised rate near the target
    assert 0.03 <= rates[0] <= 0.2 and 0.15 <= rates[1] <= 0.45 and rates[0] < rates[1]
    assert 64 < widths[0] < widths[1] < 128
    # quality: the routed policy is better than resolving everything at 64 coordinates
    r64, _, _ = run_http(gateway_url, queries, 64)
    ndcg64 = np.mean(list(per_query(r64, scifact.qrels, "ndcg", 10).values()))
    assert ndcgs[1] > ndcg64
