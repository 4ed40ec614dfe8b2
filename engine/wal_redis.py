"""The write-ahead log in a Redis stream (``REDIS_URL``): one log a collection, shared by every gateway replica.

Keys for collection ``c`` (named like the registry's, :mod:`engine.registry.redis_store`)::

    adawidth:wal:<c>        stream  one entry a record, id ``<seq>-0``, field ``rec``: the record's log line
                                    (:func:`engine.wal.encode_record`, its crc32 included) without ``seq``:
                                    the entry's id is its sequence number
    adawidth:wal:<c>:seq    string  the last sequence number assigned (INCR)
    adawidth:wal:<c>:cut    string  the highest sequence number cut (``XTRIM MINID``) after a fold

**Appending** runs one Lua script (atomic in Redis): ``INCR`` the counter and ``XADD`` the entry with the
explicit id ``<seq>-0``.  Every replica appends through it, so Redis is the one ordering point: sequence numbers
are gapless (1, 2, 3, ...), and no reader ever sees ``seq + 1`` before ``seq``.  A counter that is missing while
the stream exists (a Redis that lost data) is refused instead of numbering from 1 again.

**Durable before acknowledged.**  :meth:`RedisWriteLog.append` returns after the ``EVALSHA`` reply.  That reply
means "on disk" only when Redis runs with ``appendonly yes`` and ``appendfsync always`` (Redis writes and fsyncs
the append-only file before it answers).  The log checks ``CONFIG GET`` when it opens and every
:data:`DURABILITY_RECHECK_S` seconds after; with ``require_fsync`` (the production default) it refuses
(:class:`engine.wal.WalUnavailable`: the gateway answers 503 ``writes_unavailable``, reads go on) when either
setting is different or ``CONFIG`` is not allowed (a managed Redis that renames it: then set
``require_fsync`` off only if the provider guarantees an fsync per write).  Without ``require_fsync`` it logs a
warning and appends anyway.  On Redis 7.2 and later each append is also followed by ``WAITAOF 1 0`` on the
same connection (one pipeline: WAITAOF waits for its own connection's writes), which returns once the local
append-only file holds the write (and fails the append when it does not); older servers have no ``WAITAOF``
and rely on ``appendfsync always``.

**Reading**: :meth:`RedisWriteLog.replay` pages through ``XRANGE`` (:data:`PAGE` entries a call), checks the
crc of every entry and that sequence numbers follow each other; :meth:`RedisWriteLog.follow` blocks in ``XREAD``
until an entry after a sequence number exists (a replica's follower).  :meth:`RedisWriteLog.cut` trims with
``XTRIM MINID`` and records the cut point, so a replay from before it raises :class:`engine.wal.WalCut`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine.registry.redis_store import unreachable_as
from engine.registry.state import COLLECTION_NAME
from engine.wal import WalCorrupt, WalCut, WalError, WalUnavailable, WriteLog, decode_record, encode_record

log = logging.getLogger(__name__)

PAGE = 500
"""Entries a replay reads per ``XRANGE``."""
DURABILITY_RECHECK_S = 30.0
"""Seconds between two checks of the server's ``appendonly`` / ``appendfsync`` settings by a writer."""

# KEYS[1] stream, KEYS[2] counter; ARGV[1] the record line (without seq).  Returns the new sequence number, or
# an error reply when the counter was lost while the stream still exists.
_APPEND = """
local cur = redis.call('GET', KEYS[2])
if not cur and redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('ADAWIDTH_WAL counter missing while the stream exists')
end
local seq = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], tostring(seq) .. '-0', 'rec', ARGV[1])
return seq
"""

# KEYS[1] stream, KEYS[2] counter, KEYS[3] cut; ARGV[1] before_seq.  Trims the entries with seq <= before_seq
# (never above the counter) and raises the cut point; returns {cut_seq, entries removed}.
_CUT = """
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local want = math.min(tonumber(ARGV[1]), last)
local old = tonumber(redis.call('GET', KEYS[3]) or '0')
if want <= old then
  return {old, 0}
end
local removed = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  removed = redis.call('XTRIM', KEYS[1], 'MINID', tostring(want + 1) .. '-0')
end
redis.call('SET', KEYS[3], want)
return {want, removed}
"""


