"""Index versions held by one gateway replica: reference counting, verified loading, warming, atomic switch.

:class:`VersionManager` holds every loaded :class:`~engine.index.IndexVersion` of the replica's collection with
a reference count.  A request calls :meth:`VersionManager.acquire` once at its start and keeps the returned
lease to its end, so it sees one version's rotation, documents, ids and routers throughout, whatever happens
to the live pointer meanwhile.  :meth:`VersionManager.switch` replaces the live pointer under a lock (one
reference assignment); a version that is no longer wanted (neither live, previous nor a candidate) is dropped
only once its reference count is zero.

Loading verifies the version with the one :func:`engine.version.manifest.verify` (checksums, encoder hash and
max tokens, dimension, router features, collection) and warms it with canary queries through the full path.
A version that fails any check is *refused*: logged, counted in ``adawidth_versions_refused_total``, and never
served; the live version is untouched.  Following the registry is :mod:`service.follower`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.index import LEVEL_SCAN_MIN_DOCS, IndexVersion
from engine.pipeline import Pipeline, capabilities
from engine.plan import SearchSpec
from engine.stage1 import Stage1Unavailable
from engine.version.manifest import Expect, IndexVersionError

log = logging.getLogger(__name__)


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
        self.level_threads = 0  # kernel threads of one query's level scan; 0: every core (the kernel keeps
        # at least 32,768 rows a thread, so a small corpus scans on one)
        self.level_scan_min_docs = LEVEL_SCAN_MIN_DOCS  # width full: one flat scan below it (engine.index)
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._live: str | None = None
        self._wanted: set[str] = set()
        self.refused: dict[str, str] = {}  # version -> refusal code (not retried until restart)
        self.on_live = None  # called with the IndexVersion after each switch (outside the lock)
        self.before_live = None  # called with the IndexVersion about to go live, before the switch (outside the lock)
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
            log.info("loaded and warmed %s/%s in %.2f s (%d documents, stage 1 on %s for prefix widths, %s for "
                     "declared recall and width full)", self.collection, version, seconds, v.size, v.stage1.kind,
                     getattr(v, "stage1_backend", "flat"))
            return v

    def _refuse(self, version: str, e: VersionRefused) -> None:
        self.refused[version] = e.code
        if self.metrics is not None:
            self.metrics.refused.labels(self.collection, e.code).inc()
        log.error("REFUSED index version %s/%s: %s; live traffic stays on %s", self.collection, version, e,
                  self._live)

    def _load_checked(self, version: str) -> IndexVersion:
        """Verify (:func:`engine.version.manifest.verify` against this replica's encoder, collection and the
        version name) and load ``version``.

        Raises:
            VersionRefused: a failed check (its code) or a file that does not parse (``load_error``).
            engine.stage1.Stage1Unavailable: transient (the stage-1 engine did not answer): retried, not refused.
        """
        path = self.index_root / self.collection / version
        if not path.is_dir():
            raise VersionRefused("missing", f"no version directory {path}")
        expect = Expect.of_encoder(self.encoder, collection=self.collection, version=version)
        try:
            v = IndexVersion.load(path, expect=expect, stage1=self.stage1)
            v.level_threads = self.level_threads or os.cpu_count() or 1
            v.level_scan_min_docs = self.level_scan_min_docs
            return v
        except Stage1Unavailable as e:
            if e.transient:  # the engine did not answer: not a verdict on the version; retried next reconcile
                raise
            raise VersionRefused(e.code if e.code in REFUSAL_CODES else "load_error", str(e)) from e
        except IndexVersionError as e:
            raise VersionRefused(e.code if e.code in REFUSAL_CODES else "load_error", str(e)) from e
        except Exception as e:  # a file that verifies but does not parse (e.g. a foreign faiss build)
            raise VersionRefused("load_error", f"{type(e).__name__}: {e}") from e

    def _canary(self, v: IndexVersion) -> None:
        """Run every canary query through the pipeline at each width the version serves: ``full``, ``m0`` and
        ``auto`` (its default policy) when it has one."""
        caps = capabilities(v)
        widths: list = ["full", v.m0] + (["auto"] if caps.default_policy is not None else [])
        k = min(10, v.size)
        pipe = Pipeline()
        for text in self.canary_queries:
            emb = self.encoder.encode([text])
            for width in widths:
                try:
                    out = pipe.search(v, [SearchSpec(query=text, k=10, width=width)], embeddings=emb)[0]
                except Exception as e:
                    raise VersionRefused("canary_failed", f"canary {text!r} width {width}: {e}") from e
                scores = [float(s) for s in out.scores]
                ok = (len(out.ids) == k and all(math.isfinite(s) for s in scores)
                      and all(a >= b - 1e-6 for a, b in zip(scores, scores[1:])))
                if not ok:
                    raise VersionRefused("canary_failed", f"canary {text!r} width {width} returned {len(out.ids)} "
                                                          f"results, scores {scores[:3]}...")

    def switch(self, version: str, action: str = "promote") -> bool:
        """Make a loaded version live (one pointer assignment under the lock).

        Returns True when live changed.  Raises KeyError when ``version`` is not loaded.  ``before_live`` runs
        first (the delta segment of a rollback is rebuilt before the older version serves), ``on_live`` after.
        """
        if self.before_live is not None:
            with self._lock:
                if version not in self._held:
                    raise KeyError(version)
                upcoming = self._held[version].version if self._live != version else None
            if upcoming is not None:
                self.before_live(upcoming)
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
                if old is not None:  # this collection's series only: other collections keep theirs
                    with contextlib.suppress(KeyError):
                        m.live_version.remove(self.collection, old)
                m.live_version.labels(self.collection, version).set(1)
                m.index_documents.labels(self.collection).set(v.size)
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
            self.metrics.set_loaded(self.collection, len(self._held))
