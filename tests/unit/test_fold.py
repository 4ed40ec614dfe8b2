"""Issue 18 phase 2 units: the lock-free log reader, the fold's corpus, the segment's advance past a fold, the
build lock and its stale-draft cleanup, and the manifest's writes section."""

from __future__ import annotations

import numpy as np
import pytest

from engine.io.beir import Document
from engine.live import LiveCollection, manifest_folded_seq
from engine.version.manifest import Manifest, WritesSection
from engine.version.store import BuildLocked, build_lock
from engine.wal import FileWriteLog, WalCorrupt, read_log
from trainer.fold import apply_writes


def up(*ids: str, text: str = "t") -> dict:
    return {"op": "upsert", "docs": [{"id": i, "title": "", "text": f"{text} {i}", "fields": {"k": i}} for i in ids]}


def test_the_reader_reads_while_the_writer_holds_the_lock_and_stops_at_a_torn_tail(tmp_path):
    log = FileWriteLog(tmp_path / "wal", segment_bytes=200)
    for i in range(8):
        log.append(up(f"d{i}"))
    assert len(log.segments()) > 1
    assert [r["seq"] for r in read_log(tmp_path / "wal", 3)] == list(range(4, 9))
    with open(log.segments()[-1], "ab") as f:  # an append in flight
        f.write(b'{"crc":"0000')
    assert [r["seq"] for r in read_log(tmp_path / "wal")] == list(range(1, 9))
    log.close()
    assert list(read_log(tmp_path / "nowhere")) == []


def test_the_reader_refuses_a_corrupt_record_before_the_end(tmp_path):
    log = FileWriteLog(tmp_path / "wal")
    for i in range(3):
        log.append(up(f"d{i}"))
    log.close()
    seg = sorted((tmp_path / "wal").glob("*.jsonl"))[0]
    seg.write_bytes(seg.read_bytes().replace(b"t d1", b"t dX", 1))
    with pytest.raises(WalCorrupt):
        list(read_log(tmp_path / "wal"))


def test_writes_apply_in_order_replacing_in_place_and_deleting():
    base = [Document("a", "", "A"), Document("b", "", "B"), Document("c", "", "C")]
    records = [up("b", "x", text="new"), {"op": "delete", "ids": ["a", "x", "zz"]}, up("x", "y", text="again"),
               {"op": "delete", "ids": ["y"]}]
    docs, counts = apply_writes(base, records)
    assert [d.doc_id for d in docs] == ["b", "c", "x"]
    assert docs[0].text == "new b" and docs[0].fields == {"k": "b"} and docs[2].text == "again x"
    assert counts == {"upserted": 2, "added": 1, "replaced": 1, "deleted": 1}


def test_a_fold_going_live_drops_what_it_folded_without_encoding(tmp_path):
    calls = []

    def encode(texts):
        calls.append(len(texts))
        rng = np.random.default_rng(len(calls))
        E = rng.standard_normal((len(texts), 8)).astype(np.float32)
        return E / np.linalg.norm(E, axis=1, keepdims=True)

    live = LiveCollection("c", FileWriteLog(tmp_path / "wal"), 8, encode)
    live.upsert(up("a", "b")["docs"])            # seq 1
    live.delete(["a", "v"])                      # seq 2
    live.upsert(up("c")["docs"])                 # seq 3
    live.delete(["w"])                           # seq 4
    n = len(calls)
    assert live.advance(2) == {"dropped": 3, "upserts": 1, "deletes": 1}  # b, a, v
    snap = live.snapshot()
    assert live.base_seq == 2 and sorted(snap.docs) == ["c"] and sorted(snap.deleted) == ["w"] and len(calls) == n
    assert snap.embeddings.shape == (1, 8)
    # a rollback to seq 0 replays the log: every write after 0 is back
    live.advance(0)
    snap = live.snapshot()
    assert live.base_seq == 0 and sorted(snap.docs) == ["b", "c"] and sorted(snap.deleted) == ["a", "v", "w"]
    live.close()


def test_one_build_a_collection_and_stale_drafts_are_cleaned(tmp_path):
    coll = tmp_path / "scifact"
    (coll / ".tmp-20260101T000000Z-abc-1234abcd").mkdir(parents=True)
    (coll / ".tmp-LIVE-1234abcd").write_text("{}")  # a pointer write in flight: a file, left alone
    with build_lock(coll) as removed:
        assert removed == [".tmp-20260101T000000Z-abc-1234abcd"]
        with pytest.raises(BuildLocked):
            with build_lock(coll):
                pass
    assert (coll / ".tmp-LIVE-1234abcd").exists()
    with build_lock(coll) as removed:
        assert removed == []


def test_a_version_without_a_writes_section_folded_nothing():
    assert manifest_folded_seq(None) == 0
    assert manifest_folded_seq(Manifest.model_construct(writes=None)) == 0
    assert manifest_folded_seq(Manifest.model_construct(writes=WritesSection(folded_seq=7, base_version="v"))) == 7