class RedisWriteLog(WriteLog):
    """:class:`engine.wal.WriteLog` in a Redis stream (module docstring), shared by every replica.

    Args:
        url: ``redis://host:port/db``.
        collection: the collection (a registry collection name).
        prefix: key prefix (default ``adawidth:wal``).
        socket_timeout_s: per-command socket timeout, in seconds (a blocking ``XREAD`` adds its block time).
        require_fsync: refuse appends unless Redis fsyncs every write (``appendonly yes``, ``appendfsync always``);
            False: warn and append anyway.
        check_durability: check the settings at all (False for readers: the trainer's fold and cut).

    Raises:
        WalUnavailable: Redis is unreachable, or (``require_fsync``) does not fsync every write.
        WalError: ``collection`` is not a valid collection name.
    """

    shared = True
    kind = "redis"

    def __init__(self, url: str, collection: str, *, prefix: str = "adawidth:wal", socket_timeout_s: float = 2.0,
                 require_fsync: bool = True, check_durability: bool = True):
        if not COLLECTION_NAME.match(collection or ""):
            raise WalError(f"{collection!r} is not a valid collection name")
        self.url, self.collection = url, collection
        self.stream, self.counter, self.cut_key = (f"{prefix}:{collection}", f"{prefix}:{collection}:seq",
                                                   f"{prefix}:{collection}:cut")
        self.require_fsync, self.check_durability = bool(require_fsync), bool(check_durability)
        self.socket_timeout_s = float(socket_timeout_s)
        # one immediate retry (a pooled connection may have died with a Redis restart), as the registry does
        self.client = redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                           socket_connect_timeout=socket_timeout_s, retry=Retry(NoBackoff(), 1))
        self._append = self.client.register_script(_APPEND)
        self._cut = self.client.register_script(_CUT)
        self._checked_at = float("-inf")
        self._waitaof: bool | None = None
        self.durability: dict = {}
        if check_durability:
            self._check(force=True)
        else:
            with self._errors():
                self.client.ping()

    # -- connection and durability ------------------------------------------------------------------------------
    def _errors(self):
        return unreachable_as(WalUnavailable, self.url)

    def _check(self, *, force: bool = False) -> None:
        """Check ``appendonly`` / ``appendfsync`` (and whether ``WAITAOF`` exists) at most every
        :data:`DURABILITY_RECHECK_S` seconds; raise :class:`WalUnavailable` when they do not promise an fsync
        per write and ``require_fsync`` is set."""
        now = time.monotonic()
        if not force and now - self._checked_at < DURABILITY_RECHECK_S:
            return
        with self._errors():
            try:
                conf = {}
                for name in ("appendonly", "appendfsync"):
                    conf.update({k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                                 for k, v in self.client.config_get(name).items()})
                problem = None
                if conf.get("appendonly") != "yes" or conf.get("appendfsync") != "always":
                    problem = (f"appendonly={conf.get('appendonly')!r}, appendfsync={conf.get('appendfsync')!r}: an "
                               "acknowledged write could be lost when Redis crashes (run redis-server --appendonly yes "
                               "--appendfsync always)")
            except redis.ResponseError as e:  # CONFIG renamed or not allowed (managed Redis, ACLs)
                conf, problem = {}, f"CONFIG GET is not allowed ({e}), so fsync per write cannot be checked"
            if self._waitaof is None:  # WAITAOF exists from Redis 7.2
                try:
                    version = str(self.client.info("server").get("redis_version", "0"))
                    self._waitaof = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) >= (7, 2)
                except (redis.ResponseError, ValueError):
                    self._waitaof = False
        self.durability = {**conf, "waitaof": self._waitaof, "problem": problem}
        self._checked_at = now
        if problem is not None:
            if self.require_fsync:
                raise WalUnavailable(f"redis write-ahead log {self.stream} refused: {problem}; "
                                     "writes need a Redis that fsyncs every write (setting wal_require_fsync)")
            log.warning("redis write-ahead log %s: %s; appending anyway (wal_require_fsync is off)", self.stream,
                        problem)

    # -- WriteLog -------------------------------------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """The last sequence number assigned (``GET`` of the counter; every assigned record is in the stream).

        Raises:
            WalUnavailable: Redis is unreachable.
        """
        with self._errors():
            return int(self.client.get(self.counter) or 0)

    @property
    def cut_seq(self) -> int:
        """See :attr:`engine.wal.WriteLog.cut_seq` (``GET`` of the cut key)."""
        with self._errors():
            return int(self.client.get(self.cut_key) or 0)

    def append(self, rec: dict) -> int:
        """See :meth:`engine.wal.WriteLog.append`: one atomic script (INCR + XADD ``<seq>-0``), then ``WAITAOF``
        where the server has it.

        Raises:
            WalUnavailable: Redis unreachable or not durable (nothing acknowledged; the record may be in the
                stream when the connection broke after the script ran: it then counts as written, as a file
                append whose fsync returned but whose answer was lost).
            WalCorrupt: the counter was lost while the stream exists.
        """
        if self.check_durability:
            self._check()
        line = encode_record({k: v for k, v in rec.items() if k != "seq"})
        with self._errors():
            try:
                # redis-py retries once on a broken connection; a retry after a lost reply appends the batch a
                # second time under the next seq, which is harmless (applying a batch twice changes nothing)
                if not self._waitaof:
                    seq = int(self._append(keys=[self.stream, self.counter], args=[line]))
                else:  # WAITAOF waits for the writes of *its connection*: one pipeline keeps both on one
                    pipe = self.client.pipeline(transaction=False)
                    self._append(keys=[self.stream, self.counter], args=[line], client=pipe)
                    pipe.execute_command("WAITAOF", 1, 0, int(self.socket_timeout_s * 1000))
                    seq, waited = pipe.execute(raise_on_error=False)
                    if isinstance(seq, Exception):
                        raise seq
                    seq = int(seq)
                    if isinstance(waited, Exception):  # e.g. appendonly switched off meanwhile
                        raise WalUnavailable(f"{self.stream}: record {seq} written, but WAITAOF failed: {waited}")
                    if int(waited[0]) < 1:
                        raise WalUnavailable(f"{self.stream}: record {seq} not in the append-only file within "
                                             f"{self.socket_timeout_s} s")
            except redis.ResponseError as e:
                if "ADAWIDTH_WAL" in str(e):
                    raise WalCorrupt(f"{self.stream}: {e}; the log was lost (restore Redis' append-only file)") from e
                raise WalError(f"{self.stream}: append refused: {e}") from e
        return seq

    def _decode_entry(self, entry_id, fields) -> dict:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        ms, _, part = eid.partition("-")
        line = fields.get(b"rec", fields.get("rec")) if isinstance(fields, dict) else None
        rec = decode_record(line if isinstance(line, bytes) else (line or "").encode(), seq=int(ms)) \
            if ms.isdigit() and part == "0" and line is not None else None
        if rec is None:
            raise WalCorrupt(f"{self.stream}: entry {eid} is unreadable (bad crc, id or record)")
        return rec

    def replay(self, after: int = 0, until: int | None = None) -> Iterator[dict]:
        """See :meth:`engine.wal.WriteLog.replay` (``XRANGE`` pages of :data:`PAGE` entries).

        Raises:
            WalCut: ``after`` < :attr:`cut_seq`.
            WalCorrupt: an unreadable entry or a gap.
            WalUnavailable: Redis is unreachable (also mid-replay).
        """
        after = int(after)
        with self._errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.get(self.counter).get(self.cut_key)
            last, cut = (int(x or 0) for x in pipe.execute())
        if until is not None:
            last = min(last, int(until))
        if after < cut:
            raise WalCut(after, cut, self.stream)
        expected = after + 1
        while expected <= last:
            with self._errors():
                page = self.client.xrange(self.stream, min=f"{expected}-0", max=f"{last}-0",
                                          count=min(PAGE, last - expected + 1))
            if not page:
                break
            for entry_id, fields in page:
                rec = self._decode_entry(entry_id, fields)
                if rec["seq"] != expected:
                    self._gap(after, expected, rec["seq"])
                expected += 1
                yield rec
        if expected <= last:
            self._gap(after, expected, None)

    def _gap(self, after: int, expected: int, got: int | None) -> None:
        cut = self.cut_seq
        if after < cut:  # cut while we read
            raise WalCut(after, cut, self.stream)
        raise WalCorrupt(f"{self.stream}: record {expected} is missing (next: {got}); the stream lost entries")

    def follow(self, after: int, timeout_s: float) -> bool:
        """See :meth:`engine.wal.WriteLog.follow`: ``XREAD BLOCK`` for an entry after ``<after>-0`` (the block
        is kept half a second under the socket timeout, so a quiet stream is not mistaken for a dead Redis)."""
        block = max(1, int(min(timeout_s, self.socket_timeout_s - 0.5) * 1000))
        with self._errors():
            got = self.client.xread({self.stream: f"{int(after)}-0"}, count=1, block=block)
        return bool(got)

    def cut(self, before_seq: int) -> int:
        """See :meth:`engine.wal.WriteLog.cut`: ``XTRIM MINID <before_seq + 1>-0`` and the cut key, atomically."""
        return self.cut_report(before_seq)["cut_seq"]

    def cut_report(self, before_seq: int, *, dry_run: bool = False) -> dict:
        """:meth:`cut` with a report ``{"cut_seq", "removed"}`` (entries trimmed; ``dry_run``: nothing trimmed,
        ``removed`` is the entries that would be)."""
        with self._errors():
            if dry_run:
                last = int(self.client.get(self.counter) or 0)
                old = int(self.client.get(self.cut_key) or 0)
                want = max(old, min(int(before_seq), last))
                n = len(self.client.xrange(self.stream, min="-", max=f"{want}-0")) if want > old else 0
                return {"cut_seq": want, "removed": n, "dry_run": True}
            cut, removed = self._cut(keys=[self.stream, self.counter, self.cut_key], args=[int(before_seq)])
        return {"cut_seq": int(cut), "removed": int(removed)}

    def close(self) -> None:
        """Close the connection pool (errors ignored)."""
        with contextlib.suppress(Exception):
            self.client.close()
