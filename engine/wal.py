"""The write-ahead log of a collection's live documents (issue 18): durable before acknowledged.

One record is one accepted write batch: ``{"seq": int, "op": "upsert", "docs": [{id, title, text, fields}],
"emb": {...}}`` or ``{"seq": int, "op": "delete", "ids": [str]}``.  ``emb`` (optional; records written before
it existed lack it) holds the batch's embeddings as the gateway's encoder made them (:func:`pack_embeddings`),
with that encoder's fingerprint, so a replay or a fold by the same encoder does not encode them again.  Sequence numbers start at 1 and grow by one per record,
so a batch is applied whole or not at all.  :meth:`WriteLog.append` returns only after the record is on disk
(``fsync`` of the segment file, and of the directory when a segment is created); the gateway answers 202
only after that.

:class:`FileWriteLog` keeps the log on the index volume, ``<index_root>/<collection>/wal/``:

* segment files ``<first seq, 20 digits>.jsonl``, a new one when the current one passes ``segment_bytes``;
* one record a line, ``{"crc":"<crc32 of REC, 8 hex>","rec":REC}`` where ``REC`` is the record's compact
  JSON (UTF-8), so every line is JSON and a torn or corrupted line is detected;
* on open, a last record of the last segment that is torn (a kill -9 or power loss mid-append: it was
  never acknowledged) is dropped and the file truncated to the last whole record, with a warning in the log
  and the dropped bytes kept in ``<segment>.torn-<byte>`` (a record corrupted on disk after it was
  acknowledged reads the same as a torn one; the kept bytes let an operator tell); a bad record anywhere
  else, or a gap in the sequence numbers, is :class:`WalCorrupt` (never silently skipped);
* an exclusive ``flock`` on ``wal/LOCK``: one writer process a collection (a second gets
  :class:`WalLocked`; it is released by the kernel when the holder dies, kill -9 included).

A reader that is not the writer (the trainer's fold, :func:`read_log`) scans the segment files without the
lock and stops at the first line that is not a whole record: the writer's append in flight, never
acknowledged before its fsync returns, so nothing acknowledged is missed that was acknowledged before the scan.

**The cut** (:meth:`WriteLog.cut`, :func:`cut_file_log`; the trainer's retention step after a fold): whole
segment files whose records all have ``seq <= before_seq`` are deleted, never the newest segment (the writer
appends to it), so deleting needs no lock.  The cut point (the highest sequence number removed) is written
first, atomically, to ``wal/CUT``: a reader then knows that records up to it are gone on purpose, and a replay
from before it raises :class:`WalCut` instead of silently starting later.

:class:`engine.wal_redis.RedisWriteLog` (``REDIS_URL``) keeps the log in a Redis stream, shared by every
replica; :mod:`engine.write_logs` picks the implementation from the settings, as
:func:`engine.registry.open_registry` picks the registry.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engine.io import atomic

log = logging.getLogger(__name__)

SEGMENT_DIGITS = 20
CUT_FILE = "CUT"
_PREFIX = '{"crc":"'
_MIDDLE = '","rec":'
_HEAD = len(_PREFIX) + 8 + len(_MIDDLE)


class WalError(RuntimeError):
    """The write-ahead log cannot be used (base class)."""


class WalCorrupt(WalError):
    """A record other than a torn last one is unreadable, or sequence numbers have a gap."""


class WalLocked(WalError):
    """Another process holds the collection's log (one writer a collection)."""


class WalUnavailable(WalError):
    """The log's store cannot be reached (Redis down, a timeout), or refuses to promise durability.

    ``transient`` is True: a cutover whose replay meets it is retried on the next reconcile, not refused."""

    transient = True


class WalCut(WalError):
    """A replay asked for records the log cut on purpose (``after`` < ``cut_seq``: folded into kept versions)."""

    def __init__(self, after: int, cut_seq: int, where: str):
        self.after, self.cut_seq = int(after), int(cut_seq)
        super().__init__(f"{where}: records up to seq {cut_seq} were cut from the write-ahead log after a fold; "
                         f"a replay after seq {after} needs them (replay after a version that folded at least "
                         f"seq {cut_seq})")


