"""Admin authentication, POST /admin/reload (atomic swap of the live version), optional search key,
and bounded metric series under 10,000 requests to random paths."""

import asyncio
import hmac
import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from engine.registry.file import FileRegistry
from engine.version import store
from engine.version.manifest import read_manifest
from service.app import create_app
from service.config import GatewaySettings
from tests.integration.conftest import STRONG_ADMIN_KEY, STRONG_SEARCH_KEY, GatedEncoder, post

pytestmark = pytest.mark.integration

Q = "Vitamin D deficiency is associated with multiple sclerosis."
ADMIN = {"authorization": f"Bearer {STRONG_ADMIN_KEY}"}


def bearer(key):
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


# ---------------------------------------------------------------- authentication

def test_admin_is_disabled_without_a_key(app_client):
    for headers in ({}, ADMIN, {"authorization": "Bearer "}):
        r = app_client.post("/admin/reload", headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"


def test_admin_requires_the_key_compared_in_constant_time(make_gateway, monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr("service.auth.hmac.compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    with make_gateway(admin_api_key=STRONG_ADMIN_KEY) as (client, state):
        r = client.post("/admin/reload")
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        assert r.headers["www-authenticate"].startswith("Bearer")
        for wrong in (STRONG_ADMIN_KEY[:-1], STRONG_ADMIN_KEY + "x", "Basic " + STRONG_ADMIN_KEY, "ключ-не-тот"):
            r = client.post("/admin/reload", headers={"authorization": f"Bearer {wrong}".encode()})  # raw bytes
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", wrong
        assert len(compared) == 4 and all(len(a) == len(b) == 32 for a, b in compared)  # digests, not raw keys
        r = client.post("/admin/reload", headers={"authorization": f"Basic {STRONG_ADMIN_KEY}"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and r.json()["status"] == "unchanged"
        assert post(client, {"query": Q}).status_code == 200  # search stays open without a search key


def test_a_bad_admin_body_names_the_field_at_fault(make_gateway):
    """The admin bodies are refused as a search body is: 422 with the machine-readable code and the field
    (``{}`` to /admin/publish: missing_field ``version``), never a bare invalid_request."""
    cases = [("/admin/publish", {}, "missing_field", "version"),
             ("/admin/publish", {"version": "v1", "force": True}, "unknown_field", "force"),
             ("/admin/publish", {"version": 7}, "invalid_type", "version"),
             ("/admin/promote", {"skip_gate": [1]}, "invalid_type", "skip_gate"),
             ("/admin/rollback", {"reason": 5}, "invalid_type", "reason"),
             ("/admin/reload", {"collection": "x" * 129}, "invalid_type", "collection"),
             ("/admin/publish", ["v1"], "invalid_type", None)]
    with make_gateway(admin_api_key=STRONG_ADMIN_KEY) as (client, _):
        for path, body, code, field in cases:
            r = client.post(path, json=body, headers=ADMIN)
            err = r.json()["error"]
            assert (r.status_code, err["code"], err["field"]) == (422, code, field), (path, body, r.text)
            assert repr(field) in err["message"] if field else "JSON object" in err["message"]
        r = client.post("/admin/publish", json={}, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401  # the key is still checked before the body
        # the body's own faults, coded as a search body's
        for path, raw, ctype, status, code in [
                ("/admin/reload", b'{"collection":', "application/json", 400, "invalid_json"),
                ("/admin/publish", b"not json", "application/json", 400, "invalid_json"),
                ("/admin/publish", b'{"version": "v1"}', "text/plain", 415, "unsupported_media_type"),
                ("/admin/publish", b'{"version": "' + b"v" * 70_000 + b'"}', "application/json", 413,
                 "body_too_large"),
                # read as strictly as a search body: a byte-order mark, a field name twice (which value?)
                ("/admin/publish", b'\xef\xbb\xbf{"version": "v1"}', "application/json", 400, "invalid_json"),
                ("/admin/reload", b'{"collection": "nope", "collection": "scifact"}', "application/json", 422,
                 "duplicate_field"),
                ("/admin/publish", b'{"version": "a", "version": "b"}', "application/json", 422,
                 "duplicate_field")]:
            r = client.post(path, content=raw, headers={**ADMIN, "content-type": ctype})
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (path, r.text[:200])
        # a refused name is echoed shortened, and the code is not repeated in the message
        r = client.post("/admin/publish", json={"version": "A" * 5000}, headers=ADMIN)
        err = r.json()["error"]
        assert (r.status_code, err["code"]) == (422, "invalid_version") and len(err["message"]) < 300, r.text[:300]
        assert not err["message"].startswith("[")


def test_search_key_when_configured(make_gateway):
    with make_gateway(admin_api_key=STRONG_ADMIN_KEY, search_api_key=STRONG_SEARCH_KEY) as (client, _):
        r = post(client, {"query": Q})
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        r = post(client, {"query": Q}, headers=bearer(STRONG_ADMIN_KEY))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        # authentication comes before the body is even read
        r = post(client, b"not json", headers=bearer("wrong-key"))
        assert r.status_code == 401
        assert post(client, {"query": Q}, headers=bearer(STRONG_SEARCH_KEY)).status_code == 200
        assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200


# ---------------------------------------------------------------- reload

@pytest.fixture
def two_versions(tmp_path, scifact_version, encoder_dir):
    """A home whose collection holds a copy of the session's version (LIVE) and a second version."""
    home = tmp_path / "home"
    coll = home / "indexes" / "scifact"
    coll.mkdir(parents=True)
    v1 = scifact_version.name
    shutil.copytree(scifact_version, coll / v1)
    store.write_live_pointer(coll, v1)
    (home / "models").mkdir()
    (home / "models" / "minilm-onnx").symlink_to(encoder_dir)

    def new_version(name: str):
        manifest = read_manifest(coll / v1)
        writers = {f: (lambda path, f=f: shutil.copyfile(coll / v1 / f, path)) for f in manifest.files}
        return store.write_version(coll, name, writers, manifest)

    return home, coll, v1, new_version


def promote_in_registry(home, version):
    """Register ``version`` and make it live in the collection's file registry (what `trainer promote` does)."""
    reg = FileRegistry(home / "indexes")
    reg.publish("scifact", version, actor="test")
    reg.promote("scifact", version, gate={"skipped": True}, actor="test")


def live_series(client):
    return [line for line in client.get("/metrics").text.splitlines()
            if line.startswith("adawidth_live_version_info{")]


def test_reload_swaps_atomically_and_keeps_in_flight_requests_on_their_version(make_gateway, two_versions):
    home, coll, v1, new_version = two_versions
    new_version("v2-reload-test")
    with make_gateway(home=home, admin_api_key=STRONG_ADMIN_KEY) as (client, state):
        assert client.get("/readyz").json()["index_version"] == v1
        enc = state.encoder = GatedEncoder(state.encoder)
        with ThreadPoolExecutor(1) as pool:
            try:
                in_flight = pool.submit(post, client, {"query": Q, "k": 5})
                assert enc.entered.wait(60)  # it holds its reference to v1 now
                promote_in_registry(home, "v2-reload-test")
                r = client.post("/admin/reload", headers=ADMIN)
                assert r.status_code == 200, r.text
                # the follower may have switched on its own already; either way v2 is live now
                assert r.json()["index_version"] == "v2-reload-test"
                assert r.json()["previous_version"] in (v1, "v2-reload-test")
            finally:
                enc.release.set()
            assert in_flight.result(timeout=120).json()["trace"]["index_version"] == v1
        assert post(client, {"query": Q}).json()["trace"]["index_version"] == "v2-reload-test"
        assert client.get("/readyz").json()["index_version"] == "v2-reload-test"
        assert len(live_series(client)) == 1 and 'version="v2-reload-test"' in live_series(client)[0]
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.json() == {"status": "unchanged", "index_version": "v2-reload-test",
                            "previous_version": "v2-reload-test"}


def test_failed_reload_keeps_the_current_version(make_gateway, two_versions):
    home, coll, v1, new_version = two_versions
    bad = new_version("v3-corrupt")
    with open(bad / "docs.npy", "r+b") as fh:  # flip bytes: the checksum no longer matches
        fh.seek(4096)
        fh.write(b"\xff" * 16)
    with make_gateway(home=home, admin_api_key=STRONG_ADMIN_KEY) as (client, state):
        promote_in_registry(home, "v3-corrupt")
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "reload_failed"
        assert "checksum" in r.json()["error"]["message"]
        (coll / store.LIVE_POINTER).write_text(json.dumps({"version": "no-such-version"}))
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "reload_failed"
        r = post(client, {"query": Q})
        assert r.status_code == 200 and r.json()["trace"]["index_version"] == v1
        assert client.get("/readyz").json()["index_version"] == v1


# ---------------------------------------------------------------- metrics hygiene

def count_series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def test_metric_series_stay_bounded_after_10000_random_requests(tmp_path):
    """Random paths, methods and query strings: labels stay route templates and bounded values.

    Every route is first hit once with every method (so every bounded label
    combination exists); 10,000 random requests later the number of exported
    series has not grown.
    """
    rng = random.Random(8)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_.~%"
    routes = ["/v1/search", "/healthz", "/readyz", "/admin/reload", "/metrics"]
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "PURGE", "BREW", "X-RANDOM"]
    app = create_app(GatewaySettings(home=tmp_path, collection="none"), CollectorRegistry(), load=False)
    registry = app.state.gw.metrics.registry
    seen_paths = []

    def random_request():
        if rng.random() < 0.1:  # a known route, a random method and query string
            return rng.choice(methods), rng.choice(routes) + f"?q={rng.randrange(10 ** 9)}"
        path = "/" + "/".join("".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(rng.randint(1, 4)))
        seen_paths.append(path)
        return rng.choice(methods), path

    async def drive():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for route in routes + ["/unknown"]:
                for method in methods:
                    await client.request(method, route)
            before = generate_latest(registry).decode()
            for _ in range(10_000):
                await client.request(*random_request())
        return before

    before = asyncio.run(drive())
    text = generate_latest(registry).decode()
    assert count_series(before) == count_series(text) < 400
    unmatched = next(line for line in text.splitlines()
                     if line.startswith('adawidth_http_requests_total{method="any",route="unmatched",status="4xx"}'))
    assert float(unmatched.split()[-1]) == len(methods) + len(seen_paths)  # every random path counted, one series
    labels = {line.split("{")[1].split("}")[0] for line in text.splitlines() if "{" in line and line[0] != "#"}
    routes_seen = {lab.split('route="')[1].split('"')[0] for lab in labels if 'route="' in lab}
    assert routes_seen == {"unmatched", *routes}
    methods_seen = {lab.split('method="')[1].split('"')[0] for lab in labels if 'method="' in lab}
    assert methods_seen <= {"any", "other", "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}
    assert "PURGE" not in text and "BREW" not in text
    assert len(seen_paths) > 8_000 and not any(p in text for p in seen_paths if len(p) > 6)
