"""Typed request and response models of the gateway's HTTP API, mirroring its OpenAPI document.

Standard library only (no pydantic, no httpx): the load test and any caller can build and parse
bodies with these without the gateway's dependencies.  ``tests/integration/test_client_live.py``
checks every model against the live ``/openapi.json`` (field names, required fields, JSON types and
enums), so they cannot drift from ``service/app.py``.

Forward compatibility: a response field this client does not know yet is kept in ``extra``
instead of failing; a request field it does not know yet can be sent through ``extra``
(``Client.search(..., new_field=...)``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Union
from urllib.parse import quote

Width = Union[Literal["auto", "full"], int]
"""``"auto"`` (the router or funnel policy decides per query), ``"full"`` (exact full-width search) or a
prefix width in coordinates, 1..D."""

FilterValue = Union[str, int, bool, list[Union[str, int, bool]]]


class MalformedResponse(ValueError):
    """A 2xx body that does not have the documented shape (a required field missing, not an object)."""


def _parse(cls, data: Any, where: str):
    """Build dataclass ``cls`` from a JSON object: known fields by name, unknown ones into ``extra``."""
    if not isinstance(data, dict):
        raise MalformedResponse(f"{where}: expected a JSON object, got {type(data).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
    kwargs, extra = {}, {}
    for key, value in data.items():
        (kwargs if key in names else extra)[key] = value
    missing = [n for n, f in names.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise MalformedResponse(f"{where}: missing field(s) {', '.join(missing)}")
    if "extra" in {f.name for f in dataclasses.fields(cls)}:
        kwargs["extra"] = extra
    return cls(**kwargs)


@dataclass(frozen=True)
class SearchRequest:
    """Body of ``POST /v1/search`` and ``POST /v1/collections/{name}/search`` (one item of a batch).

    ``None`` means "not sent": the gateway applies its default (``docs/API.md``).
    """

    query: str
    """Query text; at least one visible character, at most the gateway's ``max_query_chars``."""
    k: int | None = None
    """Results wanted, 1..k_max (gateway default 10)."""
    width: Width | None = None
    """See :data:`Width` (gateway default ``"auto"``)."""
    policy: Literal["recall", "router", "funnel"] | None = None
    """Policy of ``width: "auto"`` (gateway default ``"recall"``, a declared recall@k)."""
    recall_target: float | None = None
    """Policy ``"recall"``: the recall@k against exhaustive search to meet, in (0, 1] (gateway default 0.99)."""
    rho: float | None = None
    """Policy ``"router"`` only: target escalation fraction of the width router, in [0, 1]."""
    mode: Literal["dense", "lexical", "hybrid"] | None = None
    """Lane (gateway default ``"dense"``)."""
    filter: dict[str, FilterValue] | None = None
    """Keyword filter applied before the top-k: field -> value or list of values (any of)."""
    fusion: Literal["rrf", "convex"] | None = None
    """Fusion of mode ``"hybrid"``."""
    alpha: float | None = None
    """Dense weight of the convex fusion, in [0, 1]."""
    tier: Literal["auto", "mips", "maxsim", "cross_encoder"] | None = None
    """DART tier (gateway default ``"mips"``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields this client does not model yet, sent as given."""

    def to_json(self) -> dict[str, Any]:
        """The JSON body: every field that is not None, then ``extra``."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "extra" and getattr(self, f.name) is not None}
        body.update(self.extra)
        return body

    @classmethod
    def build(cls, query: str, **fields: Any) -> "SearchRequest":
        """A request from keyword fields: known ones by name, any other into ``extra``."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "query"}
        return cls(query, **{k: v for k, v in fields.items() if k in known},
                   extra={k: v for k, v in fields.items() if k not in known})


@dataclass(frozen=True)
class Hit:
    """One result: a document id and its score (higher is better; its meaning depends on lane and tier)."""

    id: str
    score: float


