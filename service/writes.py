"""Live documents over HTTP (issue 18): the write routes, their validation, and the collections' write state.

==================================================  =========================================================
``PUT  /v1/collections/{name}/documents``           a JSON array, or NDJSON (``application/x-ndjson``), of
                                                    ``{id, title?, text, fields?}``: 202 ``{seq, ...}``
``POST /v1/collections/{name}/documents/delete``    ``{"ids": [...]}``: 202 ``{seq, ...}``
``GET  /v1/collections/{name}/documents/{id}``      the stored document and where it is served from
``GET  /v1/collections/{name}/writes``              sequence numbers: last accepted, last folded, the live
                                                    version's; pending upserts and deletes
==================================================  =========================================================

Every route requires ``write_api_key`` (403 ``writes_disabled`` when none is configured; the GET routes
return stored text regardless of any access policy, so they are guarded too).  A write is validated whole
(:func:`parse_documents`, :func:`parse_delete`): any bad document refuses the batch with its code and nothing
is written.  An accepted batch is encoded, appended to the collection's write-ahead log with fsync and applied
to its delta segment (:class:`engine.live.LiveCollection`) before the 202, so it is durable and searchable
when acknowledged.  The log is the file log on the index volume (one writer process), or with ``REDIS_URL`` the
collection's Redis stream, which every replica appends to and follows (:class:`LogFollower`).  The rules:
docs/LIVE_DOCUMENTS.md.
"""

from __future__ import annotations

import logging
import re
import time
import random
import threading
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from engine.delta import DeltaSnapshot
from engine.encoder import encoder_fingerprint
from engine.live import DegenerateDocument, LiveCollection, folded_seq, manifest_folded_seq
from engine.plan import has_lone_surrogate, is_blank
from engine.version import store
from engine.wal import WalCorrupt, WalError, WalLocked, WalUnavailable
from engine.write_logs import open_write_log
from service import examples as ex
from service.auth import require_write_key
from service.errors import ApiError
from service.models import error_responses
from service.parsing import parse_json, read_body

log = logging.getLogger("service.writes")

MAX_ID_CHARS = 512
"""Longest document id accepted, in characters."""
DOCUMENT_KEYS = frozenset({"id", "title", "text", "fields"})
NDJSON = "application/x-ndjson"
FOLLOW_BACKOFF_MIN_S = 0.1
FOLLOW_BACKOFF_MAX_S = 0.5
"""Retry backoff of a log follower while its log is unreachable, in seconds."""


# -- validation ---------------------------------------------------------------------------------------------------
def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_utf8", "request body is not valid UTF-8") from None


def media_type(request: Request) -> str:
    """``application/json`` (also when undeclared) or ``application/x-ndjson``.

    Raises:
        ApiError: ``unsupported_media_type`` (415) for any other declared type.
    """
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype in ("application/json", ""):
        return "application/json"
    if ctype in (NDJSON, "application/ndjson", "application/jsonl"):
        return NDJSON
    raise ApiError("unsupported_media_type", "send the documents as application/json or application/x-ndjson")


def check_id(value, field: str, *, new: bool = False) -> str:
    """A document id: a non-blank string of at most :data:`MAX_ID_CHARS` characters, valid Unicode; an id a write
    creates (``new``) holds no control character either (C0, DEL, C1: a newline or a NUL in an id cannot be put
    in the path of ``GET /v1/collections/{name}/documents/{id}``), while a delete may still name an id written
    before that rule.

    Raises:
        ApiError: ``invalid_id`` or ``invalid_unicode`` (422).
    """
    if not isinstance(value, str):
        raise ApiError("invalid_id", "a document id must be a string", field)
    if has_lone_surrogate(value):
        raise ApiError("invalid_unicode", "the id contains a lone UTF-16 surrogate", field)
    if is_blank(value) or len(value) > MAX_ID_CHARS or value != value.strip():
        raise ApiError("invalid_id", f"a document id must be 1..{MAX_ID_CHARS} characters with a visible one "
                                     "and no surrounding whitespace", field)
    if new and _CONTROL.search(value):
        raise ApiError("invalid_id", "a document id must not contain control characters (U+0000-U+001F, "
                                     "U+007F-U+009F)", field)
    return value


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


