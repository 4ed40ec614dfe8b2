"""API-key authentication as reusable FastAPI dependencies.

Clients send ``Authorization: Bearer <key>`` (or ``X-API-Key: <key>``).  Keys are compared in constant
time (:func:`hmac.compare_digest` over SHA-256 digests, so neither the content
nor the length of the configured key leaks through timing).

* :func:`require_admin` guards every ``/admin/*`` route (reload here; promote
  and rollback reuse it: ``APIRouter(dependencies=[Depends(require_admin)])``
  or ``@router.post(..., dependencies=[Depends(require_admin)])``).  With no
  ``admin_api_key`` configured the admin routes answer 403 ``admin_disabled``.
* :func:`require_search_key` guards ``POST /v1/search`` only when
  ``search_api_key`` is configured.

Both read the settings from ``request.app.state.gw.settings`` (the
:class:`service.app.GatewayState` of the app), so they need no globals.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from service.errors import ApiError

bearer_scheme = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                           description="API key as a bearer token: `Authorization: Bearer <key>`.")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def key_matches(presented: str, expected: SecretStr) -> bool:
    """Constant-time comparison of a presented key with the configured one."""
    return hmac.compare_digest(_digest(presented), _digest(expected.get_secret_value()))


def _presented(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    if credentials is not None and credentials.credentials:
        return credentials.credentials
    return request.headers.get("x-api-key") or None


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None, expected: SecretStr,
           realm: str) -> None:
    challenge = {"WWW-Authenticate": f'Bearer realm="{realm}"'}
    presented = _presented(request, credentials)
    if presented is None:
        raise ApiError("missing_api_key", "send the API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                       headers=challenge)
    if not key_matches(presented, expected):
        raise ApiError("invalid_api_key", "the API key is not valid", headers=challenge)


def _configured(key: SecretStr | None) -> bool:
    return key is not None and bool(key.get_secret_value())


def _require(request: Request, credentials, kind: str, disabled_code: str, disabled_message: str) -> None:
    """The request carries the ``<kind>_api_key``; 403 ``disabled_code`` when none is configured."""
    key = getattr(request.app.state.gw.settings, f"{kind}_api_key")
    if not _configured(key):
        raise ApiError(disabled_code, disabled_message)
    _check(request, credentials, key, kind)


async def require_admin(request: Request,
                        credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> None:
    """Dependency: the request carries the admin key; admin is disabled (403) when no key is configured.

    Raises:
        ApiError: ``admin_disabled`` (403), ``missing_api_key`` or ``invalid_api_key`` (401).
    """
    _require(request, credentials, "admin", "admin_disabled",
             "admin endpoints are disabled: no admin_api_key is configured")


async def require_search_key(request: Request,
                             credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> None:
    """Dependency: when ``search_api_key`` is configured, the request carries it.

    Raises:
        ApiError: ``missing_api_key`` or ``invalid_api_key`` (401).
    """
    key = request.app.state.gw.settings.search_api_key
    if _configured(key):
        _check(request, credentials, key, "search")


async def require_write_key(request: Request,
                            credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> None:
    """Dependency of the document write routes: the request carries ``write_api_key``; the routes are disabled
    (403) when no key is configured.

    Raises:
        ApiError: ``writes_disabled`` (403), ``missing_api_key`` or ``invalid_api_key`` (401).
    """
    _require(request, credentials, "write", "writes_disabled",
             "document writes are disabled: no write_api_key is configured")
