"""Issue 18: cutting the write-ahead log after a fold.  The file log deletes whole older segments (never the
newest, which its writer appends to) and records the cut point in ``wal/CUT``; readers replay after it and refuse
(WalCut) a replay from before it; the trainer's retention step cuts up to the smallest folded seq of every kept
version, on the file log and on the Redis stream."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.live import LiveCollection
from engine.wal import CUT_FILE, FileWriteLog, WalCorrupt, WalCut, cut_file_log, read_cut, read_log
from engine.wal_redis import RedisWriteLog
from engine.write_logs import log_records
from tests.cutover_support import RedisServer
from trainer import retention as trainer_retention


def upsert(i: int) -> dict:
    return {"op": "upsert", "docs": [{"id": f"d{i}", "title": "", "text": f"text {i}", "fields": {}}]}


def filled(tmp_path: Path, n: int = 12) -> FileWriteLog:
    log = FileWriteLog(tmp_path / "wal", segment_bytes=250)  # about two records a segment
    for i in range(n):
        log.append(upsert(i))
    return log


def firsts(log: FileWriteLog) -> list[int]:
    return [int(p.stem) for p in log.segments()]


def test_a_cut_removes_whole_older_segments_while_the_writer_appends(tmp_path):
    log = filled(tmp_path)
    segs = firsts(log)
    assert len(segs) >= 4 and segs[0] == 1
    # before_seq inside a segment: only the segments wholly <= it go; the cut point is the next one's first - 1
    target = segs[2] + 0  # the first record of the third segment: that segment keeps records > it
    dry = cut_file_log(tmp_path / "wal", target, dry_run=True)
    assert dry["cut_seq"] == segs[2] - 1 and len(dry["removed"]) == 2 and firsts(log) == segs  # nothing deleted
    out = cut_file_log(tmp_path / "wal", target)
    assert out["cut_seq"] == segs[2] - 1 == read_cut(tmp_path / "wal") == log.cut_seq
    assert firsts(log) == segs[2:] and out["bytes_freed"] > 0
    cut = out["cut_seq"]
    # the writer (it holds the lock) goes on appending; readers replay from the cut point
    assert log.append(upsert(99)) == 13
    assert [r["seq"] for r in log.replay(cut)] == list(range(cut + 1, 14))
    assert [r["seq"] for r in read_log(tmp_path / "wal", cut)] == list(range(cut + 1, 14))
    assert [r["seq"] for r in read_log(tmp_path / "wal", 11)] == [12, 13]
    for replay in (lambda a: list(log.replay(a)), lambda a: list(read_log(tmp_path / "wal", a))):
        with pytest.raises(WalCut, match=f"up to seq {cut}"):
            replay(cut - 1)
    # the newest segment is never removed (its writer appends to it), the cut point never lowered
    newest = log.segments()[-1]
    assert cut_file_log(tmp_path / "wal", 10 ** 9)["cut_seq"] == int(newest.stem) - 1 > cut
    assert log.segments() == [newest] and newest.stat().st_size > 0
    assert cut_file_log(tmp_path / "wal", 1)["cut_seq"] == read_cut(tmp_path / "wal") == int(newest.stem) - 1
    assert [r["seq"] for r in log.replay(int(newest.stem) - 1)][-1] == 13
    log.close()
    # a reopened writer accepts a log starting after seq 1 and numbers on
    again = FileWriteLog(tmp_path / "wal", segment_bytes=250)
    assert again.last_seq == 13 and again.append(upsert(100)) == 14
    again.close()


def test_a_missing_segment_without_a_cut_point_is_corrupt(tmp_path):
    log = filled(tmp_path)
    first = log.segments()[0]
    log.close()
    first.unlink()  # lost, not cut: no CUT file says so
    with pytest.raises(WalCorrupt, match="a segment is missing"):
        FileWriteLog(tmp_path / "wal", segment_bytes=250)
    with pytest.raises(WalCorrupt, match="gap"):
        list(read_log(tmp_path / "wal", 0))
    (tmp_path / "wal" / CUT_FILE).write_text("garbage\n")
    with pytest.raises(WalCorrupt, match="not a sequence number"):
        list(read_log(tmp_path / "wal", 0))


def test_a_live_collection_replays_after_the_cut_and_refuses_before_it(tmp_path):
    def enc(texts):
        E = np.random.default_rng(len(texts)).standard_normal((len(texts), 8)).astype(np.float32)
        return E / np.linalg.norm(E, axis=1, keepdims=True)

    log = filled(tmp_path)
    cut = cut_file_log(tmp_path / "wal", 7)["cut_seq"]
    assert 0 < cut <= 7
    live = LiveCollection("c", log, 8, enc)
    assert live.replay(7)["records"] == 5 and live.applied == 12
    assert sorted(live.snapshot().docs) == sorted(f"d{i}" for i in range(7, 12))
    with pytest.raises(WalCut):
        live.replay(cut - 1)  # a rollback to a version the retention would not have kept
    live.close()


def _settings(tmp_path, redis_url=None):
    return SimpleNamespace(index_root=tmp_path / "indexes", redis_url=redis_url, keep_versions=3,
                           lease_fresh_seconds=60)


def _fake_manifests(monkeypatch, folded: dict[str, int | None]):
    def read(path):
        value = folded[Path(path).name]
        if value is None:
            raise ValueError("unreadable")
        return SimpleNamespace(writes=SimpleNamespace(folded_seq=value))

    monkeypatch.setattr(trainer_retention, "read_manifest", read)


def test_retention_cuts_up_to_the_smallest_folded_seq_of_every_kept_version(tmp_path, monkeypatch):
    coll = tmp_path / "indexes" / "c"
    log = FileWriteLog(coll / "wal", segment_bytes=250)
    for i in range(12):
        log.append(upsert(i))
    segs = firsts(log)
    s = _settings(tmp_path)
    _fake_manifests(monkeypatch, {"v1": 0, "v2": 9, "v3": 11, "bad": None})
    # a kept version built from the corpus alone (folded 0) needs the whole log: nothing is cut
    assert trainer_retention.cut_after_retention(s, "c", {"v1": ["previous"], "v3": ["live"]})["before_seq"] == 0
    assert "unreadable" in trainer_retention.cut_after_retention(s, "c", {"bad": ["newest"], "v3": ["live"]})["reason"]
    assert read_cut(coll / "wal") == 0 and firsts(log) == segs
    dry = trainer_retention.cut_after_retention(s, "c", {"v2": ["previous"], "v3": ["live"]}, dry_run=True)
    assert dry["before_seq"] == 9 and dry["dry_run"] and firsts(log) == segs
    out = trainer_retention.cut_after_retention(s, "c", {"v2": ["previous"], "v3": ["live"]})
    assert out["backend"] == "file" and out["before_seq"] == 9 and 0 < out["cut_seq"] <= 9
    assert [r["seq"] for r in log_records("c", 9, redis_url=None, index_root=s.index_root)] == [10, 11, 12]
    log.close()


def test_retention_cuts_the_redis_stream(tmp_path, monkeypatch):
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    try:
        log = RedisWriteLog(srv.url, "c")
        for i in range(10):
            log.append(upsert(i))
        _fake_manifests(monkeypatch, {"v2": 6, "v3": 10})
        out = trainer_retention.cut_after_retention(_settings(tmp_path, srv.url), "c", {"v2": ["previous"],
                                                                                     "v3": ["live"]})
        assert out == {"before_seq": 6, "backend": "redis", "cut_seq": 6, "removed": 6}
        assert [r["seq"] for r in log.replay(6)] == [7, 8, 9, 10]
        with pytest.raises(WalCut):
            list(log.replay(5))
        log.close()
        srv.kill()
        # Redis down: reported, never raised (the versions are already decided)
        down = trainer_retention.cut_after_retention(_settings(tmp_path, srv.url), "c", {"v3": ["live"]})
        assert "WalUnavailable" in down["error"]
    finally:
        srv.kill()


def test_a_log_started_after_a_folded_seq_numbers_on_from_it(tmp_path):
    """Moving a collection between the file log and Redis after a fold: the new log is started at the live
    version's folded seq S by setting its cut point (and, for Redis, its counter) to S (docs/LIVE_DOCUMENTS.md)."""
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / CUT_FILE).write_text("5\n")
    log = FileWriteLog(tmp_path / "wal")
    assert log.last_seq == 5 and log.append(upsert(6)) == 6
    assert [r["seq"] for r in read_log(tmp_path / "wal", 5)] == [6]
    log.close()
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    try:
        import redis
        r = redis.Redis.from_url(srv.url)
        r.set("adawidth:wal:c:seq", 5), r.set("adawidth:wal:c:cut", 5)
        rlog = RedisWriteLog(srv.url, "c")
        assert rlog.last_seq == 5 and rlog.append(upsert(6)) == 6
        assert [x["seq"] for x in rlog.replay(5)] == [6]
        with pytest.raises(WalCut):
            list(rlog.replay(0))
        rlog.close()
    finally:
        srv.kill()
