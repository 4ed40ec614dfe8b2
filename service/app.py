"""The FastAPI gateway: routes only.  ``POST /v1/search`` (the default collection), ``GET /v1/collections``,
``POST /v1/collections/{name}/search``, the batch searches ``POST /v1/collections/{name}/search/batch`` and
``POST /v1/search/batch``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics`` and ``/admin/*``.

The collection-scoped routes look the name up in :attr:`service.state.GatewayState.collections` (every
collection of ``settings.collections``, each with its own versions and registry follower); an unknown name is
404 ``unknown_collection``.  ``POST /v1/search`` and ``/v1/search/batch`` search the default collection
(``settings.collection``).

A batch is one unit of work: the body-size limit applies to the whole body, it takes one admission slot of
the limiter and the request's one fixed deadline (``search_deadline_s``, not scaled by its size), and its
dense items are encoded in one encoder call (:meth:`service.state.GatewayState.run_batch`).  Each item is
typed and planned on its own: a bad item is answered in its slot (its error body and HTTP-equivalent status),
the others are searched.

A search is parse -> plan -> run -> render (docs/ARCHITECTURE.md): the body is read size-limited and decoded
strictly (:mod:`service.parsing`), typed by :class:`service.models.SearchRequest`, resolved once into an
:class:`engine.plan.Plan` against the one index version the request holds, and run through
:class:`engine.pipeline.Pipeline` on a worker (:meth:`service.state.GatewayState.run`).  Every client error is
an :class:`service.errors.ApiError` with a stable code; nothing a client sends can produce a 500.

Hardening (issue 8): integers too long for any field and lone surrogates are refused before they reach the
tokenizer; the search work runs under :class:`service.limits.SearchLimiter` (bounded concurrency and queue, 429
with ``Retry-After``, a per-request deadline); ``/admin/*`` and, optionally, search require an API key
(:mod:`service.auth`); query text is logged only when sampling is enabled, and then truncated; metric labels
are route templates and bounded values only.
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.access import principal_of
from service import examples as ex
from service.admin import build_admin_router
from service.auth import require_search_key
from service.config import GatewaySettings
from service.errors import ApiError
from service.metrics import bounded_method
from service.models import (BatchItemError, BatchSearchRequest, BatchSearchResponse, CollectionsResponse,
                            SearchRequest, SearchResponse, batch_request_schema, error_responses,
                            search_request_schema)
from service.parsing import check_media_type, parse_json, read_body, route_validation_error, validate
from service.state import GatewayState
from service.writes import build_write_router

log = logging.getLogger("service")


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
    generate_openapi = app.openapi

    def openapi() -> dict:  # generated once; the examples' nulls put back (service.examples.restore_examples)
        if app.openapi_schema is None:
            app.openapi_schema = ex.restore_examples(generate_openapi(), app)
        return app.openapi_schema

    app.openapi = openapi

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
        # the admin bodies: the field at fault, coded as a search body's (missing_field, unknown_field, ...)
        return await api_error(request, route_validation_error(exc.errors()))

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
    search_deps = [Depends(require_search_key)] if search_key else []
    search_errors = (400, *([401] if search_key or settings.access_policy == "api_key" else []),
                     *([403] if settings.access_policy == "header" else []), 408, 409, 413, 415, 422, 429, 503)
    search_examples = {403: "tenant_required"}  # the error code each status's example shows, where not the default
    batch_examples = {**search_examples, 413: "batch_too_large"}
    search_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": search_request_schema(settings)}}}}
    batch_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": batch_request_schema(settings)}}}}

    async def search_in(request: Request, name: str) -> dict:
        deadline = time.monotonic() + settings.search_deadline_s
        versions = state.collection(name)
        check_media_type(request)
        req = validate(SearchRequest, parse_json(await read_body(request, settings.max_body_bytes, deadline),
                                                 settings.max_body_bytes))
        principal = principal_of(request, settings)
        with versions.acquire() as version:  # the one reference this request holds to its end
            if version is None or state.encoder is None:
                raise ApiError("not_ready", "no index version is loaded")
            plan = state.plan(req.spec(), version, principal)
            result = await state.run(plan, version, deadline)
            return {"results": result.hits(), "trace": result.trace}

    async def search_batch_in(request: Request, name: str) -> dict:
        deadline = time.monotonic() + settings.search_deadline_s  # one fixed deadline for the whole batch
        versions = state.collection(name)
        check_media_type(request)
        batch = BatchSearchRequest.parse(parse_json(await read_body(request, settings.max_body_bytes, deadline),
                                                    settings.max_body_bytes), settings.max_batch)
        principal = principal_of(request, settings)
        items = batch.items()
        with versions.acquire() as version:  # every item runs on this one version
            if version is None or state.encoder is None:
                raise ApiError("not_ready", "no index version is loaded")
            slots: list = [None] * len(items)
            plans, where = [], []
            for i, item in enumerate(items):
                try:
                    if isinstance(item, ApiError):
                        raise item
                    plans.append(state.plan(item.spec(), version, principal))
                    where.append(i)
                except ApiError as e:  # this item alone is refused; the others are answered
                    state.metrics.errors.labels(e.code).inc()
                    slots[i] = BatchItemError.of(e)
            state.metrics.batch_size.observe(len(items))
            if plans:
                for i, result in zip(where, await state.run_batch(plans, version, deadline)):
                    slots[i] = {"results": result.hits(), "trace": result.trace}
            return {"results": slots}

    @app.post("/v1/search", response_model=SearchResponse, dependencies=search_deps,
              responses=error_responses(*search_errors, examples=search_examples), openapi_extra=search_body)
    async def search(request: Request):
        """Search the default collection's live index version.  See ``docs/API.md`` for the error codes."""
        return await search_in(request, settings.collection)

    @app.post("/v1/search/batch", response_model=BatchSearchResponse, dependencies=search_deps,
              responses=error_responses(*search_errors, examples=batch_examples), openapi_extra=batch_body)
    async def search_batch(request: Request):
        """Batch search of the default collection: ``{"queries": [search body, ...]}`` -> one slot per query."""
        return await search_batch_in(request, settings.collection)

    @app.get("/v1/collections", response_model=CollectionsResponse)
    async def collections():
        """The collections this gateway serves: live version, documents, the ``auto`` policies, default policy."""
        return {"collections": [state.collection_info(name) for name in state.collections]}

    @app.post("/v1/collections/{name}/search", response_model=SearchResponse, dependencies=search_deps,
              responses=error_responses(*search_errors, 404, examples=search_examples),
              openapi_extra=search_body)
    async def search_collection(request: Request, name: str):
        """Search collection ``name`` (as ``POST /v1/search``; 404 ``unknown_collection`` for a name not served)."""
        return await search_in(request, name)

    @app.post("/v1/collections/{name}/search/batch", response_model=BatchSearchResponse, dependencies=search_deps,
              responses=error_responses(*search_errors, 404, examples=batch_examples),
              openapi_extra=batch_body)
    async def search_collection_batch(request: Request, name: str):
        """Batch search of collection ``name``: one slot per query, in request order (docs/API.md)."""
        return await search_batch_in(request, name)

    app.include_router(build_admin_router(state))
    app.include_router(build_write_router(state))  # live documents (issue 18)

    @app.get("/healthz", responses={200: {"description": "The process answers.",
                                          "content": {"application/json": {"example": ex.HEALTH}}}})
    async def healthz():
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={
        200: {"description": "Ready (or degraded: still serving its own live versions).",
              "content": {"application/json": {"example": ex.READY}}},
        503: {"description": "Not ready: the encoder, or a live version of some collection served, is not loaded "
                             "(or the write-ahead logs are being replayed).",
              "content": {"application/json": {"example": ex.NOT_READY}}}})
    async def readyz():
        """Readiness: 503 while the encoder or any served collection's live version is not loaded; else 200 with
        ``status`` "ready", or "degraded" when the registry is unreachable, a collection's registry live version
        was refused here, a collection's write-ahead log follower (Redis) cannot follow the log, a collection's file
        log is held by another process (the writer) or unreadable, or a pinned
        collection's lease report failed (the replica still serves its own live versions correctly, so it stays in
        rotation; see deploy/CUTOVER.md).  The top-level version fields are the default collection's; ``collections`` holds
        every served collection's live version, documents, registry view and ``degraded`` reasons (its registry's
        and its write-ahead log's, as the top-level ``degraded`` lists them).  ``tiers.rerank`` says, per reranking
        tier, whether the default collection's live version can be served at it here, and why not (e.g.
        ``max_concurrent_reranks = 0`` turns both off)."""
        per = {name: state.collection_status(name) for name in state.collections}
        missing = [name for name, c in per.items() if c["index_version"] is None]
        if state.encoder is None or missing:
            reason = state.load_error if state.encoder is None else "; ".join(
                state.load_errors.get(name) or f"collection {name!r}: no live version loaded" for name in missing)
            return JSONResponse({"status": "not_ready", "reason": reason or "no live version loaded",
                                 "collections": per}, status_code=503)
        live = state.live
        if state.live_docs.pending:  # the write-ahead logs are being replayed
            return JSONResponse({"status": "not_ready", "reason": "replaying the write-ahead logs",
                                 "collections": per}, status_code=503)
        reg = {k: v for k, v in per[settings.collection].items()
               if k not in ("index_version", "documents", "pending_writes")}
        degraded = list(reg["degraded"]) + [f"collection {name!r}: {d}" for name, c in per.items()
                                            if name != settings.collection for d in c["degraded"]]
        wal = {name: state.wal_degraded(name) for name in state.collections}
        degraded += [f"collection {name!r}: {d}" for name in state.collections for d in wal[name]]
        for name, c in per.items():  # each collection's entry lists its own reasons, the log's included
            c["degraded"] = [*c["degraded"], *wal[name]]
        return {"status": "degraded" if degraded else "ready", "collection": live.collection,
                "index_version": live.version, "documents": live.size, "encoder_providers": state.encoder.providers,
                "tiers": {"default": state.settings.default_tier, "difficulty_head": live.tier_head is not None,
                          "document_texts": live.texts is not None, "cross_encoder": state.cross_encoder is not None,
                          "rerank": state.rerank_status(live)},
                "stage1": live.backend_report(), **reg, "degraded": degraded, "collections": per}


    @app.get("/metrics", response_class=Response,
             responses={200: {"description": "Prometheus text exposition.",
                              "content": {CONTENT_TYPE_LATEST: {"example": ex.METRICS}}}})
    async def metrics():
        """Prometheus exposition of this replica's metrics."""
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