@dataclass(frozen=True)
class Trace:
    """How the gateway answered one query (``docs/API.md``); work is in multiply-adds, times in seconds."""

    width: int
    """Coordinates the returned dense scores cover (384 for policies "exact" and "recall")."""
    escalated: bool
    router_score: float | None
    index_version: str
    coordinates_scored: int
    """Multiply-adds of stage 1 plus rescoring."""
    timings_seconds: dict[str, float]
    """Per stage (encode, rotate, stage1, route, rescore, fuse, rerank) and total, seconds."""
    mode: str = "dense"
    fusion: str | None = None
    allowed_documents: int | None = None
    stage1_work: int = 0
    rescoring_work: int = 0
    policy: Literal["exact", "recall", "router", "funnel", "fixed"] | None = None
    stage1_width: int | None = None
    shortlist: int | None = None
    recall_target: float | None = None
    confidence: float | None = None
    """Policy "recall": the level-pruning confidence z used (None when exact)."""
    certified: bool | None = None
    """True when the ranking is certified equal to the exhaustive full-width top-k."""
    alive_per_level: list[int] | None = None
    tier: Literal["mips", "maxsim", "cross_encoder"] = "mips"
    tier_predicted: Literal["mips", "maxsim", "cross_encoder"] | None = None
    reranked: int = 0
    stage1_backend: str | None = None
    """Stage-1 backend of the dense lane: 'levels', 'flat', 'faiss', 'milvus' or an ANN kind ('hnsw', 'ivf', ...)."""
    effort: int | None = None
    """ANN backends: the effort used (nprobe or efSearch, see ``effort_name``)."""
    effort_name: str | None = None
    effort_per_query: bool | None = None
    """Policy 'recall': True when a per-query model chose the effort (ANN: from a probe search; the level scan: the
    confidence from the first level's evidence), False for the target's one tuned effort."""
    probe_coordinates: int | None = None
    """ANN backends: multiply-adds of that probe (included in ``coordinates_scored``)."""
    served_exact_because: str | None = None
    """Set when a 'recall' request on an ANN version was served by the exact path, and why."""
    tier_fallback_because: str | None = None
    """Set when tier 'auto' picked a reranking tier but every rerank worker was taken, so mips served, and why."""
    delta: dict[str, int | bool] | None = None
    """Pending writes of the collection (null when none): documents in its delta segment, returned here, masked."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Trace fields this client does not model yet."""


@dataclass(frozen=True)
class SearchResponse:
    """Answer of one search: hits best first, and the trace."""

    results: list[Hit]
    trace: Trace
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        """Document ids, best first."""
        return [h.id for h in self.results]

    @classmethod
    def from_json(cls, data: Any) -> "SearchResponse":
        """Parse a 200 body.  Raises :class:`MalformedResponse`."""
        r = _parse(cls, data, "search response")
        if not isinstance(r.results, list):
            raise MalformedResponse("search response: results is not a list")
        return dataclasses.replace(r, results=[_parse(Hit, h, "hit") for h in r.results],
                                   trace=_parse(Trace, r.trace, "trace"))


@dataclass(frozen=True)
class ErrorDetail:
    """``error`` of every error body: a stable machine-readable ``code`` (docs/API.md), a message and the
    request field at fault (or None)."""

    code: str
    message: str
    field: str | None

    @classmethod
    def from_json(cls, data: Any) -> "ErrorDetail":
        return _parse(cls, data, "error")


@dataclass(frozen=True)
class BatchItemError:
    """A slot of a batch answer whose query was refused: the error a single search with that query would get
    (``error``) and its HTTP status (``status``, e.g. 422 for ``blank_query``, 413 for ``query_too_long``).
    ``code``, ``message`` and ``field`` read through to ``error``."""

    error: ErrorDetail
    status: int

    @property
    def code(self) -> str:
        return self.error.code

    @property
    def message(self) -> str:
        return self.error.message

    @property
    def field(self) -> str | None:
        return self.error.field

    @classmethod
    def from_json(cls, data: Any) -> "BatchItemError":
        r = _parse(cls, data, "batch slot error")
        if not isinstance(r.status, int) or isinstance(r.status, bool):
            raise MalformedResponse("batch slot error: status is not an integer")
        return dataclasses.replace(r, error=ErrorDetail.from_json(r.error))


