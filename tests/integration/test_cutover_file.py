"""Cutover with the file registry (no Redis): one gateway under load, the quality gate, crashes during a build,
and reference counting of versions held by requests (issue 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import faiss
import httpx
import pytest
from prometheus_client import CollectorRegistry

from engine.encoder import OnnxEncoder
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from engine.registry.file import FileRegistry
from engine.version import store
from service.metrics import CutoverMetrics, GatewayMetrics
from service.version_manager import VersionManager
from tests.conftest import ROOT, SCIFACT, VAR, make_cutover_home
from tests.cutover_support import (ADMIN_KEY, LoadGenerator, check_offline, judged_test_queries, metric, readyz,
                                   start_gateways, trainer_cli, wait_converged)
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

pytestmark = pytest.mark.integration


def _trainer_settings(home, encoder_dir):
    return TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                           embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()


@pytest.fixture(scope="module")
def identity_version(tmp_path_factory, encoder_dir, encoder):
    """A deliberately weaker candidate: identity rotation, no router (plain MiniLM prefixes)."""
    home = tmp_path_factory.mktemp("identity-build")
    path, _ = build_index(BuildOptions(dataset=SCIFACT, rotation="identity", train_split=None, eval_split=None,
                                       publish=False), _trainer_settings(home, encoder_dir), encoder)
    return path


@pytest.fixture(scope="module")
def file_home(tmp_path_factory, scifact_version, pca_version, identity_version, encoder_dir):
    home = make_cutover_home(tmp_path_factory.mktemp("file-registry") / "home", encoder_dir,
                             [scifact_version, pca_version, identity_version])
    for args in (("publish", "scifact", scifact_version.name), ("promote", "scifact", scifact_version.name)):
        r = trainer_cli(home, None, *args)
        assert r.returncode == 0, r.stderr
    return home


@pytest.fixture(scope="module")
def gateway(file_home):
    (gw,) = start_gateways(file_home, None, ["solo"])
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def queries():
    return judged_test_queries(30)


def test_file_registry_promote_and_rollback_under_load(file_home, gateway, queries, scifact_version, pca_version,
                                                        encoder_dir):
    v1, v2 = scifact_version.name, pca_version.name
    coll = file_home / "indexes" / "scifact"
    reg = FileRegistry(file_home / "indexes")
    code, body = readyz(gateway.url)
    assert code == 200 and body["registry"] == "file" and body["index_version"] == v1
    load = LoadGenerator([gateway.url], queries, concurrency=20).start()
    load.wait_for(150)
    r = trainer_cli(file_home, None, "publish", "scifact", v2)
    assert r.returncode == 0, r.stderr
    r = trainer_cli(file_home, None, "promote", "scifact", v2, "--require-warm", "1", "--wait-s", "120")
    assert r.returncode == 0, r.stderr
    promoted = reg.get("scifact")
    assert (promoted.live, promoted.previous) == (v2, v1) and store.read_live_pointer(coll) == v2
    t_promote = wait_converged([gateway], v2, since=promoted.updated_at)
    n = load.count
    load.wait_for(n + 300)
    r = httpx.post(f"{gateway.url}/admin/rollback", json={"reason": "file flow"}, timeout=60,
                   headers={"X-API-Key": ADMIN_KEY})
    assert r.status_code == 200, r.text
    rolled = r.json()["state"]
    assert rolled["live"] == v1 and store.read_live_pointer(coll) == v1
    t_rollback = wait_converged([gateway], v1, since=rolled["updated_at"])
    load.wait_for(max(800, load.count + 200))
    load.stop()
    outs = load.outcomes
    assert [o for o in outs if o.status != 200] == []
    assert {o.version for o in outs} == {v1, v2}
    after_promote = [o.version for o in outs
                     if promoted.updated_at + t_promote < o.started_at and o.done_at < rolled["updated_at"]]
    after_rollback = [o.version for o in outs if o.started_at > rolled["updated_at"] + t_rollback]
    assert len(after_promote) > 50 and set(after_promote) == {v2}
    assert len(after_rollback) > 50 and set(after_rollback) == {v1}
    check_offline(outs, queries, {v1: scifact_version, v2: pca_version},
                  OnnxEncoder(encoder_dir, threads=1, spin=False))
    assert [e["action"] for e in reg.history("scifact")[-3:]] == ["publish", "promote", "rollback"]
    assert metric(gateway.url, "adawidth_cutovers_total", collection="scifact") == 1
    assert metric(gateway.url, "adawidth_rollbacks_total", collection="scifact") == 1


def _write_gate(file_home, **cfg):
    (file_home / "indexes" / "scifact" / "gate.json").write_text(json.dumps(cfg))


def test_quality_gate_refuses_a_worse_candidate(file_home, gateway, identity_version, pca_version, scifact_version):
    reg = FileRegistry(file_home / "indexes")
    bad = identity_version.name
    v1 = scifact_version.name
    assert reg.get("scifact").live == v1
    r = trainer_cli(file_home, None, "publish", "scifact", bad)
    assert r.returncode == 0, r.stderr
    try:
        # labelled: NDCG@10 at width 64 on 100 held-out SciFact test queries
        _write_gate(file_home, dataset=str(SCIFACT), split="test", max_queries=100, width=64, ndcg_margin=0.02)
        r = trainer_cli(file_home, None, "promote", "scifact", bad)
        assert r.returncode == 2 and "quality_gate: NDCG@10" in r.stderr
        gate = json.loads(r.stdout)["gate"]
        assert gate["passed"] is False and gate["candidate"] < gate["live"] - 0.02 and gate["queries"] == 100
        # label-free: agreement with live, through the admin endpoint (the gateway's loaded versions)
        _write_gate(file_home, dataset=str(SCIFACT), split=None, max_queries=100, width=64,
                    overlap_margin=0.2, top1_margin=0.2)
        r = httpx.post(f"{gateway.url}/admin/promote", json={"version": bad}, headers={"X-API-Key": ADMIN_KEY},
                       timeout=120)
        assert r.status_code == 409 and r.json()["error"]["code"] == "gate_refused"
        assert "top-10 overlap" in r.json()["error"]["message"]
        refusals = [e for e in reg.history("scifact") if e["action"] == "refuse" and e["version"] == bad]
        assert [e["gate"]["metric"] for e in refusals] == ["ndcg@10", "agreement"]
        assert all(e["reason"].startswith("quality_gate:") for e in refusals)
        state = reg.get("scifact")
        assert state.live == v1 and bad in state.candidates
        assert metric(gateway.url, "adawidth_versions_refused_total", collection="scifact", reason="quality_gate") == 1
        assert readyz(gateway.url)[1]["index_version"] == v1
        # the PCA version ranks as the live one at full width (rotation-invariant): it passes the label-free gate
        r = trainer_cli(file_home, None, "publish", "scifact", pca_version.name)
        assert r.returncode == 0, r.stderr
        _write_gate(file_home, dataset=str(SCIFACT), split=None, max_queries=100, width="full",
                    overlap_margin=0.05, top1_margin=0.05)
        r = httpx.post(f"{gateway.url}/admin/promote", json={"version": pca_version.name},
                       headers={"X-API-Key": ADMIN_KEY}, timeout=120)
        assert r.status_code == 200, r.text
        gate = r.json()["gate"]
        assert gate["passed"] and gate["top10_overlap"] >= 0.95 and gate["top1_agreement"] >= 0.95
        assert reg.history("scifact")[-1]["gate"] == gate
        assert readyz(gateway.url)[1]["index_version"] == pca_version.name  # switched before answering
    finally:
        (file_home / "indexes" / "scifact" / "gate.json").unlink(missing_ok=True)
    state = reg.rollback("scifact", reason="restore")
    assert state.live == v1
    wait_converged([gateway], v1, since=state.updated_at)


@pytest.fixture
def build_home(tmp_path, scifact_version, encoder_dir):
    home = make_cutover_home(tmp_path / "home", encoder_dir, [scifact_version])
    for args in (("publish", "scifact", scifact_version.name), ("promote", "scifact", scifact_version.name)):
        assert trainer_cli(home, None, *args).returncode == 0
    return home


def _snapshot(home):
    coll = home / "indexes" / "scifact"
    return (store.list_versions(coll), FileRegistry(home / "indexes").get("scifact"),
            store.read_live_pointer(coll))


def test_build_that_fails_while_writing_leaves_nothing(build_home, encoder_dir, encoder, monkeypatch):
    before = _snapshot(build_home)

    def failing_write_index(index, path):
        with open(path, "wb") as fh:
            fh.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(faiss, "write_index", failing_write_index)
    with pytest.raises(OSError, match="No space left"):
        build_index(BuildOptions(dataset=SCIFACT, rotation="identity", train_split=None, eval_split=None),
                    _trainer_settings(build_home, encoder_dir), encoder)
    assert _snapshot(build_home) == before
    assert [p.name for p in (build_home / "indexes" / "scifact").iterdir() if p.name.startswith(".tmp-")] == []


CRASHING_BUILD = """
import os, signal, sys
from pathlib import Path
import numpy as np
from engine.encoder import OnnxEncoder
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

