"""Offline numbers are served numbers (issue 16): the build's evaluation, the in-process pipeline and the HTTP
gateway answer every SciFact test query alike, policy by policy; and the default request meets the
declared-recall targets of issue 15 over HTTP.

* The build reports ``evaluation.served`` by running :class:`engine.pipeline.Pipeline` on the version it is
  about to write, on the cached query embeddings (:func:`trainer.build.served_evaluation`).
* The gateway runs the same pipeline on the version it loaded, on query embeddings it encodes itself.
* Here the loaded version answers in process on embeddings encoded one query at a time, as the gateway
  encodes them: ids must equal the HTTP answers (a swap of documents tied within 1e-6 is allowed) and
  scores agree within 1e-6.  The HTTP answers' NDCG@10 and work must then equal the build's report (within
  the rounding of the cached versus re-encoded embeddings: the shipped vectors agree to cosine 0.9999998).
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from adawidth.metrics import ranking_metric
from engine.index import IndexVersion
from engine.io.beir import load_collection
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from engine.version import store
from engine.version.manifest import read_manifest
from tests.conftest import SCIFACT, VAR, build_home, serve_home
from trainer.build import SERVED_POLICIES, served_evaluation
from trainer.embed_cache import EmbeddingCache, encode_with_cache
from trainer.evaluate import QuerySet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def home(tmp_path_factory, encoder_dir, encoder):
    """A SciFact PCA build with its routers, level store and recall policy (no lexical side, no capacity)."""
    return build_home(tmp_path_factory.mktemp("served-home"), encoder_dir, encoder, rotation="pca",
                      capacity=False, lexical=False)


@pytest.fixture(scope="module")
def served(home):
    """(manifest, loaded version, test query ids, texts, judgments, unseen mask, HTTP answers per policy)."""
    coll = home / "indexes" / "scifact"
    path = coll / store.read_live_pointer(coll)
    manifest = read_manifest(path)
    col = load_collection(SCIFACT, "test")
    train = load_collection(SCIFACT, "train")
    cited = {d for j in train.qrels.values() for d, g in j.items() if g > 0}
    qids = sorted(q for q in col.qrels if q in col.queries and any(g > 0 for g in col.qrels[q].values()))
    texts = [col.queries[q] for q in qids]
    judged = [col.qrels[q] for q in qids]
    unseen = np.array([not any(d in cited for d, g in j.items() if g > 0) for j in judged])
    answers = {}
    with serve_home(home, "scifact") as url, httpx.Client(timeout=60) as client:
        for name, fields in {**SERVED_POLICIES, "default": {}}.items():
            got = []
            for t in texts:
                r = client.post(f"{url}/v1/search", json={"query": t, "k": 10, **fields})
                assert r.status_code == 200, r.text
                got.append(r.json())
            answers[name] = got
    return manifest, IndexVersion.load(path), qids, texts, judged, unseen, answers


def test_in_process_pipeline_answers_as_the_gateway(served, encoder):
    _, version, qids, texts, _, _, answers = served
    pipe = Pipeline()
    for name, fields in SERVED_POLICIES.items():
        near_ties = []
        for qid, text, http in zip(qids, texts, answers[name]):
            emb = encoder.encode([text])  # one query a call, as the gateway encodes
            got = pipe.search(version, [SearchSpec(query=text, k=10, **fields)], embeddings=emb)[0]
            want_ids = [h["id"] for h in http["results"]]
            gaps = [abs(float(a) - h["score"]) for a, h in zip(got.scores, http["results"])]
            assert len(got.ids) == len(want_ids) and max(gaps) <= 1e-6, (name, qid, max(gaps))
            if got.ids != want_ids:
                assert all(a == b or g <= 1e-6 for a, b, g in zip(got.ids, want_ids, gaps)), (name, qid)
                near_ties.append(qid)
            assert got.trace["policy"] == http["trace"]["policy"], (name, qid)
            assert got.trace["coordinates_scored"] == http["trace"]["coordinates_scored"], (name, qid)
        assert len(near_ties) <= 3, (name, near_ties)


def test_the_builds_served_evaluation_is_what_the_loaded_version_answers(served, encoder):
    """The build's report, recomputed on the written-and-loaded version with the build's own (cached) query
    embeddings, is equal to the last digit; over HTTP (re-encoded queries) it agrees within their rounding."""
    manifest, version, _, texts, judged, unseen, answers = served
    report = manifest.evaluation["served"]
    assert set(report) == set(SERVED_POLICIES)  # a PCA build with routers, levels and a recall policy has all
    cache = EmbeddingCache(VAR / "cache" / "embeddings.sqlite", encoder.dimension)
    try:
        E, encoded = encode_with_cache(encoder, texts, cache)
    finally:
        cache.close()
    assert encoded == 0  # the build cached them
    col = load_collection(SCIFACT, "test")
    qs = QuerySet(sorted(q for q in col.qrels if q in col.queries and any(g > 0 for g in col.qrels[q].values())),
                  E, judged)
    again = served_evaluation(version, qs, texts, {"all": None, "unseen": unseen})
    # the same pipeline on the same version and embeddings: the same numbers (to JSON's round trip)
    assert set(again) == set(report)
    for name, by_subset in again.items():
        for subset, row in by_subset.items():
            assert row == pytest.approx(report[name][subset], rel=1e-12, abs=1e-15), (name, subset)
    # over HTTP the gateway re-encodes the queries (vectors move ~1e-7 from the cached ones): a pruning
    # decision or a router threshold may flip on a few queries, never on more than 3 % of them
    pipe = Pipeline()
    for name, fields in SERVED_POLICIES.items():
        offline = pipe.search(version, [SearchSpec(query=t, k=10, **fields) for t in texts], embeddings=E)
        differ = [i for i, (o, a) in enumerate(zip(offline, answers[name]))
                  if o.ids != [h["id"] for h in a["results"]]]
        assert len(differ) <= 0.03 * len(texts), (name, len(differ))
    # width "full" is the frozen encoder's exhaustive ranking: the build's exact row at 384
    exact = manifest.evaluation["static"]["exact/identity/384"]["all"]["ndcg@10"]
    assert report["full"]["all"]["ndcg@10"] == pytest.approx(exact, abs=1e-9)


def test_the_default_request_meets_its_declared_recall_over_http(served):
    """Issue 15's SciFact target: the plain request ({"query", "k": 10}) is declared recall 0.99, reaches
    NDCG@10 >= 0.99 x full width on all test queries and on the unseen subset, realised recall@10 >= 0.99
    against exhaustive search, with at most 15 % of N x D coordinates scored."""
    _, version, _, _, judged, unseen, answers = served
    assert {a["trace"]["policy"] for a in answers["default"]} == {"recall"}
    assert {a["trace"]["recall_target"] for a in answers["default"]} == {0.99}
    full = [[h["id"] for h in a["results"]] for a in answers["full"]]
    ranks = [[h["id"] for h in a["results"]] for a in answers["default"]]
    assert all(a["trace"]["certified"] for a in answers["full"])
    recall = np.array([len(set(f) & set(r)) / len(f) for f, r in zip(full, ranks)])
    nd, nd_full = ranking_metric(ranks, judged, "ndcg", 10), ranking_metric(full, judged, "ndcg", 10)
    work = np.array([a["trace"]["coordinates_scored"] for a in answers["default"]]) / (version.size * version.dimension)
    for m in (np.ones(len(nd), bool), unseen):
        assert nd[m].mean() >= 0.99 * nd_full[m].mean(), (nd[m].mean(), nd_full[m].mean())
    assert recall.mean() >= 0.99, recall.mean()
    assert work.mean() <= 0.15, work.mean()
