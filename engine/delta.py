"""The delta segment of a collection (issue 18): writes accepted since the live version's folded sequence number.

A small, exact, in-memory segment searched beside the index version:

* an upserted document is kept with its (D,) float32 unit-norm embedding (the gateway's encoder, the text
  :meth:`engine.io.beir.Document.encoder_text` of its title and text, as the trainer encodes a corpus);
* a deleted id is kept as a tombstone;
* the latest write of an id wins (sequence order).

Every id the segment knows (upserted or deleted) *overrides* the version's copy: the version's row is masked
out of its results (:meth:`DeltaSnapshot.allowed`), and an upserted document is scored exactly against the
query instead (:mod:`engine.stages.delta`).  Readers take an immutable :class:`DeltaSnapshot`
(:meth:`DeltaSegment.snapshot`); writers apply whole batches under one lock, so a search sees a batch
entirely or not at all.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DeltaDocument:
    """One upserted document of the segment: its record ``{id, title, text, fields}`` and the write's seq."""

    doc: dict
    seq: int
    slot: int


class DeltaSnapshot:
    """An immutable view of the segment at one generation (what one search reads).

    Attributes:
        generation: increases with every applied batch.
        ids: the M live delta document ids, in slot order of ``embeddings``.
        embeddings: (M, D) float32 unit-norm rows (raw encoder space, not rotated).
        overridden: every id the segment holds (upserted or deleted): the version's copies are masked.
        docs: id -> :class:`DeltaDocument`; deleted: id -> seq of its delete.
    """

    def __init__(self, generation: int, ids: list[str], embeddings: np.ndarray, docs: dict, deleted: dict):
        self.generation = generation
        self.ids, self.embeddings = ids, embeddings
        self.docs, self.deleted = docs, deleted
        self.overridden = frozenset(docs) | frozenset(deleted)
        self._masks: dict = {}
        self._rotated: dict = {}
        self._lock = threading.Lock()

    @property
    def empty(self) -> bool:
        """True when the segment neither adds nor hides anything."""
        return not self.overridden

    def allowed(self, version) -> np.ndarray | None:
        """(N,) bool of ``version``'s rows not overridden by the segment, or None when none is (cached per
        version object).  ``version`` needs ``row_of`` (id -> row) and ``size``."""
        key = id(version)
        with self._lock:
            if key in self._masks:
                return self._masks[key][1]
        if not self.overridden:
            mask = None
        else:
            row_of = version.row_of
            rows = [row_of[d] for d in self.overridden if d in row_of]
            mask = None
            if rows:
                mask = np.ones(version.size, dtype=bool)
                mask[rows] = False
        with self._lock:
            self._masks[key] = (version, mask)  # the version object is held so its id() is not reused
        return mask

    def rotated(self, version) -> np.ndarray:
        """(M, D) float32: the delta embeddings rotated by ``version.rotation`` (R e; cached per version)."""
        key = id(version)
        with self._lock:
            if key in self._rotated:
                return self._rotated[key][1]
        out = (self.embeddings @ np.asarray(version.rotation, np.float32).T).astype(np.float32)
        with self._lock:
            self._rotated[key] = (version, out)
        return out


class DeltaSegment:
    """The mutable segment of one collection (writers), publishing :class:`DeltaSnapshot` s (readers).

    Args:
        dimension: embedding width D.
    """

    def __init__(self, dimension: int):
        self.dimension = int(dimension)
        self._lock = threading.Lock()
        self._docs: dict[str, DeltaDocument] = {}
        self._deleted: dict[str, int] = {}
        self._buf = np.zeros((16, self.dimension), np.float32)
        self._slot_ids: list[str | None] = []
        self._alive = 0
        self._generation = 0
        self._snapshot = DeltaSnapshot(0, [], np.zeros((0, self.dimension), np.float32), {}, {})

    def snapshot(self) -> DeltaSnapshot:
        """The current immutable view (O(1))."""
        return self._snapshot

    def upsert(self, seq: int | list[int], docs: list[dict], embeddings: np.ndarray) -> None:
        """Apply one upsert batch.

        Args:
            seq: the batch's sequence number, or one a document (a replayed segment).
            docs: records ``{id, title, text, fields}`` (validated, ids distinct).
            embeddings: (len(docs), D) float32 unit-norm rows, in the order of ``docs``.

        Raises:
            ValueError: a shape mismatch (nothing applied).
        """
        E = np.asarray(embeddings, np.float32)
        if E.shape != (len(docs), self.dimension):
            raise ValueError(f"embeddings must be ({len(docs)}, {self.dimension}), got {E.shape}")
        seqs = [int(seq)] * len(docs) if isinstance(seq, (int, np.integer)) else [int(s) for s in seq]
        with self._lock:
            for doc, e, s in zip(docs, E, seqs):
                old = self._docs.get(doc["id"])
                if old is not None:
                    self._slot_ids[old.slot] = None
                    self._alive -= 1
                slot = len(self._slot_ids)
                if slot == len(self._buf):  # grow: published snapshots keep the old buffer
                    grown = np.zeros((2 * len(self._buf), self.dimension), np.float32)
                    grown[:slot] = self._buf[:slot]
                    self._buf = grown
                self._buf[slot] = e
                self._slot_ids.append(doc["id"])
                self._alive += 1
                self._docs[doc["id"]] = DeltaDocument(doc, s, slot)
                self._deleted.pop(doc["id"], None)
            self._publish()

    def delete(self, seq: int, ids: list[str]) -> None:
        """Apply one delete batch: every id gets a tombstone (whether or not it exists anywhere)."""
        with self._lock:
            for i in ids:
                old = self._docs.pop(i, None)
                if old is not None:
                    self._slot_ids[old.slot] = None
                    self._alive -= 1
                self._deleted[i] = seq
            self._publish()

    def _publish(self) -> None:
        if len(self._slot_ids) > 2 * self._alive + 64:  # compact the dead slots
            keep = [s for s, i in enumerate(self._slot_ids) if i is not None]
            buf = np.zeros((max(16, 2 * len(keep)), self.dimension), np.float32)
            buf[:len(keep)] = self._buf[keep]
            self._buf = buf
            self._slot_ids = [self._slot_ids[s] for s in keep]
            self._docs = {i: DeltaDocument(d.doc, d.seq, s) for s, i in enumerate(self._slot_ids)
                          for d in (self._docs[i],)}
        slots = [s for s, i in enumerate(self._slot_ids) if i is not None]
        self._generation += 1
        # a copy of the live rows: the buffer is written in place by later batches
        self._snapshot = DeltaSnapshot(self._generation, [self._slot_ids[s] for s in slots],
                                       self._buf[slots].copy(), dict(self._docs), dict(self._deleted))
