"""Admin endpoints under ``/admin``, all behind :func:`service.auth.require_admin`.

``POST /admin/reload`` re-reads the collection's LIVE pointer and serves that
version: it is verified and loaded first, then made live by swapping one
reference, so requests in flight finish on the version they started with and
a failed load leaves the current version serving.  Promote and rollback
(issue 3) join this router and inherit its authentication.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.auth import require_admin
from service.errors import ApiError

if TYPE_CHECKING:
    from service.app import GatewayState

log = logging.getLogger("service.admin")


class ReloadResponse(BaseModel):
    status: Literal["reloaded", "unchanged"] = Field(
        description="'unchanged' when LIVE already named the version served.")
    index_version: str = Field(description="The version served from now on.")
    previous_version: str | None = Field(description="The version served before (None when none was).")


def build_admin_router(state: "GatewayState") -> APIRouter:
    """The ``/admin`` router of one app; every route requires the admin key."""
    from service.app import error_responses

    router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)],
                       responses=error_responses(401, 403))

    @router.post("/reload", response_model=ReloadResponse, responses=error_responses(409))
    async def reload():
        """Re-read the LIVE pointer and serve that version (atomic swap; the current one stays on failure)."""
        try:
            previous, current = await run_in_threadpool(state.reload)
        except Exception as e:  # any failure to load leaves the current version live
            reason = getattr(e, "code", type(e).__name__)
            log.error("reload failed (%s): %s", reason, e)
            raise ApiError("reload_failed", f"LIVE could not be loaded ({reason}): {e}; "
                                            f"still serving {previous_or_none(state)}") from None
        return {"status": "unchanged" if previous == current else "reloaded",
                "index_version": current, "previous_version": previous}

    return router


def previous_or_none(state: "GatewayState") -> str | None:
    return state.live.version if state.live is not None else None
