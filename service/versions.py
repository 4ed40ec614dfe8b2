"""Index versions held by one gateway replica: reference counting, atomic switch, and the registry follower.

:class:`VersionManager` holds every loaded :class:`~engine.index.IndexVersion`
of the replica's collection with a reference count.  A request calls
:meth:`VersionManager.acquire` once at its start and keeps the returned lease to
its end, so it sees one version's rotation, documents, ids and routers
throughout, whatever happens to the live pointer meanwhile.  :meth:`switch`
replaces the live pointer under a lock (one reference assignment); a version
that is no longer wanted (neither live, previous nor a candidate) is dropped
only once its reference count is zero.

:class:`RegistryFollower` is the replica's background thread: it reconciles with
the registry on every change notification (Redis pub/sub, or the file
registry's state-file poll) and every ``registry_poll_s`` seconds.  A reconcile
loads and verifies new versions (checksums, encoder hash, dimension, router
feature names, collection), warms them with canary queries through the full
path, reports to the registry which versions this replica holds warm, and
switches live when the registry's live version changed.  A version that fails
any check is *refused*: logged, counted in ``adawidth_versions_refused_total``,
recorded in the registry history, and never served; the live version is
untouched.  When the registry is unreachable the replica keeps serving, reports
itself degraded, and retries with exponential backoff; the first successful
reconcile converges it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.version import store
from adawidth.router import FEATURE_NAMES
from engine.index import IndexVersion
from engine.registry.base import Registry
from engine.registry.state import RegistryState, RegistryUnavailable
from engine.stage1 import Stage1Unavailable

log = logging.getLogger("service.versions")


@dataclass
class _Held:
    version: IndexVersion
    refs: int = 0
    warm: bool = False
    loaded_at: float = field(default_factory=time.time)


class VersionRefused(RuntimeError):
    """A version failed a check; ``code`` is the refusal reason (a bounded label value)."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(f"[{code}] {message}")


REFUSAL_CODES = ("missing", "schema", "checksum", "encoder_mismatch", "dimension_mismatch", "router_mismatch",
                 "collection_mismatch", "canary_failed", "load_error", "quality_gate")


