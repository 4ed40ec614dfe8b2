"""The Python client against a scripted fake gateway over real HTTP (a threaded ``http.server`` on loopback).

Sleeps are measured through the injected ``sleep`` (and ``clock``), not wall time: the fake answers 429
twice with ``Retry-After`` and the client must wait exactly what it was told (stretched by its jitter,
never shortened), retry, and return; give up at its bounds; never retry other 4xx.  Async the same.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from adawidth_client import (ApiError, AsyncClient, BatchItemError, Client, ClientError, ErrorDetail, NotReadyError,
                             RetryPolicy, SearchRequest, SearchResponse, ServerExited, TransportError)
from adawidth_client.errors import retry_after_seconds

HIT = {"results": [{"id": "d1", "score": 0.9}, {"id": "d2", "score": 0.5}],
       "trace": {"width": 64, "escalated": False, "router_score": -0.01, "index_version": "v1",
                 "coordinates_scored": 331712, "timings_seconds": {"total": 0.004}, "policy": "router",
                 "future_field": 7}}
OVERLOADED = (429, {"Retry-After": "2"}, {"error": {"code": "overloaded", "message": "busy", "field": None}})


class FakeGateway:
    """Answers each path from a script: a list of (status, headers, JSON body) consumed in order, the last
    one repeating.  Records every request as (method, path, headers, parsed body)."""

    def __init__(self, script: dict[str, list]):
        self.script = {path: list(answers) for path, answers in script.items()}
        self.requests: list[tuple[str, str, dict, object]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, dict(self.headers), json.loads(raw) if raw else None))
                answers = fake.script.get(self.path) or [(404, {}, {"error": {"code": "not_found", "message": "no",
                                                                              "field": None}})]
                status, headers, body = answers.pop(0) if len(answers) > 1 else answers[0]
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def paths(self) -> list[str]:
        return [p for _, p, _, _ in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def fake():
    servers = []

    def make(script):
        servers.append(FakeGateway(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


class Sleeps(list):
    """An injected sleep that records instead of sleeping (sync and async)."""

    def __call__(self, seconds):
        self.append(seconds)

    async def async_sleep(self, seconds):
        self.append(seconds)


def expected_waits(retry_after: float, n: int, jitter: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [retry_after * (1 + jitter * rng.random()) for _ in range(n)]


# ------------------------------------------------------------------------------------------ retries (sync)

def test_429_twice_then_200_waits_as_told_and_returns(fake):
    gw = fake({"/v1/search": [OVERLOADED, OVERLOADED, (200, {}, HIT)]})
    sleeps = Sleeps()
    with Client(gw.url, sleep=sleeps, rng=random.Random(7), retry=RetryPolicy(jitter=0.2)) as c:
        res = c.search("statins", k=2, width="auto", rho=0.2)
    assert isinstance(res, SearchResponse) and res.ids == ["d1", "d2"] and res.trace.width == 64
    assert res.trace.extra == {"future_field": 7}  # a trace field this client does not know yet is kept
    assert gw.paths() == ["/v1/search"] * 3
    assert all(body == {"query": "statins", "k": 2, "width": "auto", "rho": 0.2} for *_, body in gw.requests)
    assert sleeps == pytest.approx(expected_waits(2.0, 2, 0.2, 7), abs=1e-12)
    assert all(2.0 <= s <= 2.4 for s in sleeps)  # never shorter than Retry-After, jitter bounded


def test_gives_up_after_max_attempts_with_the_servers_error(fake):
    gw = fake({"/v1/search": [OVERLOADED]})
    sleeps = Sleeps()
    with Client(gw.url, sleep=sleeps, retry=RetryPolicy(max_attempts=3, jitter=0.0)) as c:
        with pytest.raises(ApiError) as e:
            c.search("q")
    err = e.value
    assert (err.status, err.code, err.message, err.field, err.attempts) == (429, "overloaded", "busy", None, 3)
    assert err.retry_after_s == 2.0 and sleeps == [2.0, 2.0] and len(gw.requests) == 3


def test_gives_up_when_the_next_wait_would_pass_the_total_bound(fake):
    gw = fake({"/v1/search": [OVERLOADED]})
    sleeps = Sleeps()
    with Client(gw.url, sleep=sleeps, retry=RetryPolicy(max_attempts=100, max_total_wait_s=5.0, jitter=0.0)) as c:
        with pytest.raises(ApiError) as e:
            c.search("q")
    assert sleeps == [2.0, 2.0] and e.value.attempts == 3  # a third wait would make 6 s > 5 s


def test_no_retry_on_other_4xx(fake):
    for status, code, field in [(422, "k_out_of_range", "k"), (400, "invalid_json", None), (401, "missing_api_key", None),
                                (404, "unknown_collection", None), (409, "tier_unavailable", "tier"),
                                (413, "body_too_large", None)]:
        gw = fake({"/v1/search": [(status, {"Retry-After": "1"}, {"error": {"code": code, "message": "m",
                                                                            "field": field}})]})
        sleeps = Sleeps()
        with Client(gw.url, sleep=sleeps) as c, pytest.raises(ApiError) as e:
            c.search("q", k=0)
        assert (e.value.status, e.value.code, e.value.field, e.value.attempts) == (status, code, field, 1)
        assert sleeps == [] and len(gw.requests) == 1


def test_503_without_retry_after_backs_off_exponentially(fake):
    gw = fake({"/v1/search": [(503, {}, {"error": {"code": "not_ready", "message": "m", "field": None}})] * 2
               + [(200, {}, HIT)]})
    sleeps = Sleeps()
    with Client(gw.url, sleep=sleeps, retry=RetryPolicy(backoff_s=0.2, jitter=0.0)) as c:
        assert c.search("q").ids == ["d1", "d2"]
    assert sleeps == [0.2, 0.4]


def test_a_non_json_error_page_still_raises_a_typed_error(fake):
    gw = fake({"/v1/search": [(502, {}, b"<html>bad gateway</html>")]})
    with Client(gw.url, sleep=Sleeps()) as c, pytest.raises(ApiError) as e:
        c.search("q")
    assert e.value.status == 502 and e.value.code == "http_502" and "bad gateway" in e.value.message


def test_no_answer_is_retried_for_searches_but_not_for_admin_writes():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    sleeps = Sleeps()
    with Client(url, sleep=sleeps, retry=RetryPolicy(max_attempts=3, backoff_s=0.1, jitter=0.0)) as c:
        with pytest.raises(TransportError) as e:
            c.search("q")
        assert e.value.attempts == 3 and sleeps == [0.1, 0.2]
        sleeps.clear()
        with pytest.raises(TransportError) as e:
            c.promote("v2")
        assert e.value.attempts == 1 and sleeps == []


def test_retry_after_forms():
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds("0.5") == 0.5
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    assert retry_after_seconds("-4") == 0.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: retry now


# ------------------------------------------------------------------------------------------ retries (async)

def test_async_429_twice_then_200(fake):
    gw = fake({"/v1/search": [OVERLOADED, OVERLOADED, (200, {}, HIT)]})
    sleeps = Sleeps()

    async def go():
        async with AsyncClient(gw.url, sleep=sleeps.async_sleep, rng=random.Random(3)) as c:
            return await c.search("statins", k=2)

    res = asyncio.run(go())
    assert res.ids == ["d1", "d2"] and len(gw.requests) == 3
    assert sleeps == pytest.approx(expected_waits(2.0, 2, 0.2, 3), abs=1e-12)


def test_async_gives_up_and_does_not_retry_4xx(fake):
    gw = fake({"/v1/search": [OVERLOADED]})
    bad = fake({"/v1/search": [(422, {}, {"error": {"code": "blank_query", "message": "m", "field": "query"}})]})
    sleeps = Sleeps()

    async def go(url, retry):
        async with AsyncClient(url, sleep=sleeps.async_sleep, retry=retry) as c:
            return await c.search(" ")

    with pytest.raises(ApiError) as e:
        asyncio.run(go(gw.url, RetryPolicy(max_attempts=2, jitter=0.0)))
    assert e.value.code == "overloaded" and e.value.attempts == 2 and sleeps == [2.0]
    sleeps.clear()
    with pytest.raises(ApiError) as e:
        asyncio.run(go(bad.url, RetryPolicy()))
    assert (e.value.status, e.value.code, e.value.field) == (422, "blank_query", "query") and sleeps == []


def test_a_field_json_cannot_carry_raises_a_client_error_naming_it_and_sends_nothing(fake):
    gw = fake({"/v1/collections/c/search": [(200, {}, HIT)], "/v1/collections/c/search/batch": [(200, {}, BATCH)]})
    with Client(gw.url, collection="c") as c:
        for fields, name in (({"rho": float("nan")}, "rho"), ({"alpha": float("inf")}, "alpha"),
                             ({"vector": [0.5, float("nan")]}, "vector[1]"),
                             ({"filter": {"team": float("-inf")}}, "filter.team")):
            with pytest.raises(ClientError, match=re.escape(repr(name))) as e:
                c.search("q", policy="router", **fields)
            assert not isinstance(e.value, ApiError)
        with pytest.raises(ClientError, match="surrogate"):
            c.search("\ud800 broken")                  # UTF-8 cannot carry it: no UnicodeEncodeError
        with pytest.raises(ClientError, match="bytes"):
            c.search(b"vitamin")                       # no TypeError from json
        with pytest.raises(ClientError, match=re.escape("'queries[1].recall_target'")):
            c.search_batch(["a", {"query": "b", "recall_target": float("nan")}])
        assert c.search("q", rho=0.5).ids == ["d1", "d2"]  # a finite value still goes out
        with pytest.raises(ClientError, match=re.escape("'rho'")):
            c.search("q", policy="router", rho=np.float32("nan"))  # a numpy NaN too
        assert c.search("q", k=np.int64(3), rho=np.float32(0.5)).ids == ["d1", "d2"]  # numpy numbers go out
        body = gw.requests[-1][3]
        assert body["k"] == 3 and body["rho"] == 0.5

    async def go():
        async with AsyncClient(gw.url, collection="c") as c:
            await c.search("q", rho=float("nan"))

    with pytest.raises(ClientError, match="'rho'"):
        asyncio.run(go())
    assert gw.paths() == ["/v1/collections/c/search"] * 2  # the two finite searches only


# ------------------------------------------------------------------------------------------ batch, collections

BATCH = {"results": [HIT, {"error": {"code": "blank_query", "message": "query must contain a visible character",
                                     "field": "query"}, "status": 422}, HIT]}


def test_batch_sends_the_documented_shape_and_keeps_slots_in_order(fake):
    gw = fake({"/readyz": [(200, {}, {"status": "ready", "collection": "scifact"})],
               "/v1/collections/scifact/search/batch": [OVERLOADED, (200, {}, BATCH)],
               "/v1/collections/nf%20corpus/search/batch": [(200, {}, BATCH)]})
    sleeps = Sleeps()
    with Client(gw.url, sleep=sleeps) as c:
        out = c.search_batch(["a", " ", SearchRequest("c", k=3, width=128)], k=5, width="auto")
        assert gw.requests[-1][3] == {"queries": [{"query": "a", "k": 5, "width": "auto"},
                                                  {"query": " ", "k": 5, "width": "auto"},
                                                  {"query": "c", "k": 3, "width": 128}]}
        assert isinstance(out[0], SearchResponse) and isinstance(out[2], SearchResponse)
        assert out[1] == BatchItemError(ErrorDetail("blank_query", "query must contain a visible character", "query"),
                                        422)
        assert (out[1].code, out[1].field, out[1].status) == ("blank_query", "query", 422)
        assert len(sleeps) == 1  # the batch as a whole was retried once after its 429
        c.search_batch(["x", "y", "z"], collection="nf corpus")
    assert gw.paths() == ["/readyz", "/v1/collections/scifact/search/batch", "/v1/collections/scifact/search/batch",
                          "/v1/collections/nf%20corpus/search/batch"]


def test_batch_with_a_wrong_slot_count_is_malformed(fake):
    from adawidth_client import MalformedResponse

    gw = fake({"/v1/collections/c/search/batch": [(200, {}, BATCH)]})
    with Client(gw.url, collection="c") as c, pytest.raises(MalformedResponse):
        c.search_batch(["only one"])


def test_async_batch_and_collections(fake):
    gw = fake({"/v1/collections/c/search/batch": [(200, {}, BATCH)],
               "/v1/collections": [(200, {}, {"collections": [
                   {"name": "c", "index_version": "v1", "documents": 5183, "policies": ["auto", "full"], "memory": 1}]})],
               "/v1/collections/c/search": [(200, {}, HIT)]})

    async def go():
        async with AsyncClient(gw.url, collection="c") as c:
            return await c.search_batch(["a", "", "b"]), await c.collections(), await c.search("q")

    batch, cols, one = asyncio.run(go())
    assert [type(x).__name__ for x in batch] == ["SearchResponse", "BatchItemError", "SearchResponse"]
    assert cols[0].name == "c" and cols[0].documents == 5183 and cols[0].policies == ["auto", "full"]
    assert cols[0].extra == {"memory": 1} and one.ids == ["d1", "d2"]
    assert gw.paths()[-1] == "/v1/collections/c/search"


# ------------------------------------------------------------------------------------------ readiness, admin

class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_wait_ready_polls_until_200(fake):
    gw = fake({"/readyz": [(503, {}, {"status": "not_ready"})] * 2 + [(200, {}, {"status": "ready", "documents": 3})]})
    clock, sleeps = FakeClock(), Sleeps()

    def sleep(s):
        sleeps.append(s)
        clock.now += s

    with Client(gw.url, sleep=sleep, clock=clock) as c:
        assert c.wait_ready(10, poll_s=0.5)["documents"] == 3
    assert sleeps == [0.5, 0.5] and len(gw.requests) == 3


def test_wait_ready_times_out_and_stops_when_the_server_is_gone(fake):
    gw = fake({"/readyz": [(503, {}, {"status": "not_ready", "reason": "no live version"})]})
    clock = FakeClock()

    def sleep(s):
        clock.now += s

    with Client(gw.url, sleep=sleep, clock=clock) as c:
        with pytest.raises(NotReadyError, match="no live version") as e:
            c.wait_ready(3, poll_s=1)
        assert isinstance(e.value, TimeoutError) and len(gw.requests) == 4
        polls = iter([True, False])
        with pytest.raises(ServerExited):
            c.wait_ready(60, alive=lambda: next(polls))

    def advancing():
        clock.now += 1
        return clock.now

    with pytest.raises(NotReadyError):
        asyncio.run(AsyncClient(gw.url, clock=advancing, sleep=lambda s: asyncio.sleep(0)).wait_ready(2))


def test_admin_calls_send_the_admin_key_and_parse(fake):
    gw = fake({"/admin/reload": [(200, {}, {"status": "reloaded", "index_version": "v2", "previous_version": "v1"})],
               "/admin/promote": [(409, {}, {"error": {"code": "gate_refused", "message": "worse", "field": None}})],
               "/admin/rollback": [(200, {}, {"state": {"live": "v1"}})],
               "/admin/registry": [(200, {}, {"kind": "file", "state": {"live": "v1"}, "history": [], "replicas": {}})],
               "/v1/search": [(200, {}, HIT)]})
    with Client(gw.url, api_key="search-key-0123456789", admin_key="admin-key-0123456789") as c:
        r = c.reload()
        assert (r.status, r.index_version, r.previous_version) == ("reloaded", "v2", "v1")
        with pytest.raises(ApiError) as e:
            c.promote("v2")
        assert e.value.code == "gate_refused" and e.value.attempts == 1
        assert c.rollback("bad")["state"]["live"] == "v1" and c.status()["kind"] == "file"
        c.search("q")
    auth = {p: h.get("Authorization") for _, p, h, _ in gw.requests}
    assert auth["/admin/reload"] == "Bearer admin-key-0123456789"
    assert auth["/v1/search"] == "Bearer search-key-0123456789"
    bodies = {p: b for _, p, _, b in gw.requests}
    assert bodies["/admin/promote"] == {"version": "v2", "skip_gate": False} and bodies["/admin/rollback"] == {"reason": "bad"}


def test_request_model_sends_only_what_is_set():
    assert SearchRequest("q").to_json() == {"query": "q"}
    r = SearchRequest.build("q", k=3, width=None, mode="hybrid", future_field=0.95)
    assert r.to_json() == {"query": "q", "k": 3, "mode": "hybrid", "future_field": 0.95}
    assert r.extra == {"future_field": 0.95}


def test_models_match_the_gateways_openapi_document(tmp_path):
    """The app's own document (no index loaded); the live document is checked in test_client_live.py."""
    from service.app import create_app
    from service.config import GatewaySettings
    from tests.client_contract import model_mismatches, openapi_mismatches

    doc = create_app(GatewaySettings(home=tmp_path, collection="scifact", redis_url=None), load=False).openapi()
    assert openapi_mismatches(doc) == []
    # the check can fail: a field the client lacks, a wrong type, an enum value too many
    from dataclasses import make_dataclass

    from adawidth_client.models import Hit

    comps = doc["components"]["schemas"]
    Narrow = make_dataclass("Hit", [("id", int)])
    assert model_mismatches(Narrow, comps["Hit"], comps) == [
        "Hit: the gateway has field 'score', the client does not",
        "Hit.id: JSON types ['integer'] in the client, ['string'] in the gateway"]
    assert model_mismatches(Hit, comps["Hit"], comps) == []
