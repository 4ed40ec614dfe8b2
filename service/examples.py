"""Example payloads of the OpenAPI document: what this gateway answers on the SciFact collection.

Data (nothing from the service imported), used by :mod:`service.models`, :mod:`service.admin`,
:mod:`service.writes` and :mod:`service.app`, and :func:`restore_examples`, which puts the examples' nulls back
into the generated document (FastAPI drops every null of it).  ``tests/unit/test_openapi_examples.py`` checks
that every operation carries examples and that each validates against its response model.
"""

from __future__ import annotations

import copy

from fastapi import routing
from pydantic import BaseModel

LIVE = "20261201T155832Z-4a31a5ef"
"""The live version of the examples (built after PREVIOUS)."""
PREVIOUS = "20261130T063214Z-fc31887d"
"""The version live before LIVE (the rollback target)."""
PUBLISHED_AT = 1796140712.0
PROMOTED_AT = 1796141054.3
REPLICA = "gateway-0:8000"

# -- search ---------------------------------------------------------------------------------------------------
TRACE_RECALL = {
    "policy": "recall", "width": 384, "escalated": False, "router_score": None, "index_version": LIVE,
    "mode": "dense", "fusion": None, "allowed_documents": None, "coordinates_scored": 178144,
    "stage1_work": 178144, "rescoring_work": 0, "stage1_width": 32, "shortlist": 5183, "recall_target": 0.99,
    "confidence": 5.0, "certified": False, "alive_per_level": [5183, 0, 0, 0, 0, 0, 0], "tier": "mips",
    "tier_predicted": None, "reranked": 0,
    "timings_seconds": {"encode": 0.038, "stage1": 0.0005, "rotate": 0.0001, "route": 0.0003, "rescore": 0.0001,
                        "rerank": 0.0, "total": 0.039},
    "delta": None}
TRACE_ROUTER = {
    "policy": "router", "width": 128, "escalated": True, "router_score": 0.0412, "index_version": LIVE,
    "mode": "dense", "fusion": None, "allowed_documents": None, "coordinates_scored": 178624,
    "stage1_work": 165856, "rescoring_work": 12768, "stage1_width": 32, "shortlist": 133, "recall_target": None,
    "confidence": None, "certified": None, "alive_per_level": None, "tier": "mips", "tier_predicted": None,
    "reranked": 0,
    "timings_seconds": {"encode": 0.021, "stage1": 0.0004, "rotate": 0.0001, "route": 0.0002, "rescore": 0.0001,
                        "rerank": 0.0, "total": 0.023},
    "delta": {"documents": 2, "returned": 1, "masked": True}}
SEARCH_RESPONSES = [
    {"results": [{"id": "13734012", "score": 0.7621}, {"id": "4983", "score": 0.4417}], "trace": TRACE_RECALL},
    {"results": [{"id": "22843838", "score": 0.8134}, {"id": "4983", "score": 0.3702}], "trace": TRACE_ROUTER},
]

# -- collections, health ---------------------------------------------------------------------------------------
REGISTRY_VIEW = {"registry": "file", "registry_revision": 7, "registry_live": LIVE,
                 "warm_versions": [PREVIOUS, LIVE], "degraded": []}
READY = {
    "status": "ready", "collection": "scifact", "index_version": LIVE, "documents": 5183,
    "encoder_providers": ["CPUExecutionProvider"],
    "tiers": {"default": "mips", "difficulty_head": True, "document_texts": True, "cross_encoder": False,
              "rerank": {"maxsim": {"available": True, "reason": None},
                         "cross_encoder": {"available": False,
                                           "reason": "no cross_encoder scorer is loaded on this replica"}}},
    **REGISTRY_VIEW,
    "collections": {"scifact": {"index_version": LIVE, "documents": 5183, **REGISTRY_VIEW}}}
NOT_READY = {
    "status": "not_ready", "reason": "replaying the write-ahead logs",
    "collections": {"scifact": {"index_version": LIVE, "documents": 5183, **REGISTRY_VIEW}}}
HEALTH = {"status": "ok"}
METRICS = (
    "# HELP adawidth_http_requests_total HTTP requests by route template and status.\n"
    "# TYPE adawidth_http_requests_total counter\n"
    'adawidth_http_requests_total{method="POST",route="/v1/search",status="2xx"} 1532.0\n'
    'adawidth_http_requests_total{method="POST",route="/v1/search",status="4xx"} 12.0\n'
    "# HELP adawidth_errors_total Client errors by machine-readable code.\n"
    "# TYPE adawidth_errors_total counter\n"
    'adawidth_errors_total{code="blank_query"} 9.0\n'
    "# HELP adawidth_live_version_info 1 for the version this replica serves.\n"
    "# TYPE adawidth_live_version_info gauge\n"
    f'adawidth_live_version_info{{collection="scifact",version="{LIVE}"}} 1.0\n'
    "# HELP adawidth_index_documents Documents in the live version of each collection.\n"
    "# TYPE adawidth_index_documents gauge\n"
    'adawidth_index_documents{collection="scifact"} 5183.0\n')

