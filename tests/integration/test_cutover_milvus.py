"""Promote and rollback under concurrent load with stage 1 on Milvus (issue 10; modelled on test_cutover_redis).

A private ``redis-server`` (the registry), a private Milvus Lite server (stage 1,
reached over the Milvus protocol like a cluster), two gateway processes with
``ADAWIDTH_STAGE1_BACKEND=milvus``, and two SciFact versions: PCA (v1) and the
identity rotation (v2), both with a (64,128) router.  The trainer writes each
version's Milvus collection when it publishes it -- v2's while the gateways
serve v1 under load.  Guarantees as in the cutover issue: zero failed requests,
and every answer equals what the version named in its trace returns offline (the
faiss backend, loaded from the version directory), so the Milvus path is also
congruent with faiss request by request.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import httpx
import pytest

from engine.encoder import OnnxEncoder
from engine.stage1 import Stage1Provider
from engine.io.beir import load_collection
from engine.registry.redis_store import RedisRegistry
from engine.version.milvus import milvus_collection_name
from tests.conftest import SCIFACT, VAR, make_cutover_home
from tests.cutover_support import (ADMIN_KEY, LoadGenerator, MilvusLiteServer, RedisServer, check_offline, metric,
                                   readyz, start_gateways, trainer_cli, wait_converged)
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

pytestmark = pytest.mark.integration

N_QUERIES = 40


@pytest.fixture(scope="module")
def identity_version(tmp_path_factory, encoder_dir, encoder):
    """A second SciFact version with the identity rotation (truncation): its rankings differ from PCA's."""
    home = tmp_path_factory.mktemp("identity-build")
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    path, _ = build_index(BuildOptions(dataset=SCIFACT, rotation="identity", eval_split=None,
                                       action_pairs=((64, 128),), default_pair=(64, 128), publish=False),
                          settings, encoder)
    return path


@pytest.fixture(scope="module")
def queries():
    col = load_collection(SCIFACT, "test")
    return [col.queries[q] for q in sorted(col.judged_queries())][:N_QUERIES]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pca_version, identity_version, encoder_dir):
    root = tmp_path_factory.mktemp("milvus-cluster")
    home = make_cutover_home(root / "home", encoder_dir, [pca_version, identity_version])
    redis_server = RedisServer(root / "redis")
    redis_server.start()
    milvus = MilvusLiteServer(root / "milvus")
    milvus.start()
    env = {"ADAWIDTH_STAGE1_BACKEND": "milvus", "ADAWIDTH_MILVUS_URI": milvus.uri}
    v1, v2 = pca_version.name, identity_version.name
    gws, reg = [], None
    try:
        for args in (("publish", "scifact", v1), ("promote", "scifact", v1)):
            r = trainer_cli(home, redis_server.url, *args, extra_env=env)
            assert r.returncode == 0, r.stderr
        gws = start_gateways(home, redis_server.url, ["blue", "green"], **env)
        reg = RedisRegistry(redis_server.url)
        yield {"home": home, "redis": redis_server, "milvus": milvus, "env": env, "gateways": gws, "v1": v1,
               "v2": v2, "registry": reg, "dirs": {v1: pca_version, v2: identity_version}}
    finally:
        for g in gws:
            g.stop()
        if reg is not None:
            reg.close()
        milvus.stop()
        redis_server.kill()


@pytest.fixture(scope="module")
def local_encoder(encoder_dir):
    return OnnxEncoder(encoder_dir, threads=1, spin=False)


