"""The version registry: which index version of a collection is live, which was, which are candidates.

Two implementations behind one interface (:class:`Registry`):

* :class:`FileRegistry` (the embedded default, one host, no Redis): the state of
  collection ``c`` is ``<index_root>/<c>/REGISTRY.json``, rewritten by an
  atomic rename while holding an exclusive ``flock`` on ``<c>/.registry.lock``;
  the legacy ``<c>/LIVE`` pointer is kept in sync (written after the state
  file).  Replica reports are one small file per replica under ``<c>/.replicas/``.
* :class:`RedisRegistry` (selected by ``REDIS_URL``), keys for collection ``c``::

      adawidth:registry:<c>            hash   live, previous, candidates (JSON list), revision,
                                              last_action, updated_at
      adawidth:registry:<c>:history    list   JSON events, oldest first (trimmed to the last 1000)
      adawidth:registry:<c>:replicas   hash   replica id -> JSON report (live, warm, refused, ts)
      adawidth:registry:<c>:events     pub/sub channel; one JSON message per state change

  Every state change is a compare-and-set: ``WATCH`` the state hash, read it,
  compute the new state, and ``MULTI``/``EXEC`` the new hash (revision + 1), the
  history event and the ``PUBLISH``; a concurrent writer makes ``EXEC`` fail and
  the change is recomputed on the fresh state.  Two publishers at once therefore
  serialise: every event gets its own revision and nothing is lost.

State changes (:meth:`Registry.publish`, :meth:`Registry.promote`,
:meth:`Registry.rollback`, :meth:`Registry.record`) are pure functions of the
current :class:`RegistryState` (see :func:`apply_publish` and friends), shared by
both implementations.  The registry stores names only; verifying a version's
files is the caller's job (``trainer`` CLI, gateway admin endpoints, replicas).
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import json
import logging
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engine.version import store

log = logging.getLogger("engine.registry")

HISTORY_LIMIT = 1000
STATE_FILE = "REGISTRY.json"
LOCK_FILE = ".registry.lock"
REPLICAS_DIR = ".replicas"
VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
COLLECTION_NAME = VERSION_NAME


class RegistryError(RuntimeError):
    """A registry operation was refused.  ``code`` is machine-readable:

    ``invalid_version`` (not a valid version name), ``unknown_version`` (not a
    candidate of the collection), ``no_previous`` (nothing to roll back to),
    ``conflict`` (compare-and-set retries exhausted).
    """

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(f"[{code}] {message}")


class RegistryUnavailable(RegistryError):
    """The registry backend (Redis) cannot be reached; code ``registry_unavailable``."""

    def __init__(self, message: str):
        super().__init__("registry_unavailable", message)


@dataclass(frozen=True)
class RegistryState:
    """The registry's view of one collection.

    Attributes:
        collection: collection name.
        live: the version every replica should serve (None before the first promotion).
        previous: the version live before the last promotion or rollback (the rollback target).
        candidates: registered, not yet promoted versions, oldest first.
        revision: incremented by every state change (0: nothing recorded yet).
        last_action: ``publish``, ``promote``, ``rollback`` or ``record`` (the last change's kind).
        updated_at: unix time of the last change, in seconds.
    """

    collection: str
    live: str | None = None
    previous: str | None = None
    candidates: tuple[str, ...] = ()
    revision: int = 0
    last_action: str | None = None
    updated_at: float | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["candidates"] = list(self.candidates)
        return d


@dataclass
class Change:
    """What a state function returns: the new state (revision not yet bumped) and the history event."""

    state: RegistryState
    event: dict


def check_version_name(version: str) -> str:
    """Return ``version`` or raise :class:`RegistryError` (``invalid_version``) for a name that is not a
    plain directory name (letters, digits, ``._-``, at most 128 characters, no leading dot)."""
    if not isinstance(version, str) or not VERSION_NAME.match(version):
        raise RegistryError("invalid_version", f"{version!r} is not a valid version name")
    return version


def apply_publish(state: RegistryState, version: str) -> Change | None:
    """Register ``version`` as a candidate (None: already live or a candidate, nothing to do)."""
    check_version_name(version)
    if version == state.live or version in state.candidates:
        return None
    return Change(replace(state, candidates=state.candidates + (version,), last_action="publish"),
                  {"action": "publish", "version": version})


def apply_promote(state: RegistryState, version: str | None = None, gate: dict | None = None) -> Change | None:
    """Make a candidate live; the old live version becomes ``previous``.

    ``version`` None promotes the newest candidate.  Promoting the live version
    is a no-op (None).  Raises :class:`RegistryError` ``unknown_version`` when
    ``version`` is not a candidate (publish it first).
    """
    if version is None:
        if not state.candidates:
            raise RegistryError("unknown_version", f"collection {state.collection!r} has no candidate to promote")
        version = state.candidates[-1]
    check_version_name(version)
    if version == state.live:
        return None
    if version not in state.candidates:
        raise RegistryError("unknown_version", f"{version!r} is not a candidate of {state.collection!r} "
                                               f"(publish it first)")
    event = {"action": "promote", "version": version, "from": state.live}
    if gate is not None:
        event["gate"] = gate
    return Change(replace(state, live=version, previous=state.live,
                          candidates=tuple(c for c in state.candidates if c != version), last_action="promote"), event)


def apply_rollback(state: RegistryState, reason: str | None = None) -> Change:
    """Swap ``live`` and ``previous`` (a second rollback undoes the first).

    Raises :class:`RegistryError` ``no_previous`` when there is nothing to roll back to.
    """
    if state.previous is None:
        raise RegistryError("no_previous", f"collection {state.collection!r} has no previous version to roll back to")
    event = {"action": "rollback", "version": state.previous, "from": state.live}
    if reason:
        event["reason"] = reason
    return Change(replace(state, live=state.previous, previous=state.live, last_action="rollback"), event)


def apply_record(state: RegistryState, event: dict) -> Change:
    """Append an event to the history without changing live/previous/candidates (e.g. a refused promotion)."""
    return Change(replace(state, last_action="record"), dict(event))


class Subscription(abc.ABC):
    """Change notifications of one collection."""

    @abc.abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds; True when a change was (probably) made.

        Raises:
            RegistryUnavailable: the backend was lost (subscribe again after a backoff).
        """

    def close(self) -> None:  # noqa: B027 - optional
        """Release the subscription."""


class Registry(abc.ABC):
    """Registry interface: read the state, change it by compare-and-set, report replicas, subscribe.

    Every method may raise :class:`RegistryUnavailable` when the backend cannot be reached.
    """

    kind: str = "abstract"

    @abc.abstractmethod
    def get(self, collection: str) -> RegistryState:
        """Current state (a state with revision 0 when nothing was recorded)."""

    @abc.abstractmethod
    def history(self, collection: str, limit: int = 100) -> list[dict]:
        """The last ``limit`` events, oldest first; each has ``revision``, ``ts`` (unix s), ``action``, ..."""

    @abc.abstractmethod
    def _transact(self, collection: str, fn: Callable[[RegistryState], Change | None]) -> RegistryState:
        """Apply ``fn`` to the current state atomically (compare-and-set), bump the revision, append
        the event, notify subscribers; return the new state (the unchanged one when ``fn`` returns None)."""

    @abc.abstractmethod
    def report_replica(self, collection: str, replica: str, report: dict) -> None:
        """Record what a replica holds: ``{"live": str|None, "warm": [str], "refused": {version: code}}``
        (``ts`` is added here)."""

    @abc.abstractmethod
    def replicas(self, collection: str) -> dict[str, dict]:
        """Replica id -> its last report (with ``ts``, unix seconds); callers judge freshness."""

    @abc.abstractmethod
    def subscribe(self, collection: str) -> Subscription:
        """A subscription to the collection's changes."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""

    # -- operations shared by both implementations ---------------------------------------------
    def publish(self, collection: str, version: str, actor: str | None = None) -> RegistryState:
        """Register ``version`` as a candidate (idempotent)."""
        return self._transact(collection, _with_actor(lambda s: apply_publish(s, version), actor))

    def promote(self, collection: str, version: str | None = None, *, gate: dict | None = None,
                actor: str | None = None) -> RegistryState:
        """Make a candidate live (see :func:`apply_promote`); ``gate`` is the quality-gate report to record."""
        return self._transact(collection, _with_actor(lambda s: apply_promote(s, version, gate), actor))

    def rollback(self, collection: str, *, reason: str | None = None, actor: str | None = None) -> RegistryState:
        """Swap live and previous (see :func:`apply_rollback`)."""
        return self._transact(collection, _with_actor(lambda s: apply_rollback(s, reason), actor))

    def record(self, collection: str, event: dict, actor: str | None = None) -> RegistryState:
        """Append an event (e.g. ``{"action": "refuse", "version": v, "reason": ...}``) to the history."""
        return self._transact(collection, _with_actor(lambda s: apply_record(s, event), actor))

    def warm_replicas(self, collection: str, version: str, fresh_s: float = 30.0) -> list[str]:
        """Replicas whose report younger than ``fresh_s`` seconds lists ``version`` as warm."""
        now = time.time()
        return sorted(r for r, rep in self.replicas(collection).items()
                      if now - rep.get("ts", 0) <= fresh_s and version in rep.get("warm", ()))


def _with_actor(fn: Callable[[RegistryState], Change | None], actor: str | None):
    def wrapped(state: RegistryState) -> Change | None:
        change = fn(state)
        if change is not None and actor:
            change.event.setdefault("actor", actor)
        return change
    return wrapped


def _finish(state: RegistryState, change: Change) -> tuple[RegistryState, dict]:
    now = time.time()
    new = replace(change.state, revision=state.revision + 1, updated_at=now)
    event = {"revision": new.revision, "ts": now, **change.event}
    return new, event


# --------------------------------------------------------------------------------------------------
# file registry


class FileRegistry(Registry):
    """Registry on the index volume (single host).  See the module docstring for the files.

    Args:
        index_root: root of index versions (``<index_root>/<collection>/<version>/``).
        mirror_live: keep ``<collection>/LIVE`` equal to the registry's live version.
    """

    kind = "file"

    def __init__(self, index_root: Path | str, *, mirror_live: bool = True):
        self.index_root = Path(index_root)
        self.mirror_live = mirror_live

    def _dir(self, collection: str) -> Path:
        if not COLLECTION_NAME.match(collection or ""):
            raise RegistryError("invalid_version", f"{collection!r} is not a valid collection name")
        return self.index_root / collection

    def _read(self, collection: str) -> dict:
        path = self._dir(collection) / STATE_FILE
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
        # no registry yet: adopt the legacy LIVE pointer (revision 0)
        live = store.read_live_pointer(self._dir(collection))
        return {"state": RegistryState(collection, live=live).as_dict(), "history": []}

    @staticmethod
    def _state_of(raw: dict) -> RegistryState:
        s = dict(raw["state"])
        s["candidates"] = tuple(s.get("candidates") or ())
        return RegistryState(**s)

    def get(self, collection: str) -> RegistryState:
        return self._state_of(self._read(collection))

    def history(self, collection: str, limit: int = 100) -> list[dict]:
        return self._read(collection)["history"][-limit:]

    @contextlib.contextmanager
    def _locked(self, collection: str) -> Iterator[Path]:
        d = self._dir(collection)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / LOCK_FILE, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield d
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _transact(self, collection, fn):
        with self._locked(collection) as d:
            raw = self._read(collection)
            state = self._state_of(raw)
            change = fn(state)
            if change is None:
                return state
            new, event = _finish(state, change)
            doc = {"state": new.as_dict(), "history": (raw["history"] + [event])[-HISTORY_LIMIT:]}
            _atomic_write_json(d / STATE_FILE, doc)
            if self.mirror_live and new.live is not None and new.live != store.read_live_pointer(d):
                try:
                    store.write_live_pointer(d, new.live)
                except store.IndexVersionError as e:  # not a complete version here: replicas refuse it too
                    log.warning("LIVE pointer of %s not updated: %s", collection, e)
            return new

    def report_replica(self, collection, replica, report):
        """Write the report; on a read-only index volume reports are skipped (logged once)."""
        d = self._dir(collection) / REPLICAS_DIR
        try:
            d.mkdir(parents=True, exist_ok=True)
            _atomic_write_json(d / f"{_safe(replica)}.json", {**report, "replica": replica, "ts": time.time()},
                               fsync=False)
        except OSError as e:
            if not getattr(self, "_report_warned", False):
                log.warning("cannot write replica reports under %s (%s); warm reports are unavailable", d, e)
                self._report_warned = True

    def replicas(self, collection):
        d = self._dir(collection) / REPLICAS_DIR
        out = {}
        if d.is_dir():
            for p in d.glob("*.json"):
                with contextlib.suppress(OSError, json.JSONDecodeError):
                    rep = json.loads(p.read_text(encoding="utf-8"))
                    out[rep.get("replica", p.stem)] = rep
        return out

    def subscribe(self, collection):
        return _FileSubscription(self._dir(collection) / STATE_FILE)


class _FileSubscription(Subscription):
    """Polls the state file's (inode, size, mtime) every 0.1 s."""

    def __init__(self, path: Path):
        self.path = path
        self.last = self._sig()

    def _sig(self):
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def wait(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while True:
            sig = self._sig()
            if sig != self.last:
                self.last = sig
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.1, left))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:128] or "_"


