"""Live documents of one collection (issue 18): its write-ahead log, its delta segment, and the order between them.

:class:`LiveCollection` is what the gateway's write routes call.  An upsert is encoded first (outside any
lock, so a bad embedding refuses the batch before anything is written), then, under the collection's write
lock, appended to the log (durable: :meth:`engine.wal.WriteLog.append` fsyncs) and applied to the delta
segment; the caller acknowledges only after that, so a write is searchable when its 202 is sent, and the
segment's order is the log's order.  At start, :meth:`LiveCollection.replay` rebuilds the segment from the
log records after the live version's folded sequence number.

**A shared log** (:attr:`engine.wal.WriteLog.shared`: the Redis stream every replica appends to): the segment
applies every replica's records in sequence order (:meth:`LiveCollection.catch_up`, called by the gateway's
follower when the log has records after :attr:`LiveCollection.applied`, with the embeddings logged in each
record).  A replica's own write is applied after the records before it, before its 202 (read-your-writes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from engine.delta import DeltaSegment, DeltaSnapshot
from engine.io.beir import Document
from engine.wal import WalCorrupt, WriteLog, pack_embeddings, unpack_embeddings

MIN_EMBEDDING_NORM = 0.5
"""An encoder output (unit-norm by construction) with a smaller norm, or not finite, is never indexed."""

REPLAY_BATCH = 256


class DegenerateDocument(ValueError):
    """A document's embedding is not finite or has a norm below :data:`MIN_EMBEDDING_NORM`; ``index`` is its
    position in the batch."""

    def __init__(self, index: int, message: str):
        self.index = index
        super().__init__(message)


def encoder_text(doc: dict) -> str:
    """The text the encoder embeds for a record ``{id, title?, text, ...}`` (BEIR's title + " " + text)."""
    return Document(doc["id"], doc.get("title") or "", doc["text"]).encoder_text()


def manifest_folded_seq(manifest) -> int:
    """The last write sequence number a version's manifest says it folded (0: built from a corpus alone)."""
    writes = getattr(manifest, "writes", None)
    return int(getattr(writes, "folded_seq", 0) or 0)


def folded_seq(version) -> int:
    """The last write sequence number folded into ``version`` (an :class:`engine.index.IndexVersion`)."""
    return manifest_folded_seq(getattr(version, "manifest", None))


class LiveCollection:
    """Writes of one collection: the log, the delta segment, and the lock that orders them.

    Args:
        name: the collection.
        log: its :class:`engine.wal.WriteLog`.
        dimension: embedding width D.
        encode: ``list[str] -> (B, D) float32`` unit-norm rows (the gateway's encoder).
        fingerprint: that encoder's :func:`engine.encoder.encoder_fingerprint`.  When given, an upsert record
            carries its embeddings (:func:`engine.wal.pack_embeddings`, about 2 KiB a document at D = 384), and
            a replay reuses the embeddings of records with the same fingerprint instead of encoding again.
    """

    def __init__(self, name: str, log: WriteLog, dimension: int, encode: Callable[[list[str]], np.ndarray],
                 fingerprint: str | None = None):
        self.name, self.log, self.encode, self.fingerprint = name, log, encode, fingerprint
        self.delta = DeltaSegment(dimension)
        self.base_seq = 0  # the live version's folded sequence number: the segment holds writes after it
        self.applied = 0  # the last log record the segment reflects (applied, or folded into the live version)
        self._lock = threading.Lock()

    def snapshot(self) -> DeltaSnapshot:
        """The delta view a search reads (:meth:`engine.delta.DeltaSegment.snapshot`)."""
        return self.delta.snapshot()

    def embed(self, docs: list[dict]) -> np.ndarray:
        """(B, D) float32 embeddings of ``docs``.

        Raises:
            DegenerateDocument: a row is not finite or has a norm below :data:`MIN_EMBEDDING_NORM`.
        """
        return self.checked(np.asarray(self.encode([encoder_text(d) for d in docs]), np.float32), docs)

    def checked(self, E: np.ndarray, docs: list[dict]) -> np.ndarray:
        """``E`` ((B, D) float32 embeddings of ``docs``) with unit rows.

        Raises:
            ValueError: ``E`` is not (len(docs), D).
            DegenerateDocument: a row is not finite or has a norm below :data:`MIN_EMBEDDING_NORM`.
        """
        if E.shape != (len(docs), self.delta.dimension):
            raise ValueError(f"the encoder returned shape {E.shape} for {len(docs)} documents")
        norms = np.linalg.norm(E, axis=1)
        bad = np.flatnonzero(~np.isfinite(E).all(axis=1) | ~(norms >= MIN_EMBEDDING_NORM))
        if bad.size:
            raise DegenerateDocument(int(bad[0]), "the document's embedding is degenerate (not finite or ~0)")
        return E / norms[:, None]

    def upsert(self, docs: list[dict]) -> int:
        """Encode, log (durably) and apply one validated upsert batch; returns its sequence number.

        With a shared log the records other replicas appended before this one are applied first, so the
        segment keeps the log's order and this write is visible when the call returns.

        Args:
            docs: records ``{"id": str, "title": str, "text": str, "fields": dict}``, ids distinct.

        Raises:
            DegenerateDocument: nothing written.
            engine.wal.WalError, OSError: the log refused the append (nothing acknowledged), or (shared log) the
                records before it could not be read (the write is durable but not yet applied here).
        """
        E = self.embed(docs)
        rec = {"op": "upsert", "docs": docs}
        if self.fingerprint is not None:
            rec["emb"] = pack_embeddings(E, self.fingerprint)
        with self._lock:
            seq = self.log.append(rec)
            self._catch_up_locked(seq - 1)
            self._apply_locked({**rec, "seq": seq}, E)
        return seq

    def delete(self, ids: list[str]) -> int:
        """Log (durably) and apply one delete batch; returns its sequence number (shared log: as :meth:`upsert`).

        Raises:
            engine.wal.WalError, OSError: the log refused the append (nothing acknowledged).
        """
        rec = {"op": "delete", "ids": list(ids)}
        with self._lock:
            seq = self.log.append(rec)
            self._catch_up_locked(seq - 1)
            self._apply_locked({**rec, "seq": seq})
        return seq

    def catch_up(self, until: int | None = None) -> int:
        """Apply the log records after :attr:`applied` (up to ``until``; None: the log's end), in sequence order,
        under the collection lock; returns how many were applied.  The upserts use their logged embeddings
        (encoded only when a record has none of this encoder).  A shared log's follower calls this.

        Raises:
            engine.wal.WalError: the log is unreachable, cut before :attr:`applied`, or corrupt.
            DegenerateDocument: a logged document without usable embeddings no longer encodes.
        """
        with self._lock:
            return self._catch_up_locked(until)

    def _catch_up_locked(self, until: int | None) -> int:
        if until is not None and until <= self.applied:
            return 0
        n = 0
        for rec in self.log.replay(self.applied, until):
            self._apply_locked(rec)
            n += 1
        if until is not None and self.applied < until:
            raise WalCorrupt(f"{self.name}: the log ends at record {self.applied}, before {until}")
        return n

    def _apply_locked(self, rec: dict, E: np.ndarray | None = None) -> None:
        seq = int(rec["seq"])
        if seq <= self.applied:
            return
        if seq != self.applied + 1:
            raise WalCorrupt(f"{self.name}: record {seq} arrived after record {self.applied} (a gap)")
        if seq > self.base_seq:  # else the live version folded it already
            if rec["op"] == "upsert":
                docs = rec["docs"]
                if E is None and self.fingerprint is not None:
                    E = unpack_embeddings(rec, self.fingerprint, self.delta.dimension)
                E = self.embed(docs) if E is None else self.checked(np.asarray(E, np.float32), docs)
                self.delta.upsert(seq, docs, E)
            elif rec["op"] == "delete":
                self.delta.delete(seq, list(rec["ids"]))
        self.applied = seq

    def replay(self, after: int) -> dict:
        """Rebuild the delta segment from the log records with ``seq > after`` (a fresh segment).

        Only the last write of each id counts; its embedding is read from the log when the record carries one
        of this encoder (:func:`engine.wal.unpack_embeddings`), else encoded.  Returns ``{"records": r, "upserts": u, "deletes": d}``
        (u and d: the segment's documents and tombstones afterwards).

        Raises:
            engine.wal.WalCorrupt: an unreadable record.
            DegenerateDocument: a logged document no longer encodes (a changed encoder).
        """
        with self._lock:
            D = self.delta.dimension
            latest: dict[str, tuple[int, dict | None, np.ndarray | None]] = {}
            records = reused = 0
            applied = int(after)
            for rec in self.log.replay(after):
                records += 1
                applied = rec["seq"]
                if rec["op"] == "upsert":
                    E = unpack_embeddings(rec, self.fingerprint, D) if self.fingerprint is not None else None
                    for j, d in enumerate(rec["docs"]):
                        latest[d["id"]] = (rec["seq"], d, None if E is None else E[j])
                elif rec["op"] == "delete":
                    for i in rec["ids"]:
                        latest[i] = (rec["seq"], None, None)
            delta = DeltaSegment(D)
            ups = [(s, d, e) for s, d, e in latest.values() if d is not None]
            logged = [u for u in ups if u[2] is not None]
            for start in range(0, len(logged), REPLAY_BATCH):
                chunk = logged[start:start + REPLAY_BATCH]
                docs = [d for _, d, _ in chunk]
                delta.upsert([s for s, _, _ in chunk], docs, self.checked(np.stack([e for _, _, e in chunk]), docs))
                reused += len(chunk)
            fresh = [u for u in ups if u[2] is None]
            for start in range(0, len(fresh), REPLAY_BATCH):
                chunk = fresh[start:start + REPLAY_BATCH]
                docs = [d for _, d, _ in chunk]
                delta.upsert([s for s, _, _ in chunk], docs, self.embed(docs))
            dels: dict[int, list[str]] = {}
            for i, (s, d, _) in latest.items():
                if d is None:
                    dels.setdefault(s, []).append(i)
            for s, ids in sorted(dels.items()):
                delta.delete(s, ids)
            self.delta, self.base_seq, self.applied = delta, int(after), applied
            snap = delta.snapshot()
            return {"records": records, "upserts": len(snap.docs), "deletes": len(snap.deleted),
                    "encoded": len(fresh), "reused_embeddings": reused}

    def advance(self, folded: int) -> dict:
        """A version that folded every write up to ``folded`` went live: drop the segment's entries with
        ``seq <= folded`` (that version holds them) and keep the rest, without encoding anything.  A ``folded``
        below the segment's base (a rollback) replays the log instead (:meth:`replay`).

        Returns ``{"dropped": n, "upserts": u, "deletes": d}`` (u and d: the segment's afterwards).
        """
        if folded < self.base_seq:
            counts = self.replay(folded)
            return {"dropped": 0, "upserts": counts["upserts"], "deletes": counts["deletes"]}
        with self._lock:
            snap = self.delta.snapshot()
            delta = DeltaSegment(self.delta.dimension)
            keep = [k for k, i in enumerate(snap.ids) if snap.docs[i].seq > folded]
            if keep:
                delta.upsert([snap.docs[snap.ids[k]].seq for k in keep], [snap.docs[snap.ids[k]].doc for k in keep],
                             snap.embeddings[keep])
            dels: dict[int, list[str]] = {}
            for i, s in snap.deleted.items():
                if s > folded:
                    dels.setdefault(s, []).append(i)
            for s, ids in sorted(dels.items()):
                delta.delete(s, ids)
            # records up to ``folded`` not applied here yet (a follower behind) are in the new version
            self.delta, self.base_seq, self.applied = delta, int(folded), max(self.applied, int(folded))
            after = delta.snapshot()
            return {"dropped": len(snap.overridden) - len(after.overridden), "upserts": len(after.docs),
                    "deletes": len(after.deleted)}

    def status(self) -> dict:
        """``{"last_accepted_seq", "applied_seq", "base_seq", "pending_upserts", "pending_deletes"}`` of the
        collection (``last_accepted_seq``: the log's last record, every replica's; ``applied_seq``: the last one
        this segment reflects).

        Raises:
            engine.wal.WalError: (Redis) the log is unreachable.
        """
        snap = self.snapshot()
        return {"last_accepted_seq": self.log.last_seq, "applied_seq": self.applied, "base_seq": self.base_seq,
                "pending_upserts": len(snap.docs), "pending_deletes": len(snap.deleted)}

    def close(self) -> None:
        """Close the log."""
        self.log.close()