def parse_batch_item(item: Any) -> SearchResponse | BatchItemError:
    """One slot of a batch answer: ``{"results": ..., "trace": ...}`` or ``{"error": {...}, "status": int}``."""
    if isinstance(item, dict) and "error" in item:
        return BatchItemError.from_json(item)
    return SearchResponse.from_json(item)


def search_path(collection: str | None = None) -> str:
    """Path of one search: ``/v1/search`` (the gateway's default collection) or
    ``/v1/collections/{name}/search``."""
    return "/v1/search" if collection is None else f"/v1/collections/{quote(collection, safe='')}/search"


def batch_path(collection: str) -> str:
    """Path of a batch search: ``/v1/collections/{name}/search/batch``."""
    return f"/v1/collections/{quote(collection, safe='')}/search/batch"


def batch_request_json(requests: list[SearchRequest]) -> dict[str, Any]:
    """Body of ``POST /v1/collections/{name}/search/batch``: ``{"queries": [search body, ...]}``."""
    return {"queries": [r.to_json() for r in requests]}


def parse_batch_response(data: Any, expected: int) -> list[SearchResponse | BatchItemError]:
    """The batch answer ``{"results": [slot, ...]}``, in request order.

    Raises:
        MalformedResponse: not that shape, or not ``expected`` slots.
    """
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise MalformedResponse("batch response: expected {'results': [...]}")
    if len(data["results"]) != expected:
        raise MalformedResponse(f"batch response: {len(data['results'])} slots for {expected} queries")
    return [parse_batch_item(item) for item in data["results"]]


@dataclass(frozen=True)
class CollectionInfo:
    """One entry of ``GET /v1/collections``: name, live version, documents and the policies it serves."""

    name: str
    index_version: str | None = None
    """Live index version (None while none is loaded)."""
    documents: int | None = None
    """Documents in the live version (without the pending writes)."""
    pending_writes: dict[str, int] | None = None
    """Writes not yet folded into the live version: ``{"upserts", "deletes"}`` (None: no write state)."""
    policies: list[str] = field(default_factory=list)
    """Policies of ``width: "auto"`` the live version serves (``recall``, ``router``, ``funnel``)."""
    default_policy: str | None = None
    """Policy of ``width: "auto"`` when a request names none."""
    default: bool = False
    """True for the collection ``POST /v1/search`` serves."""
    extra: dict[str, Any] = field(default_factory=dict)


def parse_collections(data: Any) -> list[CollectionInfo]:
    """``{"collections": [...]}`` -> entries.  Raises :class:`MalformedResponse`."""
    if not isinstance(data, dict) or not isinstance(data.get("collections"), list):
        raise MalformedResponse("collections response: expected {'collections': [...]}")
    return [_parse(CollectionInfo, c, "collection") for c in data["collections"]]


@dataclass(frozen=True)
class ReloadResult:
    """Answer of ``POST /admin/reload``: ``status`` is "reloaded" or "unchanged"."""

    status: Literal["reloaded", "unchanged"]
    index_version: str | None
    previous_version: str | None
    collection: str | None = None
    """The collection reconciled, when the request named one."""
    collections: dict[str, Any] | None = None
    """Every collection reconciled, by name, when the gateway serves several and the request named none."""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> "ReloadResult":
        return _parse(cls, data, "reload response")


MODELS_BY_SCHEMA = {"SearchResponse": SearchResponse, "Hit": Hit, "Trace": Trace, "ErrorDetail": ErrorDetail,
                    "BatchItemError": BatchItemError,
                    "ReloadResponse": ReloadResult, "CollectionInfo": CollectionInfo}
"""OpenAPI component name -> the model mirroring it (the request body is checked as :class:`SearchRequest`)."""
