"""The FastAPI gateway: ``POST /v1/search``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

Request path: read the raw body (size-limited), decode UTF-8 strictly, parse
JSON, validate with :class:`SearchRequest`, take **one** reference to the live
index version, then (in a worker thread) encode, rotate, stage 1, route and
rescore.  Every client error is an :class:`service.errors.ApiError` with a
stable code; nothing a client sends can produce a 500.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.admin import build_admin_router
from service.config import GatewaySettings
from service.errors import ApiError
from service.index import IndexVersion
from service.metrics import STAGES, CutoverMetrics, GatewayMetrics
from service.versions import VersionManager, start_replica

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
        None, description="Target escalation fraction for width 'auto', in [0, 1] (default: the index's).")


class Hit(BaseModel):
    id: str = Field(description="Document id from the corpus.")
    score: float = Field(description="Prefix cosine at the width used (higher is better).")


class Trace(BaseModel):
    width: int = Field(description="Prefix width the shortlist was scored at, in coordinates.")
    escalated: bool = Field(description="True when the router chose the high width of its action pair.")
    router_score: float | None = Field(description="Predicted NDCG@10 gain of escalating (width 'auto' only).")
    index_version: str
    coordinates_scored: int = Field(description="Multiply-adds of stage 1 plus rescoring for this query.")
    timings_seconds: dict[str, float]


class SearchResponse(BaseModel):
    results: list[Hit]
    trace: Trace


class ErrorBody(BaseModel):
    error: dict


class GatewayState:
    """What the process holds: settings, encoder, the versions (live and warm) with the registry follower, metrics."""

    def __init__(self, settings: GatewaySettings, registry: CollectorRegistry):
        self.settings = settings
        self.metrics = GatewayMetrics(registry)
        self.cutover_metrics = CutoverMetrics(self.metrics)
        self.encoder = None
        self.versions = VersionManager(settings.collection, settings.index_root, None, self.cutover_metrics,
                                       settings.canary_queries)
        self.registry = None  # service.registry.Registry, None when a version is pinned
        self.follower = None  # service.versions.RegistryFollower
        self.load_error: str | None = None

    @property
    def live(self) -> IndexVersion | None:
        """The live version now (requests take theirs with ``self.versions.acquire()``)."""
        return self.versions.live

    def load(self) -> None:
        """Load the encoder, then the live version (pinned, or the registry's) and follow the registry;
        failures leave the replica unready."""
        from service.encoder import OnnxEncoder

        s = self.settings
        try:
            self.encoder = OnnxEncoder(s.encoder_dir, threads=s.encoder_threads, prefer_gpu=s.prefer_gpu, spin=False)
        except FileNotFoundError as e:
            self.load_error = str(e)
            log.error("gateway not ready: %s", e)
            return
        self.versions.encoder = self.encoder
        self.registry, self.follower, self.load_error = start_replica(s, self.versions, self.cutover_metrics)
        if self.live is None:
            log.error("gateway not ready: %s", self.load_error)
            return
        log.info("serving %s/%s (%d documents, providers %s, registry %s)", self.live.collection, self.live.version,
                 self.live.size, self.encoder.providers, self.registry.kind if self.registry else "pinned")

    def close(self) -> None:
        """Stop following the registry."""
        if self.follower is not None:
            self.follower.stop()
        if self.registry is not None:
            self.registry.close()


def _validation_error(err: ValidationError) -> ApiError:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if not isinstance(p, int)) or None
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return ApiError("unknown_field", f"unknown field {loc!r}", loc)
    if kind == "missing":
        return ApiError("missing_field", f"field {loc!r} is required", loc)
    if loc and loc.startswith("width"):
        return ApiError("unknown_width", "width must be 'auto', 'full' or an integer number of coordinates", "width")
    return ApiError("invalid_type", f"field {loc!r}: {first.get('msg', 'invalid value')}", loc)


def parse_search_request(raw: bytes, settings: GatewaySettings) -> SearchRequest:
    """Decode, parse and validate a search body.

    Raises:
        ApiError: ``body_too_large``, ``invalid_utf8``, ``invalid_json``, ``invalid_type``,
            ``unknown_field``, ``missing_field``, ``unknown_width``, ``blank_query``,
            ``query_too_long``, ``k_out_of_range``, ``width_out_of_range``, ``rho_out_of_range``.
    """
    if len(raw) > settings.max_body_bytes:
        raise ApiError("body_too_large", f"request body exceeds {settings.max_body_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_utf8", "request body is not valid UTF-8") from None
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ApiError("invalid_json", "request body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise ApiError("invalid_type", "request body must be a JSON object")
    try:
        req = SearchRequest.model_validate(obj)
    except ValidationError as e:
        raise _validation_error(e) from None
    if not req.query.strip():
        raise ApiError("blank_query", "query must contain a non-blank character", "query")
    if len(req.query) > settings.max_query_chars:
        raise ApiError("query_too_long", f"query exceeds {settings.max_query_chars} characters", "query")
    k = settings.k_default if req.k is None else req.k
    if not 1 <= k <= settings.k_max:
        raise ApiError("k_out_of_range", f"k must be between 1 and {settings.k_max}", "k")
    if isinstance(req.width, int) and not isinstance(req.width, bool) and not 1 <= req.width <= 384_000:
        raise ApiError("width_out_of_range", "width must be between 1 and the encoder width", "width")
    if req.rho is not None and not 0.0 <= float(req.rho) <= 1.0:
        raise ApiError("rho_out_of_range", "rho must be in [0, 1]", "rho")
    return req.model_copy(update={"k": k})


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
                  description="Dense retrieval with per-query adaptive embedding width.")
    app.state.gw = state

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        state.metrics.http_requests.labels(template, request.method if template != "unmatched" else "any",
                                           f"{response.status_code // 100}xx").inc()
        state.metrics.http_latency.labels(template).observe(time.perf_counter() - start)
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        state.metrics.errors.labels(exc.code).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return await api_error(request, ApiError("invalid_request", "invalid request"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        if code is None:
            return JSONResponse({"error": {"code": "http_error", "message": str(exc.detail), "field": None}},
                                status_code=exc.status_code)
        return await api_error(request, ApiError(code, str(exc.detail)))

    @app.post("/v1/search", response_model=SearchResponse,
              responses={400: {"model": ErrorBody}, 413: {"model": ErrorBody}, 415: {"model": ErrorBody},
                         422: {"model": ErrorBody}, 503: {"model": ErrorBody}},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": SearchRequest.model_json_schema()}}}})
    async def search(request: Request):
        """Search the live index version.  See ``docs/API.md`` for the error codes."""
        with state.versions.acquire() as version:  # the one reference this request holds to its end
            return await _serve(request, version)

    async def _serve(request: Request, version: IndexVersion | None):
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise ApiError("unsupported_media_type", "send the body as application/json")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_body_bytes:
            raise ApiError("body_too_large", f"request body exceeds {settings.max_body_bytes} bytes")
        req = parse_search_request(await request.body(), settings)
        if version is None or state.encoder is None:
            raise ApiError("not_ready", "no index version is loaded")
        if isinstance(req.width, int) and req.width > version.dimension:
            raise ApiError("width_out_of_range", f"width must be between 1 and {version.dimension}", "width")
        if req.width == "auto":
            pair = settings.action_pair or version.default_pair
            if pair is None or tuple(pair) not in version.routers:
                raise ApiError("unknown_width", "this index version has no router; use 'full' or an integer", "width")
        rho = settings.default_rho if req.rho is None else float(req.rho)

        def run():
            t0 = time.perf_counter()
            emb = state.encoder.encode([req.query])[0]
            t_enc = time.perf_counter() - t0
            out = version.search(emb, req.k, req.width, rho=rho,
                                 pair=tuple(settings.action_pair) if settings.action_pair else None)
            timings = {"encode": t_enc, **out.timings_seconds, "total": time.perf_counter() - t0}
            return out, timings

        out, timings = await run_in_threadpool(run)
        m = state.metrics
        for stage in STAGES:
            if stage in timings:
                m.stage_latency.labels(stage).observe(timings[stage])
        policy = req.width if isinstance(req.width, str) else "fixed"
        m.width.labels(policy).observe(out.width)
        m.coordinates.observe(out.coordinates_scored)
        if req.width == "auto":
            m.routed.inc()
            if out.escalated:
                m.escalations.inc()
        return {"results": [{"id": i, "score": s} for i, s in zip(out.ids, out.scores)],
                "trace": {"width": out.width, "escalated": out.escalated, "router_score": out.router_score,
                          "index_version": version.version, "coordinates_scored": out.coordinates_scored,
                          "timings_seconds": timings}}

    @app.get("/healthz")
    async def healthz():
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz")
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
                **reg}

    app.include_router(build_admin_router(state))

    @app.get("/metrics")
    async def metrics():
        """Prometheus exposition of this replica's metrics."""
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
