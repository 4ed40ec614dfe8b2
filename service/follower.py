"""The registry follower of a gateway replica, and the replica's start-up.

:class:`RegistryFollower` is the replica's background thread: it reconciles with the registry on every change
notification (Redis pub/sub, or the file registry's state-file poll) and every ``registry_poll_s`` seconds.
A reconcile loads, verifies and warms new versions (:meth:`service.version_manager.VersionManager.ensure_loaded`),
reports to the registry which versions this replica holds warm, and switches live when the registry's live
version changed.  A refused version is recorded in the registry history.  When the registry is unreachable
the replica keeps serving, reports itself degraded, and retries with exponential backoff; the first
successful reconcile converges it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.registry import open_registry
from engine.registry.base import Registry
from engine.registry.state import RegistryState, RegistryUnavailable
from engine.version import store
from service.version_manager import VersionManager, VersionRefused

log = logging.getLogger(__name__)


def default_replica_id(port: int | None = None) -> str:
    """``<hostname>:<port>`` (or ``<hostname>:pid<pid>``)."""
    return f"{socket.gethostname()}:{port}" if port else f"{socket.gethostname()}:pid{os.getpid()}"


class RegistryFollower:
    """Background thread keeping a :class:`VersionManager` in step with the registry.

    Args:
        registry: the registry.
        manager: the replica's versions.
        replica: this replica's id (reported to the registry).
        poll_s: seconds between reconciles when no notification arrives.
        backoff_initial_s / backoff_max_s: reconnect backoff after the registry is lost (doubles, ±20 % jitter).
        fallback_live: called when the registry cannot be read at start, or has no live version;
            returns a version name (the file LIVE pointer) or None.
        metrics: :class:`service.metrics.CutoverMetrics` (``registry_up``).
    """

    def __init__(self, registry: Registry, manager: VersionManager, replica: str, *, poll_s: float = 1.0,
                 backoff_initial_s: float = 0.2, backoff_max_s: float = 5.0,
                 fallback_live: Callable[[], str | None] | None = None, metrics=None):
        self.registry, self.manager, self.replica = registry, manager, replica
        self.poll_s, self.backoff_initial_s, self.backoff_max_s = poll_s, backoff_initial_s, backoff_max_s
        self.fallback_live = fallback_live
        self.metrics = metrics
        self.collection = manager.collection
        self.registry_error: str | None = None
        self.registry_live: str | None = None
        self.revision: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reconcile_lock = threading.Lock()
        self._last_report: tuple | None = None
        self._last_report_at = 0.0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Reconcile once in the caller (so the replica starts serving), then follow in a daemon thread."""
        try:
            self.reconcile()
            self._up()
        except RegistryUnavailable as e:
            self._down(e)
            self._fallback()
        except Exception:  # e.g. an unreadable state file: serve the LIVE pointer, keep following
            log.exception("first reconcile with the registry failed")
            self._fallback()
        self._thread = threading.Thread(target=self._run, name=f"registry-follower-{self.collection}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the follower thread, waiting up to ``timeout_s`` seconds for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def degraded(self) -> bool:
        """True while the registry is unreachable (the replica keeps serving its live version)."""
        return self.registry_error is not None

    def _up(self) -> None:
        if self.registry_error is not None:
            log.warning("registry %s reachable again; converged at revision %s", self.registry.kind, self.revision)
        self.registry_error = None
        if self.metrics is not None:
            self.metrics.registry_up.set(1)

    def _down(self, e: Exception) -> None:
        if self.registry_error is None:
            log.error("registry %s unreachable, serving %s/%s until it returns: %s", self.registry.kind,
                      self.collection, self.manager.live.version if self.manager.live else None, e)
        self.registry_error = str(e)
        if self.metrics is not None:
            self.metrics.registry_up.set(0)

    def _fallback(self) -> None:
        if self.manager.live is not None or self.fallback_live is None:
            return
        name = self.fallback_live()
        if name:
            with contextlib.suppress(Exception):
                self.manager.ensure_loaded(name)
                self.manager.switch(name, "start")

    def _run(self) -> None:
        sub = None
        backoff = self.backoff_initial_s
        while not self._stop.is_set():
            try:
                if sub is None:
                    sub = self.registry.subscribe(self.collection)
                    # reachable again: say so before reconciling, so that a replica never serves the new live
                    # version while /readyz still reports the registry lost (reconcile raises if it drops again)
                    self._up()
                    backoff = self.backoff_initial_s
                    self.reconcile()  # changes missed while unsubscribed
                sub.wait(self.poll_s)
                if self._stop.is_set():
                    break
                self.reconcile()
                self._up()
            except RegistryUnavailable as e:
                self._down(e)
                if sub is not None:
                    sub.close()
                    sub = None
                self._stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self.backoff_max_s)
            except Exception:  # never let the follower die; the live version keeps serving
                log.exception("registry follower error; retrying")
                self._stop.wait(self.poll_s)
        if sub is not None:
            sub.close()

    def status(self) -> dict:
        """Registry view for ``/readyz``: kind, revision, the registry's live version, and degradation reasons."""
        live = self.manager.live
        degraded = []
        if self.registry_error is not None:
            degraded.append(f"registry unreachable: {self.registry_error}")
        if self.registry_live and (live is None or self.registry_live != live.version):
            code = self.manager.refused.get(self.registry_live)
            degraded.append(f"registry live version {self.registry_live} "
                            + (f"refused here ({code})" if code else "not switched to yet"))
        return {"registry": self.registry.kind, "registry_revision": self.revision, "registry_live": self.registry_live,
                "warm_versions": self.manager.warm(), "degraded": degraded}

    # -- one reconcile --------------------------------------------------------------------------
    def reconcile(self) -> RegistryState:
        """Bring this replica in line with the registry; returns the state read.

        Raises:
            RegistryUnavailable: the registry cannot be read (nothing changes locally).
        """
        with self._reconcile_lock:
            state = self.registry.get(self.collection)
            self.revision = state.revision
            self.registry_live = state.live
            target = state.live or (self.fallback_live() if self.fallback_live and self.manager.live is None else None)
            # the live version first (a promotion must not wait behind candidate warm-ups) ...
            if target and target not in self.manager.refused:
                try:
                    self.manager.ensure_loaded(target)
                    self.manager.switch(target, state.last_action or "promote")
                except Exception as e:
                    self._report_refusal(target, e)
            # ... then the candidates and the rollback target, kept warm
            for name in (*state.candidates, state.previous):
                if name and name not in self.manager.refused:
                    try:
                        self.manager.ensure_loaded(name)
                    except Exception as e:
                        self._report_refusal(name, e)
            if state.revision > 0 or state.live:
                self.manager.retain({n for n in (state.live, state.previous, *state.candidates) if n})
            self._report()
            return state

    def _report_refusal(self, version: str, e: Exception) -> None:
        if getattr(e, "transient", False):  # e.g. Milvus unreachable: retried on the next reconcile, not refused
            log.warning("cannot load %s/%s yet: %s", self.collection, version, e)
            return
        code = getattr(e, "code", "load_error")
        with contextlib.suppress(RegistryUnavailable):
            self.registry.record(self.collection, {"action": "refuse", "version": version, "reason": code,
                                                   "detail": str(e)[:500], "replica": self.replica})

    def _report(self, every_s: float = 10.0) -> None:
        live = self.manager.live
        rep = {"live": live.version if live else None, "warm": self.manager.warm(),
               "refused": dict(self.manager.refused)}
        key = (rep["live"], tuple(rep["warm"]), tuple(sorted(rep["refused"].items())))
        now = time.monotonic()
        if key != self._last_report or now - self._last_report_at >= every_s:
            self.registry.report_replica(self.collection, self.replica, rep)
            self._last_report, self._last_report_at = key, now


