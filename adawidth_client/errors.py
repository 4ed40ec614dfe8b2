"""Errors raised by the client; every one is a :class:`ClientError`."""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Any


class ClientError(Exception):
    """Base class of the client's errors."""


class ApiError(ClientError):
    """The gateway answered an error (after any retries).

    Attributes:
        status: HTTP status (e.g. 422, 429, 503).
        code: the gateway's machine-readable code (``docs/API.md``), e.g. ``"k_out_of_range"``; for a body
            that is not the gateway's error shape (a proxy's page), ``"http_<status>"``.
        message: the gateway's human-readable message.
        field: the request field at fault, or None.
        retry_after_s: the ``Retry-After`` header in seconds, or None.
        attempts: requests made, retries included.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None, *,
                 retry_after_s: float | None = None, attempts: int = 1):
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field
        self.retry_after_s, self.attempts = retry_after_s, attempts

    @classmethod
    def from_parts(cls, status: int, body: bytes | str, headers: Any = None, *, attempts: int = 1) -> "ApiError":
        """Build from an HTTP status, the raw body and the headers (a mapping with ``get``)."""
        retry_after = retry_after_seconds(headers.get("retry-after") if headers is not None else None)
        try:
            err = json.loads(body)["error"]
            return cls(status, str(err["code"]), str(err.get("message", "")), err.get("field"),
                       retry_after_s=retry_after, attempts=attempts)
        except (ValueError, KeyError, TypeError):
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
            return cls(status, f"http_{status}", text[:200], None, retry_after_s=retry_after, attempts=attempts)


class TransportError(ClientError):
    """No HTTP answer (connection refused or reset, timeout) after any retries; ``attempts`` requests made."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(message)
        self.attempts = attempts


class NotReadyError(ClientError, TimeoutError):
    """:meth:`Client.wait_ready` ran out of time; ``last`` describes the last answer (status and body, or the
    connection error)."""

    def __init__(self, message: str, last: str | None = None):
        super().__init__(message)
        self.last = last


class ServerExited(ClientError):
    """:meth:`Client.wait_ready` stopped because its ``alive`` callback said the server is gone."""


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds (``"2"``, also ``"0.5"``) or an HTTP date (relative to now);
    None when absent or unreadable.  Never negative."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
