"""Issue 18 units: the write-ahead log's format and recovery, the delta segment, and the merge stage."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from engine.delta import DeltaSegment
from engine.index import IndexVersion
from engine.live import DegenerateDocument, LiveCollection
from engine.pipeline import Pipeline, capabilities
from engine.plan import PlanDefaults, SearchSpec, resolve_plan
from engine.stages.delta import delta_applies, merge_delta
from engine.stages.render import Result
from engine.wal import FileWriteLog, WalCorrupt, WalLocked, decode_record, encode_record, unpack_embeddings


def upsert(i: int) -> dict:
    return {"op": "upsert", "docs": [{"id": f"d{i}", "title": "", "text": f"text {i} é", "fields": {}}]}


def test_a_record_round_trips_and_every_corruption_is_detected():
    line = encode_record({"seq": 3, **upsert(3)})
    assert line.endswith(b"\n") and decode_record(line)["docs"][0]["text"] == "text 3 é"
    for bad in (line[:-5], line[:10], line.replace(b"text 3", b"text 4"), b"", b"{}\n", b"garbage\n"):
        assert decode_record(bad) is None


def test_appends_are_numbered_and_replayed_after_a_sequence_number(tmp_path):
    log = FileWriteLog(tmp_path / "wal", segment_bytes=300)
    seqs = [log.append(upsert(i)) for i in range(10)]
    assert seqs == list(range(1, 11)) and log.last_seq == 10
    assert len(log.segments()) > 1  # rolled over
    assert [r["seq"] for r in log.replay(4)] == list(range(5, 11))
    log.close()
    again = FileWriteLog(tmp_path / "wal", segment_bytes=300)
    assert again.last_seq == 10 and [r["docs"][0]["id"] for r in again.replay(0)] == [f"d{i}" for i in range(10)]
    assert again.append(upsert(10)) == 11
    again.close()


def test_one_writer_at_a_time(tmp_path):
    log = FileWriteLog(tmp_path / "wal")
    with pytest.raises(WalLocked):
        FileWriteLog(tmp_path / "wal")
    log.close()
    FileWriteLog(tmp_path / "wal").close()


@pytest.mark.parametrize("cut", [1, 7, -2])
def test_a_torn_last_record_is_dropped_and_the_log_goes_on(tmp_path, cut, caplog):
    log = FileWriteLog(tmp_path / "wal")
    for i in range(3):
        log.append(upsert(i))
    log.close()
    seg = sorted((tmp_path / "wal").glob("*.jsonl"))[-1]
    data = seg.read_bytes()
    last = data[:-1].rfind(b"\n") + 1
    torn = data[:last + (cut if cut > 0 else len(data) - last + cut)]  # part of record 3
    seg.write_bytes(torn)
    with caplog.at_level(logging.WARNING, logger="engine.wal"):
        log = FileWriteLog(tmp_path / "wal")
    assert log.last_seq == 2
    # said, and the dropped bytes kept beside the segment (not read as one)
    assert any("dropped an unreadable last record after record 2" in r.getMessage() for r in caplog.records)
    assert (seg.parent / f"{seg.name}.torn-{last}").read_bytes() == torn[last:]
    assert seg.read_bytes() == data[:last]
    assert log.append(upsert(9)) == 3
    assert [r["docs"][0]["id"] for r in log.replay(0)] == ["d0", "d1", "d9"]
    log.close()


def test_a_bad_record_before_the_last_is_refused(tmp_path):
    log = FileWriteLog(tmp_path / "wal")
    for i in range(3):
        log.append(upsert(i))
    log.close()
    seg = sorted((tmp_path / "wal").glob("*.jsonl"))[-1]
    seg.write_bytes(seg.read_bytes().replace(b"text 1", b"text X"))
    with pytest.raises(WalCorrupt):
        FileWriteLog(tmp_path / "wal")


def unit(rng, n, d):
    X = rng.standard_normal((n, d)).astype(np.float32)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def test_the_latest_write_of_an_id_wins_and_snapshots_do_not_change():
    rng = np.random.default_rng(0)
    seg = DeltaSegment(8)
    E = unit(rng, 3, 8)
    seg.upsert(1, [{"id": "a"}, {"id": "b"}, {"id": "c"}], E)
    before = seg.snapshot()
    seg.delete(2, ["b", "x"])
    seg.upsert(3, [{"id": "a", "v": 2}], E[2:3])
    after = seg.snapshot()
    assert before.ids == ["a", "b", "c"] and np.allclose(before.embeddings, E)
    assert sorted(after.ids) == ["a", "c"] and after.docs["a"].doc == {"id": "a", "v": 2} and after.docs["a"].seq == 3
    assert set(after.deleted) == {"b", "x"} and after.overridden == {"a", "b", "c", "x"}
    for _ in range(100):  # compaction keeps the live rows
        seg.upsert(4, [{"id": "a"}], E[:1])
    snap = seg.snapshot()
    assert sorted(snap.ids) == ["a", "c"] and np.allclose(snap.embeddings[snap.ids.index("a")], E[0])


class FakeEncoder:
    def __init__(self, d):
        self.d = d

    def __call__(self, texts):
        out = np.zeros((len(texts), self.d), np.float32)
        for i, t in enumerate(texts):
            out[i] = np.random.default_rng(abs(hash(t)) % 2 ** 32).standard_normal(self.d)
            out[i] /= np.linalg.norm(out[i]) if t != "zero" else np.inf
        return out


def test_replay_rebuilds_the_segment_from_the_log(tmp_path):
    enc = FakeEncoder(8)
    live = LiveCollection("c", FileWriteLog(tmp_path / "wal"), 8, enc)
    live.upsert([{"id": "a", "title": "", "text": "one", "fields": {}}])
    live.upsert([{"id": "b", "title": "T", "text": "two", "fields": {}}, {"id": "a", "title": "", "text": "uno",
                                                                      "fields": {}}])
    live.delete(["b", "v1"])
    with pytest.raises(DegenerateDocument):
        live.upsert([{"id": "z", "title": "", "text": "zero", "fields": {}}])
    assert live.log.last_seq == 3  # the degenerate batch was not written
    before = live.snapshot()
    live.log.close()
    again = LiveCollection("c", FileWriteLog(tmp_path / "wal"), 8, enc)
    assert again.replay(0) == {"records": 3, "upserts": 1, "deletes": 2, "encoded": 1, "reused_embeddings": 0}
    snap = again.snapshot()
    assert snap.ids == ["a"] and snap.docs["a"].doc["text"] == "uno" and set(snap.deleted) == {"b", "v1"}
    assert np.allclose(snap.embeddings, before.embeddings)
    assert again.replay(2) == {"records": 1, "upserts": 0, "deletes": 2, "encoded": 0, "reused_embeddings": 0}
    again.close()


class CountingEncoder(FakeEncoder):
    def __init__(self, d):
        super().__init__(d)
        self.texts = []

    def __call__(self, texts):
        self.texts += list(texts)
        return super().__call__(texts)


def test_a_replay_reads_the_logged_embeddings_of_the_same_encoder_and_encodes_only_the_others(tmp_path):
    enc = CountingEncoder(8)
    live = LiveCollection("c", FileWriteLog(tmp_path / "wal"), 8, enc, fingerprint="enc-A")
    live.upsert([{"id": "a", "title": "", "text": "one", "fields": {}}, {"id": "b", "title": "", "text": "two",
                                                                      "fields": {}}])
    rec = next(live.log.replay(0))
    assert unpack_embeddings(rec, "enc-A", 8).shape == (2, 8)
    assert unpack_embeddings(rec, "enc-B", 8) is None and unpack_embeddings(rec, "enc-A", 9) is None
    # a record written before embeddings were logged
    live.log.append({"op": "upsert", "docs": [{"id": "c", "title": "", "text": "three", "fields": {}}]})
    before = {i: live.snapshot().embeddings[k] for k, i in enumerate(live.snapshot().ids)}
    live.close()
    enc.texts.clear()
    again = LiveCollection("c", FileWriteLog(tmp_path / "wal"), 8, enc, fingerprint="enc-A")
    counts = again.replay(0)
    assert counts["reused_embeddings"] == 2 and counts["encoded"] == 1 and enc.texts == ["three"]
    snap = again.snapshot()
    for k, i in enumerate(snap.ids):
        if i in before:
            assert np.array_equal(snap.embeddings[k], before[i])  # bit-identical: read back, not re-encoded
    again.close()
    # another encoder (a new export): every logged embedding is stale and encoded again
    enc.texts.clear()
    other = LiveCollection("c", FileWriteLog(tmp_path / "wal"), 8, enc, fingerprint="enc-B")
    assert other.replay(0)["encoded"] == 3 and sorted(enc.texts) == ["one", "three", "two"]
    other.close()


@pytest.mark.parametrize("width", ["full", 32, 8])
def test_the_merge_is_the_exact_top_k_of_the_masked_version_and_the_delta(width):
    rng = np.random.default_rng(1)
    D, N = 48, 200
    X = unit(rng, N, D)
    R, _ = np.linalg.qr(rng.standard_normal((D, D)))
    R = R.astype(np.float32)
    ids = [f"v{i}" for i in range(N)]
    version = IndexVersion.in_memory(X @ R.T, R, ids, m0=16, shortlist=N)
    seg = DeltaSegment(D)
    new = unit(rng, 5, D)
    seg.upsert(1, [{"id": f"n{i}"} for i in range(5)] + [{"id": "v3"}], np.vstack([new, X[3:4]]))
    seg.delete(2, ["v0", "v1", "v2"])
    snap = seg.snapshot()
    q = unit(rng, 1, D)[0]
    plan = resolve_plan(SearchSpec(query="q", k=10, width=width), PlanDefaults(), capabilities(version))
    res = Pipeline().run([plan], version, embeddings=q[None, :], allowed=snap.allowed(version))[0]
    merged = merge_delta(plan, version, res, snap)
    assert len(merged.ids) == 10 and not {"v0", "v1", "v2"} & set(merged.ids)
    assert merged.ids.count("v3") <= 1
    # the reference: every document that exists, scored the version's way at the trace's width
    w = res.trace["width"]
    docs = {i: X[int(i[1:])] for i in ids if i not in snap.overridden}
    docs.update({f"n{i}": new[i] for i in range(5)}, v3=X[3])
    qr = R @ q
    def score(x):
        xr = R @ x
        return float(qr[:w] @ xr[:w] / np.linalg.norm(qr[:w]) / np.linalg.norm(xr[:w]))
    ref = sorted(docs, key=lambda i: -score(docs[i]))[:10]
    assert merged.ids == ref
    assert np.allclose(merged.scores, [score(docs[i]) for i in ref], atol=1e-5)


def test_restricted_lexical_and_cars_searches_take_no_delta_documents():
    res = Result(np.zeros(0, np.int64), [], np.zeros(0), {"tier": "mips"}, np.ones(4, np.float32))
    plain = SimpleNamespace(manifest=SimpleNamespace(cars=None))
    cars = SimpleNamespace(manifest=SimpleNamespace(cars={"kind": "shared"}))
    dense = resolve_plan(SearchSpec(query="q", k=3, width="full"), PlanDefaults(),
                         capabilities(IndexVersion.in_memory(np.eye(4, dtype=np.float32), np.eye(4, dtype=np.float32),
                                                             list("abcd"), m0=2, shortlist=4)))
    assert delta_applies(dense, res, plain) and not delta_applies(dense, res, cars)
    assert not delta_applies(dense, Result(res.rows, [], res.scores, {"tier": "maxsim"}, res.embedding), plain)
    assert not delta_applies(dense, Result(res.rows, [], res.scores, {"tier": "mips"}, None), plain)
