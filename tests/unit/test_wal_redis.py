"""Issue 18: the write-ahead log in a Redis stream, against a real redis-server of the test's own (it fails,
never skips, when redis-server is missing): sequence numbers, replay pages, the durability check, a Redis
killed with -9 and restarted, two writers sharing one log, the cut, and LiveCollection following a shared log."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis

from engine import wal_redis
from engine.live import LiveCollection
from engine.wal import WalCorrupt, WalCut, WalUnavailable, decode_record, encode_record
from engine.wal_redis import RedisWriteLog
from engine.write_logs import cut_log, log_records, open_write_log
from tests.cutover_support import RedisServer


def upsert(i: int, text: str | None = None) -> dict:
    return {"op": "upsert", "docs": [{"id": f"d{i}", "title": "", "text": text or f"text {i} é", "fields": {}}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("wal-redis"))
    srv.start()
    yield srv
    srv.kill()


_names = iter(range(10 ** 6))


@pytest.fixture
def name():
    """A fresh collection name per test (the server is shared by the module)."""
    return f"walc{next(_names)}"


def test_appends_get_gapless_numbers_and_replay_pages_through_xrange(server, name, monkeypatch):
    monkeypatch.setattr(wal_redis, "PAGE", 3)
    log = RedisWriteLog(server.url, name)
    assert log.shared and log.last_seq == 0 and list(log.replay(0)) == []
    seqs = [log.append(upsert(i)) for i in range(10)]
    assert seqs == list(range(1, 11)) and log.last_seq == 10
    assert [r["seq"] for r in log.replay(0)] == list(range(1, 11))
    assert [r["seq"] for r in log.replay(4)] == list(range(5, 11))
    assert [r["seq"] for r in log.replay(4, until=7)] == [5, 6, 7]
    rec = next(log.replay(2))
    assert rec["docs"][0]["text"] == "text 2 é" and rec["op"] == "upsert"
    # the entry is the log line of the file log (crc included), without seq: the entry id is the seq
    raw = redis.Redis.from_url(server.url).xrange(f"adawidth:wal:{name}", count=1)
    (eid, fields), = raw
    assert eid == b"1-0" and decode_record(fields[b"rec"], seq=1)["seq"] == 1
    assert decode_record(fields[b"rec"], seq=2)["seq"] == 2  # decoded with the id it is stored under
    assert log_records(name, 8, redis_url=server.url, index_root="/nonexistent") == list(log.replay(8))
    log.close()


def test_a_corrupt_entry_or_a_gap_is_refused(server, name):
    log = RedisWriteLog(server.url, name)
    for i in range(3):
        log.append(upsert(i))
    r = redis.Redis.from_url(server.url)
    line = r.xrange(f"adawidth:wal:{name}", min="2-0", max="2-0")[0][1][b"rec"]
    r.xdel(f"adawidth:wal:{name}", "2-0")
    with pytest.raises(WalCorrupt, match="record 2 is missing"):
        list(log.replay(0))
    bad = f"{name}x"  # a stream whose second entry fails its crc
    r.xadd(f"adawidth:wal:{bad}", {"rec": encode_record(upsert(0))}, id="1-0")
    r.xadd(f"adawidth:wal:{bad}", {"rec": line.replace(b"text 1", b"text X")}, id="2-0")
    r.set(f"adawidth:wal:{bad}:seq", 2)
    with pytest.raises(WalCorrupt, match="entry 2-0 is unreadable"):
        list(RedisWriteLog(server.url, bad).replay(0))
    # a lost counter with the stream still there is never numbered from 1 again
    r.delete(f"adawidth:wal:{name}:seq")
    with pytest.raises(WalCorrupt, match="counter missing"):
        log.append(upsert(9))
    log.close()


def test_two_writers_share_one_ordering_point(server, name):
    logs = [RedisWriteLog(server.url, name) for _ in range(2)]
    got: list[list[int]] = [[], []]

    def write(k):
        for i in range(50):
            got[k].append(logs[k].append(upsert(1000 * k + i)))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got[0] + got[1]) == list(range(1, 101)) and not set(got[0]) & set(got[1])
    assert all(a < b for a, b in zip(got[0], got[0][1:]))  # each writer's records in its own order
    ids = {r["seq"]: r["docs"][0]["id"] for r in logs[1].replay(0)}
    assert all(ids[s] == f"d{i}" for i, s in enumerate(got[0]))
    for log in logs:
        log.close()


def test_a_redis_without_fsync_per_write_is_refused_or_warned(server, name, caplog):
    r = redis.Redis.from_url(server.url)
    r.config_set("appendfsync", "everysec")
    try:
        with pytest.raises(WalUnavailable, match="appendfsync='everysec'"):
            RedisWriteLog(server.url, name)
        with pytest.raises(WalUnavailable):
            open_write_log(name, redis_url=server.url, index_root="/nonexistent")
        relaxed = RedisWriteLog(server.url, name, require_fsync=False)
        assert "appending anyway" in caplog.text and relaxed.append(upsert(1)) == 1
        relaxed.close()
        reader = RedisWriteLog(server.url, name, check_durability=False)  # the trainer only reads: no check
        assert [x["seq"] for x in reader.replay(0)] == [1]
        reader.close()
    finally:
        r.config_set("appendfsync", "always")
    # a writer re-checks: switched off while it runs, its next append (after the recheck interval) is refused
    log = RedisWriteLog(server.url, name)
    assert log.durability["appendonly"] == "yes" and log.durability["problem"] is None
    r.config_set("appendonly", "no")
    try:
        log._checked_at = float("-inf")
        with pytest.raises(WalUnavailable, match="appendonly='no'"):
            log.append(upsert(2))
    finally:
        r.config_set("appendonly", "yes")
    log._checked_at = float("-inf")
    assert log.append(upsert(2)) == 2
    log.close()


def test_unreachable_redis_is_unavailable(tmp_path):
    dead = RedisServer(tmp_path / "dead")  # never started: nothing listens on its port
    with pytest.raises(WalUnavailable, match="unreachable"):
        RedisWriteLog(dead.url, "c", socket_timeout_s=0.5)


def test_a_redis_killed_and_restarted_keeps_every_acknowledged_record(tmp_path):
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    try:
        log = RedisWriteLog(srv.url, "crash", socket_timeout_s=1.0)
        acked = [log.append(upsert(i)) for i in range(20)]
        srv.kill()  # SIGKILL: only the append-only file (fsync per write) survives
        with pytest.raises(WalUnavailable):
            log.append(upsert(99))
        with pytest.raises(WalUnavailable):
            _ = log.last_seq
        srv.start()  # same port, same directory
        assert log.last_seq == acked[-1] == 20  # the same object reconnects
        assert [r["seq"] for r in log.replay(0)] == acked
        assert log.append(upsert(20)) == 21
        log.close()
    finally:
        srv.kill()


def test_the_cut_trims_up_to_a_seq_and_a_replay_from_before_it_is_refused(server, name):
    log = RedisWriteLog(server.url, name)
    for i in range(10):
        log.append(upsert(i))
    assert cut_log(name, 4, redis_url=server.url, index_root="/x", dry_run=True) == {
        "backend": "redis", "cut_seq": 4, "removed": 4, "dry_run": True}
    assert log.cut_seq == 0
    assert cut_log(name, 4, redis_url=server.url, index_root="/x") == {"backend": "redis", "cut_seq": 4, "removed": 4}
    assert log.cut_seq == 4 and log.last_seq == 10
    assert redis.Redis.from_url(server.url).xlen(f"adawidth:wal:{name}") == 6
    assert [r["seq"] for r in log.replay(4)] == list(range(5, 11))
    with pytest.raises(WalCut, match="up to seq 4"):
        list(log.replay(3))
    assert log.cut(2) == 4  # never lowered
    assert log.cut(50) == 10  # never beyond the last record
    assert list(log.replay(10)) == [] and log.append(upsert(11)) == 11
    assert [r["seq"] for r in log.replay(10)] == [11]
    log.close()


class FakeEncoder:
    def __init__(self, d):
        self.d, self.texts = d, []

    def __call__(self, texts):
        self.texts += list(texts)
        out = np.zeros((len(texts), self.d), np.float32)
        for i, t in enumerate(texts):
            out[i] = np.random.default_rng(abs(hash(t)) % 2 ** 32).standard_normal(self.d)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_two_live_collections_on_one_stream_hold_each_others_writes(server, name):
    enc = FakeEncoder(8)
    a = LiveCollection(name, RedisWriteLog(server.url, name), 8, enc, fingerprint="enc")
    b = LiveCollection(name, RedisWriteLog(server.url, name), 8, enc, fingerprint="enc")
    a.replay(0), b.replay(0)
    s1 = a.upsert(upsert(1)["docs"])
    s2 = b.upsert([{"id": "e", "title": "", "text": "two", "fields": {}}])  # b applies a's record first
    assert (s1, s2) == (1, 2) and b.applied == 2 and sorted(b.snapshot().docs) == ["d1", "e"]
    assert a.log.follow(a.applied, 0.05) and not b.log.follow(b.applied, 0.05)
    enc.texts.clear()
    assert a.catch_up() == 1 and enc.texts == []  # the logged embedding is used, nothing encoded
    assert np.array_equal(a.snapshot().embeddings[a.snapshot().ids.index("e")],
                          b.snapshot().embeddings[b.snapshot().ids.index("e")])
    b.delete(["d1"])
    a.catch_up()
    for live in (a, b):
        assert sorted(live.snapshot().docs) == ["e"] and set(live.snapshot().deleted) == {"d1"}
        assert live.status()["last_accepted_seq"] == 3 and live.status()["applied_seq"] == 3
    # a follower behind a fold that went live skips what the version folded
    a.log.append(upsert(7))
    a.advance(4)
    assert a.applied == 4 and a.catch_up() == 0 and "d7" not in a.snapshot().docs
    a.close(), b.close()


def test_waitaof_runs_on_the_appends_connection_where_the_server_has_it(server, name):
    log = RedisWriteLog(server.url, name)
    version = redis.Redis.from_url(server.url).info("server")["redis_version"]
    assert log.durability["waitaof"] == (tuple(int(x) for x in version.split(".")[:2]) >= (7, 2))
    if log.durability["waitaof"]:
        assert log.append(upsert(1)) == 1  # WAITAOF 1 0 confirmed the local append-only file
    else:
        # this server (< 7.2) has no WAITAOF: forced on, the append still goes through the one pipeline and is
        # then refused, since the fsync cannot be confirmed
        log._waitaof = True
        with pytest.raises(WalUnavailable, match="record 1 written, but WAITAOF failed"):
            log.append(upsert(1))
        assert log.last_seq == 1
    log.close()
