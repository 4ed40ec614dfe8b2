"""Admin endpoints of the version registry: publish, promote, rollback, and the registry's state.

All require the admin API key (:mod:`service.auth`).  They act on the replica's
collection through the same registry the replicas follow, so a promotion made on
one replica reaches every replica (pub/sub with Redis, the state-file poll with
the file registry); the replica that served the call reconciles at once.

=========================  ====================================================================
``GET  /admin/registry``   state, last 50 history events, replica reports
``POST /admin/publish``    ``{"version": str}``: verify the version's files, register it as a candidate
``POST /admin/promote``    ``{"version": str | null, "skip_gate": bool}``: load and warm it here,
                           run the collection's quality gate (if any), then make it live
``POST /admin/rollback``   ``{"reason": str | null}``: swap live and previous
``POST /admin/reload``     ``{"collection": str | null}`` (body optional): reconcile that collection with
                           the registry now (load, verify, warm, switch); no collection: every
                           collection served, answered for the default one (plus ``collections``
                           when the gateway serves several)
=========================  ====================================================================

Publish, promote, rollback and the registry view act on the default collection (``settings.collection``);
the trainer CLI (``python -m trainer promote <collection> ...``) acts on any collection's registry entry, and
each collection's follower picks its own change up.

Errors: 401 ``missing_api_key`` / ``invalid_api_key``, 403 ``admin_disabled`` (no key configured),
404 ``unknown_version`` / ``unknown_collection`` (reload of a collection not served), 409 ``reload_failed`` / 
``no_previous`` / ``version_refused`` / ``gate_refused`` / ``conflict``, 422 ``invalid_version``, and for a
malformed body 422 ``missing_field`` / ``unknown_field`` / ``invalid_type`` naming the field
(:func:`service.parsing.route_validation_error`), 503 ``registry_unavailable`` / ``not_ready``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from engine.gate import run_gate
from engine.registry.state import RegistryError, check_version_name
from engine.version.manifest import Expect, IndexVersionError, verify
from service import examples as ex
from service.auth import require_admin
from service.errors import ApiError
from service.models import error_responses
from service.parsing import admin_body
from service.version_manager import VersionRefused

log = logging.getLogger("service.admin")


class PublishBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [ex.PUBLISH_BODY]})
    version: str = Field(description="Version directory name under <index_root>/<collection>/.")


class PromoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": ex.PROMOTE_BODIES})
    version: str | None = Field(None, description="Candidate to promote (default: the newest candidate).")
    skip_gate: bool = Field(False, description="Promote without the quality gate (recorded in the history).")


class ReloadBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": ex.RELOAD_BODIES})
    collection: str | None = Field(None, max_length=128, description="Collection to reconcile (default: every "
                                                                     "collection served).")


class ReloadEntry(BaseModel):
    status: Literal["reloaded", "unchanged"] = Field(description="'unchanged' when the registry's live version "
                                                                 "was already served.")
    index_version: str | None = Field(description="The version served from now on.")
    previous_version: str | None = Field(description="The version served before (None when none was).")


class ReloadResponse(ReloadEntry):
    model_config = ConfigDict(json_schema_extra={"examples": ex.RELOAD_RESPONSES})

    collection: str | None = Field(None, description="The collection reconciled, when the request named one.")
    collections: dict[str, ReloadEntry] | None = Field(
        None, description="Every collection reconciled, by name, when the gateway serves several and the request "
                          "named none (the top-level fields are the default collection's).")


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [ex.ROLLBACK_BODY]})
    reason: str | None = Field(None, max_length=500, description="Why (recorded in the history).")


def _ok(description: str, example: dict) -> dict:
    """The OpenAPI entry of a 200 answered as a plain dict: its description and example."""
    return {200: {"description": description, "content": {"application/json": {"example": example}}}}


def _api(e: RegistryError) -> ApiError:
    """The registry's refusal as the gateway's error (its code already in the body's ``code``: not repeated in the
    message)."""
    return ApiError(e.code, getattr(e, "message", str(e)))


def build_admin_router(state) -> APIRouter:
    """Routes bound to a :class:`service.app.GatewayState` (its registry, versions, follower and encoder)."""
    router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin), Depends(admin_body)],
                       responses=error_responses(400, 401, 403, 413, 415))
    s = state.settings

    async def reload_one(name: str) -> dict:
        try:
            previous, current = await run_in_threadpool(state.reload, name)
        except Exception as e:  # noqa: BLE001 - any failure to load leaves the current version live
            reason = getattr(e, "code", type(e).__name__)
            log.error("reload of %s failed (%s): %s", name, reason, e)
            live = state.collection(name).live
            still = live.version if live is not None else None
            where = "" if name == s.collection else f" of collection {name!r}"
            raise ApiError("reload_failed", f"the registry's live version{where} could not be served ({reason}); "
                                            f"still serving {still}") from None
        return {"status": "unchanged" if previous == current else "reloaded",
                "index_version": current, "previous_version": previous}

    @router.post("/reload", response_model=ReloadResponse, response_model_exclude_unset=True,
                 responses=error_responses(404, 409, 422, 503, examples={
                     404: "unknown_collection", 409: "reload_failed", 422: "unknown_field"}))
    async def reload(body: ReloadBody | None = None):
        """Reconcile one collection (``collection``) or every collection served with the registry now; on any
        failure that collection's current version stays live (the others are still reconciled)."""
        if body is not None and body.collection is not None:
            state.collection(body.collection)  # 404 unknown_collection before any work
            return {**await reload_one(body.collection), "collection": body.collection}
        entries, failures = {}, []
        for name in state.collections:
            try:
                entries[name] = await reload_one(name)
            except ApiError as e:
                failures.append(e)
        if failures:
            first = failures[0]
            raise ApiError(first.code, "; ".join(e.message for e in failures))
        out = dict(entries[s.collection])
        if len(entries) > 1:
            out["collections"] = entries
        return out

    def need_registry():
        if state.registry is None or state.follower is None:  # the default collection follows none
            raise ApiError("not_ready", "this replica does not follow a registry (pinned version or not loaded)")
        return state.registry

    @router.get("/registry", responses={**_ok("The registry state, its last 50 history events and the replicas' "
                                                  "reports.", ex.REGISTRY),
                                           **error_responses(503, examples={503: "registry_unavailable"})})
    async def registry_state():
        """The registry's view of this collection, its history and the replicas' reports."""
        reg = need_registry()
        try:
            st, hist, reps = await run_in_threadpool(
                lambda: (reg.get(s.collection), reg.history(s.collection, 50), reg.replicas(s.collection)))
        except RegistryError as e:
            raise _api(e) from None
        return {"kind": reg.kind, "state": st.as_dict(), "history": hist, "replicas": reps}

    @router.post("/publish", responses={**_ok("The registry state, the version now a candidate.",
                                              {"state": ex.STATE_PUBLISHED}),
                                          **error_responses(404, 409, 422, 503, examples={
                                              404: "unknown_version", 409: "version_refused",
                                              422: "invalid_version", 503: "registry_unavailable"})})
    async def publish(body: PublishBody):
        """Verify a built version's files and register it as a candidate."""
        reg = need_registry()
        try:
            check_version_name(body.version)
        except RegistryError as e:
            raise _api(e) from None
        path = s.index_root / s.collection / body.version

        def run():
            try:
                verify(path, Expect.of_encoder(state.encoder, collection=s.collection, version=body.version))
            except IndexVersionError as e:
                if e.code == "missing" and not path.is_dir():
                    raise ApiError("unknown_version", f"no version {body.version!r} in {s.collection!r}") from None
                raise ApiError("version_refused", str(e)) from None
            return reg.publish(s.collection, body.version, actor="admin-api")

        try:
            st = await run_in_threadpool(run)
        except RegistryError as e:
            raise _api(e) from None
        return {"state": st.as_dict()}

    @router.post("/promote", responses={**_ok("The registry state, the version now live, and the quality gate's "
                                              "report (null when live already, {\"skipped\": true} with skip_gate).",
                                              {"state": ex.STATE_PROMOTED, "gate": ex.GATE}),
                                          **error_responses(404, 409, 422, 503, examples={
                                              404: "unknown_version", 409: "gate_refused",
                                              422: "invalid_version", 503: "registry_unavailable"})})
    async def promote(body: PromoteBody):
        """Load and warm the candidate on this replica, run the quality gate, make it live."""
        reg = need_registry()

        def run():
            st = reg.get(s.collection)
            version = body.version or (st.candidates[-1] if st.candidates else None)
            if version is None:
                raise RegistryError("unknown_version", f"{s.collection!r} has no candidate to promote")
            check_version_name(version)
            if version == st.live:
                return st, None
            if version not in st.candidates:
                raise RegistryError("unknown_version", f"{version!r} is not a candidate of {s.collection!r}")
            try:
                cand = state.versions.ensure_loaded(version)
            except VersionRefused as e:
                raise ApiError("version_refused", str(e)) from None
            gate = {"skipped": True} if body.skip_gate else None
            live = state.versions.live
            if not body.skip_gate and live is not None:
                try:
                    gate = run_gate(s.index_root / s.collection, live, cand, state.encoder)
                except (ValueError, OSError) as e:
                    raise ApiError("gate_refused", f"quality gate misconfigured: {e}") from None
                if gate is not None and not gate["passed"]:
                    reg.record(s.collection, {"action": "refuse", "version": version, "reason": gate["reason"],
                                              "gate": gate}, actor="admin-api")
                    if state.cutover_metrics is not None:
                        state.cutover_metrics.refused.labels(s.collection, "quality_gate").inc()
                    log.warning("promotion of %s/%s refused: %s", s.collection, version, gate["reason"])
                    raise ApiError("gate_refused", gate["reason"])
            st = reg.promote(s.collection, version, gate=gate, actor="admin-api")
            with contextlib.suppress(RegistryError):  # the follower catches up on its own
                state.follower.reconcile()
            return st, gate

        try:
            st, gate = await run_in_threadpool(run)
        except RegistryError as e:
            raise _api(e) from None
        return {"state": st.as_dict(), "gate": gate}

    @router.post("/rollback", responses={**_ok("The registry state, live and previous swapped.",
                                               {"state": ex.STATE_ROLLED_BACK}),
                                           **error_responses(409, 422, 503, examples={
                                               409: "no_previous", 422: "unknown_field",
                                               503: "registry_unavailable"})})
    async def rollback(body: RollbackBody | None = None):
        """Swap live and previous; every replica follows."""
        reg = need_registry()

        def run():
            st = reg.rollback(s.collection, reason=body.reason if body else None, actor="admin-api")
            with contextlib.suppress(RegistryError):
                state.follower.reconcile()
            return st

        try:
            st = await run_in_threadpool(run)
        except RegistryError as e:
            raise _api(e) from None
        return {"state": st.as_dict()}

    return router
