"""The FastAPI gateway: ``POST /v1/search``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

Request path: read the raw body (size-limited), decode UTF-8 strictly, parse
JSON, validate with :class:`SearchRequest`, take **one** reference to the live
index version, then (in a worker thread) encode, rotate, stage 1, route and
rescore.  Every client error is an :class:`service.errors.ApiError` with a
stable code; nothing a client sends can produce a 500.

Hardening (issue 8): the body is read in chunks and refused past its limit;
integers too long for any field and lone surrogates are refused before they
reach the tokenizer; the search work runs under :class:`service.limits.SearchLimiter`
(bounded concurrency and queue, 429 with ``Retry-After``, a per-request
deadline); ``/admin/*`` and, optionally, search require an API key
(:mod:`service.auth`); query text is logged only when sampling is enabled, and
then truncated; metric labels are route templates and bounded values only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
import unicodedata
from contextlib import asynccontextmanager
from typing import Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from adawidth.hybrid import parse_query
from adawidth.tiers import RERANK_DEPTH, TIERS, predict_tier
from engine.encoder import OnnxEncoder
from engine.index import IndexVersion
from engine.scorers import CrossEncoderNotFoundError, CrossEncoderScorer, MaxSimScorer, rerank_order
from engine.stage1 import Stage1Unavailable
from service.access import principal_of
from service.admin import build_admin_router
from service.auth import require_search_key
from service.config import GatewaySettings
from service.errors import MAX_ECHO_CHARS, ApiError, error_responses, safe_text
from service.follower import start_replica
from service.limits import SearchLimiter, check_deadline
from service.metrics import STAGES, CutoverMetrics, GatewayMetrics, bounded_method
from service.online_cus import OnlineCusMonitor
from service.retrieval import FilterValues, RetrievalOptions, retrieve
from service.version_manager import VersionManager, VersionRefused

log = logging.getLogger("service")


class SearchRequest(BaseModel):
    """Body of ``POST /v1/search``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"query": "statins reduce cardiovascular events", "k": 10, "width": "auto"}]})

    query: StrictStr = Field(description="Query text; must contain a non-blank character.")
    k: StrictInt | None = Field(None, description="Results wanted, 1..k_max (default 10).")
    width: Literal["auto", "full"] | StrictInt = Field(
        "auto", description="'auto' (router decides per query), 'full' (exact search at full width), "
                            "or a prefix width in coordinates, 1..D.")
    rho: StrictFloat | StrictInt | None = Field(
        None, description="Target escalation fraction of the width router for width 'auto', in [0, 1] (default: the "
                          "index's). Giving rho selects the width router even on a version with a funnel policy.")
    mode: Literal["dense", "lexical", "hybrid"] = Field(
        "dense", description="Lane: 'dense' (adaptive width), 'lexical' (BM25) or 'hybrid' (union of both, fused).")
    filter: FilterValues | None = Field(
        None, description="Keyword filter applied before the top-k: field -> value or list of values (any of).")
    fusion: Literal["rrf", "convex"] | None = Field(
        None, description="Fusion of mode 'hybrid': 'rrf' (k = 60) or 'convex' (default: the gateway's).")
    alpha: StrictFloat | StrictInt | None = Field(
        None, description="Dense weight of the convex fusion, in [0, 1] (default: the gateway's).")
    tier: Literal["auto", "mips", "maxsim", "cross_encoder"] | None = Field(
        None, description="DART tier (Algorithm 1 of 000): 'mips' (the adaptive-width ranking alone), 'maxsim' "
                          "(late interaction over the encoder's token embeddings on the top 50), 'cross_encoder' "
                          "(the fine-tuned cross-encoder on the top 50) or 'auto' (the version's difficulty head "
                          "picks per query). Default: the gateway's (ADAWIDTH_DEFAULT_TIER, 'mips').")


