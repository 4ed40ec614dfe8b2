"""Version retention over real files (issue 18 item 6): one SciFact version built by the trainer, then 20
copies of it registered through the registry (published and promoted, as consecutive folds would), retention run
after each.  The version directories stay bounded (keep_versions + live/previous + leased), a version an old
replica leases is kept and still loads, ``trainer retention`` reports as JSON, the daemon's gauge counts the
bytes, and a build that would not fit on the disk exits 2 naming the bytes.

With a real lease: a gateway process pinned (``ADAWIDTH_VERSION``) to the oldest version reports it to the
registry; ``python -m trainer retention`` runs while that gateway answers searches in a loop; every search before,
during and after it succeeds on the pinned version with the answers that version gives offline, the leased
directory stays, the unleased old ones go, and once the replica is gone and its report stale the old version
goes too."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry

from engine.index import IndexVersion
from engine.registry import open_registry
from engine.version import retention, store
from engine.version.retention import DiskSpaceError, collection_bytes
from tests.conftest import ROOT, SCIFACT, VAR, build_home
from tests.cutover_support import (LoadGenerator, check_offline, judged_test_queries, readyz, start_gateways,
                                   trainer_cli)
from tests.live_support import fold_env
from trainer import cli
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.retention import run_retention
from trainer.serve import TrainerMetrics

pytestmark = pytest.mark.integration

COPIES = 20
KEEP = 3


@pytest.fixture(scope="module")
def home(tmp_path_factory, encoder_dir, encoder):
    return build_home(tmp_path_factory.mktemp("retention-home"), encoder_dir, encoder, rotation="pca", capacity=False)


def settings_of(home) -> TrainerSettings:
    return TrainerSettings(home=home, redis_url=None, keep_versions=KEEP,
                           embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()


def test_disk_stays_bounded_over_20_versions_and_a_leased_version_survives(home):
    settings = settings_of(home)
    coll = home / "indexes" / "scifact"
    registry = open_registry(redis_url=None, index_root=settings.index_root)
    first = registry.get("scifact").live
    assert store.list_versions(coll) == [first]
    t0 = dt.datetime.now(dt.timezone.utc)
    made = []
    for i in range(COPIES):
        # an old replica keeps serving the first version and keeps reporting it
        registry.report_replica("scifact", "old-replica", {"live": first, "warm": [], "refused": {}})
        name = store.new_version_id(f"{i:08x}", t0 + dt.timedelta(minutes=i + 1))
        shutil.copytree(coll / first, coll / name)
        made.append(name)
        registry.publish("scifact", name, actor="test")
        registry.promote("scifact", name, actor="test")
        report = run_retention(settings, "scifact")
        on_disk = store.list_versions(coll)
        assert len(on_disk) <= KEEP + 2 + 1, on_disk
        assert first in on_disk and "leased:old-replica" in report["kept"][first]
        assert name in on_disk and made[-2:] == [v for v in on_disk if v in made[-2:]]
        assert not [p for p in coll.iterdir() if p.name.startswith(".trash-")]
    state = registry.get("scifact")
    assert store.list_versions(coll) == sorted([first, *made[-KEEP:]])
    assert (state.live, state.previous) == (made[-1], made[-2])
    IndexVersion.load(coll / first)  # the leased version is whole

    # a candidate is kept however old; the dry run deletes nothing and says why each version is kept
    registry.publish("scifact", made[-KEEP], actor="test")  # already on disk: now also a candidate
    r = subprocess.run([sys.executable, "-m", "trainer", "retention", "--collection", "scifact", "--dry-run"],
                       cwd=ROOT, env=dict(fold_env(home), ADAWIDTH_KEEP_VERSIONS="1"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    assert dry["dry_run"] and dry["keep_last"] == 1 and dry["deleted"] == []
    assert dry["kept"][made[-KEEP]] == ["candidate"] and dry["kept"][made[-1]] == ["live", "newest"]
    assert dry["kept"][made[-2]] == ["previous"]

    # the lease expires (no fresh report): the old version goes
    registry.report_replica("scifact", "old-replica", {"live": made[-1], "warm": [], "refused": {}})
    report = run_retention(settings_of(home).model_copy(update={"keep_versions": 1}), "scifact")
    assert report["deleted"] == [first]
    assert store.list_versions(coll) == made[-KEEP:]

    metrics = TrainerMetrics(CollectorRegistry())
    assert metrics.export_disk("scifact", coll) == collection_bytes(coll) > 0
    assert metrics.registry.get_sample_value("adawidth_index_bytes_on_disk", {"collection": "scifact"}) == \
        collection_bytes(coll)
    registry.close()


def test_a_build_that_does_not_fit_is_refused(home, encoder, monkeypatch, capsys):
    settings = settings_of(home)
    before = store.list_versions(home / "indexes" / "scifact")
    with pytest.raises(DiskSpaceError) as e:
        build_index(BuildOptions(dataset=SCIFACT, rotation="pca", capacity=False, free_bytes=lambda p: 10_000),
                    settings, encoder)
    assert e.value.free == 10_000 and e.value.needed > 10_000
    # the CLI: exit 2 with the bytes needed and free
    monkeypatch.setattr(retention, "free_disk_bytes", lambda p: 12_345)
    monkeypatch.setenv("ADAWIDTH_EMBEDDING_CACHE", str(VAR / "cache" / "embeddings.sqlite"))
    monkeypatch.setenv("ADAWIDTH_ENCODER_THREADS", "1")
    for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["--home", str(home), "build", "--dataset", str(SCIFACT), "--rotation", "pca",
                     "--no-capacity"]) == 2
    err = capsys.readouterr().err
    assert "not enough disk space" in err and "12,345 bytes are free" in err and "needs about" in err
    assert store.list_versions(home / "indexes" / "scifact") == before


def publish_copies(registry, coll, first: str, n: int) -> list[str]:
    """``n`` newer copies of version ``first`` (as consecutive folds would write), each published and promoted."""
    t0 = dt.datetime.now(dt.timezone.utc)
    made = []
    for i in range(n):
        name = store.new_version_id(f"{i:08x}", t0 + dt.timedelta(minutes=i + 1))
        shutil.copytree(coll / first, coll / name)
        registry.publish("scifact", name, actor="test")
        registry.promote("scifact", name, actor="test")
        made.append(name)
    return made


@pytest.fixture(scope="module")
def lease_home(tmp_path_factory, encoder_dir, encoder):
    return build_home(tmp_path_factory.mktemp("lease-home"), encoder_dir, encoder, rotation="pca", capacity=False,
                      eval_split=None)


def test_a_pinned_replica_keeps_serving_its_leased_version_while_retention_runs(lease_home, encoder):
    home, replica = lease_home, "pinned-old"
    coll = home / "indexes" / "scifact"
    registry = open_registry(redis_url=None, index_root=home / "indexes")
    first = registry.get("scifact").live
    made = publish_copies(registry, coll, first, 5)  # live made[-1], previous made[-2]; made[:3] unleased
    (gw,) = start_gateways(home, None, [replica], ADAWIDTH_VERSION=first)
    queries = judged_test_queries(8)
    load = LoadGenerator([gw.url], queries, concurrency=3)
    load.start()
    try:
        # the pinned replica reports its version (its lease) before it reports ready
        rep = registry.replicas("scifact").get(replica)
        assert rep is not None and rep["live"] == first and rep["pinned"] is True and first in rep["warm"], rep
        code, body = readyz(gw.url)
        assert code == 200 and body["index_version"] == first and body["status"] == "ready"
        load.wait_for(30)
        started = time.time()
        r = trainer_cli(home, None, "retention", "--collection", "scifact", timeout_s=120,
                        extra_env={"ADAWIDTH_KEEP_VERSIONS": "1"})
        ended = time.time()
        assert r.returncode == 0, r.stderr
        load.wait_for(load.count + 30)  # and it goes on serving after
    finally:
        load.stop()
        gw.stop()
    report = json.loads(r.stdout)
    assert report["deleted"] == made[:3]
    assert report["kept"] == {first: [f"leased:{replica}"], made[3]: ["previous"], made[4]: ["live", "newest"]}
    assert store.list_versions(coll) == [first, *made[3:]]
    assert not [p for p in coll.iterdir() if p.name.startswith(".trash-")]
    IndexVersion.load(coll / first)  # the leased version is whole on disk

    bad = [o for o in load.outcomes if o.status != 200 or o.version != first]
    assert not bad, bad[:3]
    during = [o for o in load.outcomes if o.started_at >= started and o.done_at <= ended]
    after = [o for o in load.outcomes if o.started_at > ended]
    assert during and len(after) >= 30, (len(during), len(after))
    check_offline(load.outcomes, queries, {first: coll / first}, encoder)

    # the replica is gone: once its report is older than lease_fresh_seconds its version is deleted too
    time.sleep(1.5)
    r = trainer_cli(home, None, "retention", "--collection", "scifact", timeout_s=120,
                    extra_env={"ADAWIDTH_KEEP_VERSIONS": "1", "ADAWIDTH_LEASE_FRESH_SECONDS": "1"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["deleted"] == [first]
    assert store.list_versions(coll) == made[3:]
    registry.close()
