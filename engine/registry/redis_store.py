"""The Redis registry (selected by ``REDIS_URL``).

Keys for collection ``c``::

    adawidth:registry:<c>            hash   live, previous, candidates (JSON list), revision,
                                            last_action, updated_at
    adawidth:registry:<c>:history    list   JSON events, oldest first (trimmed to the last 1000)
    adawidth:registry:<c>:replicas   hash   replica id -> JSON report (live, warm, refused, ts)
    adawidth:registry:<c>:events     pub/sub channel; one JSON message per state change

Every state change is a compare-and-set: ``WATCH`` the state hash, read it, compute the new state, and
``MULTI``/``EXEC`` the new hash (revision + 1), the history event and the ``PUBLISH``; a concurrent writer
makes ``EXEC`` fail and the change is recomputed on the fresh state.  Two publishers at once therefore
serialise: every event gets its own revision and nothing is lost.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine.registry.base import Registry, Subscription
from engine.registry.state import (COLLECTION_NAME, HISTORY_LIMIT, RegistryError, RegistryState, RegistryUnavailable,
                                   finish)
from engine.version import store


def redacted(url: str) -> str:
    """``url`` with its credentials replaced by ``***`` (for messages and logs)."""
    return re.sub(r"//[^@/]*@", "//***@", url)


@contextlib.contextmanager
def unreachable_as(error: type[Exception], url: str):
    """Turn a connection error, timeout or OSError of redis-py inside the block into ``error(message)`` naming
    the (redacted) ``url``; the registry's and the write-ahead log's connection handling."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise error(f"redis at {redacted(url)} unreachable: {e}") from e


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

    def _errors(self):
        return unreachable_as(RegistryUnavailable, self.url)

    def _redacted(self) -> str:
        return redacted(self.url)

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
        """See :meth:`engine.registry.base.Registry.get`."""
        with self._errors():
            return self._decode(collection, self.client.hgetall(self._key(collection)))

    def history(self, collection, limit=100):
        """See :meth:`engine.registry.base.Registry.history`."""
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
                        new, event = finish(state, change)
                        pipe.multi()
                        pipe.hset(key, mapping=self._encode(new))
                        pipe.rpush(hist, json.dumps(event, sort_keys=True))
                        pipe.ltrim(hist, -HISTORY_LIMIT, -1)
                        pipe.publish(self.channel(collection), json.dumps(
                            {"revision": new.revision, "action": event["action"], "live": new.live}))
                        pipe.execute()
                    except redis.WatchError:
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
        """See :meth:`engine.registry.base.Registry.report_replica` (one hash field per replica)."""
        with self._errors():
            self.client.hset(self._key(collection, ":replicas"), replica,
                             json.dumps({**report, "replica": replica, "ts": time.time()}, sort_keys=True))

    def replicas(self, collection):
        """See :meth:`engine.registry.base.Registry.replicas`."""
        with self._errors():
            raw = self.client.hgetall(self._key(collection, ":replicas"))
        return {k: json.loads(v) for k, v in raw.items()}

    def subscribe(self, collection):
        """A pub/sub subscription to the collection's change channel."""
        with self._errors():
            ps = self.client.pubsub(ignore_subscribe_messages=True)
            ps.subscribe(self.channel(collection))
        return _RedisSubscription(self, ps)

    def close(self):
        """Close the connection pool (errors ignored)."""
        with contextlib.suppress(Exception):
            self.client.close()


class _RedisSubscription(Subscription):
    def __init__(self, registry: RedisRegistry, pubsub):
        self.registry, self.pubsub = registry, pubsub

    def wait(self, timeout_s):
        """See :meth:`engine.registry.base.Subscription.wait`; drains pending messages so one reconcile answers them all."""
        with self.registry._errors():
            msg = self.pubsub.get_message(timeout=timeout_s)
            got = msg is not None and msg.get("type") == "message"
            while msg is not None:  # drain: one reconcile answers them all
                msg = self.pubsub.get_message(timeout=0)
                got = got or (msg is not None and msg.get("type") == "message")
            return got

    def close(self):
        """Close the pub/sub connection (errors ignored)."""
        with contextlib.suppress(Exception):
            self.pubsub.close()
