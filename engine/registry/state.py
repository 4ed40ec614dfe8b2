"""Registry state and its transitions: pure functions of the current :class:`RegistryState`.

A collection's registry state says which index version is live, which was (the rollback target) and which
are candidates.  :func:`apply_publish`, :func:`apply_promote`, :func:`apply_rollback` and
:func:`apply_record` compute a :class:`Change` (the new state and the history event) from the current state;
the backends (:mod:`engine.registry.file`, :mod:`engine.registry.redis_store`) apply it by compare-and-set
through :meth:`engine.registry.base.Registry._transact`.  Nothing here does I/O.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

HISTORY_LIMIT = 1000
"""History events kept per collection (the oldest are trimmed)."""
VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
COLLECTION_NAME = VERSION_NAME


class RegistryError(RuntimeError):
    """A registry operation was refused.  ``code`` is machine-readable:

    ``invalid_version`` (not a valid version name), ``unknown_version`` (not a
    candidate of the collection), ``no_previous`` (nothing to roll back to),
    ``conflict`` (compare-and-set retries exhausted).
    """

    def __init__(self, code: str, message: str):
        self.code, self.message = code, message
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
        """The state as JSON-ready types (candidates as a list)."""
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
        shown = version if not isinstance(version, str) or len(version) <= 64 else version[:64] + "..."
        raise RegistryError("invalid_version", f"{shown!r} is not a valid version name (letters, digits, '.', '_' "
                                               "and '-', at most 128 characters, no leading '.' or '-')")
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


def with_actor(fn: Callable[[RegistryState], Change | None], actor: str | None):
    """``fn`` that also records ``actor`` (who made the change) in the event of the change it returns."""

    def wrapped(state: RegistryState) -> Change | None:
        change = fn(state)
        if change is not None and actor:
            change.event.setdefault("actor", actor)
        return change
    return wrapped


def finish(state: RegistryState, change: Change) -> tuple[RegistryState, dict]:
    """The new state of ``change`` with its revision bumped and ``updated_at`` set (unix seconds), and the
    history event with ``revision`` and ``ts`` added."""
    now = time.time()
    new = replace(change.state, revision=state.revision + 1, updated_at=now)
    event = {"revision": new.revision, "ts": now, **change.event}
    return new, event
