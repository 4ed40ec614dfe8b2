"""Blue/green cutover through Redis with two real gateway processes (issue 3).

One module-scoped cluster: a private ``redis-server`` (append-only file, so a
killed server restarts with its state), two gateways following it, and a home
whose collection holds the adapter version (v1, live) and a PCA version (v2).
The tests run in file order and each one leaves v1 live.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from engine.encoder import OnnxEncoder
from engine.io.beir import load_collection
from engine.registry.redis_store import RedisRegistry
from engine.version import store
from tests.conftest import ROOT, SCIFACT, free_port, make_cutover_home
from tests.cutover_support import (ADMIN_KEY, LoadGenerator, RedisServer, check_offline, metric, readyz, start_gateways,
                                   trainer_cli, wait_converged)

pytestmark = pytest.mark.integration

N_QUERIES = 50


@pytest.fixture(scope="module")
def queries():
    col = load_collection(SCIFACT, "test")
    return [col.queries[q] for q in sorted(col.judged_queries())][:N_QUERIES]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, scifact_version, pca_version, encoder_dir):
    root = tmp_path_factory.mktemp("redis-cluster")
    home = make_cutover_home(root / "home", encoder_dir, [scifact_version, pca_version])
    redis_server = RedisServer(root / "redis")
    redis_server.start()
    v1, v2 = scifact_version.name, pca_version.name
    for args in (("publish", "scifact", v1), ("promote", "scifact", v1)):
        r = trainer_cli(home, redis_server.url, *args)
        assert r.returncode == 0, r.stderr
    gws = start_gateways(home, redis_server.url, ["blue", "green"])
    reg = RedisRegistry(redis_server.url)
    try:
        yield {"home": home, "redis": redis_server, "gateways": gws, "v1": v1, "v2": v2, "registry": reg,
               "dirs": {v1: scifact_version, v2: pca_version}}
    finally:
        for g in gws:
            g.stop()
        reg.close()
        redis_server.kill()


@pytest.fixture(scope="module")
def local_encoder(encoder_dir):
    """The encoder configured as the gateways run it (one intra-op thread), for bit-equal query embeddings."""
    return OnnxEncoder(encoder_dir, threads=1, spin=False)


def admin(url: str, path: str, body: dict | None = None, key: str | None = ADMIN_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body or {}, headers=headers, timeout=120)


def test_promote_and_rollback_under_load_with_two_replicas(cluster, queries, local_encoder):
    gws, reg, v1, v2 = cluster["gateways"], cluster["registry"], cluster["v1"], cluster["v2"]
    assert {readyz(g.url)[1]["index_version"] for g in gws} == {v1}
    load = LoadGenerator([g.url for g in gws], queries, concurrency=24).start()
    load.wait_for(300)

    # publish v2: each replica loads, verifies and warms it in the background, then reports it warm
    r = trainer_cli(cluster["home"], cluster["redis"].url, "publish", "scifact", v2)
    assert r.returncode == 0, r.stderr
    r = trainer_cli(cluster["home"], cluster["redis"].url, "promote", "scifact", v2, "--require-warm", "2",
                    "--wait-s", "120")
    assert r.returncode == 0, r.stderr
    assert sorted(reg.warm_replicas("scifact", v2)) == ["blue", "green"]
    promoted_at = reg.get("scifact").updated_at
    n_promote = load.count
    t_promote = wait_converged(gws, v2, since=promoted_at)

    load.wait_for(n_promote + 700)
    # roll back through the admin endpoint of one replica; the other follows through pub/sub
    r = admin(gws[1].url, "/admin/rollback", {"reason": "test rollback"})
    assert r.status_code == 200, r.text
    state = r.json()["state"]
    assert (state["live"], state["previous"]) == (v1, v2)
    t_rollback = wait_converged(gws, v1, since=state["updated_at"])
    n_rollback = load.count
    load.wait_for(max(2000, n_rollback + 500))
    elapsed = load.stop()

    outs = load.outcomes
    failed = [o for o in outs if o.status != 200]
    assert len(outs) >= 2000 and failed == [], failed[:5]
    by_version = {v: sum(o.version == v for o in outs) for v in (v1, v2)}
    assert by_version[v1] > 0 and by_version[v2] > 0
    # requests started after both replicas switched (and before the next change) are served by the new version
    after_promote = [o.version for o in outs if promoted_at + t_promote < o.started_at and o.done_at < state["updated_at"]]
    after_rollback = [o.version for o in outs if o.started_at > state["updated_at"] + t_rollback]
    assert len(after_promote) > 100 and set(after_promote) == {v2}
    assert len(after_rollback) > 100 and set(after_rollback) == {v1}
    pairs = check_offline(outs, queries, cluster["dirs"], local_encoder)
    for g in gws:
        assert metric(g.url, "adawidth_cutovers_total", collection="scifact") == 1
        assert metric(g.url, "adawidth_rollbacks_total", collection="scifact") == 1
        assert metric(g.url, "adawidth_live_version_info", collection="scifact", version=v1) == 1
    hist = reg.history("scifact")
    assert [e["action"] for e in hist[-3:]] == ["publish", "promote", "rollback"]
    print(json.dumps({"requests": len(outs), "concurrency": 24, "failed": len(failed), "seconds": round(elapsed, 1),
                      "requests_per_s": round(len(outs) / elapsed, 1), "served_by_version": by_version,
                      "offline_pairs_checked": pairs, "converge_promote_s": round(t_promote, 3),
                      "converge_rollback_s": round(t_rollback, 3)}))


def test_redis_outage_keeps_serving_then_converges(cluster, queries):
    gws, redis_server, v1, v2 = cluster["gateways"], cluster["redis"], cluster["v1"], cluster["v2"]
    redis_server.kill()
    try:
        # every replica reports degraded (still 200: it serves its live version correctly) ...
        deadline = time.monotonic() + 10
        while not all(readyz(g.url)[1]["status"] == "degraded" for g in gws):
            assert time.monotonic() < deadline, [readyz(g.url) for g in gws]
            time.sleep(0.1)
        for g in gws:
            code, body = readyz(g.url)
            assert code == 200 and body["index_version"] == v1 and "registry unreachable" in body["degraded"][0]
            assert metric(g.url, "adawidth_registry_up") == 0
        # ... keeps answering from v1 ...
        with httpx.Client(timeout=30) as client:
            for i in range(40):
                r = client.post(f"{gws[i % 2].url}/v1/search", json={"query": queries[i], "k": 10, "width": 64})
                assert r.status_code == 200 and r.json()["trace"]["index_version"] == v1
        # ... and the trainer says clearly that the registry is down
        r = trainer_cli(cluster["home"], redis_server.url, "rollback", "scifact")
        assert r.returncode == 3 and "unreachable" in r.stderr
    finally:
        redis_server.start()  # same port, same append-only file
    # a change made right after recovery reaches both replicas (they reconnect with backoff and reconcile)
    reg = RedisRegistry(redis_server.url)
    assert reg.get("scifact").live == v1  # the state survived the crash
    state = reg.rollback("scifact", reason="after outage")
    assert state.live == v2
    try:
        wait_converged(gws, v2, since=state.updated_at)
        # the registry follower and the write-ahead log follower reconnect independently (each with its own
        # backoff); both are back within a second of convergence, and then nothing is degraded
        deadline = time.monotonic() + 1.0
        while not all(readyz(g.url)[1]["status"] == "ready" for g in gws) and time.monotonic() < deadline:
            time.sleep(0.05)
        for g in gws:
            body = readyz(g.url)[1]
            assert body["status"] == "ready", body["degraded"]
            assert metric(g.url, "adawidth_registry_up") == 1
    finally:  # the next tests start from v1 live
        state = reg.rollback("scifact")
        wait_converged(gws, v1, since=state.updated_at)
        reg.close()


def _corrupt_copy(src, coll_dir, name: str, damage: str):
    """A copy of version ``src`` named ``name`` (manifest renamed to match), then damaged."""
    dst = coll_dir / name
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["version"] = name
    (dst / "manifest.json").write_text(json.dumps(m))
    if damage == "truncate":
        with open(dst / "docs.npy", "r+b") as fh:
            fh.truncate(4096)
    else:
        (dst / "stage1.faiss").unlink()
    return dst


@pytest.mark.parametrize("damage", ["truncate", "missing_file"])
def test_corrupted_version_is_refused_and_live_traffic_untouched(cluster, queries, damage):
    gws, reg, v1, home = cluster["gateways"], cluster["registry"], cluster["v1"], cluster["home"]
    coll = home / "indexes" / "scifact"
    bad = f"{cluster['v2']}-bad-{damage.replace('_', '')}"
    _corrupt_copy(cluster["dirs"][cluster["v2"]], coll, bad, damage)
    before = [metric(g.url, "adawidth_versions_refused_total", collection="scifact", reason="checksum") for g in gws]

    # the trainer refuses to publish it ...
    r = trainer_cli(home, cluster["redis"].url, "publish", "scifact", bad)
    assert r.returncode == 2 and "checksum" in r.stderr
    # ... and so does the admin endpoint
    r = admin(gws[0].url, "/admin/publish", {"version": bad})
    assert r.status_code == 409 and r.json()["error"]["code"] == "version_refused"

    # registered behind the tools' back (damage after publication) and even promoted: every replica refuses it
    reg.publish("scifact", bad)
    state = reg.promote("scifact", bad)
    deadline = time.monotonic() + 10
    while not all(metric(g.url, "adawidth_versions_refused_total", collection="scifact", reason="checksum") > b
                  for g, b in zip(gws, before)):
        assert time.monotonic() < deadline, "replicas did not refuse the damaged version"
        time.sleep(0.1)
    with httpx.Client(timeout=30) as client:
        for i in range(30):
            r = client.post(f"{gws[i % 2].url}/v1/search", json={"query": queries[i], "k": 10, "width": "full"})
            assert r.status_code == 200 and r.json()["trace"]["index_version"] == v1
    for g in gws:
        code, body = readyz(g.url)
        assert code == 200 and body["index_version"] == v1 and body["status"] == "degraded"
        assert f"{bad} refused here (checksum)" in body["degraded"][0]
        assert f"REFUSED index version scifact/{bad}: [checksum]" in g.log()
    refusals = [e for e in reg.history("scifact") if e["action"] == "refuse" and e["version"] == bad]
    assert {e["replica"] for e in refusals} == {"blue", "green"} and all(e["reason"] == "checksum" for e in refusals)
    # the operator rolls back; nothing was ever served from the damaged version
    state = reg.rollback("scifact", reason="damaged version")
    assert state.live == v1
    deadline = time.monotonic() + 5
    while not all(readyz(g.url)[1]["status"] == "ready" for g in gws):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_replica_started_while_redis_is_down_serves_the_live_file(cluster, queries):
    """Cold start without the registry: the LIVE file (mirrored by promotions) is served, degraded."""
    live = store.read_live_pointer(cluster["home"] / "indexes" / "scifact")
    assert live == cluster["v1"]
    (gw,) = start_gateways(cluster["home"], f"redis://127.0.0.1:{free_port()}/0", ["cold"])
    try:
        code, body = readyz(gw.url)
        assert code == 200 and body["index_version"] == live and body["status"] == "degraded"
        assert "registry unreachable" in body["degraded"][0]
        r = httpx.post(f"{gw.url}/v1/search", json={"query": queries[0], "k": 10, "width": "full"}, timeout=30)
        assert r.status_code == 200 and r.json()["trace"]["index_version"] == live
    finally:
        gw.stop()


def test_two_publishers_race_without_losing_anything(cluster):
    """Two processes publish 60 versions each and promote concurrently through WATCH/MULTI."""
    url = cluster["redis"].url
    script = ("import sys; from engine.registry.redis_store import RedisRegistry as R; r = R(sys.argv[1]); w = sys.argv[2]\n"
              "for i in range(60):\n"
              "    r.publish('race', f'{w}-{i:03d}', actor=w)\n"
              "    if i % 3 == 2: r.promote('race', f'{w}-{i - 1:03d}', actor=w)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, url, w], cwd=ROOT) for w in ("alpha", "beta")]
    assert [p.wait(120) for p in procs] == [0, 0]
    reg = RedisRegistry(url)
    state, hist = reg.get("race"), reg.history("race", 1000)
    published = {f"{w}-{i:03d}" for w in ("alpha", "beta") for i in range(60)}
    promoted = {f"{w}-{i - 1:03d}" for w in ("alpha", "beta") for i in range(60) if i % 3 == 2}
    assert state.revision == len(hist) == 120 + 40
    assert [e["revision"] for e in hist] == list(range(1, 161))
    assert {e["version"] for e in hist if e["action"] == "publish"} == published
    # every promotion is recorded once and chains: each one's "from" is the live version before it
    promos = [e for e in hist if e["action"] == "promote"]
    assert {e["version"] for e in promos} == promoted
    assert all(b["from"] == a["version"] for a, b in zip(promos, promos[1:]))
    assert state.live == promos[-1]["version"] and state.previous == promos[-1]["from"]
    assert set(state.candidates) == published - promoted
    reg.close()


def test_admin_endpoints_require_the_key(cluster):
    url = cluster["gateways"][0].url
    r = admin(url, "/admin/rollback", key=None)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = admin(url, "/admin/rollback", key="wrong")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(f"{url}/admin/registry", headers={"X-API-Key": ADMIN_KEY})
    assert r.status_code == 200 and r.json()["state"]["live"] == cluster["v1"] and r.json()["kind"] == "redis"
    r = admin(url, "/admin/promote", {"version": "../etc"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_version"
    r = admin(url, "/admin/promote", {"version": "no-such-version"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_version"
