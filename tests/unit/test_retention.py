"""Version retention (engine.version.retention): the pure rule keeps live, previous, candidates, the newest
keep_last and every leased version and deletes the rest oldest first; deletion renames to .trash- first; the
disk check refuses a version that does not fit."""

from __future__ import annotations

import json

import pytest

from engine.registry.state import RegistryState
from engine.version import retention
from engine.version.retention import (DiskSpaceError, apply_retention, check_free_space, decide, delete_version,
                                      estimate_version_bytes, leases)
from engine.version.store import list_versions

V = [f"2026010{i}T000000Z-aaaaaaaa" for i in range(1, 10)]  # oldest first


def state(**kw) -> RegistryState:
    return RegistryState(collection="c", **kw)


def test_live_previous_candidates_and_newest_are_kept_the_rest_deleted_oldest_first():
    plan = decide(V, state(live=V[2], previous=V[1], candidates=(V[4],)), {}, keep_last=2)
    assert plan.kept == {V[1]: ["previous"], V[2]: ["live"], V[4]: ["candidate"], V[7]: ["newest"],
                         V[8]: ["newest"]}
    assert plan.deleted == [V[0], V[3], V[5], V[6]]


def test_a_leased_old_version_survives():
    plan = decide(V, state(live=V[8], previous=V[7]), {V[0]: ["replica-a"]}, keep_last=1)
    assert plan.kept[V[0]] == ["leased:replica-a"]
    assert V[0] not in plan.deleted
    assert plan.deleted == V[1:7]


def test_reasons_accumulate_and_names_not_on_disk_are_ignored():
    plan = decide(V[:3], state(live=V[2], previous="gone", candidates=("also-gone",)), {V[2]: ["r1", "r2"]}, 3)
    assert plan.kept[V[2]] == ["live", "newest", "leased:r1", "leased:r2"]
    assert plan.deleted == []


def test_no_registry_state_keeps_only_newest_and_leases():
    plan = decide(V, None, {}, keep_last=3)
    assert list(plan.kept) == V[-3:] and plan.deleted == V[:-3]
    assert decide(V, None, {}, keep_last=0).deleted == V


def test_leases_come_from_fresh_reports_naming_live_or_warm():
    reports = {"a": {"live": V[0], "warm": [V[1]], "ts": 100.0},
               "b": {"live": V[2], "warm": [], "ts": 100.0 - 61},      # stale: no lease
               "c": {"live": None, "warm": [V[1]], "ts": 99.0}}
    assert leases(reports, now=100.0, fresh_s=60) == {V[0]: ["a"], V[1]: ["a", "c"]}


def _version(coll, name, size=1000):
    d = coll / name
    d.mkdir(parents=True)
    (d / "docs.npy").write_bytes(b"x" * size)
    (d / "manifest.json").write_text(json.dumps({"version": name}))


def test_apply_deletes_atomically_and_cleans_trash(tmp_path):
    coll = tmp_path / "c"
    for v in V:
        _version(coll, v)
    (coll / ".trash-old").mkdir()  # a crash between rename and rmtree
    (coll / ".tmp-draft").mkdir()  # a build's draft is not ours to touch
    dry = apply_retention(coll, state(live=V[8]), {}, keep_last=2, lease_fresh_s=60, dry_run=True)
    assert dry["deleted"] == V[:7] and list_versions(coll) == V and dry["bytes_freed"] > 7000
    rep = apply_retention(coll, state(live=V[8]), {"r": {"live": V[0], "warm": [], "ts": 1e12}}, keep_last=2,
                          lease_fresh_s=60, now=1e12)
    assert rep["deleted"] == V[1:7] and rep["trash_removed"] == [".trash-old"]
    assert list_versions(coll) == [V[0], V[7], V[8]]
    assert sorted(p.name for p in coll.iterdir() if p.name.startswith(".")) == [".tmp-draft"]
    assert rep["bytes_on_disk"] == retention.collection_bytes(coll)
    assert delete_version(coll, V[1]) is False  # already gone


def test_a_version_is_never_half_visible(tmp_path, monkeypatch):
    coll = tmp_path / "c"
    _version(coll, V[0])

    def crash(path, ignore_errors=False):
        raise KeyboardInterrupt  # killed between the rename and the removal
    monkeypatch.setattr(retention.shutil, "rmtree", crash)
    with pytest.raises(KeyboardInterrupt):
        delete_version(coll, V[0])
    assert list_versions(coll) == [] and (coll / f".trash-{V[0]}").is_dir()


def test_estimate_and_disk_check():
    assert estimate_version_bytes(documents=200, live_bytes=1000, live_documents=100, dimension=384) == 2000
    assert estimate_version_bytes(documents=10, live_bytes=None, live_documents=None, dimension=384) == 2 * 10 * 384 * 4
    assert check_free_space("/x", 100, 10, free_bytes=lambda p: 110) == 110
    with pytest.raises(DiskSpaceError, match=r"needs about 100 bytes, 109 bytes are free") as e:
        check_free_space("/x", 100, 10, free_bytes=lambda p: 109)
    assert (e.value.needed, e.value.free, e.value.margin) == (100, 109, 10)
    assert isinstance(e.value, ValueError)