class Hit(BaseModel):
    id: str = Field(description="Document id from the corpus.")
    score: float = Field(description="Higher is better: the prefix cosine at the width used (tier 'mips', mode "
                                     "'dense'), the fused score (mode 'hybrid'), BM25 (mode 'lexical'), or the "
                                     "reranker's score (tiers 'maxsim' and 'cross_encoder').")


class Trace(BaseModel):
    width: int = Field(description="Prefix width the shortlist was scored at, in coordinates.")
    escalated: bool = Field(description="True when the router chose the high width of its action pair.")
    router_score: float | None = Field(description="Width 'auto' only: the router's predicted NDCG@10 gain of "
                                                   "escalating (policy 'router'), or the chosen configuration's "
                                                   "predicted top-10 agreement with full width (policy 'funnel').")
    index_version: str
    mode: str = Field("dense", description="Lane that answered: dense, lexical or hybrid.")
    fusion: str | None = Field(None, description="Fusion used by mode 'hybrid' (rrf or convex).")
    allowed_documents: int | None = Field(None, description="Documents passing filter, access policy and quoted "
                                                            "phrases (null when nothing restricted the search).")
    coordinates_scored: int = Field(description="Multiply-adds of stage 1 plus rescoring for this query.")
    stage1_work: int = Field(0, description="Stage-1 share of coordinates_scored: documents visited × stage-1 width.")
    rescoring_work: int = Field(0, description="Rescoring share of coordinates_scored: candidates × coordinates added.")
    policy: Literal["funnel", "router", "fixed", "full"] = Field(
        "fixed", description="How the query was resolved: 'funnel' (per-query stage-1 width, shortlist and rescoring "
                             "width), 'router' (width router over the action pair), 'fixed' or 'full'.")
    stage1_width: int | None = Field(None, description="Coordinates stage 1 scanned the corpus at.")
    shortlist: int | None = Field(None, description="Candidates kept by stage 1 and rescored.")
    tier: Literal["mips", "maxsim", "cross_encoder"] = Field(
        "mips", description="DART tier that produced the ranking.")
    tier_predicted: Literal["mips", "maxsim", "cross_encoder"] | None = Field(
        None, description="Tier 'auto' only: the difficulty head's argmax W_t h_q. It equals 'tier' unless the "
                          "predicted tier is not available on this replica, when the nearest cheaper one serves.")
    reranked: int = Field(0, description="Candidates the tier reranked (0 for 'mips').")
    timings_seconds: dict[str, float]


class SearchResponse(BaseModel):
    results: list[Hit]
    trace: Trace


