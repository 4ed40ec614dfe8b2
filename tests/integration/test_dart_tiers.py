"""DART tiered routing through the gateway (issue 5, Algorithm 1 of 000), on SciFact.

A small cross-encoder is fine-tuned here from the bundled MiniLM weights (a few steps: this checks the
plumbing, not its quality; bench/results/dart/tiers.md measures a fully trained one), a PCA version is built
with ``--tiers`` (difficulty head fitted on held-out training queries), and the gateway serves it.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from adawidth.tiers import TIERS, maxsim, normalize_rows, predict_tier
from engine.scorers import CrossEncoderScorer
from engine.version import store
from service.app import create_app
from service.config import GatewaySettings
from tests.conftest import SCIFACT, VAR, build_home
from trainer.dart.cross_encoder import main

QUERIES = ["statins reduce cardiovascular events", "BRCA1 mutation breast cancer risk",
           "vitamin D deficiency and bone fractures", "microRNA regulation of cell differentiation",
           "smoking increases the risk of lung cancer", "antibiotic resistance in hospital infections"]


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ce") / "minilm-cross-encoder"
    rc = main(["--dataset", str(SCIFACT), "--out", str(out), "--home", str(VAR), "--max-steps", "6",
               "--train-queries", "24", "--holdout-queries", "40", "--dev-queries", "0",
               "--train-max-tokens", "96", "--batch-queries", "2", "--group-size", "4"])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def tiers_home(tmp_path_factory, encoder_dir, encoder, ce_dir):
    home = build_home(tmp_path_factory.mktemp("tiers-home"), encoder_dir, encoder, rotation="pca",
                      action_pairs=((64, 128),), default_pair=(64, 128), capacity=False, lexical=False,
                      tiers=True, cross_encoder=ce_dir, tier_head_queries=16)
    os.symlink(ce_dir, home / "models" / "minilm-cross-encoder")
    return home


@pytest.fixture(scope="module")
def manifest(tiers_home):
    coll = tiers_home / "indexes" / "scifact"
    return json.loads((coll / store.read_live_pointer(coll) / "manifest.json").read_text())


def _client(home, **settings):
    return TestClient(create_app(GatewaySettings(home=home, collection="scifact", redis_url=None, **settings),
                                 CollectorRegistry()))


@pytest.fixture(scope="module")
def client(tiers_home):
    with _client(tiers_home) as c:
        yield c


def _search(client, query, **body):
    r = client.post("/v1/search", json={"query": query, "k": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_head_is_fitted_only_on_queries_the_cross_encoder_never_saw(manifest, ce_dir):
    ce_meta = json.loads((ce_dir / "cross_encoder.json").read_text())
    head = manifest["tiers"]["head"]
    assert head["queries"] == 16 and sum(head["oracle_counts"].values()) == 16
    assert manifest["tiers"]["cross_encoder"]["onnx_sha256"] == ce_meta["onnx_sha256"]
    assert len(ce_meta["train_query_ids"]) == 24 and head["cross_encoder_held_out"]
    labelled = head["labels"]["query_ids"]
    assert len(labelled) == 16 and not set(labelled) & set(ce_meta["train_query_ids"])
    assert np.array(head["labels"]["ndcg10"]).shape == (16, 3)
    # the oracle is the best tier per query, so routing by it is at least as good as any single tier
    assert head["oracle_routed_ndcg10"] >= max(head["tier_ndcg10"].values())
    assert manifest["rerank"]["text_file"] == "encoder_text.json"


def test_each_tier_answers_and_the_trace_names_it(client, encoder):
    gw = client.app.state.gw
    version = gw.live
    q = QUERIES[0]
    mips = _search(client, q, tier="mips", k=50)
    assert mips["trace"]["tier"] == "mips" and mips["trace"]["reranked"] == 0
    assert mips["trace"]["tier_predicted"] is None and len(mips["results"]) == 50
    cand = [h["id"] for h in mips["results"]]
    rows = [version.doc_ids.index(i) for i in cand]
    texts = [version.texts[r] for r in rows]

    ms = _search(client, q, tier="maxsim")
    assert ms["trace"]["tier"] == "maxsim" and ms["trace"]["reranked"] == 50 and len(ms["results"]) == 10
    assert "rerank" in ms["trace"]["timings_seconds"]
    # the served MaxSim order is late interaction over the encoder's token embeddings of the same 50 candidates
    qt = normalize_rows(encoder.encode_tokens([q])[0])
    want = maxsim(qt, [normalize_rows(t) for t in encoder.encode_tokens(texts)])
    assert [h["id"] for h in ms["results"]] == [cand[i] for i in np.argsort(-want, kind="stable")[:10]]
    assert np.allclose([h["score"] for h in ms["results"]], np.sort(want)[::-1][:10], atol=1e-3)

    ce = _search(client, q, tier="cross_encoder")
    assert ce["trace"]["tier"] == "cross_encoder" and ce["trace"]["reranked"] == 50
    s = CrossEncoderScorer(gw.settings.cross_encoder_dir, threads=1).score(q, texts)
    assert [h["id"] for h in ce["results"]] == [cand[i] for i in np.argsort(-s, kind="stable")[:10]]

    # the reranking tiers only reorder the first stage's top 50
    assert {h["id"] for h in ms["results"]} <= set(cand) and {h["id"] for h in ce["results"]} <= set(cand)
    metrics = client.get("/metrics").text
    for tier in ("mips", "maxsim", "cross_encoder"):
        assert f'adawidth_search_tier_total{{tier="{tier}"}}' in metrics


def test_auto_follows_the_trained_head(client, encoder):
    on = {"available": True, "reason": None}
    assert client.get("/readyz").json()["tiers"] == {"default": "mips", "difficulty_head": True,
                                                     "document_texts": True, "cross_encoder": True,
                                                     "rerank": {"maxsim": on, "cross_encoder": on}}
    version = client.app.state.gw.live
    for q in QUERIES:
        want = TIERS[int(predict_tier(version.tier_head, encoder.encode([q])[0]))]
        t = _search(client, q, tier="auto")["trace"]
        assert t["tier_predicted"] == want and t["tier"] == want
        assert t["reranked"] == (0 if want == "mips" else 50)


def test_auto_follows_a_head_that_uses_every_tier(tiers_home, encoder):
    """A hand-made head W (3, D) whose argmax differs across the queries: the gateway serves each query at
    the tier the head picks, and the default tier of the gateway can be 'auto'."""
    E = encoder.encode(QUERIES)
    # rows: directions that separate the queries (their embeddings' deviations from the mean)
    W = np.stack([E[0] - E.mean(0), E[1] - E.mean(0), E[2] - E.mean(0)]).astype(np.float32)
    pred = [TIERS[int(p)] for p in predict_tier(W, E)]
    assert set(pred) == set(TIERS)
    with _client(tiers_home, default_tier="auto") as c:
        c.app.state.gw.live.tier_head = W
        for q, want in zip(QUERIES, pred):
            t = _search(c, q)["trace"]            # no tier in the request: the gateway's default, auto
            assert t["tier_predicted"] == want and t["tier"] == want


def test_without_the_cross_encoder_auto_falls_back_and_the_explicit_tier_is_refused(tiers_home, tmp_path, encoder):
    with _client(tiers_home, cross_encoder_dir=tmp_path / "none") as c:
        r = c.post("/v1/search", json={"query": QUERIES[0], "tier": "cross_encoder"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "tier_unavailable"
        D = c.app.state.gw.live.dimension
        W = np.zeros((len(TIERS), D), np.float32)
        W[2] = encoder.encode([QUERIES[0]])[0]       # predicts the cross-encoder for this query
        c.app.state.gw.live.tier_head = W
        t = _search(c, QUERIES[0], tier="auto")["trace"]
        assert t["tier_predicted"] == "cross_encoder" and t["tier"] == "maxsim"


def test_with_no_rerank_workers_auto_serves_mips_and_the_explicit_tiers_are_refused(tiers_home, encoder):
    """max_concurrent_reranks = 0 turns the reranking tiers off: an explicit one gets 409 tier_unavailable naming
    the setting, and 'auto' serves a head's reranking prediction at mips (the trace keeps the prediction)."""
    with _client(tiers_home, max_concurrent_reranks=0) as c:
        rerank = c.get("/readyz").json()["tiers"]["rerank"]  # what an operator sees
        assert rerank == {t: {"available": False, "reason": "reranking is turned off on this replica "
                                                            "(max_concurrent_reranks = 0)"}
                          for t in ("maxsim", "cross_encoder")}
        for tier in ("maxsim", "cross_encoder"):
            r = c.post("/v1/search", json={"query": QUERIES[0], "tier": tier})
            assert r.status_code == 409 and r.json()["error"]["code"] == "tier_unavailable", r.text
            assert "max_concurrent_reranks" in r.json()["error"]["message"]
        W = np.zeros((len(TIERS), c.app.state.gw.live.dimension), np.float32)
        W[2] = encoder.encode([QUERIES[0]])[0]       # predicts the cross-encoder for this query
        c.app.state.gw.live.tier_head = W
        t = _search(c, QUERIES[0], tier="auto")["trace"]
        assert t["tier_predicted"] == "cross_encoder" and t["tier"] == "mips" and t["reranked"] == 0


