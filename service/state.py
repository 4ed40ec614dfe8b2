"""What one gateway process holds (settings, encoder, rerankers, index versions, metrics) and how it runs a
search: resolve the :class:`engine.plan.Plan`, run :class:`engine.pipeline.Pipeline` under the limiter, count it.

A gateway serves every collection of ``settings.collections``: one :class:`VersionManager` and one
:class:`service.follower.RegistryFollower` per collection, each following its own registry entry (a promotion
or rollback of one never touches another), over one shared registry connection, encoder, reranker set,
limiter and query-embedding cache.  ``settings.collection`` is the default collection (``POST /v1/search``,
``/admin/*`` without a collection, the top-level ``/readyz`` fields, the online-CUS monitor).
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry

from adawidth.hybrid import Principal
from adawidth.tiers import RERANK_TIERS
from engine.encoder import OnnxEncoder
from engine.index import IndexVersion
from engine.pipeline import Pipeline, Result, capabilities
from engine.plan import Plan, PlanError, SearchSpec, resolve_plan
from engine.query_cache import QueryEmbeddingCache
from engine.scorers import CrossEncoderNotFoundError, CrossEncoderScorer, MaxSimScorer
from engine.stage1 import Stage1Unavailable
from engine.stages.delta import merge_delta
from service.config import GatewaySettings
from service.errors import ApiError
from service.follower import PinnedLease, RegistryFollower, start_replica
from service.limits import SearchLimiter, check_deadline
from service.metrics import CutoverMetrics, GatewayMetrics
from service.online_cus import OnlineCusMonitor
from service.parsing import log_query_sample, plan_defaults
from service.version_manager import VersionManager, VersionRefused
from service.writes import LiveDocuments

log = logging.getLogger("service")


class GatewayState:
    """What the process holds: settings, encoder, each collection's versions (live and warm) with its registry
    follower, metrics."""

    def __init__(self, settings: GatewaySettings, registry: CollectorRegistry):
        self.settings = settings
        self.metrics = GatewayMetrics(registry)
        self.online_cus = OnlineCusMonitor(registry, settings.online_cus_sample_rate, settings.online_cus_queue_size)
        self.cutover_metrics = CutoverMetrics(self.metrics)
        self.encoder = None
        self.maxsim = None  # engine.scorers.MaxSimScorer once the encoder is loaded
        self.cross_encoder = None  # engine.scorers.CrossEncoderScorer when an export is present
        # the collections served, by name, in the order of settings.collections
        self.collections: dict[str, VersionManager] = {}
        stage1 = settings.stage1_provider()  # faiss in process, or Milvus (engine/stage1.py)
        for name in settings.collections:
            versions = VersionManager(name, settings.index_root, None, self.cutover_metrics, settings.canary_queries)
            versions.stage1 = stage1
            versions.level_threads = settings.level_threads
            versions.level_scan_min_docs = settings.level_scan_min_docs
            self.collections[name] = versions
        self.versions = self.collections[settings.collection]  # the default collection's
        self.registry = None  # engine.registry.Registry shared by the followers (and a pinned lease); None: none
        self.followers: dict[str, RegistryFollower] = {}  # by collection; none for a pinned default collection
        self.pinned_leases: dict[str, PinnedLease] = {}  # the pinned default collection's lease reporter
        self.load_error: str | None = None  # the encoder's, or the default collection's, failure at start
        self.load_errors: dict[str, str] = {}  # collection -> why it had no live version at start
        self.limiter = SearchLimiter(settings.max_concurrent_searches, settings.max_queued_searches,
                                     settings.retry_after_s)
        # requests that ask for a reranking tier (one cold MaxSim request took 6 s on 2 cores): their own workers and
        # queue, so a few of them cannot starve every other search of workers until its deadline
        self.rerank_limiter = SearchLimiter(max(settings.max_concurrent_reranks, 1), settings.max_queued_reranks,
                                            settings.retry_after_s, name="rerank")
        self.metrics.search_running.set_function(lambda: self.limiter.running)
        self.metrics.search_queued.set_function(lambda: self.limiter.queued)
        self._reload_lock = threading.Lock()
        self.defaults = plan_defaults(settings)
        self.query_cache = QueryEmbeddingCache(settings.query_cache_entries, settings.query_cache_bytes,
                                               on_lookup=self.metrics.observe_query_cache)
        self.live_docs = LiveDocuments(self)  # write-ahead logs and delta segments (issue 18), opened by load()

    @property
    def follower(self) -> RegistryFollower | None:
        """The default collection's registry follower (None when pinned or not loaded)."""
        return self.followers.get(self.settings.collection)

    def collection(self, name: str) -> VersionManager:
        """The versions of collection ``name`` (what ``/v1/collections/{name}/...`` routes search).

        Raises:
            ApiError: ``unknown_collection`` (404) when this gateway does not serve ``name``.
        """
        versions = self.collections.get(name)
        if versions is None:
            raise ApiError("unknown_collection", "this gateway does not serve that collection", "name")
        return versions

    def collection_info(self, name: str) -> dict:
        """``GET /v1/collections`` entry of ``name``: live version, documents, the ``auto`` policies it serves
        (:func:`engine.pipeline.capabilities`) and its default policy; nulls and no policies while unloaded."""
        live = self.collection(name).live
        caps = capabilities(live, self.rerankers()) if live is not None else None
        return {"name": name, "index_version": live.version if live is not None else None,
                "documents": live.size if live is not None else None,
                "pending_writes": self.pending_writes(name),
                "policies": sorted(caps.policies) if caps is not None else [],
                "default_policy": caps.default_policy if caps is not None else None,
                "default": name == self.settings.collection}

    def collection_status(self, name: str) -> dict:
        """``/readyz`` entry of collection ``name``: its live version and documents (nulls while none is live)
        and its registry view (:meth:`service.follower.RegistryFollower.status`, or ``"pinned"``)."""
        versions = self.collection(name)
        live = versions.live
        follower = self.followers.get(name) or self.pinned_leases.get(name)
        reg = follower.status() if follower is not None else {"registry": "pinned", "degraded": []}
        return {"index_version": live.version if live is not None else None,
                "documents": live.size if live is not None else None,
                "pending_writes": self.pending_writes(name), **reg}

    def pending_writes(self, name: str) -> dict | None:
        """The writes of collection ``name`` not yet folded into its live version, which ``documents`` does not
        count: ``{"upserts", "deletes"}`` in its delta segment (``GET .../writes`` has the rest), None when
        this replica has no write state for it."""
        seg = self.live_docs.segment(name)
        return None if seg is None else {"upserts": seg[0], "deletes": seg[1]}

    @property
    def live(self) -> IndexVersion | None:
        """The default collection's live version now (requests take theirs with ``versions.acquire()``)."""
        return self.versions.live

    def load(self) -> None:
        """Load the encoder, then each collection's live version (pinned, or its registry entry's) and follow
        the registry (one follower per collection); failures leave the replica unready."""
        s = self.settings
        try:
            self.encoder = OnnxEncoder(s.encoder_dir, threads=s.encoder_threads, prefer_gpu=s.prefer_gpu, spin=False)
        except FileNotFoundError as e:
            self.load_error = str(e)
            log.error("gateway not ready: %s", e)
            return
        self.maxsim = MaxSimScorer(self.encoder, s.maxsim_cache_documents)
        try:
            self.cross_encoder = CrossEncoderScorer(s.cross_encoder_dir, threads=s.encoder_threads,
                                                    prefer_gpu=s.prefer_gpu, spin=False)
            log.info("cross-encoder tier: %s (%s)", s.cross_encoder_dir, self.cross_encoder.sha256[:12])
        except CrossEncoderNotFoundError as e:
            self.cross_encoder = None
            log.info("cross-encoder tier unavailable: %s", e)
        # the online-CUS baseline and escalation target are the default collection's (one series each)
        self.versions.on_live = lambda v: self.online_cus.observe_version(v, s.default_rho)
        self.live_docs.pending = True  # searches wait (not_ready) until the write-ahead logs are replayed
        for name, versions in self.collections.items():
            versions.encoder = self.encoder
            registry, follower, error = start_replica(s, versions, self.cutover_metrics, registry=self.registry)
            self.registry = registry or self.registry
            if isinstance(follower, PinnedLease):
                self.pinned_leases[name] = follower
            elif follower is not None:
                self.followers[name] = follower
            live = versions.live
            if live is None:
                self.load_errors[name] = error or f"collection {name!r} has no live version"
                log.error("gateway not ready: %s", self.load_errors[name])
                continue
            log.info("serving %s/%s (%d documents, providers %s, registry %s)", name, live.version, live.size,
                     self.encoder.providers, "pinned" if name in self.pinned_leases or follower is None
                     else self.registry.kind)
        self.load_error = self.load_errors.get(s.collection)
        self.live_docs.open()

    def reload(self, name: str | None = None) -> tuple[str | None, str | None]:
        """Reconcile collection ``name`` (default: the default collection) with its registry entry now
        (``POST /admin/reload``): load, verify, warm and switch to the version the registry names live, instead
        of waiting for the next poll or notification.  Other collections are not touched.

        Returns:
            (live version before, live version after); equal when nothing changed, and both the
            pinned version when the default collection serves ``settings.version`` without a registry.

        Raises:
            ApiError: ``unknown_collection`` (404) when this gateway does not serve ``name``.
            engine.registry.RegistryError: the registry is unreachable.
            service.version_manager.VersionRefused: the registry's live version failed a check here
                (the current version stays live).
        """
        name = name or self.settings.collection
        versions = self.collection(name)
        follower = self.followers.get(name)
        with self._reload_lock:
            previous = versions.live.version if versions.live is not None else None
            if follower is not None:
                follower.reconcile()
                target = follower.registry.get(name).live
                if target is not None and target in versions.refused:
                    raise VersionRefused(versions.refused[target],
                                         f"the registry's live version {target} was refused by this replica")
            return previous, versions.live.version if versions.live is not None else None

    def close(self) -> None:
        """Stop every collection's registry follower (and a pinned collection's lease reports), the limiter and
        the online-CUS worker."""
        self.limiter.close()
        self.rerank_limiter.close()
        self.online_cus.close()
        self.live_docs.close()
        for follower in (*self.followers.values(), *self.pinned_leases.values()):
            follower.stop()
        if self.registry is not None:
            self.registry.close()

    # -- search -----------------------------------------------------------------------------------
    def rerankers(self) -> dict:
        """The DART rerankers this replica serves, by tier name: those loaded, none when
        ``max_concurrent_reranks`` is 0 (then ``tier: "auto"`` serves its predictions at ``mips``)."""
        out = {}
        if self.settings.max_concurrent_reranks == 0:
            return out
        if self.maxsim is not None:
            out["maxsim"] = self.maxsim
        if self.cross_encoder is not None:
            out["cross_encoder"] = self.cross_encoder
        return out

    def rerank_status(self, version: IndexVersion) -> dict:
        """``/readyz`` ``tiers.rerank``: each reranking tier (``maxsim``, ``cross_encoder``) ->
        ``{"available": bool, "reason": str | None}``, whether ``version`` can be served at it on this replica
        and, when not, why: the setting ``max_concurrent_reranks = 0`` (reranking turned off), no document texts
        in the version, or no cross-encoder loaded."""
        served = self.rerankers()
        out = {}
        for tier in RERANK_TIERS:
            if self.settings.max_concurrent_reranks == 0:
                reason = "reranking is turned off on this replica (max_concurrent_reranks = 0)"
            elif version.texts is None:
                reason = f"the live version {version.version} has no document texts"
            elif tier not in served:
                reason = f"no {tier} scorer is loaded on this replica"
            else:
                reason = None
            out[tier] = {"available": reason is None, "reason": reason}
        return out

    def wal_degraded(self, name: str) -> list[str]:
        """``/readyz`` degradation reasons of collection ``name``'s write-ahead log (none while it is open or
        followed): its follower cannot follow the shared log (Redis: this replica misses the other replicas'
        writes), or the log is not open here (a file log another process, the writer, holds, or unreadable: this
        replica cannot write and does not see the writes not yet folded into a version)."""
        out = []
        err = self.live_docs.follower_error(name)
        if err:
            out.append(f"write-ahead log follower: {err[:200]}")
        err = self.live_docs.closed_reason(name)
        if err:
            takeover = self.settings.wal_takeover_interval_s
            out.append(f"write-ahead log not open on this replica ({err[:200]}): it cannot write and does not see "
                       "the writes not yet folded into a version; send writes and reads that must see them to the "
                       "writer, or set REDIS_URL"
                       + (f" (it takes the log over within {takeover:g} s of the writer stopping)"
                          if takeover > 0 and err.startswith("WalLocked") else ""))
        return out

    def plan(self, spec: SearchSpec, version: IndexVersion, principal: Principal | None = None) -> Plan:
        """Resolve one request against ``version`` (every value check happens here, once).

        Raises:
            ApiError: the plan's code (:data:`engine.plan.PLAN_CODES`).
        """
        tier = spec.tier or self.defaults.default_tier
        if tier in RERANK_TIERS and self.settings.max_concurrent_reranks == 0:
            raise ApiError("tier_unavailable", f"tier {tier!r} is turned off on this replica "
                                               "(max_concurrent_reranks = 0)", "tier")
        try:
            return resolve_plan(spec, self.defaults, capabilities(version, self.rerankers()), principal)
        except PlanError as e:
            raise ApiError(e.code, e.message, e.field) from None

    async def run(self, plan: Plan, version: IndexVersion, deadline: float) -> Result:
        """Run a plan on a worker (bounded concurrency, deadline), then count it in the metrics.

        Raises:
            ApiError: ``overloaded``, ``deadline_exceeded``, ``stage1_unavailable``.
        """
        return (await self.run_batch([plan], version, deadline))[0]

    async def run_batch(self, plans: list[Plan], version: IndexVersion, deadline: float) -> list[Result]:
        """Run many plans as one unit of work: one admission slot of the limiter, one worker, one deadline
        (fixed: ``deadline`` is the request's, whatever the batch size), one :meth:`Pipeline.run` call (so one
        encoder call for every dense plan); then count each plan in the metrics.

        Returns:
            One :class:`engine.stages.render.Result` per plan, in order.

        Raises:
            ApiError: ``overloaded``, ``deadline_exceeded``, ``stage1_unavailable`` (for the whole batch).
        """
        if self.live_docs.pending:
            raise ApiError("not_ready", "the write-ahead log is being replayed")
        pipeline = Pipeline(self.encoder, self.rerankers(), self.query_cache)
        delta = self.live_docs.snapshot(version.collection)  # pending writes (issue 18), one view per batch

        # an explicit reranking tier runs on the rerank workers from the start; 'auto' runs its first stages on
        # an ordinary worker and only the rerank of the plans its head sends to a reranking tier on a rerank
        # worker, so that neither pool waits on the other's work
        explicit = any(p.tier in RERANK_TIERS for p in plans)

        def finish(p, dl):
            if p.tier in RERANK_TIERS:  # a rerank takes seconds: a batch stops between them at its deadline
                check_deadline(dl)
            return pipeline.finish(p)

        def start(dl):
            allowed = delta.allowed(version) if delta is not None else None  # deletes and overrides
            pending = pipeline.start(plans, version, check=lambda: check_deadline(dl), allowed=allowed)
            # finished here, on this worker: everything on a rerank worker, else what needs no reranking
            return pending, [None if p.tier in RERANK_TIERS and not explicit else finish(p, dl) for p in pending]

        def rerank(todo):
            return lambda dl: [finish(p, dl) for p in todo]

        try:
            pending, results = await (self.rerank_limiter if explicit else self.limiter).run(start, deadline)
            todo = [i for i, r in enumerate(results) if r is None]
            if todo:
                try:
                    got = await self.rerank_limiter.run(rerank([pending[i] for i in todo]), deadline)
                except ApiError as e:
                    if e.code != "overloaded":
                        raise
                    # 'auto' only: every rerank worker and queue slot is taken, so serve its first stage's
                    # ranking rather than refuse a request that asked for no tier (the trace says why)
                    because = (f"every rerank worker and queue slot was taken (max_concurrent_reranks "
                               f"{self.settings.max_concurrent_reranks}, max_queued_reranks "
                               f"{self.settings.max_queued_reranks})")
                    got = [pipeline.finish(pending[i], "mips", because) for i in todo]
                    self.metrics.tier_fallbacks.inc(len(todo))
                for i, r in zip(todo, got):
                    results[i] = r
        except Stage1Unavailable as e:  # the stage-1 engine (Milvus) did not answer: retryable, not a 500
            log.error("stage 1 unavailable for %s: %s", version.version, e)
            raise ApiError("stage1_unavailable", "the stage-1 search engine did not answer; retry",
                           headers={"Retry-After": str(self.settings.retry_after_s)}) from e
        if delta is not None:
            results = [merge_delta(p, version, r, delta) for p, r in zip(plans, results)]
        for plan, result in zip(plans, results):
            self.observe(plan, version, result)
        return results

    def observe(self, plan: Plan, version: IndexVersion, result: Result) -> None:
        """Metrics, the online-CUS sample and the query-log sample of one served search."""
        m, t = self.metrics, result.trace
        for stage, seconds in t["timings_seconds"].items():
            m.stage_latency.labels(stage).observe(seconds)
        if plan.dense:
            m.width.labels(t["policy"]).observe(t["width"])
        m.coordinates.observe(t["coordinates_scored"])
        m.tiers.labels(t["tier"]).inc()
        m.work_by_stage.labels("stage1").observe(t["stage1_work"])
        m.work_by_stage.labels("rescoring").observe(t["rescoring_work"])
        if plan.policy in ("exact", "recall"):
            m.observe_levels(t, version.size * version.dimension)
        # the escalation-drift alert compares this ratio with the version's default rho: count only queries the
        # width router decided at that rho (not a client's own rho), on the default collection (whose target
        # adawidth_escalation_target_ratio exports)
        default = version.collection == self.settings.collection
        if plan.policy == "router" and "rho" in plan.defaulted and default:
            m.routed.inc()
            if t["escalated"]:
                m.escalations.inc()
        if plan.mode == "dense" and not plan.restricted and t["tier"] == "mips" and result.embedding is not None \
                and default:
            # O(1); compared off the request path; the default collection's only (its baseline is the one exported)
            width = {"exact": "full", "fixed": plan.width}.get(plan.policy, "auto")
            self.online_cus.offer(version, result.embedding, result.ids, width)
        log_query_sample(self.settings, plan.query, t["width"])
