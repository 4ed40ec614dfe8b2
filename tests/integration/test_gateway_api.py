"""The HTTP contract of POST /v1/search on a real SciFact index: answers, traces, and a 4xx for bad input."""

import fcntl
import json
import os
import shutil
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from engine.wal import FileWriteLog
from engine.write_logs import wal_directory
from service.app import create_app
from service.config import GatewaySettings

pytestmark = pytest.mark.integration

Q = "Vitamin D deficiency is associated with multiple sclerosis."


def post(client, body, **kw):
    return client.post("/v1/search", content=body if isinstance(body, (bytes, str)) else json.dumps(body), **kw)


def test_the_width_router_returns_ranked_results_and_trace(app_client):
    r = post(app_client, {"query": Q, "k": 10, "policy": "router"})
    assert r.status_code == 200
    data = r.json()
    scores = [h["score"] for h in data["results"]]
    ids = [h["id"] for h in data["results"]]
    assert len(ids) == 10 and len(set(ids)) == 10 and scores == sorted(scores, reverse=True)
    t = data["trace"]
    assert t["width"] in (64, 128) and isinstance(t["escalated"], bool) and isinstance(t["router_score"], float)
    assert t["index_version"] and t["coordinates_scored"] >= 5183 * 64
    # the work splits into a flat stage-1 scan and the shortlist's rescoring
    assert t["stage1_work"] == 5183 * 64
    assert t["rescoring_work"] == 500 * (t["width"] - 64)
    assert t["coordinates_scored"] == t["stage1_work"] + t["rescoring_work"]
    assert {"encode", "rotate", "stage1", "route", "rescore", "total"} <= set(t["timings_seconds"])


@pytest.mark.parametrize("width", [16, 64, 100, 384, "full"])
def test_fixed_widths(app_client, width):
    r = post(app_client, {"query": Q, "k": 5, "width": width})
    assert r.status_code == 200
    t = r.json()["trace"]
    assert t["width"] == (384 if width == "full" else width) and t["escalated"] is False and t["router_score"] is None


def test_rho_extremes_force_the_router_decision(app_client):
    hi = post(app_client, {"query": Q, "width": "auto", "policy": "router", "rho": 1.0}).json()["trace"]
    lo = post(app_client, {"query": Q, "width": "auto", "policy": "router", "rho": 0.0}).json()["trace"]
    assert (hi["escalated"], hi["width"]) == (True, 128)
    assert (lo["escalated"], lo["width"]) == (False, 64)


def test_k_beyond_shortlist_grows_it(app_client):
    r = post(app_client, {"query": Q, "k": 1000, "width": 128})
    assert r.status_code == 200 and len(r.json()["results"]) == 1000


@pytest.mark.parametrize("body,status,code", [
    ({"query": ""}, 422, "blank_query"),
    ({"query": " \t\n "}, 422, "blank_query"),
    ({"query": Q, "k": 0}, 422, "k_out_of_range"),
    ({"query": Q, "k": -3}, 422, "k_out_of_range"),
    ({"query": Q, "k": 1001}, 422, "k_out_of_range"),
    ({"query": Q, "k": 2 ** 63}, 422, "k_out_of_range"),
    ({"query": Q, "k": 1.5}, 422, "invalid_type"),
    ({"query": Q, "k": "10"}, 422, "invalid_type"),
    ({"query": Q, "k": True}, 422, "invalid_type"),
    ({"query": Q, "width": "wide"}, 422, "unknown_width"),
    ({"query": Q, "width": 0}, 422, "width_out_of_range"),
    ({"query": Q, "width": 385}, 422, "width_out_of_range"),
    ({"query": Q, "width": 2.5}, 422, "unknown_width"),
    ({"query": Q, "policy": "router", "rho": 1.5}, 422, "rho_out_of_range"),
    ({"query": Q, "width": 64, "rho": 0.5}, 422, "policy_conflict"),
    ({"query": Q, "policy": "router", "recall_target": 0.9}, 422, "policy_conflict"),
    ({"query": Q, "policy": "everything"}, 422, "unknown_policy"),
    ({"query": Q, "recall_target": "high"}, 422, "recall_target_out_of_range"),
    ({"query": Q, "colour": "red"}, 422, "unknown_field"),
    ({"k": 3}, 422, "missing_field"),
    ({"query": 42}, 422, "invalid_type"),
    (b'{"query": "x", ', 400, "invalid_json"),
    (b"\xff\xfe{not utf8}", 400, "invalid_utf8"),
    (b'{"query": "caf\xe9"}', 400, "invalid_utf8"),
    (b"[1, 2, 3]", 422, "invalid_type"),
    (b"", 400, "invalid_json"),
    (b'{"query": "x", "k": 3, "k": 50}', 422, "duplicate_field"),
    (b'{"query": "x", "filter": {"lang": "en", "lang": "de"}}', 422, "duplicate_field"),
])
def test_bad_input_gets_4xx_with_code(app_client, body, status, code):
    r = post(app_client, body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]