def test_bad_tiers_get_clear_4xx(client, scifact_home):
    r = client.post("/v1/search", json={"query": "x", "tier": "colbert"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_tier"
    r = client.post("/v1/search", json={"query": "x", "tier": 2})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_tier"
    with _client(scifact_home) as c:                 # a version built without --tiers has no head
        r = c.post("/v1/search", json={"query": "statins", "tier": "auto"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "tier_unavailable"
        assert r.json()["error"]["field"] == "tier"


class _GatedScorer:
    """The replica's MaxSim scorer, held at a gate: records the thread each rerank runs on."""

    def __init__(self, inner):
        self.inner, self.threads = inner, []
        self.entered, self.gate = threading.Event(), threading.Event()

    def score(self, *args):
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.inner.score(*args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_auto_reranks_on_a_rerank_worker_and_falls_back_to_mips_when_they_are_taken(tiers_home, encoder):
    """Tier 'auto' runs its first stages on an ordinary worker and only its rerank on a rerank worker: while one
    'auto' query's MaxSim rerank holds the only rerank worker, the only ordinary worker still serves a mips search
    (before, the 'auto' query held it through its rerank and the search got 429), a second 'auto' query the head
    sends to MaxSim is served at mips with tier_fallback_because (counted), and an explicit maxsim gets 429."""
    limits = dict(max_concurrent_searches=1, max_queued_searches=0, max_concurrent_reranks=1, max_queued_reranks=0)
    with _client(tiers_home, **limits) as c:
        gw = c.app.state.gw
        W = np.zeros((len(TIERS), gw.live.dimension), np.float32)
        W[1] = encoder.encode([QUERIES[0]])[0]       # predicts maxsim for queries near QUERIES[0]
        gw.live.tier_head = W
        gated = gw.maxsim = _GatedScorer(gw.maxsim)
        held = {}
        t = threading.Thread(target=lambda: held.setdefault("r", c.post("/v1/search", json={
            "query": QUERIES[0], "k": 10, "tier": "auto"})))
        t.start()
        try:
            assert gated.entered.wait(60), "the 'auto' query never reached its rerank"
            assert gated.threads[0].startswith("rerank"), gated.threads  # the rerank workers' thread
            r = c.post("/v1/search", json={"query": QUERIES[1], "k": 10, "tier": "mips"})
            assert r.status_code == 200, r.text           # the ordinary worker is free during the rerank
            r = c.post("/v1/search", json={"query": QUERIES[0], "k": 10, "tier": "auto"})
            assert r.status_code == 200, r.text
            tr = r.json()["trace"]
            assert tr["tier_predicted"] == "maxsim" and tr["tier"] == "mips" and tr["reranked"] == 0
            assert "max_concurrent_reranks 1" in tr["tier_fallback_because"]
            assert len(r.json()["results"]) == 10
            r = c.post("/v1/search", json={"query": QUERIES[0], "k": 10, "tier": "maxsim"})
            assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded", r.text
        finally:
            gated.gate.set()
            t.join(60)
        r = held["r"]
        assert r.status_code == 200, r.text
        tr = r.json()["trace"]
        assert tr["tier_predicted"] == "maxsim" and tr["tier"] == "maxsim" and tr["reranked"] > 0
        assert tr["tier_fallback_because"] is None
        assert len(gated.threads) == 1                      # the fallback reranked nothing
        assert "adawidth_tier_fallbacks_total 1.0" in c.get("/metrics").text


def test_a_rerank_batch_stops_at_its_deadline_and_frees_the_rerank_worker(tiers_home):
    """A batch of MaxSim items past its deadline gets 503 deadline_exceeded (with Retry-After) and stops between
    its reranks, so the rerank worker is free for the next request at once, not after the batch's remaining
    reranks (each held 0.3 s here)."""
    with _client(tiers_home, search_deadline_s=1.0, max_concurrent_reranks=1, max_queued_reranks=1) as c:
        gw = c.app.state.gw
        slow = gw.maxsim = _GatedScorer(gw.maxsim)
        slow.gate.set()

        def fake(text, version, rows, texts):  # a rerank of 0.3 s (scores: the rows' order kept)
            slow.threads.append(threading.current_thread().name)
            time.sleep(0.3)
            return [-float(i) for i in range(len(rows))]

        slow.score = fake
        r = c.post("/v1/search/batch", json={"queries": [{"query": q, "tier": "maxsim", "k": 5}
                                                         for q in QUERIES * 4]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "deadline_exceeded", r.text
        assert r.headers["Retry-After"] == "1"
        time.sleep(0.4)                                # the rerank under way when the deadline passed ends
        n = len(slow.threads)
        assert n < len(QUERIES) * 4 // 2, n            # it stopped between reranks, far short of all 24
        r = c.post("/v1/search", json={"query": QUERIES[0], "tier": "maxsim", "k": 5})
        # within its own 1 s deadline: the worker is not busy with the batch's remaining ~19 reranks (~6 s)
        assert r.status_code == 200 and r.json()["trace"]["tier"] == "maxsim", r.text
        time.sleep(0.5)
        assert len(slow.threads) == n + 1              # nothing of the batch ran after it was answered
