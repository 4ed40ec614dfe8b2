"""The gateway's request and response models (the OpenAPI document is generated from them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from engine.plan import FilterValues, SearchSpec
from service import examples as ex
from service.errors import STATUS_OF_CODE, ApiError
from service.parsing import check_keys, validate


class SearchRequest(BaseModel):
    """Body of ``POST /v1/search`` and ``POST /v1/collections/{name}/search``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"query": "statins reduce cardiovascular events", "k": 10},
        {"query": "statins reduce cardiovascular events", "k": 10, "width": "auto", "recall_target": 0.999},
        {"query": "statins reduce cardiovascular events", "width": "full"},
        {"query": "statins reduce cardiovascular events", "width": "auto", "policy": "router", "rho": 0.2}]})

    query: StrictStr = Field(description="Query text; must contain a non-blank character.")
    k: StrictInt | None = Field(None, description="Results wanted, 1..k_max (default 10).")
    width: Literal["auto", "full"] | StrictInt = Field(
        "auto", description="'auto' (the policy decides per query; by default a declared recall@k against "
                            "exhaustive search), 'full' (exactly the exhaustive full-width ranking, certified by "
                            "level pruning), or a prefix width in coordinates, 1..D (the m0 shortlist rescored "
                            "at that width).")
    policy: Literal["recall", "router", "funnel"] | None = Field(
        None, description="Policy of width 'auto': 'recall' (default: per-query level-pruning confidence that "
                          "meets recall_target), 'router' (the paper's width router over an action pair at "
                          "escalation fraction rho) or 'funnel' (per-query stage-1 width, shortlist and "
                          "rescoring width). 409 policy_unavailable when the version lacks it.")
    recall_target: StrictFloat | StrictInt | None = Field(
        None, description="Policy 'recall': the recall@k against exhaustive full-width search to meet, in (0, 1] "
                          "(default: the gateway's, 0.99). 1 means exactly the exhaustive ranking.")
    rho: StrictFloat | StrictInt | None = Field(
        None, description="Policy 'router' only: target escalation fraction in [0, 1] (default: the index's).")
    mode: Literal["dense", "lexical", "hybrid"] = Field(
        "dense", description="Lane: 'dense' (adaptive width), 'lexical' (BM25) or 'hybrid' (union of both, fused).")
    filter: FilterValues | None = Field(
        None, description="Keyword filter applied before the top-k: field -> value or list of values (any of).")
    fusion: Literal["rrf", "convex"] | None = Field(
        None, description="Fusion of mode 'hybrid': 'rrf' (k = 60) or 'convex' (default: the gateway's).")
    alpha: StrictFloat | StrictInt | None = Field(
        None, description="Dense weight of the convex fusion, in [0, 1] (default: the gateway's).")
    tier: Literal["auto", "mips", "maxsim", "cross_encoder"] | None = Field(
        None, description="DART tier (Algorithm 1 of 000): 'mips' (the dense ranking alone), 'maxsim' "
                          "(late interaction over the encoder's token embeddings on the top 50), 'cross_encoder' "
                          "(the fine-tuned cross-encoder on the top 50) or 'auto' (the version's difficulty head "
                          "picks per query). Default: the gateway's (ADAWIDTH_DEFAULT_TIER, 'mips').")

    def spec(self) -> SearchSpec:
        """The request as the engine's :class:`engine.plan.SearchSpec`."""
        return SearchSpec(query=self.query, k=self.k, width=self.width, policy=self.policy,
                          recall_target=self.recall_target, rho=self.rho, mode=self.mode, filter=self.filter,
                          fusion=self.fusion, alpha=self.alpha, tier=self.tier)


class Hit(BaseModel):
    id: str = Field(description="Document id from the corpus.")
    score: float = Field(description="Higher is better: the exact full-width inner product (policies 'recall' and "
                                     "'exact'), the prefix cosine at the width used (other dense policies), the "
                                     "fused score (mode 'hybrid'), BM25 (mode 'lexical'), or the reranker's score "
                                     "(tiers 'maxsim' and 'cross_encoder').")