def _atomic_write_json(path: Path, obj, fsync: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------------
# Redis registry


class RedisRegistry(Registry):
    """Registry in Redis (see the module docstring for the keys).

    Args:
        url: ``redis://host:port/db``.
        prefix: key prefix (default ``adawidth:registry``).
        socket_timeout_s: per-command socket timeout, in seconds.
        max_retries: compare-and-set attempts before ``conflict``.
        mirror_root: when given, a promotion or rollback made through this
            client also rewrites ``<mirror_root>/<collection>/LIVE`` (best effort),
            so a replica that starts while Redis is down serves the last live version.
    """

    kind = "redis"

    def __init__(self, url: str, *, prefix: str = "adawidth:registry", socket_timeout_s: float = 2.0,
                 max_retries: int = 200, mirror_root: Path | str | None = None):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._redis = redis
        self.url = url
        self.prefix = prefix
        self.max_retries = max_retries
        self.mirror_root = Path(mirror_root) if mirror_root else None
        # one immediate retry (a pooled connection may have died with a Redis restart); the follower's
        # own backoff handles longer outages, so redis-py's default of 10 backed-off retries is off
        self.client = redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                           socket_connect_timeout=socket_timeout_s, decode_responses=True,
                                           retry=Retry(NoBackoff(), 1))

    def _key(self, collection: str, suffix: str = "") -> str:
        if not COLLECTION_NAME.match(collection or ""):
            raise RegistryError("invalid_version", f"{collection!r} is not a valid collection name")
        return f"{self.prefix}:{collection}{suffix}"

    def channel(self, collection: str) -> str:
        """The pub/sub channel of a collection's changes."""
        return self._key(collection, ":events")

    @contextlib.contextmanager
    def _errors(self):
        try:
            yield
        except (self._redis.ConnectionError, self._redis.TimeoutError, OSError) as e:
            raise RegistryUnavailable(f"redis at {self._redacted()} unreachable: {e}") from e

    def _redacted(self) -> str:
        return re.sub(r"//[^@/]*@", "//***@", self.url)

    @staticmethod
    def _decode(collection: str, h: dict) -> RegistryState:
        if not h:
            return RegistryState(collection)
        return RegistryState(collection, live=h.get("live") or None, previous=h.get("previous") or None,
                             candidates=tuple(json.loads(h.get("candidates") or "[]")),
                             revision=int(h.get("revision", 0)), last_action=h.get("last_action") or None,
                             updated_at=float(h["updated_at"]) if h.get("updated_at") else None)

    @staticmethod
    def _encode(s: RegistryState) -> dict:
        return {"live": s.live or "", "previous": s.previous or "", "candidates": json.dumps(list(s.candidates)),
                "revision": s.revision, "last_action": s.last_action or "", "updated_at": s.updated_at or ""}

    def get(self, collection):
        with self._errors():
            return self._decode(collection, self.client.hgetall(self._key(collection)))

    def history(self, collection, limit=100):
        with self._errors():
            return [json.loads(x) for x in self.client.lrange(self._key(collection, ":history"), -limit, -1)]

    def _transact(self, collection, fn):
        key, hist = self._key(collection), self._key(collection, ":history")
        with self._errors():
            for attempt in range(self.max_retries):
                with self.client.pipeline() as pipe:
                    try:
                        pipe.watch(key)
                        state = self._decode(collection, pipe.hgetall(key))
                        change = fn(state)
                        if change is None:
                            pipe.unwatch()
                            return state
                        new, event = _finish(state, change)
                        pipe.multi()
                        pipe.hset(key, mapping=self._encode(new))
                        pipe.rpush(hist, json.dumps(event, sort_keys=True))
                        pipe.ltrim(hist, -HISTORY_LIMIT, -1)
                        pipe.publish(self.channel(collection), json.dumps(
                            {"revision": new.revision, "action": event["action"], "live": new.live}))
                        pipe.execute()
                    except self._redis.WatchError:
                        time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
                        continue
                self._mirror(collection, state, new)
                return new
        raise RegistryError("conflict", f"{collection}: {self.max_retries} compare-and-set attempts lost the race")

    def _mirror(self, collection: str, old: RegistryState, new: RegistryState) -> None:
        if self.mirror_root is None or new.live is None or new.live == old.live:
            return
        with contextlib.suppress(OSError, store.IndexVersionError):
            store.write_live_pointer(self.mirror_root / collection, new.live)

    def report_replica(self, collection, replica, report):
        with self._errors():
            self.client.hset(self._key(collection, ":replicas"), replica,
                             json.dumps({**report, "replica": replica, "ts": time.time()}, sort_keys=True))

    def replicas(self, collection):
        with self._errors():
            raw = self.client.hgetall(self._key(collection, ":replicas"))
        return {k: json.loads(v) for k, v in raw.items()}

    def subscribe(self, collection):
        with self._errors():
            ps = self.client.pubsub(ignore_subscribe_messages=True)
            ps.subscribe(self.channel(collection))
        return _RedisSubscription(self, ps)

    def close(self):
        with contextlib.suppress(Exception):
            self.client.close()


class _RedisSubscription(Subscription):
    def __init__(self, registry: RedisRegistry, pubsub):
        self.registry, self.pubsub = registry, pubsub

    def wait(self, timeout_s):
        with self.registry._errors():
            msg = self.pubsub.get_message(timeout=timeout_s)
            got = msg is not None and msg.get("type") == "message"
            while msg is not None:  # drain: one reconcile answers them all
                msg = self.pubsub.get_message(timeout=0)
                got = got or (msg is not None and msg.get("type") == "message")
            return got

    def close(self):
        with contextlib.suppress(Exception):
            self.pubsub.close()


def open_registry(*, redis_url: str | None, index_root: Path | str, mirror_live: bool = True) -> Registry:
    """The Redis registry when ``redis_url`` is set, else the file registry on ``index_root``."""
    if redis_url:
        return RedisRegistry(redis_url, mirror_root=index_root if mirror_live else None)
    return FileRegistry(index_root, mirror_live=mirror_live)