def encode_record(rec: dict) -> bytes:
    """One log line (bytes, ending in a newline) of record ``rec`` (a JSON-serialisable dict, text valid UTF-8).

    Raises:
        UnicodeEncodeError: ``rec`` holds a lone surrogate (validation refuses those before).
    """
    body = json.dumps(rec, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    raw = body.encode("utf-8")
    return f"{_PREFIX}{zlib.crc32(raw):08x}{_MIDDLE}".encode("ascii") + raw + b"}\n"


def decode_record(line: bytes, seq: int | None = None) -> dict | None:
    """The record of one log line (with or without its newline), or None when the line is torn or corrupt.

    ``seq``: the sequence number the store assigned (a Redis stream entry's id), set on a record that carries
    none; a record whose own ``seq`` differs is corrupt (None).  Without it the record must carry its ``seq``.
    """
    line = line.rstrip(b"\n")
    if len(line) < _HEAD + 2 or not line.startswith(_PREFIX.encode()) or not line.endswith(b"}"):
        return None
    try:
        crc = int(line[len(_PREFIX):len(_PREFIX) + 8].decode("ascii"), 16)
    except (UnicodeDecodeError, ValueError):
        return None
    if line[len(_PREFIX) + 8:_HEAD] != _MIDDLE.encode():
        return None
    body = line[_HEAD:-1]
    if zlib.crc32(body) != crc:
        return None
    try:
        rec = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict):
        return None
    if seq is not None:
        if rec.setdefault("seq", int(seq)) != int(seq):
            return None
    return rec if isinstance(rec.get("seq"), int) and not isinstance(rec["seq"], bool) else None


def pack_embeddings(E: np.ndarray, encoder: str) -> dict:
    """The ``emb`` field of an upsert record: ``{"encoder": fingerprint, "shape": [B, D], "f32": base64}``.

    Args:
        E: (B, D) float32 embeddings of the batch's documents, in their order (little-endian in the log).
        encoder: the encoder's fingerprint (:func:`engine.encoder.encoder_fingerprint`).
    """
    E = np.ascontiguousarray(E, dtype="<f4")
    return {"encoder": encoder, "shape": list(E.shape), "f32": base64.b64encode(E.tobytes()).decode("ascii")}


def unpack_embeddings(rec: dict, encoder: str, dimension: int) -> np.ndarray | None:
    """The (B, D) float32 embeddings logged with upsert record ``rec``, or None when it has none, they come
    from another encoder (fingerprint ``encoder``), or their shape is not (len(docs), ``dimension``): then the
    caller encodes the documents itself."""
    emb = rec.get("emb")
    if not isinstance(emb, dict) or emb.get("encoder") != encoder:
        return None
    shape = (len(rec.get("docs") or ()), int(dimension))
    if emb.get("shape") != list(shape):
        return None
    try:
        raw = base64.b64decode(emb["f32"], validate=True)
    except (KeyError, TypeError, ValueError):
        return None
    if len(raw) != 4 * shape[0] * shape[1]:
        return None
    return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)