def test_oversized_body_and_wrong_media_type(app_client):
    big = json.dumps({"query": "x" * 300_000})
    r = post(app_client, big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = post(app_client, {"query": "y" * 30_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "query_too_long"
    r = post(app_client, "query=x", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_unicode_and_control_characters_are_answered(app_client):
    for q in ["emoji 🧬🧪 protein", "nul \x00 byte", "\u202etext", "caf\u00e9 " * 400]:
        assert post(app_client, {"query": q, "k": 3}).status_code == 200


def test_unknown_path_and_method(app_client):
    r = app_client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = app_client.get("/v1/search")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_health_ready_and_metrics(app_client):
    assert app_client.get("/healthz").json() == {"status": "ok"}
    ready = app_client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["documents"] == 5183
    assert ready["collections"]["scifact"]["degraded"] == []
    rerank = ready["tiers"]["rerank"]
    assert set(rerank) == {"maxsim", "cross_encoder"}
    assert all(e["available"] == (e["reason"] is None) for e in rerank.values())
    assert not any("max_concurrent_reranks" in (e["reason"] or "") for e in rerank.values())  # reranking is on
    def counter(name: str) -> float:
        lines = [x for x in app_client.get("/metrics").text.splitlines() if x.startswith(name + " ")]
        return float(lines[0].split()[1])

    routed, escalated = counter("adawidth_routed_queries_total"), counter("adawidth_escalations_total")
    # a client's own rho is not the version's: the escalation-drift ratio counts neither
    assert post(app_client, {"query": Q, "width": "auto", "policy": "router", "rho": 1.0}).json()["trace"]["escalated"]
    assert (counter("adawidth_routed_queries_total"), counter("adawidth_escalations_total")) == (routed, escalated)
    trace = post(app_client, {"query": Q, "width": "auto", "policy": "router"}).json()["trace"]  # the default rho
    assert counter("adawidth_routed_queries_total") == routed + 1
    assert counter("adawidth_escalations_total") == escalated + int(trace["escalated"])
    text = app_client.get("/metrics").text
    for series in ("adawidth_search_stage_duration_seconds_bucket", "adawidth_search_width_coordinates_bucket",
                   "adawidth_search_scan_share_ratio_bucket", "adawidth_http_requests_total",
                   "adawidth_live_version_info"):
        assert series in text


def test_readiness_says_reranking_is_off_and_each_collection_lists_its_log_reasons(scifact_home, make_gateway,
                                                                                    tmp_path):
    """max_concurrent_reranks = 0: ``tiers.rerank`` shows both reranking tiers unavailable, naming the setting.
    A file write-ahead log held by another process (the writer): the collection's own ``degraded`` lists the
    reason the top-level ``degraded`` gives for it."""
    home = tmp_path / "home"
    shutil.copytree(scifact_home, home, symlinks=True, ignore=shutil.ignore_patterns("wal", "gateway-*.log"))
    writer = FileWriteLog(wal_directory(home / "indexes", "scifact"))  # its own open file: flock conflicts
    try:
        with make_gateway(home=home, max_concurrent_reranks=0, redis_url=None) as (client, _):
            r = client.get("/readyz")
    finally:
        writer.close()
    body = r.json()
    assert r.status_code == 200 and body["status"] == "degraded", body
    assert set(body["tiers"]["rerank"]) == {"maxsim", "cross_encoder"}
    for entry in body["tiers"]["rerank"].values():
        assert entry["available"] is False and "max_concurrent_reranks = 0" in entry["reason"], entry
    own = body["collections"]["scifact"]["degraded"]
    assert len(own) == 1 and "write-ahead log not open" in own[0] and "WalLocked" in own[0], own
    assert body["degraded"] == [f"collection 'scifact': {own[0]}"]


def test_unready_gateway_answers_503(tmp_path, encoder_dir):
    app = create_app(GatewaySettings(home=tmp_path, collection="nothing", encoder_dir=encoder_dir), CollectorRegistry())
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503 and "no live version" in r.json()["reason"]
        r = post(client, {"query": Q})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"


def test_a_gateway_of_a_missing_collection_takes_no_write_ahead_log_lock(tmp_path, encoder_dir):
    """ADAWIDTH_COLLECTION=nope (no such collection in the home): the gateway stays unready and neither creates nor
    holds ``<index_root>/nope/wal/LOCK``, while running or after it stops (a gateway of that collection, once
    built, would otherwise find its log locked)."""
    app = create_app(GatewaySettings(home=tmp_path, collection="nope", encoder_dir=encoder_dir, redis_url=None,
                                     wal_takeover_interval_s=0.05), CollectorRegistry())
    wal = tmp_path / "indexes" / "nope" / "wal"
    with TestClient(app) as client:
        r = client.get("/readyz")
        assert r.status_code == 503 and "no live version" in r.json()["reason"]
        time.sleep(0.5)                              # ten of the takeover's tries: none takes the lock
        assert not wal.exists()
        assert "NoCollection" in app.state.gw.live_docs.closed_reason("nope")  # its writes are refused
        # once a version of the collection is built, the takeover opens its log
        (tmp_path / "indexes" / "nope" / "v1").mkdir(parents=True)
        (tmp_path / "indexes" / "nope" / "v1" / "manifest.json").write_text("{}")
        deadline = time.monotonic() + 10
        while app.state.gw.live_docs.closed_reason("nope") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.gw.live_docs.closed_reason("nope") is None and (wal / "LOCK").exists()
    fd = os.open(wal / "LOCK", os.O_RDWR)            # given back when the gateway stopped
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
