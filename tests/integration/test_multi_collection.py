"""Many collections in one gateway (issue 17, part 2): two collections served at once by one real gateway
process (uvicorn), each following its own registry entry.  Under continuous search load on both collection
routes, collection A is promoted and rolled back, then collection B: no request fails, every answer carries
its own collection's expected version after each switch, and switching one never moves the other."""

from __future__ import annotations

import os
import time

import httpx
import pytest
import torch
from threadpoolctl import threadpool_limits

from engine.encoder import OnnxEncoder
from engine.registry.file import FileRegistry
from tests.conftest import SCIFACT, VAR
from tests.cutover_support import (ADMIN_KEY, LoadGenerator, check_offline, judged_test_queries, metric, readyz,
                                   start_gateways, trainer_cli)
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

pytestmark = pytest.mark.integration

A, B = "alpha", "beta"  # A is the gateway's default collection (POST /v1/search, /admin/* without a name)
ADMIN = {"X-API-Key": ADMIN_KEY}


def _build(home, encoder_dir, encoder, collection: str, rotation: str):
    """A quick SciFact version of ``collection`` written into ``home`` (not registered): 'pca' (one router) or
    'identity' (no label training); seconds from the shared embedding cache."""
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    options = (dict(rotation="pca", eval_split=None, action_pairs=((64, 128),), default_pair=(64, 128))
               if rotation == "pca" else dict(rotation="identity", train_split=None, eval_split=None))
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            path, _ = build_index(BuildOptions(dataset=SCIFACT, collection=collection, publish=False, **options),
                                  settings, encoder)
    finally:
        torch.set_num_threads(torch_threads)
    return path


@pytest.fixture(scope="module")
def multi_home(tmp_path_factory, encoder_dir, encoder):
    """A home serving two collections, each with two built versions; the first of each is live in its own
    registry entry (file registry), the second is not registered yet."""
    home = tmp_path_factory.mktemp("multi-collection") / "home"
    home.mkdir()
    versions = {A: [_build(home, encoder_dir, encoder, A, "pca"), _build(home, encoder_dir, encoder, A, "identity")],
                B: [_build(home, encoder_dir, encoder, B, "identity"), _build(home, encoder_dir, encoder, B, "pca")]}
    (home / "models").mkdir()
    os.symlink(encoder_dir, home / "models" / "minilm-onnx")
    for coll, (first, _) in versions.items():
        for args in (("publish", coll, first.name), ("promote", coll, first.name)):
            r = trainer_cli(home, None, *args)
            assert r.returncode == 0, r.stderr
    names = {p.name for paths in versions.values() for p in paths}
    assert len(names) == 4, names  # four distinct version names: an answer's version names its collection
    return home, versions


@pytest.fixture(scope="module")
def gateway(multi_home):
    home, _ = multi_home
    (gw,) = start_gateways(home, None, ["multi"], ADAWIDTH_COLLECTION=A, ADAWIDTH_COLLECTIONS=f"{A},{B}",
                           ADAWIDTH_MAX_QUEUED_SEARCHES=64)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def queries():
    return judged_test_queries(20)


def live_of(url: str) -> dict[str, str | None]:
    """Each served collection's live version, from ``/readyz``."""
    code, body = readyz(url)
    assert code == 200, body
    return {name: c["index_version"] for name, c in body["collections"].items()}


def wait_live(url: str, collection: str, version: str, bound_s: float = 30.0) -> float:
    """Poll /readyz until ``collection`` serves ``version``; returns the unix time it was seen."""
    deadline = time.monotonic() + bound_s
    while True:
        seen = live_of(url)
        if seen[collection] == version:
            return time.time()
        if time.monotonic() > deadline:
            pytest.fail(f"{collection} not on {version} {bound_s} s after the switch: {seen}")
        time.sleep(0.05)


def versions_between(outcomes, start: float, end: float) -> list[str]:
    """Versions of the answers sent after ``start`` and received before ``end`` (unix times)."""
    return [o.version for o in outcomes if o.started_at > start and o.done_at < end]



def keep_serving(first: LoadGenerator, second: LoadGenerator, n_first: int = 60, n_second: int = 30) -> None:
    """Wait until ``first`` has answered ``n_first`` more requests and ``second`` ``n_second`` more."""
    a, b = first.count, second.count
    first.wait_for(a + n_first)
    second.wait_for(b + n_second)


def publish_and_promote(home, reg, url: str, name: str, new: str, old: str) -> float:
    """Publish and promote ``new`` of collection ``name`` through the trainer CLI (live ``new``, previous ``old``
    in its registry entry); the time the gateway was first seen serving it."""
    for args in (("publish", name, new), ("promote", name, new, "--require-warm", "1", "--wait-s", "120")):
        r = trainer_cli(home, None, *args)
        assert r.returncode == 0, r.stderr
    promoted = reg.get(name)
    assert (promoted.live, promoted.previous) == (new, old)
    return wait_live(url, name, new)