class Trace(BaseModel):
    policy: Literal["exact", "recall", "router", "funnel", "fixed"] | None = Field(
        None, description="How the dense lane was resolved (null in mode 'lexical'): 'exact' (width 'full'), 'recall' "
                    "(declared recall), 'router', 'funnel' or 'fixed' (an integer width).")
    width: int = Field(description="Coordinates the returned dense scores cover (D for 'exact' and 'recall').")
    escalated: bool = Field(description="Policy 'router': True when it chose the high width of its action pair.")
    router_score: float | None = Field(description="Policy 'router': the predicted NDCG@10 gain of escalating; "
                                                   "policy 'funnel': the chosen configuration's predicted top-10 "
                                                   "agreement with full width.")
    index_version: str
    mode: str = Field("dense", description="Lane that answered: dense, lexical or hybrid.")
    fusion: str | None = Field(None, description="Fusion used by mode 'hybrid' (rrf or convex).")
    allowed_documents: int | None = Field(None, description="Documents passing filter, access policy and quoted "
                                                            "phrases (null when nothing restricted the search).")
    coordinates_scored: int = Field(description="Multiply-adds of the query over the corpus: stage 1 plus "
                                                "rescoring (the level scan's every level, its seeding and its "
                                                "float32 rescoring for 'exact' and 'recall').")
    stage1_work: int = Field(0, description="Stage-1 share of coordinates_scored (documents visited × width).")
    rescoring_work: int = Field(0, description="Rescoring share of coordinates_scored (candidates × coordinates "
                                               "added).")
    stage1_width: int | None = Field(None, description="Coordinates stage 1 scanned every document at.")
    shortlist: int | None = Field(None, description="Candidates kept by stage 1 and rescored.")
    recall_target: float | None = Field(None, description="Policy 'recall': the recall@k target served.")
    confidence: float | None = Field(None, description="Policy 'recall': the level-pruning confidence z used "
                                                       "(higher is safer and costs more); null when exact.")
    certified: bool | None = Field(None, description="True when the ranking is certified to equal the exhaustive "
                                                     "full-width top-k (policy 'exact', or 'recall' at target 1).")
    alive_per_level: list[int] | None = Field(None, description="Candidates still alive entering each level of "
                                                                "the level scan ('exact', 'recall').")
    tier: Literal["mips", "maxsim", "cross_encoder"] = Field(
        "mips", description="DART tier that produced the ranking.")
    tier_predicted: Literal["mips", "maxsim", "cross_encoder"] | None = Field(
        None, description="Tier 'auto' only: the difficulty head's argmax W_t h_q. It equals 'tier' unless the "
                          "predicted tier is not available on this replica, when the nearest cheaper one serves.")
    reranked: int = Field(0, description="Candidates the tier reranked (0 for 'mips').")
    timings_seconds: dict[str, float] = Field(description="Seconds per stage (encode, rotate, stage1, route, "
                                                          "rescore, fuse, rerank) and total: this query's own "
                                                          "work: the batch's encoding, its stages and its "
                                                          "rerank (a batch's other items and a wait for a "
                                                          "rerank worker are not in it).")
    stage1_backend: str | None = Field(None, description="Stage-1 backend of the dense lane: 'levels' (certified "
                                       "level scan), 'flat' (exhaustive scan), an ANN kind (ivf, hnsw, "
                                       "ivf_panorama, hnsw_panorama, hnsw_fp16; issue 19), or faiss / milvus "
                                       "(prefix shortlist).")
    effort: int | None = Field(None, description="ANN backends: the per-query effort used (nprobe or efSearch).")
    effort_name: str | None = Field(None, description="ANN backends: 'nprobe' or 'efSearch'.")
    effort_per_query: bool | None = Field(None, description="Policy 'recall': True when a per-query model chose "
                                          "the effort (ANN backends: nprobe or efSearch from a probe search, "
                                          "engine.ann.probe; the level scan: the confidence from the first level's "
                                          "evidence), False for the target's one tuned effort (the level scan "
                                          "serves it where the model saves too little work, engine.recall).")
    probe_coordinates: int | None = Field(None, description="ANN backends: multiply-adds of the probe search "
                                          "(0 without a per-query model), included in coordinates_scored.")
    served_exact_because: str | None = Field(None, description="Set when a 'recall' request on an ANN version was "
                                             "served by the exact path instead, and why (e.g. recall_target 1.0).")
    tier_fallback_because: str | None = Field(
        None, description="Set when tier 'auto' picked a reranking tier ('tier_predicted') but every rerank worker "
                          "and queue slot was taken, so the first stage's ranking was served ('tier' mips), and why.")
    delta: dict[str, int | bool] | None = Field(
        None, description="Pending writes of the collection (issue 18; null when there are none): 'documents' in "
                          "its delta segment, 'returned' of them in these results, 'masked' when deleted or "
                          "overwritten ids of the version were filtered out (docs/LIVE_DOCUMENTS.md).")


class SearchResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": ex.SEARCH_RESPONSES})

    results: list[Hit]
    trace: Trace


class ErrorDetail(BaseModel):
    code: Literal[tuple(STATUS_OF_CODE)] = Field(description="Machine-readable, stable (docs/API.md).")  # type: ignore[valid-type]
    message: str = Field(description="Human-readable explanation; never echoes the request body.")
    field: str | None = Field(description="The request field at fault, if any.")


class ErrorBody(BaseModel):
    error: ErrorDetail


class BatchSearchRequest(BaseModel):
    """Body of ``POST /v1/collections/{name}/search/batch`` and ``POST /v1/search/batch``.

    ``queries`` holds 1..``max_batch`` search bodies (:class:`SearchRequest`, without a collection).  The
    envelope is typed here; each item is validated on its own by :meth:`items`, so one bad item is answered in
    its slot instead of failing the batch.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"queries": [{"query": "statins reduce cardiovascular events", "k": 10},
                     {"query": "vitamin D and multiple sclerosis", "k": 5, "width": "full"},
                     {"query": "gene expression in cancer cells", "width": "auto", "policy": "router", "rho": 0.2}]}]})

    queries: list[Any] = Field(description="1..max_batch search requests (the body of POST /v1/search each), "
                                           "answered in this order.")

    @classmethod
    def parse(cls, obj, max_batch: int) -> "BatchSearchRequest":
        """Type the envelope of a decoded JSON body.

        Args:
            obj: the decoded JSON body.
            max_batch: the most items allowed (settings ``max_batch``).

        Raises:
            ApiError: ``invalid_type`` (not an object, or ``queries`` not a list), ``unknown_field``,
                ``missing_field``, ``empty_batch`` (no item), ``batch_too_large`` (more than ``max_batch``).
        """
        batch = validate(cls, obj)
        if not isinstance(obj.get("queries"), list):
            raise ApiError("invalid_type", "field 'queries' must be a list of search requests", "queries")
        if not batch.queries:
            raise ApiError("empty_batch", "a batch needs at least one query", "queries")
        if len(batch.queries) > max_batch:
            raise ApiError("batch_too_large", f"a batch holds at most {max_batch} queries", "queries")
        return batch

    def items(self) -> list[SearchRequest | ApiError]:
        """Each item typed as a :class:`SearchRequest`, or the :class:`ApiError` it alone answers (the same
        code a single search with that body would get: ``invalid_type``, ``unknown_field``, ``missing_field``,
        ``invalid_unicode``, ...), in order."""
        out: list[SearchRequest | ApiError] = []
        for item in self.queries:
            try:
                check_keys(item)
                out.append(validate(SearchRequest, item))
            except ApiError as e:
                out.append(e)
        return out


class BatchItemError(BaseModel):
    """One slot of a batch answer whose query was refused: the error body a single search would get, and
    its HTTP status."""

    error: ErrorDetail
    status: int = Field(description="The HTTP status a single search with this item would have answered.")

    @classmethod
    def of(cls, exc: ApiError) -> dict:
        """The slot of ``exc`` as JSON-ready data (message and field made safe)."""
        return {**exc.body(), "status": exc.status}


class BatchSearchResponse(BaseModel):
    """Answer of a batch search: one slot per query, in request order."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"results": [
        ex.SEARCH_RESPONSES[0], {**ex.error_example("blank_query"), "status": 422}]}]})

    results: list[SearchResponse | BatchItemError] = Field(
        description="Slot i answers queries[i]: a search response, or that query's error and status.")


