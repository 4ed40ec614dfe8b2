"""The trainer as a long-lived process: rebuild on new data, publish, export capacity gauges.

``python -m trainer serve --dataset DIR [build options] --port 9109 --poll-seconds 60``

Every ``poll_seconds`` the daemon computes the dataset fingerprint
(:func:`trainer.build.dataset_fingerprint`, a hash of the BEIR files).  When no
version of the collection was built from those bytes (manifest
``corpus.dataset_fingerprint``), it builds a new version, publishes it to the version registry and promotes it
(a build that fails is logged, counted and not retried until the data change
again).  A version built from the current data that is not live means an
operator rolled back (``trainer rollback``): the daemon respects it.  It then exports the capacity report of
the collection's live version (which follows ``trainer promote`` / ``rollback``)
and removes the series of the version it replaced.

**Folding (issue 18).**  Each poll also counts the writes of the collection's write-ahead log after the live
version's folded sequence number (upserted or deleted ids); when they reach the setting ``fold_min_writes``,
or any are pending ``fold_interval_seconds`` after the last fold (or the daemon's start; 0: by size only),
the daemon folds them (:func:`trainer.fold.fold_collection`) and promotes the folded version through the
quality gate.  A fold that fails or is refused by the gate is not retried until more writes arrive.
``--no-fold`` turns this off.

Series (injected registry; capacity gauges carry only ``collection`` and ``version``):

================================================  ==================================================
adawidth_capacity_delta                           δ = |E|/n of the evaluation qrels (000 §2)
adawidth_capacity_warren_dstar_coordinates        Warren's lower bound d*
adawidth_capacity_regime_code                     0 vacuous, 1 intermediate, 2 moderate
adawidth_capacity_cus_width_coordinates           r*, the width of the CUS below
adawidth_capacity_cus_labelled_ratio              CUS at r* (Definition 2.2 of 000), labelled
adawidth_capacity_cus_label_free_ratio            top-1 agreement at r* with full width
adawidth_capacity_failure_auc                     AUC of top-1 stability against Recall@1 = 0
adawidth_capacity_scaling_r2_mean                 R²_mean of Eq. (25) of 001
adawidth_capacity_scaling_b_coordinates           b of Eq. (24) (per ln N)
adawidth_capacity_scaling_c_coordinates           c of Eq. (24) (per ln k)
adawidth_capacity_online_cus_baseline_ratio       offline agreement of the served auto policy
adawidth_trainer_builds_total{outcome}            builds, outcome = success | failure
adawidth_trainer_build_duration_seconds           duration of the last build
adawidth_trainer_last_success_timestamp_seconds   unix time of the last successful build
adawidth_trainer_polls_total                      dataset fingerprint checks
adawidth_trainer_folds_total{outcome}             folds, outcome = success | failure | refused (gate)
adawidth_trainer_pending_writes                   documents written after the live version's folded seq
adawidth_index_bytes_on_disk{collection}          bytes of the collection's version directories, set after
                                                  every build, fold and retention (and every poll)
================================================  ==================================================
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from adawidth.capacity import REGIME_CODE
from engine.version import store
from engine.version.manifest import IndexVersionError, Manifest, read_manifest
from engine.version.retention import collection_bytes
from trainer.build import build_index, dataset_fingerprint
from trainer.fold import FoldError, fold_collection, pending_writes

log = logging.getLogger("trainer.serve")

CAPACITY_GAUGES = {
    # name suffix: (help, function of the manifest's capacity summary)
    "delta": ("Average document degree delta = |E|/n of the evaluation qrels (000 §2).",
              lambda c: c["delta"]),
    "warren_dstar_coordinates": ("Warren's lower bound d* on the width for perfect top-1 (000 §2).",
                                 lambda c: c["warren_dstar"]),
    "regime_code": ("Density regime: 0 vacuous, 1 intermediate, 2 moderate (000 §3).",
                    lambda c: REGIME_CODE[c["regime"]]),
    "cus_width_coordinates": ("Width r* at which the CUS gauges are measured.", lambda c: c["r_star"]),
    "cus_labelled_ratio": ("CUS at r*, Recall@1 at r* over Recall@1 at full width (Definition 2.2 of 000).",
                           lambda c: c["cus_labelled"]),
    "cus_label_free_ratio": ("Share of evaluation queries whose top-1 at r* equals the full-width top-1.",
                             lambda c: c["cus_label_free"]),
    "failure_auc": ("AUC of the continuous label-free CUS (top-1 stability) against Recall@1 = 0.",
                    lambda c: c["failure_auc_top1_stability"]),
    "scaling_r2_mean": ("R^2_mean of the fit q90[M_first] = a + b ln N + c ln k (Eq. 25 of 001).",
                        lambda c: c["scaling_fit"]["r2_mean"]),
    "scaling_b_coordinates": ("Slope b of q90[M_first] in ln N (Eq. 24 of 001; predicted > 0).",
                              lambda c: c["scaling_fit"]["b"]),
    "scaling_c_coordinates": ("Slope c of q90[M_first] in ln k (Eq. 24 of 001; predicted < 0).",
                              lambda c: c["scaling_fit"]["c"]),
    "online_cus_baseline_ratio": ("Offline top-1 agreement of the served auto policy with full width.",
                                  lambda c: (c.get("online_cus_baseline") or {}).get("agreement", math.nan)),
}


class TrainerMetrics:
    """The trainer's series on an injected registry (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.capacity = {key: Gauge(f"adawidth_capacity_{key}", help_, ["collection", "version"], registry=registry)
                         for key, (help_, _) in CAPACITY_GAUGES.items()}
        self.builds = Counter("adawidth_trainer_builds_total", "Index builds by outcome.", ["outcome"],
                              registry=registry)
        for outcome in ("success", "failure"):
            self.builds.labels(outcome)
        self.build_duration = Gauge("adawidth_trainer_build_duration_seconds", "Duration of the last build.",
                                    registry=registry)
        self.last_success = Gauge("adawidth_trainer_last_success_timestamp_seconds",
                                  "Unix time of the last successful build.", registry=registry)
        self.polls = Counter("adawidth_trainer_polls_total", "Dataset fingerprint checks.", registry=registry)
        self.folds = Counter("adawidth_trainer_folds_total", "Folds of pending writes by outcome.", ["outcome"],
                             registry=registry)
        for outcome in ("success", "failure", "refused"):
            self.folds.labels(outcome)
        self.pending_writes = Gauge("adawidth_trainer_pending_writes", "Documents written (upserted or deleted "
                                    "ids) after the live version's folded sequence number.", registry=registry)
        self.index_bytes = Gauge("adawidth_index_bytes_on_disk", "Bytes of a collection's index version "
                                 "directories on disk (after version retention).", ["collection"], registry=registry)
        self._exported: dict[str, str] = {}  # collection -> version whose series are exported

    def export_disk(self, collection: str, collection_dir: Path | str) -> int:
        """Set ``adawidth_index_bytes_on_disk{collection}`` to the bytes of the collection's versions; returns them."""
        n = collection_bytes(collection_dir)
        self.index_bytes.labels(collection).set(n)
        return n

    def export_version(self, collection: str, version: str, capacity: dict | None) -> None:
        """Set the capacity gauges of ``version`` and remove those of the collection's previous version."""
        old = self._exported.get(collection)
        if old is not None and old != version:
            for g in self.capacity.values():
                try:
                    g.remove(collection, old)
                except KeyError:
                    pass
        if capacity:
            for key, (_, fn) in CAPACITY_GAUGES.items():
                value = fn(capacity)
                self.capacity[key].labels(collection, version).set(math.nan if value is None else float(value))
        self._exported[collection] = version


