"""Prometheus metrics of the gateway, on an injected registry (never the global default).

Units are in the names (``_seconds``, ``_total``); labels are bounded: route
templates (unmatched paths share ``route="unmatched"``), standard methods
(anything else is ``other``), status classes, fixed stage names and error
codes from the one table.  No query text, document id or version string is a
label value except the live version's info gauge, which holds one series (it is
cleared on every swap).
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
WIDTH_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 320, 384)
STAGES = ("encode", "rotate", "stage1", "route", "rescore", "fuse", "rerank", "render", "total")
"""Values of the ``stage`` label: the pipeline's stages (:data:`engine.stages.STAGES`) and the total."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RATIO_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)


class GatewayMetrics:
    """All gateway series, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.http_requests = Counter("adawidth_http_requests_total", "HTTP requests by route template and status.",
                                     ["route", "method", "status"], registry=registry)
        self.http_latency = Histogram("adawidth_http_request_duration_seconds", "HTTP request latency by route template.",
                                      ["route"], buckets=LATENCY_BUCKETS, registry=registry)
        self.stage_latency = Histogram("adawidth_search_stage_duration_seconds", "Search latency per stage.",
                                       ["stage"], buckets=LATENCY_BUCKETS, registry=registry)
        self.width = Histogram("adawidth_search_width_coordinates", "Prefix width a query was resolved at.",
                               ["policy"], buckets=WIDTH_BUCKETS, registry=registry)
        self.coordinates = Histogram("adawidth_search_work_multiply_adds", "Multiply-adds a query cost (stage 1 + rescoring).",
                                     buckets=tuple(10.0 ** e for e in range(4, 11)), registry=registry)
        self.work_by_stage = Histogram("adawidth_search_stage_work_multiply_adds",
                                       "Multiply-adds a query cost per stage (stage1: documents visited x width; "
                                       "rescoring: candidates x coordinates added).", ["stage"],
                                       buckets=tuple(10.0 ** e for e in range(3, 11)), registry=registry)
        self.scan_share = Histogram("adawidth_search_scan_share_ratio",
                                    "Share of the corpus's N x D coordinates a level-scanned query read (policies "
                                    "exact and recall): 1 - the realised pruning ratio.", ["policy"],
                                    buckets=RATIO_BUCKETS, registry=registry)
        self.escalations = Counter("adawidth_escalations_total", "Queries the router escalated to the high width.",
                                   registry=registry)
        self.tiers = Counter("adawidth_search_tier_total", "Searches by the DART tier that served them "
                             "(mips, maxsim, cross_encoder).", ["tier"], registry=registry)
        self.tier_fallbacks = Counter("adawidth_tier_fallbacks_total", "Queries of tier 'auto' whose head picked a "
                                      "reranking tier, served at mips because every rerank worker and queue slot "
                                      "was taken.", registry=registry)
        self.routed = Counter("adawidth_routed_queries_total", "Queries the width router decided at the version's default rho (width 'auto', policy 'router', no client rho).", registry=registry)
        self.errors = Counter("adawidth_errors_total", "Client errors by machine-readable code.", ["code"],
                              registry=registry)
        self.live_version = Gauge("adawidth_live_version_info", "1 for the version this replica serves.",
                                  ["collection", "version"], registry=registry)
        self.index_documents = Gauge("adawidth_index_documents", "Documents in the live version of each collection.",
                                     ["collection"], registry=registry)
        self.search_running = Gauge("adawidth_search_running_requests", "Searches executing on a worker now.",
                                    registry=registry)
        self.search_queued = Gauge("adawidth_search_queued_requests", "Admitted searches waiting for a worker.",
                                   registry=registry)
        self.query_cache_hits = Counter("adawidth_query_cache_hits_total",
                                        "Query texts whose embedding came from the query-embedding cache.",
                                        registry=registry)
        self.query_cache_misses = Counter("adawidth_query_cache_misses_total",
                                          "Query texts looked up in the query-embedding cache and encoded.",
                                          registry=registry)
        self.batch_size = Histogram("adawidth_search_batch_queries", "Queries per batch search request.",
                                    buckets=BATCH_BUCKETS, registry=registry)
        self.documents_written = Counter("adawidth_documents_written_total",
                                         "Documents of acknowledged (202) writes by collection and op (upsert, "
                                         "delete).", ["collection", "op"], registry=registry)
        self.write_seconds = Histogram("adawidth_write_duration_seconds",
                                       "Seconds from a validated write batch to its 202 (encoding, the durable "
                                       "append, the delta segment) by op.", ["op"], buckets=LATENCY_BUCKETS,
                                       registry=registry)

    def track_delta(self, segments) -> None:
        """Export each collection's delta segment on every scrape: ``segments()`` returns
        ``{collection: (pending_upserts, pending_deletes, applied_seq)}`` (no I/O: the segment in memory) as
        ``adawidth_delta_documents{collection,kind="upsert"|"delete"}`` and ``adawidth_write_applied_seq``."""
        self.registry.register(_DeltaCollector(segments))

    def observe_query_cache(self, hits: int, misses: int) -> None:
        """Count one lookup of the query-embedding cache: ``hits`` and ``misses`` query texts."""
        if hits:
            self.query_cache_hits.inc(hits)
        if misses:
            self.query_cache_misses.inc(misses)


    def observe_levels(self, trace: dict, full_work: int) -> None:
        """Count one level-scanned query: its coordinates as a share of the corpus's N x D."""
        if full_work > 0:
            self.scan_share.labels(trace["policy"]).observe(trace["coordinates_scored"] / full_work)


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