class WriteLog(ABC):
    """A collection's write-ahead log: append (durable), replay in order, the last sequence number, cut.

    ``shared`` is True for a log that several gateway replicas append to at once (the Redis stream): each then
    follows it (:meth:`follow`) to apply the others' records.  A file log has one writer (``shared`` False).
    """

    shared = False

    @property
    @abstractmethod
    def last_seq(self) -> int:
        """Sequence number of the last durable record (0 for an empty log)."""

    @abstractmethod
    def append(self, rec: dict) -> int:
        """Append one record (without ``seq``; the log assigns the next one) and make it durable.

        Args:
            rec: ``{"op": "upsert", "docs": [...]}`` or ``{"op": "delete", "ids": [...]}``.

        Returns:
            The record's sequence number (``last_seq + 1``), once the record is on stable storage.

        Raises:
            WalError (or OSError): nothing was acknowledged; the record may or may not be durable.
        """

    @abstractmethod
    def replay(self, after: int = 0, until: int | None = None) -> Iterator[dict]:
        """Records with ``after < seq <= until`` in sequence order (each a dict with ``seq`` and ``op``);
        ``until`` None: up to the last record at the call.

        Raises:
            WalCut: ``after`` is below :attr:`cut_seq` (the records it needs were cut after a fold).
            WalCorrupt: a record is unreadable (other than a torn last one, dropped at open), or a gap.
            WalUnavailable: the store is unreachable (Redis).
        """

    @property
    def cut_seq(self) -> int:
        """The highest sequence number cut from the log (0: nothing cut); records up to it are gone on purpose."""
        return 0

    def cut(self, before_seq: int) -> int:
        """Remove records with ``seq <= before_seq`` that the store can remove (a file log: whole older segments;
        a Redis stream: every such entry); returns the new :attr:`cut_seq` (never lowered).

        Raises:
            WalError: the store refused.
        """
        raise WalError(f"{type(self).__name__} cannot be cut")

    def follow(self, after: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a record with ``seq > after``; True when one exists (a shared
        log's follower then catches up with :meth:`replay`).

        Raises:
            WalUnavailable: the store is unreachable.
        """
        return self.last_seq > after

    def close(self) -> None:
        """Release the log (its lock, its connections)."""


class FileWriteLog(WriteLog):
    """:class:`WriteLog` on a local file system (the index volume); see the module docstring for the format.

    Args:
        directory: ``<index_root>/<collection>/wal`` (created when missing).
        segment_bytes: a new segment starts once the current one is at least this large.
        fsync: fsync every append (off only in tests of the format, never in the gateway).

    Raises:
        WalLocked: another process holds the log.
        WalCorrupt: the existing log is unreadable (see the module docstring).
    """

    def __init__(self, directory: Path | str, *, segment_bytes: int = 64 * 1024 * 1024, fsync: bool = True):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes, self.fsync = int(segment_bytes), bool(fsync)
        self._lock = threading.Lock()
        self._lock_fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise WalLocked(f"another process holds the write-ahead log {self.directory}") from None
        self._fd: int | None = None
        self._size = 0
        self._last = 0
        self._broken = False
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    # -- opening ------------------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return _segments(self.directory)

    def _recover(self) -> None:
        segs = self.segments()
        cut = read_cut(self.directory)  # read after listing: a cut meanwhile only raises it
        if segs and int(segs[0].stem) > cut + 1:
            raise WalCorrupt(f"the write-ahead log {self.directory} starts at record {int(segs[0].stem)} but was "
                             f"cut only up to {cut}: a segment is missing")
        expected = None
        for i, seg in enumerate(segs):
            last_segment = i == len(segs) - 1
            try:
                good_bytes, seqs = self._scan(seg, tolerate_torn_tail=last_segment)
            except FileNotFoundError:
                if last_segment:
                    raise
                expected = None  # cut meanwhile (the trainer's retention): its records are gone on purpose
                continue
            first = int(seg.stem)
            if seqs and seqs[0] != first:
                raise WalCorrupt(f"{seg.name} starts at record {seqs[0]}, not {first}")
            if expected is not None and seqs and seqs[0] != expected:
                raise WalCorrupt(f"gap in the write-ahead log before {seg.name} (expected record {expected})")
            if seqs:
                expected = seqs[-1] + 1
                self._last = seqs[-1]
            if last_segment:
                if good_bytes < seg.stat().st_size:  # a torn last record: never acknowledged, dropped
                    self._drop_tail(seg, good_bytes, seqs[-1] if seqs else first - 1)
                if not seqs:
                    seg.unlink()
                    self._fsync_dir()
                else:
                    self._open_segment(seg)
        self._last = max(self._last, cut)

    def _drop_tail(self, seg: Path, good_bytes: int, last_good: int) -> None:
        """Truncate ``seg`` to its last whole record (``good_bytes``), keeping the dropped bytes beside it in
        ``<segment>.torn-<good_bytes>`` (never read as a segment) and saying so in the log: a record torn by a
        crash mid-append was never acknowledged, but one corrupted on disk after its fsync reads the same."""
        with open(seg, "rb") as f:  # the torn tail alone (the scan has read the segment once already)
            f.seek(good_bytes)
            tail = f.read()
        kept = seg.with_name(f"{seg.name}.torn-{good_bytes}")
        kept.write_bytes(tail)
        with open(seg, "r+b") as f:
            f.truncate(good_bytes)
            f.flush()
            os.fsync(f.fileno())
        self._fsync_dir()
        log.warning("write-ahead log %s: dropped an unreadable last record after record %d (%d bytes at byte %d "
                    "of %s: a write torn by a crash, never acknowledged, or a record corrupted on disk); its bytes "
                    "are kept in %s", self.directory, last_good, len(tail), good_bytes, seg.name,
                    kept.name)

    @staticmethod
    def _scan(seg: Path, *, tolerate_torn_tail: bool) -> tuple[int, list[int]]:
        data = seg.read_bytes()
        pos, seqs = 0, []
        while pos < len(data):
            end = data.find(b"\n", pos)
            line = data[pos:] if end < 0 else data[pos:end + 1]
            rec = decode_record(line) if end >= 0 else None
            if rec is None or (seqs and rec["seq"] != seqs[-1] + 1):
                if tolerate_torn_tail and (end < 0 or end + 1 == len(data)):
                    return pos, seqs
                raise WalCorrupt(f"{seg.name}: unreadable record at byte {pos}")
            seqs.append(rec["seq"])
            pos = end + 1
        return pos, seqs

    def _open_segment(self, seg: Path) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(seg, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def _fsync_dir(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- WriteLog -----------------------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        return self._last

    def append(self, rec: dict) -> int:
        with self._lock:
            seq = self._last + 1
            line = encode_record({"seq": seq, **{k: v for k, v in rec.items() if k != "seq"}})
            if self._fd is None or self._size >= self.segment_bytes:
                self._open_segment(self.directory / f"{seq:0{SEGMENT_DIGITS}d}.jsonl")
                self._fsync_dir()
            if self._broken:
                raise WalError("the write-ahead log failed an earlier append; restart to recover it")
            try:
                view = memoryview(line)
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                if self.fsync:
                    os.fsync(self._fd)
            except OSError:
                # never acknowledged: cut the partial record off, or refuse every later append
                try:
                    os.ftruncate(self._fd, self._size)
                    os.fsync(self._fd)
                except OSError:
                    self._broken = True
                raise
            self._size += len(line)
            self._last = seq
            return seq

    def replay(self, after: int = 0, until: int | None = None) -> Iterator[dict]:
        with self._lock:
            last = self._last if until is None else min(self._last, int(until))
        if last <= after:
            return
        yield from _read_segments(self.directory, after, last)

    @property
    def cut_seq(self) -> int:
        return read_cut(self.directory)

    def cut(self, before_seq: int) -> int:
        return cut_file_log(self.directory, before_seq)["cut_seq"]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.jsonl") if len(p.stem) == SEGMENT_DIGITS and p.stem.isdigit())


def read_cut(directory: Path | str) -> int:
    """The cut point of the file log in ``directory`` (``wal/CUT``; 0 when nothing was cut).

    Raises:
        WalCorrupt: ``CUT`` exists but holds no sequence number.
    """
    try:
        text = (Path(directory) / CUT_FILE).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return 0
    except (OSError, UnicodeDecodeError) as e:
        raise WalCorrupt(f"{directory}/{CUT_FILE} is unreadable: {e}") from e
    if not text.isdigit():
        raise WalCorrupt(f"{directory}/{CUT_FILE} holds {text[:40]!r}, not a sequence number")
    return int(text)


def _read_segments(directory: Path, after: int, last: int | None, *,
                   tolerate_torn_tail: bool = False) -> Iterator[dict]:
    """Records ``after < seq <= last`` (``last`` None: to the end) of the segments in ``directory``, in order,
    checking that they follow each other without a gap from the first one wanted (``after + 1``)."""
    cut = read_cut(directory)
    if after < cut:
        raise WalCut(after, cut, str(directory))
    segs = _segments(directory)
    expected = after + 1
    for i, seg in enumerate(segs):
        last_segment = i == len(segs) - 1
        nxt = int(segs[i + 1].stem) if not last_segment else None
        if nxt is not None and nxt <= after + 1:
            continue  # every record of this segment is <= after
        try:
            data = seg.read_bytes()
        except FileNotFoundError:  # cut meanwhile: its records are <= the new cut point
            cut = read_cut(directory)
            if after < cut:
                raise WalCut(after, cut, str(directory)) from None
            continue
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            rec = decode_record(data[pos:end + 1]) if end >= 0 else None
            if rec is None and tolerate_torn_tail and last_segment and (end < 0 or end + 1 == len(data)):
                return  # the writer's append in flight
            if rec is None:
                raise WalCorrupt(f"{seg.name}: unreadable record at byte {pos}")
            pos = end + 1
            if rec["seq"] <= after:
                continue
            if rec["seq"] != expected:
                raise WalCorrupt(f"{seg.name}: record {rec['seq']} where {expected} was expected (a gap)")
            expected += 1
            yield rec
            if last is not None and rec["seq"] >= last:  # records appended since the call are not part of it
                return
    if last is not None and expected <= last:
        raise WalCorrupt(f"{directory}: the log ends at record {expected - 1}, before {last}")


def read_log(directory: Path | str, after: int = 0) -> Iterator[dict]:
    """Records with ``seq > after`` of the log in ``directory``, read without taking its lock (the gateway may
    hold it and append meanwhile); in sequence order, ending at the first torn line of the last segment (an
    append in flight).  A missing directory is an empty log.

    Raises:
        WalCut: ``after`` is below the log's cut point (``wal/CUT``): the records it needs were cut.
        WalCorrupt: an unreadable record before the last segment's end, or a gap in the sequence numbers.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    yield from _read_segments(directory, int(after), None, tolerate_torn_tail=True)


def cut_file_log(directory: Path | str, before_seq: int, *, dry_run: bool = False) -> dict:
    """Cut the file log in ``directory`` up to ``before_seq``: delete every segment whose records all have
    ``seq <= before_seq`` (a segment's records end where the next segment's begin), never the newest segment (the
    writer appends to it, so no lock is needed).  ``wal/CUT`` is written (atomically, fsynced) before any file is
    deleted, and is never lowered.

    Returns:
        ``{"cut_seq": int, "removed": [segment names], "bytes_freed": int}``.

    Raises:
        WalCorrupt: ``CUT`` is unreadable.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return {"cut_seq": 0, "removed": [], "bytes_freed": 0}
    old = read_cut(directory)
    segs = _segments(directory)
    doomed = [seg for seg, nxt in zip(segs, segs[1:]) if int(nxt.stem) - 1 <= before_seq]
    new = max(old, int(segs[len(doomed)].stem) - 1) if doomed else old  # the first kept segment's first seq - 1
    freed = sum(seg.stat().st_size for seg in doomed)
    if dry_run:
        return {"cut_seq": new, "removed": [s.name for s in doomed], "bytes_freed": freed, "dry_run": True}
    if new > old:
        atomic.write_text(directory / CUT_FILE, f"{new}\n")
    for seg in doomed:
        try:
            seg.unlink()
        except FileNotFoundError:
            pass
    if doomed:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return {"cut_seq": new, "removed": [s.name for s in doomed], "bytes_freed": freed}