class GatewayState:
    """What the process holds: settings, encoder, the versions (live and warm) with the registry follower, metrics."""

    def __init__(self, settings: GatewaySettings, registry: CollectorRegistry):
        self.settings = settings
        self.metrics = GatewayMetrics(registry)
        self.online_cus = OnlineCusMonitor(registry, settings.online_cus_sample_rate, settings.online_cus_queue_size)
        self.cutover_metrics = CutoverMetrics(self.metrics)
        self.encoder = None
        self.maxsim = None  # engine.scorers.MaxSimScorer once the encoder is loaded
        self.cross_encoder = None  # engine.scorers.CrossEncoderScorer when an export is present
        self.versions = VersionManager(settings.collection, settings.index_root, None, self.cutover_metrics,
                                       settings.canary_queries)
        self.versions.stage1 = settings.stage1_provider()  # faiss in process, or Milvus (engine/stage1.py)
        self.registry = None  # engine.registry.Registry, None when a version is pinned
        self.follower = None  # service.follower.RegistryFollower
        self.load_error: str | None = None
        self.limiter = SearchLimiter(settings.max_concurrent_searches, settings.max_queued_searches,
                                     settings.retry_after_s)
        self.metrics.search_running.set_function(lambda: self.limiter.running)
        self.metrics.search_queued.set_function(lambda: self.limiter.queued)
        self._reload_lock = threading.Lock()

    @property
    def live(self) -> IndexVersion | None:
        """The live version now (requests take theirs with ``self.versions.acquire()``)."""
        return self.versions.live

    def load(self) -> None:
        """Load the encoder, then the live version (pinned, or the registry's) and follow the registry;
        failures leave the replica unready."""
        s = self.settings
        try:
            self.encoder = OnnxEncoder(s.encoder_dir, threads=s.encoder_threads, prefer_gpu=s.prefer_gpu, spin=False)
        except FileNotFoundError as e:
            self.load_error = str(e)
            log.error("gateway not ready: %s", e)
            return
        self.versions.encoder = self.encoder
        self.maxsim = MaxSimScorer(self.encoder, s.maxsim_cache_documents)
        try:
            self.cross_encoder = CrossEncoderScorer(s.cross_encoder_dir, threads=s.encoder_threads,
                                                    prefer_gpu=s.prefer_gpu, spin=False)
            log.info("cross-encoder tier: %s (%s)", s.cross_encoder_dir, self.cross_encoder.sha256[:12])
        except CrossEncoderNotFoundError as e:
            self.cross_encoder = None
            log.info("cross-encoder tier unavailable: %s", e)
        self.versions.on_live = lambda v: self.online_cus.observe_version(v, s.default_rho)
        self.registry, self.follower, self.load_error = start_replica(s, self.versions, self.cutover_metrics)
        if self.live is None:
            log.error("gateway not ready: %s", self.load_error)
            return
        log.info("serving %s/%s (%d documents, providers %s, registry %s)", self.live.collection, self.live.version,
                 self.live.size, self.encoder.providers, self.registry.kind if self.registry else "pinned")

    def reload(self) -> tuple[str | None, str | None]:
        """Reconcile with the registry now (``POST /admin/reload``): load, verify, warm and switch to the
        version the registry names live, instead of waiting for the next poll or notification.

        Returns:
            (live version before, live version after); equal when nothing changed, and both the
            pinned version when this replica serves ``settings.version`` without a registry.

        Raises:
            engine.registry.RegistryError: the registry is unreachable.
            service.version_manager.VersionRefused: the registry's live version failed a check here
                (the current version stays live).
        """
        with self._reload_lock:
            previous = self.live.version if self.live is not None else None
            if self.follower is not None:
                self.follower.reconcile()
                target = self.follower.registry.get(self.settings.collection).live
                if target is not None and target in self.versions.refused:
                    raise VersionRefused(self.versions.refused[target],
                                         f"the registry's live version {target} was refused by this replica")
            return previous, self.live.version if self.live is not None else None

    def close(self) -> None:
        """Stop following the registry, the limiter and the online-CUS worker."""
        self.limiter.close()
        self.online_cus.close()
        if self.follower is not None:
            self.follower.stop()
        if self.registry is not None:
            self.registry.close()


def tier_unavailable_reason(tier: str, version: IndexVersion, state: "GatewayState") -> str | None:
    """Why ``tier`` cannot be served for ``version`` on this replica, or None when it can: 'auto' needs the
    version's difficulty head; 'maxsim' and 'cross_encoder' (and so 'auto') need the version's encoder texts;
    'cross_encoder' needs a loaded cross-encoder export. 'mips' always can."""
    if tier == "auto" and version.tier_head is None:
        return (f"index version {version.version} has no difficulty head (build it with `trainer build --tiers`); "
                "use tier 'mips', 'maxsim' or 'cross_encoder'")
    if tier != "mips" and version.texts is None:
        return f"index version {version.version} holds no document texts for reranking (built before issue 5); use tier 'mips'"
    if tier == "cross_encoder" and state.cross_encoder is None:
        return "this replica has no cross-encoder export (python -m trainer.dart.cross_encoder)"
    return None


def check_tier(tier: str, version: IndexVersion, state: "GatewayState") -> None:
    """Raise 409 ``tier_unavailable`` when :func:`tier_unavailable_reason` gives a reason."""
    reason = tier_unavailable_reason(tier, version, state)
    if reason is not None:
        raise ApiError("tier_unavailable", reason, "tier")


