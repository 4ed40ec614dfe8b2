"""Overload: bounded concurrency and queue (429 + Retry-After), the per-request deadline (503), no hang.

Deterministic: a gated encoder holds a search inside the worker until the test
opens the gate, so "busy" and "past the deadline" do not depend on how fast
the machine is.  The only clock is the deadline itself, which a gated request
always passes.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

import engine.pipeline

from tests.integration.conftest import GatedEncoder, post, wait_until

pytestmark = pytest.mark.integration

Q = "Vitamin D deficiency is associated with multiple sclerosis."


def gate(state) -> GatedEncoder:
    state.encoder = GatedEncoder(state.encoder)
    return state.encoder


def series_value(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_full_queue_answers_429_with_retry_after_then_recovers(make_gateway):
    with make_gateway(max_concurrent_searches=1, max_queued_searches=1, search_deadline_s=300,
                      retry_after_s=3) as (client, state):
        enc = gate(state)
        with ThreadPoolExecutor(2) as pool:
            try:
                running = pool.submit(post, client, {"query": Q})
                assert enc.entered.wait(60)
                queued = pool.submit(post, client, {"query": Q, "k": 3})
                wait_until(lambda: state.limiter.admitted == 2)
                assert (state.limiter.running, state.limiter.queued) == (1, 1)
                text = client.get("/metrics").text
                assert series_value(text, "adawidth_search_running_requests") == 1
                assert series_value(text, "adawidth_search_queued_requests") == 1
                for _ in range(3):
                    r = post(client, {"query": Q})
                    assert r.status_code == 429, r.text
                    assert r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"] == "3"
            finally:
                enc.release.set()
            assert running.result(timeout=120).status_code == 200
            r = queued.result(timeout=120)
            assert r.status_code == 200 and len(r.json()["results"]) == 3
        wait_until(lambda: state.limiter.admitted == 0)
        assert post(client, {"query": Q}).status_code == 200  # capacity is back
        assert enc.calls == 3
        errors = [line for line in client.get("/metrics").text.splitlines()
                  if line.startswith('adawidth_errors_total{code="overloaded"}')]
        assert float(errors[0].split()[-1]) == 3


def test_no_queue_means_busy_is_refused_at_once(make_gateway):
    with make_gateway(max_concurrent_searches=1, max_queued_searches=0, search_deadline_s=300) as (client, state):
        enc = gate(state)
        with ThreadPoolExecutor(1) as pool:
            try:
                running = pool.submit(post, client, {"query": Q})
                assert enc.entered.wait(60)
                r = post(client, {"query": Q})
                assert r.status_code == 429 and r.headers["retry-after"] == "1"
            finally:
                enc.release.set()
            assert running.result(timeout=120).status_code == 200


def test_deadline_answers_503_and_stuck_work_keeps_its_slot(make_gateway, monkeypatch):
    with make_gateway(max_concurrent_searches=1, max_queued_searches=4, search_deadline_s=0.3) as (client, state):
        enc = gate(state)
        searched = []
        inner_stage1 = engine.pipeline.stage1  # the pipeline's stage-1 stage: every dense policy starts there
        monkeypatch.setattr(engine.pipeline, "stage1", lambda *a, **kw: searched.append(1) or inner_stage1(*a, **kw))
        try:
            r = post(client, {"query": Q})  # held in the encoder past its deadline
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "deadline_exceeded"
            # the abandoned work still occupies the only worker: load stays bounded
            assert state.limiter.running == 1 and state.limiter.admitted == 1
            r = post(client, {"query": Q})  # waits in the queue behind it, past its own deadline
            assert r.status_code == 503 and r.json()["error"]["code"] == "deadline_exceeded"
        finally:
            enc.release.set()
        wait_until(lambda: state.limiter.admitted == 0)
        # the first finished encoding after its deadline and stopped before stage 1;
        # the second started after its deadline and did nothing
        assert enc.calls == 1 and searched == []


def test_k_beyond_the_cap_is_refused_before_any_work(make_gateway):
    with make_gateway(k_max=50) as (client, state):
        enc = gate(state)
        enc.release.set()
        for k in ("51", "1000000", str(2 ** 63), "9" * 5000):  # 5000 digits: past Python's int() limit
            r = post(client, '{"query": "%s", "k": %s}' % (Q, k))
            assert r.status_code == 422 and r.json()["error"]["code"] == "k_out_of_range"
        assert enc.calls == 0 and state.limiter.admitted == 0
        r = post(client, {"query": Q, "k": 50})
        assert r.status_code == 200 and len(r.json()["results"]) == 50 and enc.calls == 1


def test_reranking_tiers_have_their_own_workers_and_queue(make_gateway):
    """A request for tier 'maxsim' takes a rerank slot, not an ordinary one: with the rerank worker busy a second
    one is refused with 429 while an ordinary search is still admitted, and both finish once the gate opens."""
    with make_gateway(max_concurrent_searches=1, max_queued_searches=0, max_concurrent_reranks=1,
                      max_queued_reranks=0, search_deadline_s=300) as (client, state):
        enc = gate(state)
        with ThreadPoolExecutor(2) as pool:
            try:
                rerank = pool.submit(post, client, {"query": Q, "tier": "maxsim"})
                assert enc.entered.wait(60)
                wait_until(lambda: state.rerank_limiter.admitted == 1)
                assert state.limiter.admitted == 0
                r = post(client, {"query": Q, "tier": "maxsim"})
                assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded", r.text
                ordinary = pool.submit(post, client, {"query": Q})
                wait_until(lambda: state.limiter.admitted == 1)
            finally:
                enc.release.set()
            r = rerank.result(timeout=120)
            assert r.status_code == 200 and r.json()["trace"]["tier"] == "maxsim", r.text
            r = ordinary.result(timeout=120)
            assert r.status_code == 200 and r.json()["trace"]["tier"] == "mips", r.text


def test_no_rerank_workers_turns_the_reranking_tiers_off(make_gateway):
    with make_gateway(max_concurrent_reranks=0) as (client, state):
        for tier in ("maxsim", "cross_encoder"):
            r = post(client, {"query": Q, "tier": tier})
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "tier_unavailable" and r.json()["error"]["field"] == "tier"
        assert post(client, {"query": Q}).status_code == 200