def bounded_method(method: str) -> str:
    """The HTTP method as a label value: the standard ones as themselves, anything else ``other``."""
    return method if method in KNOWN_METHODS else "other"


VERSION_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _DeltaCollector:
    """Prometheus collector of the delta segments (:meth:`GatewayMetrics.track_delta`)."""

    def __init__(self, segments):
        self.segments = segments

    def describe(self):
        return []  # unchecked: the collections are only known at scrape time

    def collect(self):
        docs = GaugeMetricFamily("adawidth_delta_documents", "Writes in a collection's delta segment, not yet "
                                 "folded into its live version, by kind (upsert, delete).",
                                 labels=["collection", "kind"])
        applied = GaugeMetricFamily("adawidth_write_applied_seq", "Last write-ahead log sequence number this "
                                    "replica's delta segment applied.", labels=["collection"])
        for name, (ups, dels, seq) in sorted(self.segments().items()):
            docs.add_metric([name, "upsert"], ups)
            docs.add_metric([name, "delete"], dels)
            applied.add_metric([name], seq)
        yield docs
        yield applied


class CutoverMetrics:
    """Series of blue/green cutover (issue 3), on the same registry as ``gateway``'s.

    Labels are bounded: ``collection`` is one of the collections a replica serves (``settings.collections``)
    and ``reason`` is one of :data:`service.version_manager.REFUSAL_CODES`.  The live version itself is only a
    label of ``adawidth_live_version_info`` (one series per collection at a time: a switch removes only that
    collection's previous series).  ``adawidth_loaded_versions`` is the process's total over its collections
    (what memory holds); ``adawidth_registry_up`` is the one registry connection every collection follows.
    """

    def __init__(self, gateway: GatewayMetrics):
        registry = gateway.registry
        self.live_version = gateway.live_version
        self.index_documents = gateway.index_documents
        self.cutovers = Counter("adawidth_cutovers_total", "Live-version switches made by this replica "
                                "(promotions; rollbacks are counted apart).", ["collection"], registry=registry)
        self.rollbacks = Counter("adawidth_rollbacks_total", "Live-version switches made by a registry rollback.",
                                 ["collection"], registry=registry)
        self.load_seconds = Histogram("adawidth_version_load_seconds", "Seconds to verify, load and warm one index "
                                      "version.", ["collection"], buckets=VERSION_LOAD_BUCKETS, registry=registry)
        self.refused = Counter("adawidth_versions_refused_total", "Index versions this replica refused to load, by "
                               "reason code.", ["collection", "reason"], registry=registry)
        self.registry_up = Gauge("adawidth_registry_up", "1 when the last exchange with the version registry "
                                 "succeeded, 0 while it is unreachable.", registry=registry)
        self.loaded_versions = Gauge("adawidth_loaded_versions", "Index versions held in memory over every "
                                     "collection (live, rollback target, warm candidates, and retired ones still "
                                     "held by requests).", registry=registry)
        self._loaded: dict[str, int] = {}
        self._loaded_lock = threading.Lock()

    def set_loaded(self, collection: str, count: int) -> None:
        """Record that ``collection`` holds ``count`` versions; ``adawidth_loaded_versions`` is the sum."""
        with self._loaded_lock:
            self._loaded[collection] = count
            self.loaded_versions.set(sum(self._loaded.values()))
