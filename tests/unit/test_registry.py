"""The version registry's state machine and the file registry (compare-and-set under concurrent writers)."""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import pytest

from engine.registry.file import FileRegistry
from engine.registry.state import (RegistryError, RegistryState, apply_promote, apply_publish, apply_rollback,
                                   check_version_name)
from engine.version import store
from tests.hybrid_support import write_synthetic_version


def test_publish_promote_rollback_transitions():
    s = RegistryState("c")
    ch = apply_publish(s, "v1")
    assert ch.state.candidates == ("v1",) and ch.event == {"action": "publish", "version": "v1"}
    assert apply_publish(ch.state, "v1") is None  # idempotent
    s = apply_promote(ch.state).state  # newest candidate
    assert (s.live, s.previous, s.candidates) == ("v1", None, ())
    s = apply_publish(apply_publish(s, "v2").state, "v3").state
    ch = apply_promote(s, "v2", gate={"passed": True})
    assert (ch.state.live, ch.state.previous, ch.state.candidates) == ("v2", "v1", ("v3",))
    assert ch.event == {"action": "promote", "version": "v2", "from": "v1", "gate": {"passed": True}}
    assert apply_promote(ch.state, "v2") is None
    back = apply_rollback(ch.state, "bad")
    assert (back.state.live, back.state.previous) == ("v1", "v2") and back.event["reason"] == "bad"
    assert apply_rollback(back.state).state.live == "v2"  # a second rollback undoes the first


@pytest.mark.parametrize("call,code", [
    (lambda: apply_promote(RegistryState("c")), "unknown_version"),
    (lambda: apply_promote(RegistryState("c", candidates=("a",)), "b"), "unknown_version"),
    (lambda: apply_rollback(RegistryState("c", live="a")), "no_previous"),
    (lambda: apply_publish(RegistryState("c"), "../x"), "invalid_version"),
    (lambda: apply_publish(RegistryState("c"), ".hidden"), "invalid_version"),
    (lambda: check_version_name("a" * 129), "invalid_version"),
])
def test_refused_transitions_have_codes(call, code):
    with pytest.raises(RegistryError) as e:
        call()
    assert e.value.code == code


def _version(coll, name):
    write_synthetic_version(coll.parent, n=8, dim=4, m0=2, shortlist=4, lexical=False, name=name,
                            collection=coll.name)


def test_file_registry_keeps_live_pointer_and_history(tmp_path):
    coll = tmp_path / "c"
    for v in ("v1", "v2"):
        _version(coll, v)
    store.write_live_pointer(coll, "v1")
    reg = FileRegistry(tmp_path)
    assert reg.get("c").live == "v1" and reg.get("c").revision == 0  # adopts the legacy LIVE pointer
    reg.publish("c", "v2", actor="t")
    s = reg.promote("c", "v2")
    assert (s.live, s.previous, s.revision) == ("v2", "v1", 2) and store.read_live_pointer(coll) == "v2"
    s = reg.rollback("c", reason="r")
    assert s.live == "v1" and store.read_live_pointer(coll) == "v1"
    hist = reg.history("c")
    assert [(e["revision"], e["action"]) for e in hist] == [(1, "publish"), (2, "promote"), (3, "rollback")]
    assert hist[0]["actor"] == "t" and json.loads((coll / "REGISTRY.json").read_text())["state"]["revision"] == 3
    reg.report_replica("c", "host:1/x", {"live": "v1", "warm": ["v1", "v2"]})
    assert reg.warm_replicas("c", "v2") == ["host:1/x"] and reg.warm_replicas("c", "v3") == []
    sub = reg.subscribe("c")
    assert sub.wait(0.2) is False
    reg.publish("c", "v3")
    assert sub.wait(1.0) is True


def _writer(root, name, n):
    reg = FileRegistry(root, mirror_live=False)
    for i in range(n):
        reg.publish("race", f"{name}-{i:03d}")
        if i % 4 == 3:
            reg.promote("race", f"{name}-{i - 1:03d}")


def test_two_file_publishers_race_without_losing_anything(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(tmp_path, w, 40)) for w in ("alpha", "beta")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    reg = FileRegistry(tmp_path, mirror_live=False)
    state, hist = reg.get("race"), reg.history("race", 1000)
    assert state.revision == len(hist) == 80 + 20 and [e["revision"] for e in hist] == list(range(1, 101))
    published = {f"{w}-{i:03d}" for w in ("alpha", "beta") for i in range(40)}
    promoted = {f"{w}-{i - 1:03d}" for w in ("alpha", "beta") for i in range(40) if i % 4 == 3}
    assert {e["version"] for e in hist if e["action"] == "publish"} == published
    promos = [e for e in hist if e["action"] == "promote"]
    assert all(b["from"] == a["version"] for a, b in zip(promos, promos[1:]))
    assert set(state.candidates) == published - promoted and state.live == promos[-1]["version"]


class _PinnedVersions:
    """The part of a VersionManager a PinnedLease reads: the collection, the live version, the warm ones."""

    collection = "c"

    def __init__(self, version: str):
        self.live = type("V", (), {"version": version})()

    def warm(self):
        return [self.live.version]


def test_a_pinned_replica_reports_its_lease_and_says_when_it_cannot(tmp_path):
    from engine.registry.state import RegistryUnavailable
    from engine.version.retention import leases
    from service.follower import PinnedLease

    reg = FileRegistry(tmp_path)
    lease = PinnedLease(reg, _PinnedVersions("v1"), "pinned-1", every_s=0.05)
    lease.start()
    try:
        rep = reg.replicas("c")["pinned-1"]
        assert (rep["live"], rep["warm"], rep["pinned"]) == ("v1", ["v1"], True)
        assert leases(reg.replicas("c"), rep["ts"], 60) == {"v1": ["pinned-1"]}
        assert lease.status() == {"registry": "pinned", "lease_registry": "file", "degraded": []}
        first_ts = rep["ts"]
        deadline = time.monotonic() + 30
        while reg.replicas("c")["pinned-1"]["ts"] == first_ts:  # reported again on the next beat
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        lease.stop()

    def down(*a, **kw):
        raise RegistryUnavailable("redis down")

    reg.report_replica = down
    assert lease.report() is False and lease.status()["degraded"] == ["lease not reported: [registry_unavailable] redis down"]
    del reg.report_replica
    assert lease.report() is True and lease.status()["degraded"] == []
    with pytest.raises(ValueError):
        PinnedLease(reg, _PinnedVersions("v1"), "p", every_s=0)