def available_tier(predicted: str, version: IndexVersion, state: "GatewayState") -> str:
    """The tier that serves a head prediction: ``predicted`` itself, or the nearest cheaper tier when it cannot be
    served here (a replica without the cross-encoder export); 'mips' always can."""
    for t in reversed(TIERS[:TIERS.index(predicted) + 1]):
        if tier_unavailable_reason(t, version, state) is None:
            return t
    return "mips"


def _validation_error(err: ValidationError) -> ApiError:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if not isinstance(p, int)) or None
    kind = first.get("type", "")
    shown = repr(safe_text(loc, MAX_ECHO_CHARS)) if loc else "?"
    if kind == "extra_forbidden":
        return ApiError("unknown_field", f"unknown field {shown}", loc)
    if kind == "missing":
        return ApiError("missing_field", f"field {shown} is required", loc)
    for prefix, code in (("mode", "unknown_mode"), ("fusion", "unknown_fusion"), ("filter", "invalid_filter"),
                         ("tier", "unknown_tier")):
        if loc and loc.startswith(prefix):
            return ApiError(code, f"field {shown}: {first.get('msg', 'invalid value')}", prefix)
    if loc and loc.startswith("width"):
        return ApiError("unknown_width", "width must be 'auto', 'full' or an integer number of coordinates", "width")
    return ApiError("invalid_type", f"field {shown}: {first.get('msg', 'invalid value')}", loc)


MAX_INT_DIGITS = 18
"""Longer JSON integers are out of range for every field (k, width); they parse to :data:`HUGE_INT`."""
HUGE_INT = 10 ** 19


def _bounded_int(text: str) -> int:
    # Python refuses int() of more than 4300 digits with a ValueError, and a
    # long one costs quadratic time; no field accepts more than 18 digits.
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        return -HUGE_INT if text.startswith("-") else HUGE_INT
    return int(text)


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


