"""Who is asking: the tenant and ACL groups of a search request, per ``GatewaySettings.access_policy``.

* ``none``: no policy; every document may be returned (request filters still apply).
* ``header``: a trusted proxy sets ``tenant_header`` (required) and ``groups_header`` (comma-separated).
  Only safe when clients cannot reach the gateway except through that proxy.
* ``api_key``: the search key (``Authorization: Bearer`` or ``X-API-Key``) is looked up by its sha256
  hex digest in ``principals``; an unknown key is 401, no key 401.

The policy is enforced in the plan and the stage-1 stage (:mod:`engine.stages.stage1`) before any lane ranks anything
(:func:`adawidth.hybrid.access_mask`: tenant must match, ACL must share a group, fail closed).
"""

from __future__ import annotations

import hashlib

from fastapi import Request

from adawidth.hybrid import Principal
from service.config import GatewaySettings
from service.errors import ApiError

MAX_GROUPS = 64
"""Most ACL groups read from the groups header."""


def _presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return request.headers.get("x-api-key") or None


def principal_of(request: Request, settings: GatewaySettings) -> Principal | None:
    """The request's principal, or None when no policy is configured.

    Raises:
        ApiError: ``tenant_required`` (403: header policy without a tenant header),
            ``missing_api_key`` / ``invalid_api_key`` (401: key policy without a known key).
    """
    policy = settings.access_policy
    if policy == "none":
        return None
    if policy == "header":
        tenant = (request.headers.get(settings.tenant_header) or "").strip()
        if not tenant:
            raise ApiError("tenant_required", f"this gateway serves tenants: send the {settings.tenant_header} header")
        raw = request.headers.get(settings.groups_header) or ""
        groups = tuple(dict.fromkeys(g.strip() for g in raw.split(",") if g.strip()))[:MAX_GROUPS]
        return Principal(tenant, groups)
    key = _presented_key(request)
    challenge = {"WWW-Authenticate": 'Bearer realm="search"'}
    if key is None:
        raise ApiError("missing_api_key", "send the API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                       headers=challenge)
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    entry = settings.principals.get(digest)
    if entry is None:
        raise ApiError("invalid_api_key", "the API key is not valid", headers=challenge)
    return Principal(entry["tenant"], tuple(str(g) for g in entry.get("groups", ())))
