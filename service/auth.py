"""API-key guard of the gateway's ``/admin`` endpoints.

``require_admin(settings)`` returns a FastAPI dependency.  With no
``admin_api_key`` configured the admin endpoints are disabled and answer 404
``not_found`` (they do not advertise themselves); otherwise the request must send
the key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``, compared in
constant time (:func:`hmac.compare_digest`); a missing or wrong key answers 403
``forbidden``.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from service.errors import ApiError


def presented_key(request: Request) -> str | None:
    """The key a request presents (Bearer token first, then ``X-API-Key``), or None."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def require_admin(settings):
    """A dependency that admits a request only with the configured admin key.

    Raises (in the dependency):
        ApiError: ``not_found`` (404) when no key is configured, ``forbidden`` (403) for a missing or wrong key.
    """
    def dependency(request: Request) -> None:
        key = settings.admin_api_key
        if key is None or not key.get_secret_value():
            raise ApiError("not_found", "Not Found")
        given = presented_key(request)
        if given is None or not hmac.compare_digest(given.encode("utf-8"), key.get_secret_value().encode("utf-8")):
            raise ApiError("forbidden", "a valid admin API key is required")

    return dependency