class PinnedLease:
    """Reports a pinned collection's versions to the registry, so that version retention keeps their files.

    A replica pinned with ``ADAWIDTH_VERSION`` follows no registry entry (it never switches), but it still serves
    from its version's directory: without a report no lease protects that directory, and ``trainer retention``
    would delete an old pinned version under it.  This thread reports ``{"live": <pinned version>, "warm": [...],
    "refused": {}, "pinned": true}`` (:meth:`engine.registry.base.Registry.report_replica`) at once and then
    every ``every_s`` seconds (below the trainer's ``lease_fresh_seconds``, default 60 s); a failed report is
    logged, shown in :meth:`status` and retried on the next beat, and serving goes on.

    Args:
        registry: the registry the trainer reads leases from.
        manager: the pinned collection's versions.
        replica: this replica's id.
        every_s: seconds between reports (> 0).
    """

    def __init__(self, registry: Registry, manager: VersionManager, replica: str, *, every_s: float = 10.0):
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self.registry, self.manager, self.replica, self.every_s = registry, manager, replica, every_s
        self.collection = manager.collection
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Report once in the caller, then every ``every_s`` seconds in a daemon thread."""
        self.report()
        self._thread = threading.Thread(target=self._run, name=f"pinned-lease-{self.collection}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop reporting (the lease then lapses after the trainer's ``lease_fresh_seconds``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.report()

    def report(self) -> bool:
        """One report of the live and warm versions; False (and :attr:`error` set) when it failed."""
        live = self.manager.live
        rep = {"live": live.version if live else None, "warm": self.manager.warm(), "refused": {}, "pinned": True}
        try:
            self.registry.report_replica(self.collection, self.replica, rep)
        except Exception as e:  # RegistryUnavailable, OSError: keep serving, retry on the next beat
            if self.error is None:
                log.error("cannot report the lease of pinned %s/%s: %s", self.collection, rep["live"], e)
            self.error = str(e) or type(e).__name__
            return False
        self.error = None
        return True

    def status(self) -> dict:
        """Registry view for ``/readyz``: ``{"registry": "pinned", "degraded": [...]}``; degraded while the
        last lease report failed (retention may then delete the pinned version's files)."""
        return {"registry": "pinned", "lease_registry": self.registry.kind,
                "degraded": [f"lease not reported: {self.error}"] if self.error else []}


def start_replica(settings, manager: VersionManager, metrics=None, *, registry: Registry | None = None):
    """Load the first live version of ``manager``'s collection and start following its registry entry.

    When ``settings.version`` is set and the manager's collection is the default one (``settings.collection``)
    the collection is pinned to that version: it never follows the registry, but a :class:`PinnedLease` reports
    it there, so retention keeps its files.  Otherwise the collection follows its own entry in
    ``registry`` (opened with :func:`engine.registry.open_registry` when None; a gateway serving several
    collections passes the one it shares between them): one reconcile here (falling back to the collection's
    ``LIVE`` file when the registry is unreachable or empty), then the follower thread.

    Returns:
        ``(registry | None, follower | None, load_error | None)``; for a pinned collection the follower is its
        :class:`PinnedLease` (None when the pinned version was refused).
    """
    root, coll = Path(settings.index_root), manager.collection
    replica = settings.replica_id or default_replica_id(settings.port)
    if settings.version and coll == settings.collection:
        try:
            manager.ensure_loaded(settings.version)
            manager.switch(settings.version, "start")
        except VersionRefused as e:
            return None, None, str(e)
        if registry is None:
            registry = open_registry(redis_url=settings.redis_url, index_root=root)
        lease = PinnedLease(registry, manager, replica)
        lease.start()
        return registry, lease, None
    if registry is None:
        registry = open_registry(redis_url=settings.redis_url, index_root=root)

    def fallback() -> str | None:
        try:
            return store.read_live_pointer(root / coll)
        except (OSError, ValueError, KeyError):
            return None

    follower = RegistryFollower(registry, manager, replica,
                                poll_s=settings.registry_poll_s, backoff_max_s=settings.registry_backoff_max_s,
                                fallback_live=fallback, metrics=metrics)
    follower.start()
    error = None
    if manager.live is None:
        refused = {v: c for v, c in manager.refused.items()}
        error = (f"collection {coll!r} under {root} has no live version"
                 + (f" that loads (refused: {refused})" if refused else
                    " (build one: python -m trainer build --dataset ...)"))
    return registry, follower, error