real_save = np.save
def save(path, arr, *a, **kw):
    if Path(path).name == "docs.npy":  # the process dies half-way through the largest file
        with open(path, "wb") as fh:
            fh.write(np.ascontiguousarray(arr).tobytes()[: arr.nbytes // 2])
            fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(path, arr, *a, **kw)
np.save = save
home, enc = Path(sys.argv[1]), Path(sys.argv[2])
settings = TrainerSettings(home=home, encoder_dir=enc, redis_url=None,
                           embedding_cache=Path(sys.argv[3])).resolved()
build_index(BuildOptions(dataset=Path(sys.argv[4]), rotation="identity", train_split=None, eval_split=None),
            settings, OnnxEncoder(enc, threads=1))
"""


def test_build_killed_mid_write_leaves_no_visible_version(build_home, encoder_dir):
    before = _snapshot(build_home)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("ADAWIDTH_")}
    p = subprocess.run([sys.executable, "-c", CRASHING_BUILD, str(build_home), str(encoder_dir),
                        str(VAR / "cache" / "embeddings.sqlite"), str(SCIFACT)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    coll = build_home / "indexes" / "scifact"
    leftovers = [x for x in coll.iterdir() if x.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and (leftovers[0] / "docs.npy").is_file()  # the crash really happened mid-write
    assert not (leftovers[0] / "manifest.json").exists()
    assert _snapshot(build_home) == before
    r = trainer_cli(build_home, None, "list", "scifact")
    assert r.returncode == 0 and r.stdout.split() == ["*", before[2]]


def test_a_version_held_by_a_request_is_unloaded_only_after_it_ends(tmp_path, scifact_version, pca_version,
                                                                    encoder_dir):
    enc = OnnxEncoder(encoder_dir, threads=1)
    home = make_cutover_home(tmp_path / "home", encoder_dir, [scifact_version, pca_version])
    metrics = CutoverMetrics(GatewayMetrics(CollectorRegistry()))
    vm = VersionManager("scifact", home / "indexes", enc, metrics, ("vitamin d",))
    v1, v2 = scifact_version.name, pca_version.name
    vm.ensure_loaded(v1)
    vm.switch(v1, "start")
    emb = enc.encode(["statins and heart disease"])
    with vm.acquire() as held:
        assert held.version == v1 and vm.refs(v1) == 1
        vm.ensure_loaded(v2)
        assert vm.switch(v2, "promote")
        vm.retain({v2})  # v1 is neither live, previous nor a candidate any more ...
        assert vm.loaded() == sorted([v1, v2])  # ... but this request still holds it
        spec = SearchSpec(query="statins and heart disease", k=10, width=64)
        assert Pipeline().search(held, [spec], embeddings=emb)[0].ids  # and can finish on it
        with vm.acquire() as newer:
            assert newer.version == v2
    assert vm.loaded() == [v2] and vm.refs(v1) == 0
    assert metrics.loaded_versions._value.get() == 1


def test_admin_endpoints_are_disabled_without_a_key(app_client):
    for path in ("/admin/promote", "/admin/rollback", "/admin/publish"):
        r = app_client.post(path, json={}, headers={"Authorization": "Bearer anything"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    assert app_client.get("/admin/registry").status_code == 403