class TrainerDaemon:
    """Polls one dataset, rebuilds and publishes on change, and keeps the gauges on the live version.

    Args:
        opts: :class:`trainer.build.BuildOptions` of every build (``publish`` is forced on).
        settings: resolved :class:`trainer.config.TrainerSettings`.
        encoder: the ONNX encoder.
        metrics: :class:`TrainerMetrics`.
        fold: fold pending writes (settings ``fold_min_writes``, ``fold_interval_seconds``).
    """

    def __init__(self, opts, settings, encoder, metrics: TrainerMetrics, fold: bool = True):
        self.opts = replace(opts, publish=True)
        self.settings = settings
        self.encoder = encoder
        self.metrics = metrics
        self.collection = opts.collection or Path(opts.dataset).name
        self.coll_dir = Path(settings.index_root) / self.collection
        self._failed_fingerprint: str | None = None
        self.fold = fold
        self._last_fold = time.monotonic()
        self._failed_fold_seq: int | None = None

    def live_manifest(self) -> Manifest | None:
        """The manifest of the collection's live version, or None when there is none or it is unreadable."""
        version = store.read_live_pointer(self.coll_dir)
        if version is None:
            return None
        try:
            return read_manifest(self.coll_dir / version)
        except IndexVersionError as e:
            log.error("live version unreadable: %s", e)
            return None

    def built_fingerprints(self) -> set[str]:
        """Dataset fingerprints of every complete version of the collection (live or not)."""
        out = set()
        for v in store.list_versions(self.coll_dir):
            try:
                fp = read_manifest(self.coll_dir / v).corpus.dataset_fingerprint
            except IndexVersionError:
                continue
            if fp:
                out.add(fp)
        return out

    def poll_once(self) -> str | None:
        """Check the data, rebuild if it changed, sync the gauges.  Returns the new version id when one was built."""
        self.metrics.polls.inc()
        fp = dataset_fingerprint(self.opts.dataset)
        manifest = self.live_manifest()
        built = None
        current = manifest.corpus.dataset_fingerprint if manifest is not None else None
        if fp != current and fp not in self.built_fingerprints() and fp != self._failed_fingerprint:
            log.info("dataset %s changed (%s -> %s): rebuilding", self.opts.dataset, (current or "none")[:12], fp[:12])
            t0 = time.perf_counter()
            try:
                _, manifest = build_index(self.opts, self.settings, self.encoder)
            except Exception:
                log.exception("build failed; keeping the live version")
                self.metrics.builds.labels("failure").inc()
                self._failed_fingerprint = fp
            else:
                self.metrics.builds.labels("success").inc()
                self.metrics.last_success.set(time.time())
                self._failed_fingerprint = None
                built = manifest.version
            self.metrics.build_duration.set(time.perf_counter() - t0)
            manifest = self.live_manifest()
        if self.fold and built is None:
            built = self.maybe_fold()
            manifest = self.live_manifest() if built else manifest
        if manifest is not None:
            self.metrics.export_version(self.collection, manifest.version, manifest.capacity)
        # builds and folds ran the retention rule after publishing (trainer.retention): the bytes it left
        self.metrics.export_disk(self.collection, self.coll_dir)
        return built

    def maybe_fold(self) -> str | None:
        """Fold the pending writes when they are due (class docstring); returns the folded version id, when
        one was built (live, or refused by the quality gate)."""
        try:
            pending = pending_writes(self.settings, self.collection)
        except FoldError:
            return None
        n = pending.documents
        self.metrics.pending_writes.set(n)
        interval = float(self.settings.fold_interval_seconds)
        due = n >= self.settings.fold_min_writes or (
            n > 0 and interval > 0 and time.monotonic() - self._last_fold >= interval)
        if not due or pending.last_seq == self._failed_fold_seq:
            return None
        log.info("%d documents written after seq %d: folding", n, pending.base_seq)
        try:
            report = fold_collection(self.settings, self.encoder, self.collection, promote=True,
                                     drift_threshold=self.settings.fold_drift_threshold, actor="trainer serve")
        except Exception:
            log.exception("fold failed; keeping the live version")
            self.metrics.folds.labels("failure").inc()
            self._failed_fold_seq = pending.last_seq
            return None
        self._last_fold = time.monotonic()
        if not report.get("folded"):
            return None
        if not report.get("promoted"):
            log.error("folded version %s refused by the quality gate: %s", report["version"],
                      (report.get("gate") or {}).get("reason"))
            self.metrics.folds.labels("refused").inc()
            self._failed_fold_seq = pending.last_seq
        else:
            self.metrics.folds.labels("success").inc()
            self.metrics.pending_writes.set(0)
        return report["version"]

    def run(self, stop: threading.Event, poll_seconds: float) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.exception("poll failed")
            stop.wait(poll_seconds)
