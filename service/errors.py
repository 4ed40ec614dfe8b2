"""One error type for the gateway, mapped to an HTTP status and a machine-readable code in one place.

Every error body is ``{"error": {"code": str, "message": str, "field": str | null}}``.
The codes are stable and listed in ``docs/API.md``.
"""

from __future__ import annotations

STATUS_OF_CODE: dict[str, int] = {
    "invalid_utf8": 400,
    "invalid_json": 400,
    "unsupported_media_type": 415,
    "body_too_large": 413,
    "query_too_long": 413,
    "blank_query": 422,
    "k_out_of_range": 422,
    "width_out_of_range": 422,
    "unknown_width": 422,
    "rho_out_of_range": 422,
    "unknown_field": 422,
    "invalid_type": 422,
    "missing_field": 422,
    "invalid_request": 422,
    "not_found": 404,
    "method_not_allowed": 405,
    "not_ready": 503,
    # admin / version registry (issue 3)
    "forbidden": 403,
    "invalid_version": 422,
    "unknown_version": 404,
    "no_previous": 409,
    "conflict": 409,
    "version_refused": 409,
    "gate_refused": 409,
    "registry_unavailable": 503,
}


class ApiError(Exception):
    """An error answered to the client.

    Args:
        code: a key of :data:`STATUS_OF_CODE`.
        message: human-readable explanation (never echoes the raw body).
        field: the request field at fault, if any.
    """

    def __init__(self, code: str, message: str, field: str | None = None):
        if code not in STATUS_OF_CODE:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code, self.message, self.field = code, message, field

    @property
    def status(self) -> int:
        return STATUS_OF_CODE[self.code]

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}