class VersionManager:
    """Loaded versions of one collection with reference counts and the live pointer.

    Args:
        collection: the collection served.
        index_root: root of the versions (``<index_root>/<collection>/<version>/``).
        encoder: the replica's :class:`engine.encoder.OnnxEncoder` (hash, dimension, canaries).
        metrics: :class:`service.metrics.CutoverMetrics` (or None).
        canary_queries: texts run through encode + search on every width policy before a version
            counts as warm.
    """

    def __init__(self, collection: str, index_root: Path | str, encoder, metrics=None,
                 canary_queries: tuple[str, ...] = ()):
        self.collection = collection
        self.index_root = Path(index_root)
        self.encoder = encoder
        self.metrics = metrics
        self.canary_queries = tuple(canary_queries)
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._live: str | None = None
        self._wanted: set[str] = set()
        self.refused: dict[str, str] = {}  # version -> refusal code (not retried until restart)
        self.on_live = None  # called with the IndexVersion after each switch (outside the lock)
        self.stage1 = None  # engine.stage1.Stage1Provider (None: faiss in process)
        self._loading = threading.Lock()

    # -- request side -------------------------------------------------------------------------
    @property
    def live(self) -> IndexVersion | None:
        """The live version now (for display; requests use :meth:`acquire`)."""
        with self._lock:
            return self._held[self._live].version if self._live else None

    @contextlib.contextmanager
    def acquire(self) -> Iterator[IndexVersion | None]:
        """Hold one reference to the live version for the duration of the ``with`` block.

        Yields the version, or None when nothing is live.  The version is not
        unloaded before the block exits, even if live switches meanwhile.
        """
        with self._lock:
            name = self._live
            if name is not None:
                self._held[name].refs += 1
        try:
            yield self._held[name].version if name is not None else None
        finally:
            if name is not None:
                with self._lock:
                    self._held[name].refs -= 1
                    self._collect_locked()

    def refs(self, version: str) -> int:
        """Requests holding ``version`` now (0 when not loaded)."""
        with self._lock:
            h = self._held.get(version)
            return h.refs if h else 0

    def loaded(self) -> list[str]:
        """Names of the versions in memory, sorted."""
        with self._lock:
            return sorted(self._held)

    def warm(self) -> list[str]:
        """Names of loaded versions that passed their canaries, sorted."""
        with self._lock:
            return sorted(n for n, h in self._held.items() if h.warm)

    # -- control side -------------------------------------------------------------------------
    def ensure_loaded(self, version: str) -> IndexVersion:
        """Load, verify and warm ``version`` unless held; return it.

        Raises:
            VersionRefused: the version failed a check (also recorded in ``self.refused`` and the metric).
        """
        with self._lock:
            if version in self._held and self._held[version].warm:
                return self._held[version].version
        if version in self.refused:
            raise VersionRefused(self.refused[version], f"{self.collection}/{version} was refused before")
        with self._loading:  # one load at a time; a second caller finds it held
            with self._lock:
                if version in self._held and self._held[version].warm:
                    return self._held[version].version
            start = time.perf_counter()
            try:
                v = self._load_checked(version)
                self._canary(v)
            except VersionRefused as e:
                self._refuse(version, e)
                raise
            seconds = time.perf_counter() - start
            if self.metrics is not None:
                self.metrics.load_seconds.labels(self.collection).observe(seconds)
            with self._lock:
                self._held[version] = _Held(v, warm=True)
                self._wanted.add(version)
                self._gauge_locked()
            log.info("loaded and warmed %s/%s in %.2f s (%d documents, stage 1 on %s)", self.collection, version,
                     seconds, v.size, v.stage1.kind)
            return v

    def _refuse(self, version: str, e: VersionRefused) -> None:
        self.refused[version] = e.code
        if self.metrics is not None:
            self.metrics.refused.labels(self.collection, e.code).inc()
        log.error("REFUSED index version %s/%s: %s; live traffic stays on %s", self.collection, version, e,
                  self._live)

    def _load_checked(self, version: str) -> IndexVersion:
        path = self.index_root / self.collection / version
        if not path.is_dir():
            raise VersionRefused("missing", f"no version directory {path}")
        try:
            v = IndexVersion.load(path, encoder_sha256=self.encoder.info.onnx_sha256, dimension=self.encoder.dimension,
                                  stage1=self.stage1)
        except Stage1Unavailable as e:
            if e.transient:  # the engine did not answer: not a verdict on the version; retried next reconcile
                raise
            raise VersionRefused(e.code if e.code in REFUSAL_CODES else "load_error", str(e)) from e
        except store.IndexVersionError as e:
            raise VersionRefused(e.code if e.code in REFUSAL_CODES else "load_error", str(e)) from e
        except Exception as e:  # a file that verifies but does not parse (e.g. a foreign faiss build)
            raise VersionRefused("load_error", f"{type(e).__name__}: {e}") from e
        if v.collection != self.collection:
            raise VersionRefused("collection_mismatch", f"{path} belongs to collection {v.collection!r}")
        if v.version != version:
            raise VersionRefused("schema", f"{path} manifest names version {v.version!r}")
        max_tokens = (v.manifest.get("encoder") or {}).get("max_tokens")
        if max_tokens is not None and max_tokens != self.encoder.max_tokens:
            raise VersionRefused("encoder_mismatch", f"{path} truncates at {max_tokens} tokens, the encoder at "
                                                     f"{self.encoder.max_tokens}: queries and documents would differ")
        names = (v.manifest.get("router") or {}).get("feature_names")
        if v.routers and list(names or ()) != list(FEATURE_NAMES):
            raise VersionRefused("router_mismatch", f"{path} router features {names} differ from this gateway's "
                                                    f"{list(FEATURE_NAMES)}")
        return v

    def _canary(self, v: IndexVersion) -> None:
        """Run every canary query through encode + search at each width policy the version serves."""
        widths: list = ["full", v.m0] + (["auto"] if v.default_pair in v.routers else [])
        k = min(10, v.size)
        for text in self.canary_queries:
            emb = self.encoder.encode([text])[0]
            for width in widths:
                try:
                    out = v.search(emb, 10, width)
                except Exception as e:
                    raise VersionRefused("canary_failed", f"canary {text!r} width {width}: {e}") from e
                ok = (len(out.ids) == k and all(math.isfinite(s) for s in out.scores)
                      and all(a >= b - 1e-6 for a, b in zip(out.scores, out.scores[1:])))
                if not ok:
                    raise VersionRefused("canary_failed", f"canary {text!r} width {width} returned {len(out.ids)} "
                                                          f"results, scores {out.scores[:3]}...")

    def switch(self, version: str, action: str = "promote") -> bool:
        """Make a loaded version live (one pointer assignment under the lock).

        Returns True when live changed.  Raises KeyError when ``version`` is not loaded.
        """
        with self._lock:
            if version not in self._held:
                raise KeyError(version)
            if self._live == version:
                return False
            old, self._live = self._live, version
            self._wanted.add(version)
            v = self._held[version].version
            if self.metrics is not None:
                m = self.metrics
                m.live_version.clear()
                m.live_version.labels(self.collection, version).set(1)
                m.index_documents.set(v.size)
                if old is not None:
                    (m.rollbacks if action == "rollback" else m.cutovers).labels(self.collection).inc()
            self._collect_locked()
        log.info("%s/%s is live (was %s; %s)", self.collection, version, old, action)
        if self.on_live is not None:
            self.on_live(v)
        return True

    def retain(self, wanted: set[str]) -> None:
        """Keep only ``wanted`` (plus live) loaded; others are dropped once no request holds them."""
        with self._lock:
            self._wanted = set(wanted) | ({self._live} if self._live else set())
            self._collect_locked()

    def _collect_locked(self) -> None:
        for name in [n for n, h in self._held.items() if n not in self._wanted and n != self._live and h.refs == 0]:
            del self._held[name]
            log.info("unloaded %s/%s", self.collection, name)
        self._gauge_locked()

    def _gauge_locked(self) -> None:
        if self.metrics is not None:
            self.metrics.loaded_versions.set(len(self._held))


