"""Batch search, the collection-scoped routes and the query-embedding cache over real HTTP on a SciFact PCA
build (issue 17): a batch answers what single requests answer, query by query; a bad item is answered in its
slot; the batch's own limits; unknown collections; the cache's hits on /metrics, and none when it is off."""

from __future__ import annotations

import httpx
import pytest

from adawidth_client import ApiError, BatchItemError, Client, SearchResponse
from engine.io.beir import load_qrels, load_queries
from tests.conftest import SCIFACT, build_home, serve_home

pytestmark = pytest.mark.integration

MAX_BATCH = 64
POLICIES = [{"width": "full"}, {"width": 64}, {"width": 128}, {"width": "auto"},
            {"width": "auto", "policy": "router"}, {"width": "auto", "policy": "router", "rho": 0.6},
            {"width": "auto", "recall_target": 0.9}, {"mode": "hybrid"}]


@pytest.fixture(scope="module")
def pca_home(tmp_path_factory, encoder_dir, encoder):
    return build_home(tmp_path_factory.mktemp("batch-home"), encoder_dir, encoder, rotation="pca", capacity=False)


@pytest.fixture(scope="module")
def uncached_url(pca_home):
    """A gateway with the query-embedding cache off (batch vs single compares real encodings)."""
    with serve_home(pca_home, "scifact", QUERY_CACHE_ENTRIES=0, MAX_BATCH=MAX_BATCH) as url:
        yield url


@pytest.fixture(scope="module")
def test_queries() -> list[str]:
    queries = load_queries(SCIFACT)
    return [queries[qid] for qid in sorted(load_qrels(SCIFACT, "test"))[:48]]


def counter(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else 0.0


def test_batch_answers_equal_single_answers_query_by_query(uncached_url, test_queries):
    items = [{"query": q, "k": 10, **POLICIES[i % len(POLICIES)]} for i, q in enumerate(test_queries)]
    with Client(uncached_url, timeout_s=60) as c:
        batch = c.search_batch(items, collection="scifact")
        singles = [c.search(**item) for item in items]
        default_route = c._send(c._batch_call("scifact", c._requests(items[:3], {}), None))  # noqa: SLF001
    assert len(batch) == len(items)
    escalations = set()
    for item, b, s in zip(items, batch, singles):
        assert isinstance(b, SearchResponse), (item, b)
        assert b.ids == s.ids, item
        assert max(abs(x.score - y.score) for x, y in zip(b.results, s.results)) < 1e-6, item
        assert (b.trace.policy, b.trace.width, b.trace.escalated, b.trace.mode) == \
            (s.trace.policy, s.trace.width, s.trace.escalated, s.trace.mode), item
        escalations.add(b.trace.escalated)
        # the batch was encoded once: every dense item reports the same encode time
        assert b.trace.timings_seconds["encode"] == batch[0].trace.timings_seconds["encode"]
    assert {b.trace.policy for b in batch} >= {"exact", "fixed", "recall", "router"} and len(escalations) == 2
    # POST /v1/search/batch is the same batch on the default collection
    r = httpx.post(uncached_url + "/v1/search/batch", json={"queries": items[:3]}, timeout=60)
    assert r.status_code == 200 and [x["results"] for x in r.json()["results"]] == \
        [x["results"] for x in default_route.json()["results"]]


def test_a_bad_item_is_answered_in_its_slot_and_the_others_are_searched(uncached_url, test_queries):
    q = test_queries[0]
    body = {"queries": [{"query": q, "k": 3}, {"query": " \t "}, {"query": q, "k": 0}, {"query": q, "width": "wide"},
                        {"query": q, "colour": "red"}, {"query": "x" * 20_001}, {"query": q, "k": 2, "width": 64},
                        {"k": 3}, 7]}
    r = httpx.post(uncached_url + "/v1/collections/scifact/search/batch", json=body, timeout=60)
    assert r.status_code == 200, r.text
    slots = r.json()["results"]
    assert len(slots) == 9
    assert len(slots[0]["results"]) == 3 and len(slots[6]["results"]) == 2 and slots[6]["trace"]["width"] == 64
    got = [(s["error"]["code"], s["error"]["field"], s["status"]) for s in slots if "error" in s]
    assert got == [("blank_query", "query", 422), ("k_out_of_range", "k", 422), ("unknown_width", "width", 422),
                   ("unknown_field", "colour", 422), ("query_too_long", "query", 413),
                   ("missing_field", "query", 422), ("invalid_type", None, 422)]
    with Client(uncached_url) as c:
        out = c.search_batch([q, "   ", {"query": q, "k": 4}], k=2)
        assert isinstance(out[1], BatchItemError) and (out[1].code, out[1].status) == ("blank_query", 422)
        assert len(out[0].results) == 2 and len(out[2].results) == 4
        assert counter(c.metrics(), 'adawidth_errors_total{code="blank_query"}') >= 2


def test_the_batch_limits_and_unknown_collections(uncached_url, test_queries):
    q = test_queries[1]
    with Client(uncached_url) as c:
        with pytest.raises(ApiError) as e:
            c.search_batch([q] * (MAX_BATCH + 1), collection="scifact")
        assert (e.value.status, e.value.code) == (413, "batch_too_large")
        assert len(c.search_batch([q] * MAX_BATCH, k=1)) == MAX_BATCH
        with pytest.raises(ApiError) as e:
            c.search_batch([q], collection="nfcorpus")
        assert (e.value.status, e.value.code) == (404, "unknown_collection")
        with pytest.raises(ApiError) as e:
            c.search(q, collection="nfcorpus")
        assert (e.value.status, e.value.code) == (404, "unknown_collection")
        assert c.search(q, k=3, collection="scifact").ids == c.search(q, k=3).ids
    for body, code, field in [({"queries": []}, "empty_batch", "queries"),
                              ({"queries": [{"query": q}], "k": 1}, "unknown_field", "k"),
                              ({"query": q}, "missing_field", "queries"),  # a single body sent to the batch route
                              ({"queries": {"query": q}}, "invalid_type", "queries")]:
        r = httpx.post(uncached_url + "/v1/search/batch", json=body)
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["field"]) == (422, code, field), body
    r = httpx.post(uncached_url + "/v1/search/batch", content=b'{"queries": [' + b'{"query": "x"},' * 20_000 + b"]}")
    assert (r.status_code, r.json()["error"]["code"]) == (413, "body_too_large")