class CollectionInfo(BaseModel):
    """One collection this gateway serves."""

    name: str = Field(description="Collection name (the {name} of /v1/collections/{name}/search).")
    index_version: str | None = Field(None, description="Live index version (null while none is loaded).")
    documents: int | None = Field(None, description="Documents in the live version (the pending writes not "
                                                    "counted: pending_writes).")
    pending_writes: dict[str, int] | None = Field(
        None, description="Writes not yet folded into the live version, in this replica's delta segment: "
                          "{'upserts', 'deletes'} (null when this replica has no write state for the collection).")
    policies: list[str] = Field(default_factory=list, description="Policies of width 'auto' the live version serves (recall, router, "
                                            "funnel); 'exact' (width 'full') and 'fixed' (an integer width) are "
                                            "always served.")
    default_policy: str | None = Field(None, description="Policy of width 'auto' when a request names none.")
    default: bool = Field(False, description="True for the collection POST /v1/search serves.")


class CollectionsResponse(BaseModel):
    """Answer of ``GET /v1/collections``."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"collections": [
        {"name": "scifact", "index_version": ex.LIVE, "documents": 5183,
         "pending_writes": {"upserts": 2, "deletes": 0},
         "policies": ["recall", "router"], "default_policy": "recall", "default": True}]}]})

    collections: list[CollectionInfo]


def error_responses(*statuses: int, examples: dict[int, str] | None = None) -> dict:
    """OpenAPI ``responses`` entries for error statuses (with Retry-After on 429), each with an example body.

    Args:
        statuses: the HTTP statuses.
        examples: status -> the code its example shows (default: :data:`service.examples.DEFAULT_ERROR_CODE`).
    """
    out: dict = {}
    for status in statuses:
        codes = sorted(c for c, st in STATUS_OF_CODE.items() if st == status)
        out[status] = {"model": ErrorBody, "description": "Error; code one of: " + ", ".join(codes)}
        code = (examples or {}).get(status) or ex.DEFAULT_ERROR_CODE.get(status)
        if code is not None:
            out[status]["content"] = {"application/json": {"example": ex.error_example(code)}}
        if status == 429:
            out[status]["headers"] = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                                      "schema": {"type": "integer"}}}
    return out


def search_request_schema(settings) -> dict:
    """JSON schema of the search body with this gateway's limits (what the OpenAPI document publishes).

    Args:
        settings: the :class:`service.config.GatewaySettings` (k_max, max_query_chars).
    """
    schema = SearchRequest.model_json_schema()
    props = schema["properties"]
    props["query"].update(minLength=1, maxLength=settings.max_query_chars)
    props["k"]["anyOf"][0].update(minimum=1, maximum=settings.k_max)
    props["width"]["anyOf"][1].update(minimum=1)
    for name in ("rho", "alpha"):
        for part in props[name]["anyOf"][:2]:
            part.update(minimum=0, maximum=1)
    for part in props["recall_target"]["anyOf"][:2]:
        part.update(exclusiveMinimum=0, maximum=1)
    return schema


def batch_request_schema(settings) -> dict:
    """JSON schema of the batch body with this gateway's limits: ``queries`` of 1..``max_batch`` items, each a
    search body (:func:`search_request_schema`) checked per slot."""
    # an item is validated on its own and a bad one is answered in its slot (200), so the schema types the
    # envelope only: declaring the items as SearchRequest would promise a 4xx the batch never gives
    item = {"description": "A search body (SearchRequest: " + ", ".join(search_request_schema(settings)["properties"])
            + "); an invalid one is answered in its slot with its error."}
    schema = BatchSearchRequest.model_json_schema()
    schema["properties"]["queries"] = {"type": "array", "items": item, "minItems": 1, "maxItems": settings.max_batch,
                                       "title": "Queries",
                                       "description": schema["properties"]["queries"].get("description", "")}
    return schema
