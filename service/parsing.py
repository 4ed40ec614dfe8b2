"""Request parsing at the gateway's edge: the body as bytes -> UTF-8 -> JSON -> a typed request model.

Only the *types* are checked here (pydantic); every value is checked once, by
:func:`engine.plan.resolve_plan`.  Each failure is an :class:`service.errors.ApiError` with one code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

from fastapi import Request
from starlette.requests import ClientDisconnect
from pydantic import BaseModel, ValidationError

from engine.plan import MAX_FILTER_VALUES, PlanDefaults, has_lone_surrogate
from service.config import GatewaySettings
from service.errors import MAX_ECHO_CHARS, ApiError, safe_text

MAX_INT_DIGITS = 18
"""Longer JSON integers are out of range for every field (k, width); they parse to :data:`HUGE_INT`."""
HUGE_INT = 10 ** 19

_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _bounded_int(text: str) -> int:
    # Python refuses int() of more than 4300 digits with a ValueError, and a
    # long one costs quadratic time; no field accepts more than 18 digits.
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        return -HUGE_INT if text.startswith("-") else HUGE_INT
    return int(text)


def validation_error(err: ValidationError) -> ApiError:
    """The one :class:`ApiError` of a pydantic validation failure (its first error decides the code)."""
    return _error_of(err.errors())


_REQUEST_PARTS = ("body", "query", "path", "header", "cookie")


def _without_part(loc) -> tuple:
    """A FastAPI error location without its leading request part (``("body", "version")`` -> ``("version",)``)."""
    loc = tuple(loc or ())
    return loc[1:] if loc[:1] and loc[0] in _REQUEST_PARTS else loc


def route_validation_error(errors: list[dict]) -> ApiError:
    """The one :class:`ApiError` of FastAPI's validation of a route's declared body (the ``/admin/*`` bodies),
    coded as a search body's failure is: ``missing_field`` / ``unknown_field`` / ``invalid_type`` naming the
    field (``{}`` to ``POST /admin/publish``: ``missing_field`` ``version``); ``invalid_json`` (400) for a body
    that is not JSON; ``invalid_type`` for a body that is not a JSON object; ``invalid_request`` when FastAPI
    names no error.

    Args:
        errors: :meth:`fastapi.exceptions.RequestValidationError.errors`, each ``loc`` led by where the value
            was (``"body"``, ``"query"``, ...), which is not a field a client sent and is dropped.
    """
    if not errors:
        return ApiError("invalid_request", "invalid request")
    bad = [e for e in errors if e.get("type") == "json_invalid"]
    if bad:  # as a search body's: 400 invalid_json
        why = str((bad[0].get("ctx") or {}).get("error") or bad[0].get("msg", ""))
        return ApiError("invalid_json", f"the body is not valid JSON ({safe_text(why, MAX_ECHO_CHARS)})")
    errors = [{**e, "loc": _without_part(e.get("loc"))} for e in errors]
    if not any(not isinstance(p, int) for p in errors[0]["loc"]):  # the body itself: missing, or not an object
        return ApiError("invalid_type", f"the body must be a JSON object ({errors[0].get('msg', 'invalid value')})")
    return _error_of(errors)


def _error_of(errors: list[dict]) -> ApiError:
    first = errors[0]
    # the request's field, not pydantic's path into it: a union member's tag ("rho.float", "filter.a.constrained-str")
    # is not a field a client sent; only a filter's own key is kept ("filter.team")
    parts = [str(p) for p in first.get("loc", ()) if not isinstance(p, int)]
    loc = (f"filter.{parts[1]}" if parts[:1] == ["filter"] and len(parts) > 1 else parts[0]) if parts else None
    kind = first.get("type", "")
    shown = repr(safe_text(loc, MAX_ECHO_CHARS)) if loc else "?"
    if kind == "extra_forbidden":
        return ApiError("unknown_field", f"unknown field {shown}", loc)
    if kind == "missing":
        return ApiError("missing_field", f"field {shown} is required", loc)
    if loc and loc.startswith("filter.") and any(e.get("type") in ("too_short", "too_long")
                                                 for e in errors if e.get("loc", ())[:1] == ("filter",)):
        # a list of values of the wrong length: pydantic's first error is the union's other member ("should be a
        # valid string"), which names the wrong problem
        return ApiError("invalid_filter", f"field {shown}: a list of values must hold 1 to {MAX_FILTER_VALUES} "
                                          "values", "filter")
    for prefix, code in (("mode", "unknown_mode"), ("fusion", "unknown_fusion"), ("filter", "invalid_filter"),
                         ("tier", "unknown_tier"), ("policy", "unknown_policy")):
        if loc and loc.startswith(prefix):
            return ApiError(code, f"field {shown}: {first.get('msg', 'invalid value')}", prefix)
    if loc and loc.startswith("width"):
        return ApiError("unknown_width", "width must be 'auto', 'full' or an integer number of coordinates", "width")
    if loc and loc.startswith("recall_target"):
        return ApiError("recall_target_out_of_range", "recall_target must be a number in (0, 1]", "recall_target")
    return ApiError("invalid_type", f"field {shown}: {first.get('msg', 'invalid value')}", loc)


async def read_body(request: Request, limit: int, deadline: float | None = None) -> bytes:
    """The request body, read in chunks and refused as soon as it passes ``limit`` bytes.

    Args:
        request: the request.
        limit: the largest body accepted, in bytes.
        deadline: a ``time.monotonic()`` instant by which the whole body must have arrived (None: no limit),
            so a client that stalls mid-body does not hold its connection beyond the request's deadline.

    Raises:
        ApiError: ``body_too_large`` (a declared or actual length above ``limit``), ``body_timeout`` (the body
            had not arrived by ``deadline``), ``client_disconnected`` (the client closed the connection before
            its body arrived: nothing to answer, counted apart from server errors).
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError("body_too_large", f"request body exceeds {limit} bytes")
    chunks, size = [], 0

    async def receive():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError("body_too_large", f"request body exceeds {limit} bytes")
            chunks.append(chunk)

    try:
        if deadline is None:
            await receive()
        else:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await receive()
    except TimeoutError:
        raise ApiError("body_timeout", "the request body did not arrive within the request's deadline") from None
    except ClientDisconnect:
        raise ApiError("client_disconnected", "the client closed the connection before its body arrived") from None
    return b"".join(chunks)


MAX_ADMIN_BODY_BYTES = 64 * 1024
"""Largest ``/admin/*`` body (theirs are a few short fields)."""


async def admin_body(request: Request) -> None:
    """The ``/admin/*`` routes' body checks, coded as a search body's: 415 ``unsupported_media_type`` for a
    declared type other than JSON, 413 ``body_too_large`` for a declared length over
    :data:`MAX_ADMIN_BODY_BYTES` (before the body is read), then :func:`parse_json`'s (400 ``invalid_json`` for a
    byte-order mark, 422 ``duplicate_field``, ``invalid_unicode``, ...) on a body that is not empty."""
    if request.method != "POST":
        return
    check_media_type(request)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_ADMIN_BODY_BYTES:
        raise ApiError("body_too_large", f"an admin body holds at most {MAX_ADMIN_BODY_BYTES} bytes")
    raw = await request.body()  # Starlette keeps it: the route's own parsing reads the same bytes
    if raw.strip():  # the same strict reading as a search body's: a byte-order mark, a repeated field name, ...
        parse_json(raw, MAX_ADMIN_BODY_BYTES)


def check_media_type(request: Request) -> None:
    """Raise ``unsupported_media_type`` (415) unless the body is declared as JSON (or not declared)."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype not in ("application/json", ""):
        raise ApiError("unsupported_media_type", "send the body as application/json")


def parse_json(raw: bytes, limit: int):
    """Decode a body strictly as UTF-8 JSON.

    ``NaN`` and ``±Infinity`` (not JSON, but sent by many clients) parse to floats so that the field they sit
    in answers its own 422 code; integers longer than 18 digits parse to an out-of-range value.

    Raises:
        ApiError: ``body_too_large``, ``invalid_utf8``, ``invalid_json``, ``invalid_unicode`` (a lone
            surrogate in an object key), ``duplicate_field`` (a name twice in one object, at any depth).
    """
    if len(raw) > limit:
        raise ApiError("body_too_large", f"request body exceeds {limit} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_utf8", "request body is not valid UTF-8") from None
    try:
        obj = json.loads(text, parse_int=_bounded_int, parse_constant=_CONSTANTS.__getitem__,
                         object_pairs_hook=_unique_object)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise ApiError("invalid_json", "request body is not valid JSON") from None
    _check_keys(obj)
    return obj


def _unique_object(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; ``duplicate_field`` when a name repeats (RFC 8259 §4 leaves which value
    counts to the parser: Python keeps the last, others the first, so the request would mean different things)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                clean = not has_lone_surrogate(key)
                raise ApiError("duplicate_field", f"field {key[:64]!r} appears more than once in one object",
                               key[:64] if clean else None)
            seen.add(key)
    return out


def check_keys(obj) -> None:
    """Raise ``invalid_unicode`` when a field name of ``obj`` (a decoded JSON value; nested objects two levels
    deep) holds a lone UTF-16 surrogate; :func:`parse_json` runs it on every body, a batch on each item."""
    _check_keys(obj)


def _check_keys(obj, depth: int = 0) -> None:
    if isinstance(obj, dict):
        if any(has_lone_surrogate(key) for key in obj):
            raise ApiError("invalid_unicode", "a field name contains a lone UTF-16 surrogate")
        if depth < 2:
            for v in obj.values():
                _check_keys(v, depth + 1)
    elif isinstance(obj, list) and depth < 2:
        for v in obj:
            _check_keys(v, depth + 1)


def validate(model: type[BaseModel], obj) -> BaseModel:
    """``model.model_validate(obj)`` with the one error mapping (:func:`validation_error`).

    Raises:
        ApiError: ``invalid_type`` (not an object), ``unknown_field``, ``missing_field``, ``unknown_*``.
    """
    if not isinstance(obj, dict):
        raise ApiError("invalid_type", "request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e) from None


def plan_defaults(settings: GatewaySettings) -> PlanDefaults:
    """The gateway settings the plan reads (defaults and limits)."""
    return PlanDefaults(k_default=settings.k_default, k_max=settings.k_max, max_query_chars=settings.max_query_chars,
                        default_policy=settings.default_policy, default_recall_target=settings.default_recall_target,
                        default_rho=settings.default_rho,
                        action_pair=tuple(settings.action_pair) if settings.action_pair else None,
                        hybrid_fusion=settings.hybrid_fusion, hybrid_alpha=settings.hybrid_alpha,
                        hybrid_depth=settings.hybrid_depth, default_tier=settings.default_tier,
                        tenant_field=settings.tenant_field, acl_field=settings.acl_field)


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