# -- admin ------------------------------------------------------------------------------------------------------
GATE = {"queries": 300, "width": "auto", "top10_overlap": 0.963667, "top1_agreement": 0.976667,
        "live_version": PREVIOUS, "candidate_version": LIVE, "metric": "ndcg@10", "live": 0.671184,
        "candidate": 0.674822, "margin": 0.01, "passed": True, "reason": "quality_gate: passed"}
STATE_PUBLISHED = {"collection": "scifact", "live": PREVIOUS, "previous": None, "candidates": [LIVE],
                   "revision": 6, "last_action": "publish", "updated_at": PUBLISHED_AT}
STATE_PROMOTED = {"collection": "scifact", "live": LIVE, "previous": PREVIOUS, "candidates": [], "revision": 7,
                  "last_action": "promote", "updated_at": PROMOTED_AT}
STATE_ROLLED_BACK = {"collection": "scifact", "live": PREVIOUS, "previous": LIVE, "candidates": [], "revision": 8,
                     "last_action": "rollback", "updated_at": PROMOTED_AT + 1800.0}
REGISTRY = {
    "kind": "file", "state": STATE_PROMOTED,
    "history": [
        {"revision": 6, "ts": PUBLISHED_AT, "action": "publish", "version": LIVE, "actor": "admin-api"},
        {"revision": 7, "ts": PROMOTED_AT, "action": "promote", "version": LIVE, "from": PREVIOUS, "gate": GATE,
         "actor": "admin-api"}],
    "replicas": {REPLICA: {"live": LIVE, "warm": [PREVIOUS, LIVE], "refused": {}, "replica": REPLICA,
                           "ts": PROMOTED_AT + 9.8}}}
PUBLISH_BODY = {"version": LIVE}
PROMOTE_BODIES = [{"version": LIVE}, {"version": LIVE, "skip_gate": True}, {}]
ROLLBACK_BODY = {"reason": "NDCG@10 regression on the nightly shadow run"}
RELOAD_BODIES = [{"collection": "scifact"}, {}]
RELOAD_RESPONSES = [
    {"status": "reloaded", "index_version": LIVE, "previous_version": PREVIOUS, "collection": "scifact"},
    {"status": "unchanged", "index_version": LIVE, "previous_version": LIVE},
]

# -- live documents ---------------------------------------------------------------------------------------------
UPSERT_BODY = [
    {"id": "4983", "title": "Microstructural development of human newborn cerebral white matter assessed in vivo "
                            "by diffusion tensor magnetic resonance imaging.",
     "text": "Alterations of the architecture of cerebral white matter in the developing human brain can affect "
             "cortical development and result in functional disabilities."},
    {"id": "acme-2026-0117", "title": "Statin therapy after myocardial infarction",
     "text": "In 4,162 patients hospitalised for an acute coronary syndrome, intensive statin therapy reduced "
             "major cardiovascular events compared with standard therapy.", "fields": {"tenant": "acme",
                                                                                      "acl": ["cardio"]}},
]
UPSERT_NDJSON = "\n".join([
    '{"id": "4983", "title": "Microstructural development of human newborn cerebral white matter", '
    '"text": "Alterations of the architecture of cerebral white matter in the developing human brain."}',
    '{"id": "acme-2026-0117", "text": "Intensive statin therapy reduced major cardiovascular events.", '
    '"fields": {"tenant": "acme"}}']) + "\n"
DELETE_BODY = {"ids": ["4983", "acme-2026-0117"]}
UPSERT_ACCEPTED = {"collection": "scifact", "op": "upsert", "seq": 42, "count": 2}
DELETE_ACCEPTED = {"collection": "scifact", "op": "delete", "seq": 43, "count": 2}
DOCUMENTS = [
    {"id": "acme-2026-0117", "served_from": "delta", "seq": 42, "document": UPSERT_BODY[1]},
    {"id": "4983", "served_from": LIVE, "seq": None, "document": {
        "id": "4983", "text": "Alterations of the architecture of cerebral white matter in the developing human "
                              "brain can affect cortical development and result in functional disabilities."}},
]
WRITES = {"collection": "scifact", "last_accepted_seq": 43, "applied_seq": 43, "last_folded_seq": 40,
          "live_version": LIVE, "live_folded_seq": 40, "pending_upserts": 1, "pending_deletes": 1, "log": "redis",
          "follower_error": None}

