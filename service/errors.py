"""One error type for the gateway, mapped to an HTTP status and a machine-readable code in one place.

Every error body is ``{"error": {"code": str, "message": str, "field": str | null}}``.
The codes are stable and listed, with their meaning, in ``docs/API.md``
(``tests/unit/test_gateway_units.py::test_error_table_in_docs_equals_the_code_table`` checks that the table
there and this one agree).
"""

from __future__ import annotations

from collections.abc import Mapping

STATUS_OF_CODE: dict[str, int] = {
    # the body as bytes / JSON
    "invalid_utf8": 400,
    "invalid_json": 400,
    "unsupported_media_type": 415,
    "body_too_large": 413,
    "body_timeout": 408,
    "client_disconnected": 499,
    # the fields
    "query_too_long": 413,
    "blank_query": 422,
    "invalid_unicode": 422,
    "duplicate_field": 422,
    "k_out_of_range": 422,
    "width_out_of_range": 422,
    "unknown_width": 422,
    "rho_out_of_range": 422,
    "recall_target_out_of_range": 422,
    "unknown_policy": 422,
    "policy_conflict": 422,
    "policy_unavailable": 409,
    "unknown_field": 422,
    "invalid_type": 422,
    "missing_field": 422,
    "invalid_request": 422,
    # authentication
    "missing_api_key": 401,
    "invalid_api_key": 401,
    "admin_disabled": 403,
    # routing
    "not_found": 404,
    "unknown_collection": 404,
    "method_not_allowed": 405,
    # capacity and state
    "overloaded": 429,
    "reload_failed": 409,
    "not_ready": 503,
    "deadline_exceeded": 503,
    "internal_error": 500,
    # admin / version registry (issue 3)
    "invalid_version": 422,
    "unknown_version": 404,
    "no_previous": 409,
    "conflict": 409,
    "version_refused": 409,
    "gate_refused": 409,
    "registry_unavailable": 503,
    # lexical / hybrid lanes, filters, access control (issue 6)
    "unknown_mode": 422,
    "unknown_fusion": 422,
    "alpha_out_of_range": 422,
    "invalid_filter": 422,
    "unknown_filter_field": 422,
    "lexical_unavailable": 409,
    "tenant_required": 403,
    # stage 1 on an external engine (issue 10)
    "stage1_unavailable": 503,
    # batch search (issue 17)
    "batch_too_large": 413,
    "empty_batch": 422,
    # live documents (issue 18)
    "writes_disabled": 403,
    "invalid_id": 422,
    "duplicate_id": 422,
    "document_too_long": 413,
    "empty_document": 422,
    "invalid_field_value": 422,
    "degenerate_document": 422,
    "unknown_document": 404,
    "writes_unavailable": 503,
    # DART tiers (issue 5)
    "unknown_tier": 422,
    "tier_unavailable": 409,
}

MAX_ECHO_CHARS = 64
"""Longest piece of client input (a field name) an error message may repeat."""


def safe_text(value: str, limit: int | None = None) -> str:
    """``value`` made safe to put in a JSON response or a log line.

    Lone surrogates (which JSON ``"\\ud800"`` escapes decode to, and which cannot
    be encoded as UTF-8) become ``\\ud800`` text; the result is cut at ``limit``
    characters when one is given.
    """
    value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(value) > limit:
        value = value[:limit] + "…"
    return value


class ApiError(Exception):
    """An error answered to the client.

    Args:
        code: a key of :data:`STATUS_OF_CODE`.
        message: human-readable explanation (never echoes the raw body).
        field: the request field at fault, if any.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).

    Raises:
        ValueError: for a code missing from :data:`STATUS_OF_CODE`.
    """

    def __init__(self, code: str, message: str, field: str | None = None,
                 headers: Mapping[str, str] | None = None):
        if code not in STATUS_OF_CODE:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code, self.message, self.field = code, message, field
        self.headers = dict(headers or {})

    @property
    def status(self) -> int:
        """The HTTP status of :attr:`code` (:data:`STATUS_OF_CODE`)."""
        return STATUS_OF_CODE[self.code]

    def body(self) -> dict:
        """The JSON error body, message and field made safe (:func:`safe_text`)."""
        field = None if self.field is None else safe_text(self.field, MAX_ECHO_CHARS)
        return {"error": {"code": self.code, "message": safe_text(self.message), "field": field}}