def default_replica_id(port: int | None = None) -> str:
    """``<hostname>:<port>`` (or ``<hostname>:pid<pid>``)."""
    import os

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
        self._thread = threading.Thread(target=self._run, name="registry-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def degraded(self) -> bool:
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
                    self.reconcile()  # changes missed while unsubscribed
                    self._up()
                    backoff = self.backoff_initial_s
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



def start_replica(settings, manager: VersionManager, metrics=None):
    """Load the first live version and start following the registry.

    With ``settings.version`` set the replica is pinned to it (no registry).
    Otherwise it opens the registry (:func:`engine.registry.open_registry`),
    reconciles once (falling back to the ``LIVE`` file when the registry is
    unreachable or empty) and starts the follower thread.

    Returns:
        ``(registry | None, follower | None, load_error | None)``.
    """
    from engine.registry import open_registry

    root, coll = Path(settings.index_root), settings.collection
    if settings.version:
        try:
            manager.ensure_loaded(settings.version)
            manager.switch(settings.version, "start")
        except VersionRefused as e:
            return None, None, str(e)
        return None, None, None
    registry = open_registry(redis_url=settings.redis_url, index_root=root)

    def fallback() -> str | None:
        try:
            return store.read_live_pointer(root / coll)
        except (OSError, ValueError, KeyError):
            return None

    follower = RegistryFollower(registry, manager, settings.replica_id or default_replica_id(settings.port),
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
