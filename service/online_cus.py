"""Online label-free CUS: sampled live queries re-ranked at full width off the request path (000 §2.1, §6).

For a sampled fraction of served queries (``ADAWIDTH_ONLINE_CUS_SAMPLE_RATE``,
default 5 %), the request thread only draws a random number and puts
``(version, embedding, served top-1)`` on a bounded queue (``put_nowait``; a full
queue drops the sample and counts it).  One background thread takes each
sample, computes the exact full-width top-1 over the same immutable index
version (``argmax_d <R q, R d>`` at width D, the frozen encoder's top-1) and
counts whether it equals the top-1 that was served.  Prometheus computes the
rate-based CUS::

    sum(rate(adawidth_online_cus_agreements_total{policy="auto"}[15m]))
      / sum(rate(adawidth_online_cus_samples_total{policy="auto"}[15m]))

and compares it with ``adawidth_online_cus_baseline_ratio``, the same agreement
measured offline by the trainer on the evaluation queries of the live version
(manifest ``capacity.online_cus_baseline``).  Requests with width ``full`` are
not sampled (they agree by construction); ``policy`` is ``auto`` or ``fixed``.

Series (all on the injected registry, bounded labels):

=============================================  =========================================================
adawidth_online_cus_samples_total{policy}      samples compared (served top-1 vs full-width top-1)
adawidth_online_cus_agreements_total{policy}   samples whose served top-1 equals the full-width top-1
adawidth_online_cus_dropped_total              samples dropped because the queue was full
adawidth_online_cus_queue_depth                samples waiting
adawidth_online_cus_baseline_ratio             offline agreement of the live version's auto policy (0..1)
adawidth_escalation_target_ratio               target escalation fraction ρ of width ``auto`` (0..1)
=============================================  =========================================================
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("service.online_cus")

POLICIES = ("auto", "fixed")


@dataclass(frozen=True)
class _Sample:
    version: object          # engine.index.IndexVersion (immutable, kept alive by this reference)
    embedding: np.ndarray    # (D,) float32, the encoder's unit-norm query embedding
    served_top1: str         # document id served first
    policy: str


class OnlineCusMonitor:
    """Samples served queries and compares their top-1 with the full-width top-1 in a background thread.

    Args:
        registry: Prometheus registry the series are registered on.
        sample_rate: fraction of eligible queries sampled, in [0, 1].
        queue_size: bound of the sample queue (>= 1); a full queue drops samples.
        seed: seed of the sampling draws (None: nondeterministic).
        start: start the worker thread now (tests may defer it with False and call :meth:`start`).
    """

    def __init__(self, registry: CollectorRegistry, sample_rate: float = 0.05, queue_size: int = 1000,
                 seed: int | None = None, start: bool = True):
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.sample_rate = sample_rate
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._queue: queue.Queue[_Sample | None] = queue.Queue(maxsize=queue_size)
        self.samples = Counter("adawidth_online_cus_samples_total",
                               "Sampled queries whose served top-1 was compared with the full-width top-1.",
                               ["policy"], registry=registry)
        self.agreements = Counter("adawidth_online_cus_agreements_total",
                                  "Sampled queries whose served top-1 equals the full-width top-1.",
                                  ["policy"], registry=registry)
        for p in POLICIES:  # export zeros so rate() has a series from the start
            self.samples.labels(p)
            self.agreements.labels(p)
        self.dropped = Counter("adawidth_online_cus_dropped_total",
                               "Samples dropped because the online-CUS queue was full.", registry=registry)
        self.depth = Gauge("adawidth_online_cus_queue_depth", "Samples waiting for the online-CUS worker.",
                           registry=registry)
        self.depth.set_function(self._queue.qsize)
        self.baseline = Gauge("adawidth_online_cus_baseline_ratio",
                              "Offline top-1 agreement of the live version's auto policy with full width "
                              "(the trainer's baseline for the online CUS).", registry=registry)
        self.escalation_target = Gauge("adawidth_escalation_target_ratio",
                                       "Target escalation fraction rho of width 'auto' for default requests.",
                                       registry=registry)
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="online-cus", daemon=True)
            self._thread.start()

    def observe_version(self, version, target_rho: float | None) -> None:
        """Export the baseline and the escalation target of a newly loaded version.

        Args:
            version: the :class:`engine.index.IndexVersion` now live.
            target_rho: the ρ default requests are served with (settings override, else the version's).
        """
        cap = version.manifest.capacity or {}
        base = (cap.get("online_cus_baseline") or {}).get("agreement")
        if base is None:
            self.baseline.set(float("nan"))
        else:
            self.baseline.set(float(base))
        self.escalation_target.set(float(version.default_rho if target_rho is None else target_rho))

    def offer(self, version, embedding: np.ndarray, served_ids: list[str], width) -> bool:
        """Maybe sample one served query; O(1), never blocks.  Returns True when a sample was queued.

        Args:
            version: the index version that served the query.
            embedding: the query's (D,) embedding.
            served_ids: the served ids, best first (empty: nothing to compare).
            width: the request's width policy ("auto", "full" or an int); "full" is never sampled.
        """
        if width == "full" or not served_ids or self.sample_rate <= 0.0:
            return False
        with self._rng_lock:
            if self._rng.random() >= self.sample_rate:
                return False
        sample = _Sample(version, np.asarray(embedding, dtype=np.float32), served_ids[0],
                         "auto" if width == "auto" else "fixed")
        try:
            self._queue.put_nowait(sample)
        except queue.Full:
            self.dropped.inc()
            return False
        return True

    def compare(self, sample: _Sample) -> bool:
        """Full-width top-1 of a sample's query over its version; True when it equals the served top-1."""
        v = sample.version
        q = v.rotate(sample.embedding, v.dimension)
        rows, _ = v.stage1.full(q, 1)  # in process with faiss; on Milvus the scan runs there, not over docs.npy
        return v.doc_ids[int(rows[0])] == sample.served_top1

    def _work(self) -> None:
        while True:
            sample = self._queue.get()
            try:
                if sample is None:
                    return
                agreed = self.compare(sample)
                self.samples.labels(sample.policy).inc()
                if agreed:
                    self.agreements.labels(sample.policy).inc()
            except Exception:  # a bad sample must not kill the monitor
                log.exception("online CUS sample failed")
            finally:
                self._queue.task_done()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until every queued sample is processed (tests, shutdown); False on timeout."""
        done = threading.Event()

        def waiter():
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker after the queued samples (drops the stop signal if the queue stays full)."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)