# -- errors: the example code of each status (a route may name another with error_responses(examples=...)) ----
ERROR_EXAMPLES: dict[str, tuple[str, str | None]] = {
    "invalid_json": ("request body is not valid JSON", None),
    "missing_api_key": ("send the API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'", None),
    "admin_disabled": ("admin endpoints are disabled: no admin_api_key is configured", None),
    "writes_disabled": ("document writes are disabled: no write_api_key is configured", None),
    "tenant_required": ("this gateway serves tenants: send the X-Tenant header", None),
    "unknown_collection": ("this gateway does not serve that collection", "name"),
    "unknown_version": (f"no version {LIVE!r} in 'scifact'", None),
    "unknown_document": ("no document has that id", "id"),
    "policy_unavailable": ("this index version cannot serve policy 'funnel' (it serves ['recall', 'router']; "
                           "rebuild it with the current trainer)", "policy"),
    "no_previous": ("[no_previous] collection 'scifact' has no previous version to roll back to", None),
    "reload_failed": (f"the registry's live version could not be served (checksum_mismatch); still serving "
                      f"{PREVIOUS}", None),
    "version_refused": (f"{LIVE}: manifest encoder sha256 0f3c9e1d2ab4 does not match the serving encoder "
                        f"7b21aa90c5d3", None),
    "gate_refused": ("quality_gate: NDCG@10 0.6411 is worse than live 0.6712 by more than 0.01 on 300 held-out "
                     "queries", None),
    "query_too_long": ("query exceeds 20000 characters", "query"),
    "batch_too_large": ("a batch holds at most 256 queries", "queries"),
    "body_too_large": ("request body exceeds 262144 bytes", None),
    "body_timeout": ("the request body did not arrive within the request's deadline", None),
    "unsupported_media_type": ("send the body as application/json", None),
    "blank_query": ("query must contain a visible character", "query"),
    "invalid_version": ("[invalid_version] '../scifact' is not a valid version name", None),
    "invalid_request": ("invalid request", None),
    "unknown_field": ("unknown field 'force'", "force"),
    "invalid_id": ("a document id must be a string", "[0].id"),
    "overloaded": ("too many searches in progress; retry later", None),
    "not_ready": ("no index version is loaded", None),
    "registry_unavailable": ("[registry_unavailable] redis at redis:6379 is unreachable", None),
    "writes_unavailable": ("this replica cannot write to the collection's log; see its log", None),
}
DEFAULT_ERROR_CODE = {400: "invalid_json", 401: "missing_api_key", 403: "admin_disabled", 404: "unknown_collection",
                      408: "body_timeout", 409: "policy_unavailable", 413: "query_too_long", 415: "unsupported_media_type",
                      422: "blank_query", 429: "overloaded", 503: "not_ready"}


def error_example(code: str) -> dict:
    """The error body of ``code`` as the gateway answers it."""
    message, field = ERROR_EXAMPLES[code]
    return {"error": {"code": code, "message": message, "field": field}}


def api_routes(app) -> list:
    """Every FastAPI route of ``app``, those of included routers too (FastAPI >= 0.160 keeps an included router
    as one entry of ``app.routes``; each item then is its route context, which reads like the route with the
    router's settings applied)."""
    iter_contexts = getattr(routing, "iter_route_contexts", None)
    if iter_contexts is None:  # older FastAPI: include_router copies the routes into app.routes
        return [r for r in app.routes if isinstance(r, routing.APIRoute)]
    return [c for c in iter_contexts(app.routes) if isinstance(c.original_route, routing.APIRoute)]


def restore_examples(doc: dict, app) -> dict:
    """``doc`` (``app``'s generated OpenAPI document) with every declared example as declared.

    FastAPI encodes the document with ``exclude_none``, which also drops the nulls of examples (an error's
    ``"field": null``, a trace's ``"router_score": null``), leaving examples that their own models refuse.  This
    copies them back from their sources: the ``json_schema_extra`` examples of the service's pydantic models (the
    components named after them) and the ``example``/``examples`` of each route's ``responses`` and
    ``openapi_extra`` request body.
    """
    schemas = doc.get("components", {}).get("schemas", {})
    todo, models = list(BaseModel.__subclasses__()), []
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("service."):
            models.append(cls)
    for model in models:
        extra = model.model_config.get("json_schema_extra")
        if isinstance(extra, dict) and "examples" in extra and "examples" in schemas.get(model.__name__, {}):
            schemas[model.__name__]["examples"] = copy.deepcopy(extra["examples"])

    def put(source: dict, target: dict) -> None:
        for key in ("example", "examples"):
            if key in source and key in target:
                target[key] = copy.deepcopy(source[key])
        if isinstance(source.get("schema"), dict) and isinstance(target.get("schema"), dict):
            put(source["schema"], target["schema"])

    for route in api_routes(app):
        if not route.include_in_schema:
            continue
        for method in route.methods:
            op = doc["paths"].get(route.path_format, {}).get(method.lower())
            if op is None:
                continue
            for status, response in route.responses.items():
                for ctype, media in (response.get("content") or {}).items():
                    target = op["responses"].get(str(status), {}).get("content", {}).get(ctype)
                    if target is not None:
                        put(media, target)
            body = (route.openapi_extra or {}).get("requestBody") or {}
            for ctype, media in (body.get("content") or {}).items():
                target = op.get("requestBody", {}).get("content", {}).get(ctype)
                if target is not None:
                    put(media, target)
    return doc
