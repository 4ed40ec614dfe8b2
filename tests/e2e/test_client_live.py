"""The Python client against the real gateway process serving the session's SciFact index."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from engine.io.beir import load_collection
from adawidth_client import NO_RETRY, ApiError, AsyncClient, Client
from tests.client_contract import openapi_mismatches

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def queries():
    from tests.conftest import SCIFACT

    judged = load_collection(SCIFACT, "test").judged_queries()
    return [judged[q] for q in sorted(judged)[:12]]


def test_models_match_the_live_openapi_document(gateway_url):
    doc = httpx.get(f"{gateway_url}/openapi.json", timeout=10).json()
    assert openapi_mismatches(doc) == []


def test_client_answers_equal_raw_http_answers(gateway_url, queries):
    with Client(gateway_url) as c, httpx.Client(base_url=gateway_url, timeout=30) as raw:
        ready = c.wait_ready(30)
        assert ready["collection"] == "scifact" and ready["documents"] == 5183
        for text in queries[:6]:
            for width in ("auto", 128, "full"):
                got = c.search(text, k=20, width=width)
                want = raw.post("/v1/search", json={"query": text, "k": 20, "width": width}).json()
                assert got.ids == [h["id"] for h in want["results"]]
                assert [h.score for h in got.results] == pytest.approx([h["score"] for h in want["results"]], abs=1e-6)
                assert got.trace.index_version == ready["index_version"] and got.trace.extra == {}
        rho = c.search(queries[0], k=5, width="auto", policy="router", rho=0.3)
        assert rho.trace.policy == "router" and len(rho.results) == 5
        assert c.health() == {"status": "ok"} and "adawidth_" in c.metrics()


def test_errors_are_typed_and_not_retried(gateway_url):
    with Client(gateway_url) as c:
        for kwargs, status, code, field in [({"k": 0}, 422, "k_out_of_range", "k"),
                                            ({"width": 385}, 422, "width_out_of_range", "width"),
                                            ({"limit": 3}, 422, "unknown_field", None)]:
            with pytest.raises(ApiError) as e:
                c.search("statins", **kwargs)
            assert (e.value.status, e.value.code, e.value.attempts) == (status, code, 1)
            if field:
                assert e.value.field == field
        with pytest.raises(ApiError) as e:
            c.search("   ")
        assert e.value.code == "blank_query"
        with pytest.raises(ApiError) as e:  # no admin key configured on this gateway
            c.reload()
        assert (e.value.status, e.value.code) == (403, "admin_disabled")


def test_async_client_concurrent_answers_equal_sync(gateway_url, queries):
    with Client(gateway_url, retry=NO_RETRY) as c:
        want = [c.search(q, k=10).ids for q in queries]

    async def go():
        async with AsyncClient(gateway_url) as ac:
            await ac.wait_ready(30)
            return await asyncio.gather(*(ac.search(q, k=10) for q in queries))

    got = asyncio.run(go())
    assert [r.ids for r in got] == want