def test_two_collections_switch_independently_under_load(multi_home, gateway, queries, encoder_dir):
    home, versions = multi_home
    (a1, a2), (b1, b2) = ([p.name for p in versions[A]], [p.name for p in versions[B]])
    url = gateway.url
    reg = FileRegistry(home / "indexes")

    # both collections are served, each on its own live version
    code, body = readyz(url)
    assert code == 200 and body["status"] == "ready", body
    assert (body["collection"], body["index_version"]) == (A, a1)  # the top level is the default collection's
    assert live_of(url) == {A: a1, B: b1}
    listed = httpx.get(f"{url}/v1/collections", timeout=10).json()["collections"]
    assert [(c["name"], c["index_version"], c["documents"], c["default"]) for c in listed] == \
        [(A, a1, 5183, True), (B, b1, 5183, False)]
    assert all(c["policies"] and c["default_policy"] in c["policies"] for c in listed)
    assert metric(url, "adawidth_live_version_info", collection=A, version=a1) == 1
    assert metric(url, "adawidth_live_version_info", collection=B, version=b1) == 1

    # an unknown collection: 404 unknown_collection, on search, batch search and reload
    for path, payload in (("/v1/collections/nope/search", {"query": queries[0]}),
                          ("/v1/collections/nope/search/batch", {"queries": [{"query": queries[0]}]})):
        r = httpx.post(f"{url}{path}", json=payload, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_collection", r.text
    r = httpx.post(f"{url}/admin/reload", json={"collection": "nope"}, headers=ADMIN, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_collection", r.text

    load_a = LoadGenerator([url], queries, concurrency=4, path=f"/v1/collections/{A}/search").start()
    load_b = LoadGenerator([url], queries, concurrency=4, path=f"/v1/collections/{B}/search").start()
    try:
        load_a.wait_for(60)
        load_b.wait_for(60)
        b_before = reg.get(B)

        # -- A: promote a2 (trainer CLI), then roll back (admin API: the default collection) ----------------
        a_promote_seen = publish_and_promote(home, reg, url, A, a2, a1)
        assert live_of(url)[B] == b1
        assert metric(url, "adawidth_live_version_info", collection=B, version=b1) == 1
        assert metric(url, "adawidth_live_version_info", collection=A, version=a1) == 0  # A's old series only
        keep_serving(load_a, load_b)
        r = httpx.post(f"{url}/admin/rollback", json={"reason": "multi-collection test"}, headers=ADMIN, timeout=60)
        assert r.status_code == 200, r.text
        a_rolled = r.json()["state"]
        assert (a_rolled["collection"], a_rolled["live"]) == (A, a1)
        a_rollback_seen = wait_live(url, A, a1)
        assert live_of(url) == {A: a1, B: b1}
        assert reg.get(B) == b_before  # B's registry entry was never touched by A's switches
        keep_serving(load_a, load_b)
        a_before = reg.get(A)
        a_phase_end = time.time()

        # -- B: promote b2, then roll back (trainer CLI: B is not the admin API's default collection) -------
        b_promote_seen = publish_and_promote(home, reg, url, B, b2, b1)
        assert live_of(url)[A] == a1
        keep_serving(load_b, load_a)
        r = trainer_cli(home, None, "rollback", B, "--reason", "multi-collection test")
        assert r.returncode == 0, r.stderr
        b_rolled = reg.get(B)
        assert (b_rolled.live, b_rolled.previous) == (b1, b2)
        b_rollback_seen = wait_live(url, B, b1)
        assert live_of(url) == {A: a1, B: b1}
        assert reg.get(A) == a_before  # A's registry entry was never touched by B's switches
        keep_serving(load_b, load_a)
    finally:
        load_a.stop()
        load_b.stop()

    outs_a, outs_b = load_a.outcomes, load_b.outcomes
    # no request failed, on either collection, through four switches
    assert [o for o in outs_a + outs_b if o.status != 200] == []
    # every answer carries a version of its own collection, and both of each were served
    assert {o.version for o in outs_a} == {a1, a2}
    assert {o.version for o in outs_b} == {b1, b2}
    # A after each of its switches; B untouched meanwhile (and the other way round)
    on_a2 = versions_between(outs_a, a_promote_seen, a_rolled["updated_at"])
    assert len(on_a2) > 20 and set(on_a2) == {a2}
    after_a = versions_between(outs_a, a_rollback_seen, float("inf"))  # B's switches happen in this window
    assert len(after_a) > 40 and set(after_a) == {a1}
    assert set(versions_between(outs_b, 0.0, a_phase_end)) == {b1}
    on_b2 = versions_between(outs_b, b_promote_seen, b_rolled.updated_at)
    assert len(on_b2) > 20 and set(on_b2) == {b2}
    after_b = versions_between(outs_b, b_rollback_seen, float("inf"))
    assert len(after_b) > 20 and set(after_b) == {b1}
    # every answer equals its version's offline answer (so B's answers come from B's versions)
    enc = OnnxEncoder(encoder_dir, threads=1, spin=False)
    check_offline(outs_a, queries, {p.name: p for p in versions[A]}, enc)
    check_offline(outs_b, queries, {p.name: p for p in versions[B]}, enc)

    # per-collection cutover series, and both live series present at once
    for coll in (A, B):
        assert metric(url, "adawidth_cutovers_total", collection=coll) == 1
        assert metric(url, "adawidth_rollbacks_total", collection=coll) == 1
    assert metric(url, "adawidth_live_version_info", collection=A, version=a1) == 1
    assert metric(url, "adawidth_live_version_info", collection=B, version=b1) == 1
    assert metric(url, "adawidth_index_documents", collection=B) == 5183
    assert [e["action"] for e in reg.history(A)[-3:]] == ["publish", "promote", "rollback"]
    assert [e["action"] for e in reg.history(B)[-3:]] == ["publish", "promote", "rollback"]

    # reload without a collection reconciles every collection (nothing to change now)
    r = httpx.post(f"{url}/admin/reload", headers=ADMIN, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "unchanged", "index_version": a1, "previous_version": a1,
                        "collections": {A: {"status": "unchanged", "index_version": a1, "previous_version": a1},
                                        B: {"status": "unchanged", "index_version": b1, "previous_version": b1}}}
    r = httpx.post(f"{url}/admin/reload", json={"collection": B}, headers=ADMIN, timeout=60)
    assert r.status_code == 200 and r.json() == {"status": "unchanged", "index_version": b1,
                                                 "previous_version": b1, "collection": B}, r.text