def test_promote_and_rollback_under_load_with_stage1_on_milvus(cluster, queries, local_encoder):
    from pymilvus import MilvusClient

    gws, reg, v1, v2, env = cluster["gateways"], cluster["registry"], cluster["v1"], cluster["v2"], cluster["env"]
    home, redis_url = cluster["home"], cluster["redis"].url
    assert {readyz(g.url)[1]["index_version"] for g in gws} == {v1}
    for g in gws:
        assert f"loaded and warmed scifact/{v1}" in g.log() and "stage 1 on milvus" in g.log()
    client = MilvusClient(uri=cluster["milvus"].uri)
    assert milvus_collection_name("scifact", v2) not in client.list_collections()  # not published yet

    load = LoadGenerator([g.url for g in gws], queries, concurrency=16).start()
    load.wait_for(150)
    # publishing v2 writes its Milvus collection first, then registers it; replicas load and warm it through Milvus
    r = trainer_cli(home, redis_url, "publish", "scifact", v2, extra_env=env)
    assert r.returncode == 0, r.stderr
    assert milvus_collection_name("scifact", v2) in client.list_collections()
    r = trainer_cli(home, redis_url, "promote", "scifact", v2, "--require-warm", "2", "--wait-s", "120",
                    extra_env=env)
    assert r.returncode == 0, r.stderr
    promoted_at = reg.get("scifact").updated_at
    n_promote = load.count
    t_promote = wait_converged(gws, v2, since=promoted_at)

    load.wait_for(n_promote + 300)
    r = httpx.post(f"{gws[1].url}/admin/rollback", json={"reason": "test rollback"},
                   headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120)
    assert r.status_code == 200, r.text
    state = r.json()["state"]
    assert (state["live"], state["previous"]) == (v1, v2)
    t_rollback = wait_converged(gws, v1, since=state["updated_at"])
    n_rollback = load.count
    load.wait_for(max(900, n_rollback + 250))
    elapsed = load.stop()

    outs = load.outcomes
    failed = [o for o in outs if o.status != 200]
    assert len(outs) >= 900 and failed == [], failed[:5]
    by_version = {v: sum(o.version == v for o in outs) for v in (v1, v2)}
    after_promote = [o.version for o in outs if promoted_at + t_promote < o.started_at and o.done_at < state["updated_at"]]
    after_rollback = [o.version for o in outs if o.started_at > state["updated_at"] + t_rollback]
    assert len(after_promote) > 50 and set(after_promote) == {v2}
    assert len(after_rollback) > 50 and set(after_rollback) == {v1}
    # every answer equals the offline answer of the version in its trace, loaded on the same Milvus stage 1
    # (a Milvus-backed version has no in-process level scan: its 'auto' is the router, its 'full' Milvus's scan)
    provider = Stage1Provider("milvus", cluster["milvus"].uri)
    try:
        pairs = check_offline(outs, queries, cluster["dirs"], local_encoder, stage1=provider)
    finally:
        provider.close()
    for g in gws:
        assert metric(g.url, "adawidth_cutovers_total", collection="scifact") == 1
        assert metric(g.url, "adawidth_rollbacks_total", collection="scifact") == 1
        assert "stage 1 on milvus" in g.log()
    # both versions' collections stay while the registry names them; gc keeps live and previous
    r = trainer_cli(home, redis_url, "milvus-gc", "scifact", extra_env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dropped"] == []
    client.close()
    print(json.dumps({"requests": len(outs), "concurrency": 16, "failed": len(failed), "seconds": round(elapsed, 1),
                      "requests_per_s": round(len(outs) / elapsed, 1), "served_by_version": by_version,
                      "offline_pairs_checked": pairs, "converge_promote_s": round(t_promote, 3),
                      "converge_rollback_s": round(t_rollback, 3)}))


def test_version_without_its_milvus_collection_is_refused_and_live_traffic_untouched(cluster, queries):
    """Registered behind the trainer's back (no Milvus collection written): every replica refuses it."""
    gws, reg, v1, home = cluster["gateways"], cluster["registry"], cluster["v1"], cluster["home"]
    bad = f"{cluster['v2']}-nomilvus"
    src = cluster["dirs"][cluster["v2"]]
    dst = home / "indexes" / "scifact" / bad
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["version"] = bad
    (dst / "manifest.json").write_text(json.dumps(m))
    reg.publish("scifact", bad)
    reg.promote("scifact", bad)
    deadline = time.monotonic() + 30
    while not all(metric(g.url, "adawidth_versions_refused_total", collection="scifact", reason="missing") >= 1
                  for g in gws):
        assert time.monotonic() < deadline, [g.log()[-1500:] for g in gws]
        time.sleep(0.1)
    with httpx.Client(timeout=30) as client:
        for i in range(10):
            r = client.post(f"{gws[i % 2].url}/v1/search", json={"query": queries[i], "k": 10, "width": "auto"})
            assert r.status_code == 200 and r.json()["trace"]["index_version"] == v1
    for g in gws:
        code, body = readyz(g.url)
        assert code == 200 and body["status"] == "degraded" and f"{bad} refused here (missing)" in body["degraded"][0]
    assert reg.rollback("scifact", reason="no milvus collection").live == v1


def test_milvus_outage_answers_503_then_recovers(cluster, queries):
    """Milvus down: searches answer 503 ``stage1_unavailable`` with Retry-After (never 500); back up: 200 again."""
    gws, milvus, v1 = cluster["gateways"], cluster["milvus"], cluster["v1"]
    os.killpg(milvus.proc.pid, signal.SIGKILL)  # a crash
    milvus.proc.wait(10)
    try:
        with httpx.Client(timeout=60) as client:
            for i, width in enumerate((64, "auto", "full")):
                r = client.post(f"{gws[i % 2].url}/v1/search", json={"query": queries[i], "k": 10, "width": width})
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "stage1_unavailable" and "Retry-After" in r.headers
            for g in gws:
                assert readyz(g.url)[0] == 200  # the replica itself is fine; the engine behind it is not
    finally:
        milvus.start()  # same port, same data folder (recovered from its write-ahead log)
    deadline = time.monotonic() + 90
    with httpx.Client(timeout=60) as client:
        for g in gws:
            while True:
                r = client.post(f"{g.url}/v1/search", json={"query": queries[0], "k": 10, "width": "auto"})
                if r.status_code == 200:
                    assert r.json()["trace"]["index_version"] == v1
                    break
                assert r.status_code == 503 and time.monotonic() < deadline, r.text
                time.sleep(0.5)
    for g in gws:
        assert metric(g.url, "adawidth_errors_total", code="stage1_unavailable") >= 1