# a document field is what a search filter can match (engine.plan.Filter; adawidth.hybrid.keyword_values): a
# name of 1..64 characters, a keyword (a string of at most 256 characters, an integer or a bool) or a list of them
MAX_FIELD_NAME = 64
MAX_FIELD_STRING = 256
RESERVED_FIELDS = frozenset({"_id", "title", "text"})  # a BEIR corpus record's own keys


def _keyword_ok(v) -> bool:
    if isinstance(v, bool):
        return True
    if isinstance(v, str):
        return len(v) <= MAX_FIELD_STRING
    return isinstance(v, int) and abs(v) < 10 ** 18


def check_fields(value, field: str) -> dict:
    """A document's ``fields``: an object whose names (1..64 characters, not ``_id``, ``title`` or ``text``) map to
    keywords a search filter can match, a string of at most 256 characters, an integer or a bool, or a list of
    those (``null`` or absent: no fields).  Anything else would be written, then dropped by the fold's field
    index, so it is refused.

    Raises:
        ApiError: ``invalid_field_value`` or ``invalid_unicode`` (422).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError("invalid_field_value", "fields must be an object", field)
    for key, v in value.items():
        where = f"{field}.{key[:MAX_FIELD_NAME]}"
        if not key or is_blank(key):
            raise ApiError("invalid_field_value", "a field name must have a visible character", field)
        if len(key) > MAX_FIELD_NAME:
            raise ApiError("invalid_field_value", f"a field name has at most {MAX_FIELD_NAME} characters (a "
                                                  "filter's limit)", where)
        if key in RESERVED_FIELDS:
            raise ApiError("invalid_field_value", f"{key!r} is a document's own key, not a field name "
                                                  "(use the document's 'title' and 'text')", where)
        if has_lone_surrogate(key):
            raise ApiError("invalid_unicode", "a field name contains a lone UTF-16 surrogate", field)
        items = v if isinstance(v, list) else [v]
        for item in items:
            if not _keyword_ok(item):
                raise ApiError("invalid_field_value", "a field value must be a keyword a filter can match: a "
                                                      f"string of at most {MAX_FIELD_STRING} characters, an "
                                                      "integer or a bool, or a list of those (no fractions)", where)
            if isinstance(item, str) and has_lone_surrogate(item):
                raise ApiError("invalid_unicode", "a field value contains a lone UTF-16 surrogate", where)
    return dict(value)


def check_document(obj, i: int, max_chars: int) -> dict:
    """One validated record ``{"id", "title", "text", "fields"}`` of item ``i`` of a write.

    Raises:
        ApiError: ``invalid_type``, ``unknown_field``, ``missing_field``, ``invalid_id``, ``invalid_unicode``,
            ``document_too_long`` (413), ``empty_document``, ``invalid_field_value``.
    """
    at = f"[{i}]"
    if not isinstance(obj, dict):
        raise ApiError("invalid_type", "each document must be a JSON object", at)
    extra = sorted(set(obj) - DOCUMENT_KEYS)
    if extra:
        raise ApiError("unknown_field", "a document takes id, title, text and fields only", f"{at}.{extra[0]}")
    for key in ("id", "text"):
        if key not in obj or obj[key] is None:
            raise ApiError("missing_field", f"every document needs {key!r}", f"{at}.{key}")
    doc_id = check_id(obj["id"], f"{at}.id", new=True)
    title = obj.get("title")
    title = "" if title is None else title
    text = obj["text"]
    for key, value in (("title", title), ("text", text)):
        if not isinstance(value, str):
            raise ApiError("invalid_type", f"{key} must be a string", f"{at}.{key}")
        if has_lone_surrogate(value):
            raise ApiError("invalid_unicode", f"{key} contains a lone UTF-16 surrogate", f"{at}.{key}")
    if len(title) + len(text) > max_chars:
        raise ApiError("document_too_long", f"title + text exceed {max_chars} characters", f"{at}.text")
    if is_blank(title) and is_blank(text):
        raise ApiError("empty_document", "the document's title and text are both empty or blank", f"{at}.text")
    return {"id": doc_id, "title": title, "text": text, "fields": check_fields(obj.get("fields"), f"{at}.fields")}


def parse_documents(raw: bytes, ctype: str, *, max_chars: int, max_batch: int) -> list[dict]:
    """The validated records of an upsert body (a JSON array, or NDJSON: one object a non-blank line).

    Raises:
        ApiError: ``invalid_utf8``, ``invalid_json``, ``invalid_type``, ``empty_batch``, ``batch_too_large``,
            ``duplicate_id`` and every code of :func:`check_document`.
    """
    if ctype == NDJSON:
        lines = _decode(raw).split("\n")
        items = [parse_json(line.encode("utf-8"), len(raw)) for line in lines if line.strip()]
    else:
        items = parse_json(raw, len(raw))
        if not isinstance(items, list):
            raise ApiError("invalid_type", "the body must be a JSON array of documents (or NDJSON)")
    if not items:
        raise ApiError("empty_batch", "the write holds no document")
    if len(items) > max_batch:
        raise ApiError("batch_too_large", f"a write holds at most {max_batch} documents")
    docs, seen = [], set()
    for i, obj in enumerate(items):
        doc = check_document(obj, i, max_chars)
        if doc["id"] in seen:
            raise ApiError("duplicate_id", "an id appears twice in one write", f"[{i}].id")
        seen.add(doc["id"])
        docs.append(doc)
    return docs


def parse_delete(raw: bytes, *, max_batch: int) -> list[str]:
    """The validated ids of a delete body ``{"ids": [str, ...]}``.

    Raises:
        ApiError: ``invalid_utf8``, ``invalid_json``, ``invalid_type``, ``unknown_field``, ``missing_field``,
            ``empty_batch``, ``batch_too_large``, ``invalid_id``, ``invalid_unicode``, ``duplicate_id``.
    """
    obj = parse_json(raw, len(raw))
    if not isinstance(obj, dict):
        raise ApiError("invalid_type", 'the body must be {"ids": [...]}')
    extra = sorted(set(obj) - {"ids"})
    if extra:
        raise ApiError("unknown_field", "a delete takes 'ids' only", extra[0])
    if "ids" not in obj:
        raise ApiError("missing_field", "'ids' is required", "ids")
    ids = obj["ids"]
    if not isinstance(ids, list):
        raise ApiError("invalid_type", "'ids' must be a list of document ids", "ids")
    if not ids:
        raise ApiError("empty_batch", "the delete holds no id", "ids")
    if len(ids) > max_batch:
        raise ApiError("batch_too_large", f"a delete holds at most {max_batch} ids", "ids")
    out, seen = [], set()
    for i, v in enumerate(ids):
        v = check_id(v, f"ids[{i}]")
        if v in seen:
            raise ApiError("duplicate_id", "an id appears twice in one delete", f"ids[{i}]")
        seen.add(v)
        out.append(v)
    return out


# -- the collections' write state ----------------------------------------------------------------------------------
class _LogThread:
    """A daemon thread working on one collection's log (``_run``, until :meth:`stop`)."""

    def __init__(self, docs: "LiveDocuments", name: str, versions, role: str):
        self.docs, self.name, self.versions = docs, name, versions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"wal-{role}-{name}", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (a blocking read or a try under way finishes first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class LogFollower(_LogThread):
    """The follower of one collection's shared log (Redis): a daemon thread that waits in ``XREAD BLOCK``
    (:meth:`engine.wal.WriteLog.follow`) for records after the segment's last applied one and applies them
    (:meth:`engine.live.LiveCollection.catch_up`), so this replica's delta segment holds every replica's writes.
    While the log is unreachable it retries with backoff (doubling from :data:`FOLLOW_BACKOFF_MIN_S` to
    :data:`FOLLOW_BACKOFF_MAX_S`, ±20 % jitter: one connection attempt, cheap, so the segment catches up and
    ``/readyz`` clears within half a second of Redis' return); when the collection could not be opened at start
    it keeps trying to open it.

    Args:
        docs: the :class:`LiveDocuments` it belongs to.
        name: the collection.
        versions: its :class:`service.version_manager.VersionManager`.
        live: its write state, or None when opening failed (the follower opens it).
    """

    def __init__(self, docs: "LiveDocuments", name: str, versions, live: LiveCollection | None):
        super().__init__(docs, name, versions, "follower")
        self.live = live
        self.error: str | None = None

    def _run(self) -> None:
        block = float(self.docs.state.settings.wal_follow_block_s)
        backoff = FOLLOW_BACKOFF_MIN_S
        while not self._stop.is_set():
            try:
                if self.live is None:
                    self.live = self.docs._open_one(self.name, self.versions)
                    self.docs.errors.pop(self.name, None)
                if self.error is not None:  # recovering: one round trip without blocking clears the error at once
                    self.live.catch_up()
                    log.info("write-ahead log follower of %s recovered at seq %d", self.name, self.live.applied)
                    self.error, backoff = None, FOLLOW_BACKOFF_MIN_S
                if self.live.log.follow(self.live.applied, block) and not self._stop.is_set():
                    self.live.catch_up()
            except (WalError, OSError, DegenerateDocument) as e:
                if self.error is None:
                    log.error("write-ahead log follower of %s: %s: %s (retrying)", self.name, type(e).__name__, e)
                self.error = f"{type(e).__name__}: {e}"
                self._stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(2 * backoff, FOLLOW_BACKOFF_MAX_S)
            except Exception:  # never let the thread die silently
                log.exception("write-ahead log follower of %s failed; retrying", self.name)
                self.error = "unexpected error (see the gateway's log)"
                self._stop.wait(FOLLOW_BACKOFF_MAX_S)



class LogTakeover(_LogThread):
    """The standby writer of one collection's file log: a daemon thread that, while another process (the writer)
    holds the log's lock (or while the collection has no version yet: then it takes no lock), tries to open it
    every ``wal_takeover_interval_s`` seconds, and once the writer is gone (or a version is built)
    opens it, replays it after the live version's folded sequence number (the writes this replica did not see)
    and serves its writes from then on (:meth:`LiveDocuments._open_one`); ``/readyz`` then turns ``ready``.

    Args:
        docs: the :class:`LiveDocuments` it belongs to.
        name: the collection.
        versions: its :class:`service.version_manager.VersionManager`.
        interval_s: seconds between two tries (> 0).
    """

    def __init__(self, docs: "LiveDocuments", name: str, versions, interval_s: float):
        super().__init__(docs, name, versions, "takeover")
        self.interval_s = interval_s

    def _run(self) -> None:
        logged = False
        while not self._stop.wait(self.interval_s):
            if not _has_versions(self.versions, self.name):  # no version of the collection yet: take no lock
                continue
            try:
                live = self.docs._open_one(self.name, self.versions)
            except WalLocked:  # the writer still holds it
                continue
            except (WalError, OSError, DegenerateDocument) as e:
                self.docs.errors[self.name] = f"{type(e).__name__}: {e}"
                if not logged:
                    log.error("taking over the write-ahead log of %s: %s (retrying)", self.name,
                              self.docs.errors[self.name])
                    logged = True
                continue
            except Exception:  # never let the thread die silently
                log.exception("taking over the write-ahead log of %s failed; retrying", self.name)
                continue
            if self._stop.is_set():  # closing meanwhile: give the log back
                self.docs.live.pop(self.name, None)
                live.close()
                return
            self.docs.errors.pop(self.name, None)
            log.warning("took over the write-ahead log of %s (its writer stopped): replayed up to seq %d; this "
                        "replica now serves its writes", self.name, live.log.last_seq)
            return


class LiveDocuments:
    """The :class:`engine.live.LiveCollection` of every collection the gateway serves, opened at start.

    The log is picked by the gateway's ``REDIS_URL``, as the registry is (:func:`engine.write_logs.open_write_log`):
    without it the file log on the index volume (one writer process a collection: another replica answers its
    writes 503 ``writes_unavailable`` and does not see the writer's segment); with it the collection's Redis
    stream, which every replica appends to and follows (:class:`LogFollower`).

    Args:
        state: the :class:`service.state.GatewayState` (its ``collections``, ``encoder``, ``settings``).
    """

    def __init__(self, state):
        self.state = state
        self.live: dict[str, LiveCollection] = {}
        self.errors: dict[str, str] = {}
        self.followers: dict[str, LogFollower] = {}
        self.takeovers: dict[str, LogTakeover] = {}  # file logs another process holds: tried again
        self.pending = False  # True from the start of GatewayState.load until every log is replayed
        state.metrics.track_delta(self.segments)

    def segments(self) -> dict[str, tuple[int, int, int]]:
        """``{collection: (pending upserts, pending deletes, applied seq)}`` of every open log (in memory, no
        I/O: what the metrics export on a scrape)."""
        return {name: seg for name in list(self.live) if (seg := self.segment(name)) is not None}

    def segment(self, name: str) -> tuple[int, int, int] | None:
        """``(pending upserts, pending deletes, applied seq)`` of collection ``name``'s open log, or None."""
        live = self.live.get(name)
        if live is None:
            return None
        snap = live.snapshot()
        return len(snap.docs), len(snap.deleted), int(live.applied)

    @property
    def backend(self) -> str:
        """``"redis"`` (``REDIS_URL`` set: a shared stream) or ``"file"`` (the index volume, one writer)."""
        return "redis" if self.state.settings.redis_url else "file"

    def wal_dir(self, name: str) -> Path:
        """``<index_root>/<collection>/wal``: the log of ``name`` on the index volume."""
        return Path(self.state.collection(name).index_root) / name / "wal"

    def open(self) -> None:
        """Open every served collection's log and replay it after its live version's folded sequence number
        (call after the encoder and the live versions are loaded).  A collection whose log cannot be opened
        (another process holds it, a corrupt record, Redis unreachable or not fsyncing) serves reads and answers
        its writes 503 ``writes_unavailable``; the reason is logged.  A collection with no version in the home
        (``ADAWIDTH_COLLECTION=nope``) gets no file log: no ``wal/LOCK`` is created there nor held (its writes
        answer 503 until a restart).  With Redis, a follower thread per collection applies the other replicas' writes (and keeps
        trying to open a log that could not be opened)."""
        try:
            self._open()
        finally:
            self.pending = False

    def _open(self) -> None:
        encoder = self.state.encoder
        if encoder is None:
            return
        for name, versions in list(self.state.collections.items()):
            if name in self.live or name in self.followers:  # opened already (a second load of the same state)
                continue
            live = None
            if self.backend == "file" and not _has_versions(versions, name):
                # no such collection in the home (ADAWIDTH_COLLECTION=nope): opening its log would create
                # <index_root>/<name>/wal/LOCK and hold the writer lock of a collection this gateway cannot serve;
                # the takeover opens it once a version of it is built
                self.errors[name] = f"NoCollection: no version of {name!r} under {versions.index_root}"
                log.error("writes of %s unavailable: %s", name, self.errors[name])
                self._take_over_later(name, versions)
                continue
            try:
                live = self._open_one(name, versions)
            except (WalError, OSError, DegenerateDocument) as e:
                self.errors[name] = f"{type(e).__name__}: {e}"
                log.error("writes of %s unavailable: %s", name, self.errors[name])
                if isinstance(e, WalLocked):
                    self._take_over_later(name, versions)
                if self.backend != "redis" or not isinstance(e, WalUnavailable):
                    continue
            if self.backend == "redis":
                self.followers[name] = LogFollower(self, name, versions, live).start()

    def _take_over_later(self, name: str, versions) -> None:
        interval = self.state.settings.wal_takeover_interval_s
        if interval > 0 and name not in self.takeovers:
            self.takeovers[name] = LogTakeover(self, name, versions, interval).start()

    def _open_one(self, name: str, versions) -> LiveCollection:
        """Open ``name``'s log, replay it after the live version's folded seq, hook the cutover callbacks."""
        s, encoder = self.state.settings, self.state.encoder
        wal = open_write_log(name, redis_url=s.redis_url, index_root=versions.index_root,
                             require_fsync=s.wal_require_fsync)
        try:
            live = LiveCollection(name, wal, encoder.dimension, encoder.encode,
                                  fingerprint=encoder_fingerprint(encoder))
            base = folded_seq(versions.live) if versions.live is not None else 0
            if wal.last_seq < base:
                raise WalCorrupt(f"the {self.backend} write-ahead log of {name} ends at seq {wal.last_seq} but the "
                                 f"live version folded up to seq {base}: the log was lost or replaced (a Redis "
                                 "without its append-only file, or REDIS_URL set or unset since the writes); new "
                                 "writes would reuse folded sequence numbers")
            counts = live.replay(base)
        except BaseException:
            wal.close()
            raise
        log.info("write-ahead log of %s (%s): last seq %d, replayed after %d: %s", name, self.backend,
                 live.log.last_seq, base, counts)
        self._hook(versions, live)
        self.live[name] = live
        return live

    @staticmethod
    def _hook(versions, live: LiveCollection) -> None:
        previous, previous_before = versions.on_live, versions.before_live

        def before_live(v, _previous=previous_before, _live=live):
            if _previous is not None:
                _previous(v)
            if folded_seq(v) < _live.base_seq:
                # a rollback to a version that folded less: replay the log after its folded seq *before* it
                # serves; that segment (a superset of the current one) is exact for both versions
                _live.replay(folded_seq(v))

        def on_live(v, _previous=previous, _live=live):
            if _previous is not None:
                _previous(v)
            if folded_seq(v) > _live.base_seq:
                # a fold went live: it holds the writes up to its folded seq; drop them from the segment
                # (after the switch: until then the old version needs them)
                counts = _live.advance(folded_seq(v))
                log.info("%s: %s folded up to seq %d; delta segment %s", _live.name, v.version, folded_seq(v),
                         counts)

        versions.before_live, versions.on_live = before_live, on_live

    def close(self) -> None:
        """Stop the followers and the takeovers and close every log (releases the writer locks and
        connections)."""
        for follower in (*self.followers.values(), *self.takeovers.values()):
            follower.stop()
        self.followers.clear()
        self.takeovers.clear()
        for live in self.live.values():
            live.close()
        self.live.clear()

    def snapshot(self, name: str) -> DeltaSnapshot | None:
        """The delta view of collection ``name`` a search reads, or None when it has no write state."""
        live = self.live.get(name)
        return live.snapshot() if live is not None else None

    def of(self, name: str) -> LiveCollection:
        """The write state of a served collection.

        Raises:
            ApiError: ``unknown_collection`` (404), ``not_ready`` (503: no encoder yet),
                ``writes_unavailable`` (503: its log could not be opened).
        """
        self.state.collection(name)
        if name in self.errors:
            raise ApiError("writes_unavailable", "this replica cannot write to the collection's log; see its log",
                           headers={"Retry-After": str(self.state.settings.retry_after_s)})
        live = self.live.get(name)
        if live is None:
            raise ApiError("not_ready", "the gateway is not ready for writes (no encoder or version loaded)")
        return live

    def closed_reason(self, name: str) -> str | None:
        """Why ``name``'s write-ahead log is not open on this replica (e.g. ``WalLocked``: another process, the
        writer, holds the file log: :class:`LogTakeover` tries again), or None when it is open, or followed
        (Redis: :meth:`follower_error`)."""
        if name in self.live or name in self.followers:
            return None
        return self.errors.get(name)

    def follower_error(self, name: str) -> str | None:
        """The last error of ``name``'s log follower (Redis), None while it follows."""
        follower = self.followers.get(name)
        return follower.error if follower is not None else None


def _has_versions(versions, name: str) -> bool:
    """Whether collection ``name`` has a live version here or any version built under its index root."""
    return versions.live is not None or bool(store.list_versions(Path(versions.index_root) / name))


def _last_folded(index_root: Path, name: str) -> int:
    best = 0
    coll = Path(index_root) / name
    for v in store.list_versions(coll):
        try:
            manifest = store.read_manifest(coll / v)
        except Exception:  # an unreadable version folded nothing this replica can serve
            continue
        best = max(best, manifest_folded_seq(manifest))
    return best


def build_write_router(state) -> APIRouter:
    """The live-document routes of the gateway (module docstring), bound to ``state`` (a GatewayState)."""
    router = APIRouter(dependencies=[Depends(require_write_key)], tags=["documents"])
    settings = state.settings
    errors = error_responses(400, 401, 403, 404, 413, 415, 422, 503, examples={
        403: "writes_disabled", 413: "body_too_large", 422: "invalid_id", 503: "writes_unavailable"})
    read_errors = {**errors, **error_responses(404, examples={404: "unknown_document"})}

    def answer(status: int, description: str, example: dict) -> dict:  # a plain-dict answer: its example
        return {status: {"description": description, "content": {"application/json": {"example": example}}}}

    def accepted(name: str, op: str, seq: int, count: int, started: float) -> JSONResponse:
        state.metrics.documents_written.labels(name, op).inc(count)
        state.metrics.write_seconds.labels(op).observe(time.perf_counter() - started)
        return JSONResponse({"collection": name, "op": op, "seq": seq, "count": count}, status_code=202)

    async def logged(fn, *args):
        try:
            return await run_in_threadpool(fn, *args)
        except DegenerateDocument as e:
            raise ApiError("degenerate_document", str(e), f"[{e.index}].text") from None
        except (WalError, OSError) as e:
            log.error("write-ahead log append failed: %s: %s", type(e).__name__, e)
            raise ApiError("writes_unavailable", "the write could not be made durable; retry",
                           headers={"Retry-After": str(settings.retry_after_s)}) from None

    @router.put("/v1/collections/{name}/documents", status_code=202, responses={
        **answer(202, "Accepted: durable (write-ahead log, fsync) and searchable.", ex.UPSERT_ACCEPTED), **errors},
        openapi_extra={"requestBody": {
            "required": True,
            "description": "The documents `{id, title?, text, fields?}`: a JSON array (application/json), or "
                           "NDJSON (application/x-ndjson: one document object a line).",
            "content": {
                "application/json": {"schema": {"type": "array", "items": {"type": "object"}},
                                     "example": ex.UPSERT_BODY},
                NDJSON: {"schema": {"type": "string"}, "example": ex.UPSERT_NDJSON}}}})
    async def put_documents(request: Request, name: str):
        """Upsert documents: 202 ``{"seq": n}`` once durable (write-ahead log, fsync) and searchable."""
        deadline = time.monotonic() + settings.write_body_timeout_s  # for the body (408 body_timeout)
        live = state.live_docs.of(name)
        ctype = media_type(request)
        docs = parse_documents(await read_body(request, settings.max_write_body_bytes, deadline), ctype,
                               max_chars=settings.max_document_chars, max_batch=settings.max_write_batch)
        started = time.perf_counter()
        seq = await logged(live.upsert, docs)
        return accepted(name, "upsert", seq, len(docs), started)

    @router.post("/v1/collections/{name}/documents/delete", status_code=202, responses={
        **answer(202, "Accepted: durable; no later search returns these ids.", ex.DELETE_ACCEPTED), **errors},
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
            "required": ["ids"]}, "example": ex.DELETE_BODY}}}})
    async def delete_documents(request: Request, name: str):
        """Delete documents by id: 202 ``{"seq": n}`` once durable; no later search returns them."""
        deadline = time.monotonic() + settings.write_body_timeout_s
        live = state.live_docs.of(name)
        if media_type(request) != "application/json":
            raise ApiError("unsupported_media_type", "send the ids as application/json")
        ids = parse_delete(await read_body(request, settings.max_write_body_bytes, deadline),
                           max_batch=settings.max_write_batch)
        started = time.perf_counter()
        seq = await logged(live.delete, ids)
        return accepted(name, "delete", seq, len(ids), started)

    @router.get("/v1/collections/{name}/documents/{doc_id:path}", responses={
        200: {"description": "The stored document: from the delta segment (seq of its write) or the live version.",
              "content": {"application/json": {"examples": {
                  "delta": {"summary": "written since the live version", "value": ex.DOCUMENTS[0]},
                  "version": {"summary": "served from the live version", "value": ex.DOCUMENTS[1]}}}}},
        **read_errors})
    async def get_document(name: str, doc_id: str):
        """The stored document ``doc_id`` and where it is served from: ``"delta"`` or the live version."""
        live = state.live_docs.of(name)
        snap = live.snapshot()
        held = snap.docs.get(doc_id)
        if held is not None:
            return {"id": doc_id, "served_from": "delta", "seq": held.seq, "document": held.doc}
        if doc_id in snap.deleted:
            raise ApiError("unknown_document", "the document was deleted", "id")
        with state.collection(name).acquire() as version:
            if version is None:
                raise ApiError("not_ready", "no index version is loaded")
            row = version.row_of.get(doc_id)
            if row is None:
                raise ApiError("unknown_document", "no document has that id", "id")
            texts = version.texts if version.texts is not None else (
                version.lexical.texts if version.lexical is not None else None)
            doc = {"id": doc_id, "text": texts[row] if texts is not None else None}
            return {"id": doc_id, "served_from": version.version, "seq": None, "document": doc}

    @router.get("/v1/collections/{name}/writes", responses={
        **answer(200, "Sequence numbers and pending writes of the collection.", ex.WRITES), **errors})
    async def writes(name: str):
        """Sequence numbers of the collection's writes: last accepted, last folded, the live version's."""
        live = state.live_docs.of(name)
        versions = state.collection(name)
        current = versions.live
        status = await logged(live.status)
        last_folded = await run_in_threadpool(_last_folded, versions.index_root, name)
        return {"collection": name, "last_accepted_seq": status["last_accepted_seq"],
                "applied_seq": status["applied_seq"],
                "last_folded_seq": max(last_folded, status["base_seq"]),
                "live_version": current.version if current is not None else None,
                "live_folded_seq": folded_seq(current) if current is not None else None,
                "pending_upserts": status["pending_upserts"], "pending_deletes": status["pending_deletes"],
                "log": state.live_docs.backend, "follower_error": state.live_docs.follower_error(name)}

    return router