def is_blank(text: str) -> bool:
    """True when ``text`` has no visible character (only whitespace, control and format characters)."""
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in text)


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a UTF-16 surrogate on its own (JSON ``"\\ud800"``), which is not text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read in chunks and refused as soon as it passes ``limit`` bytes.

    Raises:
        ApiError: ``body_too_large`` (a declared or actual length above ``limit``).
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError("body_too_large", f"request body exceeds {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError("body_too_large", f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_search_request(raw: bytes, settings: GatewaySettings) -> SearchRequest:
    """Decode, parse and validate a search body.

    Raises:
        ApiError: ``body_too_large``, ``invalid_utf8``, ``invalid_json``, ``invalid_type``,
            ``unknown_field``, ``missing_field``, ``unknown_width``, ``query_too_long``,
            ``invalid_unicode``, ``blank_query``, ``k_out_of_range``, ``width_out_of_range``,
            ``rho_out_of_range``.

    A query of at most ``max_query_chars`` characters is accepted whatever its
    token count; the encoder truncates it at the manifest's ``max_tokens``.
    """
    if len(raw) > settings.max_body_bytes:
        raise ApiError("body_too_large", f"request body exceeds {settings.max_body_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_utf8", "request body is not valid UTF-8") from None
    try:
        obj = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constants)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise ApiError("invalid_json", "request body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise ApiError("invalid_type", "request body must be a JSON object")
    if any(has_lone_surrogate(key) for key in obj):
        raise ApiError("invalid_unicode", "a field name contains a lone UTF-16 surrogate")
    try:
        req = SearchRequest.model_validate(obj)
    except ValidationError as e:
        raise _validation_error(e) from None
    if len(req.query) > settings.max_query_chars:
        raise ApiError("query_too_long", f"query exceeds {settings.max_query_chars} characters", "query")
    if has_lone_surrogate(req.query):
        raise ApiError("invalid_unicode", "query contains a lone UTF-16 surrogate (\\ud800-\\udfff)", "query")
    if is_blank(req.query):
        raise ApiError("blank_query", "query must contain a visible character", "query")
    k = settings.k_default if req.k is None else req.k
    if not 1 <= k <= settings.k_max:
        raise ApiError("k_out_of_range", f"k must be between 1 and {settings.k_max}", "k")
    if isinstance(req.width, int) and not isinstance(req.width, bool) and not 1 <= req.width <= 384_000:
        raise ApiError("width_out_of_range", "width must be between 1 and the encoder width", "width")
    if req.rho is not None and not 0.0 <= float(req.rho) <= 1.0:
        raise ApiError("rho_out_of_range", "rho must be in [0, 1]", "rho")
    if req.alpha is not None and not 0.0 <= float(req.alpha) <= 1.0:
        raise ApiError("alpha_out_of_range", "alpha must be in [0, 1]", "alpha")
    return req.model_copy(update={"k": k})


def search_request_schema(settings: GatewaySettings) -> dict:
    """JSON schema of the search body with this gateway's limits (what the OpenAPI document publishes)."""
    schema = SearchRequest.model_json_schema()
    props = schema["properties"]
    props["query"].update(minLength=1, maxLength=settings.max_query_chars)
    props["k"]["anyOf"][0].update(minimum=1, maximum=settings.k_max)
    props["width"]["anyOf"][1].update(minimum=1)
    for name in ("rho", "alpha"):
        for part in props[name]["anyOf"][:2]:
            part.update(minimum=0, maximum=1)
    return schema


query_log = logging.getLogger("service.queries")


def log_query_sample(settings: GatewaySettings, query: str, width: int, draw=random.random) -> bool:
    """Log a served query's text for a sampled fraction of requests, truncated; returns whether it did.

    Off by default (``query_log_sample_rate=0``).  The text is cut at
    ``query_log_max_chars`` and written with ``repr`` so control characters
    cannot forge log lines.
    """
    rate = settings.query_log_sample_rate
    if rate <= 0.0 or draw() >= rate:
        return False
    query_log.info("query sample (%d chars, width %d): %s", len(query), width,
                   repr(safe_text(query, settings.query_log_max_chars)))
    return True


def create_app(settings: GatewaySettings | None = None, registry: CollectorRegistry | None = None,
               *, load: bool = True) -> FastAPI:
    """Build the gateway app.

    Args:
        settings: gateway settings (default: from the environment).
        registry: Prometheus registry to register on (default: a fresh one).
        load: load encoder and index at startup (tests may set state by hand).
    """
    settings = (settings or GatewaySettings()).resolved()
    state = GatewayState(settings, registry or CollectorRegistry())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load:
            await run_in_threadpool(state.load)
        yield
        await run_in_threadpool(state.close)

    app = FastAPI(title="adawidth gateway", version="0.1.0", lifespan=lifespan,
                  description="Dense retrieval with per-query adaptive embedding width.  "
                              "Errors and their codes: docs/API.md.")
    app.state.gw = state

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            # labels: route template (unmatched paths share one), a bounded method, the status class
            route = request.scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = bounded_method(request.method) if template != "unmatched" else "any"
            state.metrics.http_requests.labels(template, method, f"{status // 100}xx").inc()
            state.metrics.http_latency.labels(template).observe(time.perf_counter() - start)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        state.metrics.errors.labels(exc.code).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return await api_error(request, ApiError("invalid_request", "invalid request"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # 400 comes from FastAPI's own body parsing (admin routes): a body that is not (UTF-8) JSON
        code = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        if code is None:  # any other status Starlette raises is a malformed request as far as clients can tell
            return await api_error(request, ApiError("invalid_request", str(exc.detail)))
        return await api_error(request, ApiError(code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        # a bug, not bad input: log the type and where, never the body or the query
        template = getattr(request.scope.get("route"), "path", None) or "unmatched"
        log.error("internal error on %s: %s", template, type(exc).__name__)
        state.metrics.errors.labels("internal_error").inc()
        return JSONResponse(ApiError("internal_error", "internal error").body(), status_code=500)

    search_key = settings.search_api_key is not None and bool(settings.search_api_key.get_secret_value())

    # the key dependency (and its security entry in the OpenAPI document) only when a search key is set
    @app.post("/v1/search", response_model=SearchResponse,
              dependencies=[Depends(require_search_key)] if search_key else [],
              responses=error_responses(400, *([401] if search_key or settings.access_policy == "api_key" else []),
                                        *([403] if settings.access_policy == "header" else []),
                                        409, 413, 415, 422, 429, 503),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": search_request_schema(settings)}}}})
    async def search(request: Request):
        """Search the live index version.  See ``docs/API.md`` for the error codes."""
        deadline = time.monotonic() + settings.search_deadline_s
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise ApiError("unsupported_media_type", "send the body as application/json")
        req = parse_search_request(await read_body(request, settings.max_body_bytes), settings)
        principal = principal_of(request, settings)
        with state.versions.acquire() as version:  # the one reference this request holds to its end
            return await _serve(req, version, deadline, principal)

    async def _serve(req: SearchRequest, version: IndexVersion | None, deadline: float, principal=None):
        encoder = state.encoder
        if version is None or encoder is None:
            raise ApiError("not_ready", "no index version is loaded")
        if isinstance(req.width, int) and req.width > version.dimension:
            raise ApiError("width_out_of_range", f"width must be between 1 and {version.dimension}", "width")
        if req.width == "auto" and req.mode != "lexical":
            pair = settings.action_pair or version.default_pair
            if pair is None or tuple(pair) not in version.routers:
                raise ApiError("unknown_width", "this index version has no router; use 'full' or an integer", "width")
        rho = settings.default_rho if req.rho is None else float(req.rho)
        tier = req.tier or settings.default_tier
        check_tier(tier, version, state)

        opts = RetrievalOptions(mode=req.mode, filter=req.filter, fusion=req.fusion or settings.hybrid_fusion,
                                alpha=settings.hybrid_alpha if req.alpha is None else float(req.alpha),
                                depth=settings.hybrid_depth, principal=principal,
                                tenant_field=settings.tenant_field, acl_field=settings.acl_field)

        def run(deadline: float):
            t0 = time.perf_counter()
            t_enc = {}

            def embed(text: str):
                s = time.perf_counter()
                emb = encoder.encode([text])[0]
                t_enc["encode"] = time.perf_counter() - s
                check_deadline(deadline)
                return emb

            served, predicted, search = tier, None, embed
            # what the dense lane encodes (quote marks dropped, words kept); only the tiers read it here
            qtext = parse_query(req.query).text if tier != "mips" else None
            if tier == "auto":  # Algorithm 1 of 000, lines 1-2: t̂ = argmax W_t h_q (O(3d), no qrels)
                h_q = embed(qtext)
                predicted = TIERS[int(predict_tier(version.tier_head, h_q))]
                served = available_tier(predicted, version, state)
                search = lambda _text: h_q  # noqa: E731  (encode once)
            k = req.k or settings.k_default
            depth = max(k, RERANK_DEPTH) if served != "mips" else k
            got, emb = retrieve(version, req.query, depth, req.width, search, opts, rho=rho,
                                pair=tuple(settings.action_pair) if settings.action_pair else None)
            out = got.outcome
            if emb is not None and got.mode == "dense" and got.allowed_documents is None and served == "mips":
                state.online_cus.offer(version, emb, out.ids, req.width)  # O(1); compared off the request path
            reranked = 0
            if served != "mips":  # lines 5-10: rerank the first stage's top 50
                s = time.perf_counter()
                rows = list(out.rows[:RERANK_DEPTH])
                texts = [version.texts[r] for r in rows]
                check_deadline(deadline)
                if served == "maxsim":
                    scores = state.maxsim.score(qtext, version.version, rows, texts)
                else:
                    scores = state.cross_encoder.score(qtext, texts)
                order = rerank_order(scores)[:k]
                out = dataclasses.replace(out, ids=[version.doc_ids[rows[i]] for i in order],
                                          scores=[float(scores[i]) for i in order], rows=[rows[i] for i in order])
                reranked = len(rows)
                t_enc["rerank"] = time.perf_counter() - s
            timings = {**t_enc, **out.timings_seconds, "total": time.perf_counter() - t0}
            got = dataclasses.replace(got, outcome=out)
            return got, timings, {"tier": served, "tier_predicted": predicted, "reranked": reranked}

        try:
            got, timings, tier_trace = await state.limiter.run(run, deadline)
        except Stage1Unavailable as e:  # the stage-1 engine (Milvus) did not answer: retryable, not a 500
            log.error("stage 1 unavailable for %s: %s", version.version, e)
            raise ApiError("stage1_unavailable", "the stage-1 search engine did not answer; retry",
                           headers={"Retry-After": str(settings.retry_after_s)}) from e
        out = got.outcome
        m = state.metrics
        for stage in STAGES:
            if stage in timings:
                m.stage_latency.labels(stage).observe(timings[stage])
        policy = req.width if isinstance(req.width, str) else "fixed"
        if got.mode != "lexical":
            m.width.labels(policy).observe(out.width)
        m.coordinates.observe(out.coordinates_scored)
        m.tiers.labels(tier_trace["tier"]).inc()
        m.work_by_stage.labels("stage1").observe(out.stage1_work)
        m.work_by_stage.labels("rescoring").observe(out.rescoring_work)
        # the escalation-drift alert compares this ratio with the version's default ρ: count only queries the
        # width router decided at that ρ (not a client's own rho, not the funnel policy)
        if out.policy == "router" and req.rho is None and got.mode != "lexical":
            m.routed.inc()
            if out.escalated:
                m.escalations.inc()
        log_query_sample(settings, req.query, out.width)
        return {"results": [{"id": i, "score": s} for i, s in zip(out.ids, out.scores)],
                "trace": {"width": out.width, "escalated": out.escalated, "router_score": out.router_score,
                          "index_version": version.version, "coordinates_scored": out.coordinates_scored,
                          "mode": got.mode, "fusion": got.fusion, "allowed_documents": got.allowed_documents,
                          "stage1_work": out.stage1_work, "rescoring_work": out.rescoring_work,
                          "policy": out.policy, "stage1_width": out.stage1_width, "shortlist": out.shortlist,
                          **tier_trace, "timings_seconds": timings}}

    app.include_router(build_admin_router(state))

    @app.get("/healthz")
    async def healthz():
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Not ready: no index version or encoder loaded."}})
    async def readyz():
        """Readiness: 503 while no index version or encoder is loaded; else 200 with ``status`` "ready", or
        "degraded" when the registry is unreachable or its live version was refused here (the replica still
        serves its own live version correctly, so it stays in rotation; see deploy/CUTOVER.md)."""
        live = state.live
        if live is None or state.encoder is None:
            return JSONResponse({"status": "not_ready", "reason": state.load_error or "no live version loaded"},
                                status_code=503)
        reg = state.follower.status() if state.follower else {"registry": "pinned", "degraded": []}
        return {"status": "degraded" if reg["degraded"] else "ready", "collection": live.collection,
                "index_version": live.version, "documents": live.size, "encoder_providers": state.encoder.providers,
                "tiers": {"default": state.settings.default_tier, "difficulty_head": live.tier_head is not None,
                          "document_texts": live.texts is not None, "cross_encoder": state.cross_encoder is not None},
                **reg}


    @app.get("/metrics", response_class=Response,
             responses={200: {"description": "Prometheus text exposition.", "content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics():
        """Prometheus exposition of this replica's metrics."""
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