def test_get_collections(uncached_url):
    with Client(uncached_url) as c:
        ready = c.wait_ready(10)
        (info,) = c.collections()
    assert info.name == "scifact" and info.default is True
    assert info.index_version == ready["index_version"] and info.documents == ready["documents"] == 5183
    assert {"recall", "router"} <= set(info.policies) and info.default_policy == "recall"


def test_no_cache_hit_is_counted_when_the_cache_is_off(uncached_url, test_queries):
    q = test_queries[2]
    with Client(uncached_url) as c:
        a, b = c.search(q, k=10), c.search(q, k=10)
        text = c.metrics()
    assert a.ids == b.ids
    assert counter(text, "adawidth_query_cache_hits_total") == 0
    assert counter(text, "adawidth_query_cache_misses_total") == 0


def test_the_cache_serves_repeated_queries_identically_and_counts_hits(pca_home, test_queries):
    q = test_queries[3]
    with serve_home(pca_home, "scifact") as url, Client(url) as c:
        before = c.metrics()
        first = c.search(q, k=10, width="full")
        second = c.search("  " + q.replace(" ", "\n ", 1) + " ", k=10, width="full")  # the same text, normalised
        mid = c.metrics()
        batch = c.search_batch([q, test_queries[4], test_queries[4]], k=10, width="full")
        after = c.metrics()
    assert first.ids == second.ids and [h.score for h in first.results] == [h.score for h in second.results]
    assert [h.score for h in batch[0].results] == [h.score for h in first.results]
    hits = [counter(t, "adawidth_query_cache_hits_total") for t in (before, mid, after)]
    misses = [counter(t, "adawidth_query_cache_misses_total") for t in (before, mid, after)]
    assert hits[1] - hits[0] == 1 and misses[1] - misses[0] == 1
    assert hits[2] - hits[1] == 1 and misses[2] - misses[1] == 2  # q hit; the new text missed twice, encoded once
