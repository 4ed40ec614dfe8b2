"""The registry interface: read a collection's state, change it by compare-and-set, report replicas, subscribe.

Two backends implement :class:`Registry`: :class:`engine.registry.file.FileRegistry` (one host, no Redis) and
:class:`engine.registry.redis_store.RedisRegistry`; :func:`engine.registry.open_registry` picks one from the
settings.  The state transitions themselves are :mod:`engine.registry.state`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable

from engine.registry.state import (Change, RegistryState, apply_promote, apply_publish, apply_record, apply_rollback,
                                   with_actor)


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
        return self._transact(collection, with_actor(lambda s: apply_publish(s, version), actor))

    def promote(self, collection: str, version: str | None = None, *, gate: dict | None = None,
                actor: str | None = None) -> RegistryState:
        """Make a candidate live (see :func:`apply_promote`); ``gate`` is the quality-gate report to record."""
        return self._transact(collection, with_actor(lambda s: apply_promote(s, version, gate), actor))

    def rollback(self, collection: str, *, reason: str | None = None, actor: str | None = None) -> RegistryState:
        """Swap live and previous (see :func:`apply_rollback`)."""
        return self._transact(collection, with_actor(lambda s: apply_rollback(s, reason), actor))

    def record(self, collection: str, event: dict, actor: str | None = None) -> RegistryState:
        """Append an event (e.g. ``{"action": "refuse", "version": v, "reason": ...}``) to the history."""
        return self._transact(collection, with_actor(lambda s: apply_record(s, event), actor))

    def warm_replicas(self, collection: str, version: str, fresh_s: float = 30.0) -> list[str]:
        """Replicas whose report younger than ``fresh_s`` seconds lists ``version`` as warm."""
        now = time.time()
        return sorted(r for r, rep in self.replicas(collection).items()
                      if now - rep.get("ts", 0) <= fresh_s and version in rep.get("warm", ()))
