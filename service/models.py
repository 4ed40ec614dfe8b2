"""The gateway's request and response models (the OpenAPI document is generated from them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from engine.plan import FilterValues, SearchSpec
from service.errors import STATUS_OF_CODE


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
        description="How the dense lane was resolved (null in mode 'lexical'): 'exact' (width 'full'), 'recall' "
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
                                                          "rescore, fuse, rerank) and total.")


class SearchResponse(BaseModel):
    results: list[Hit]
    trace: Trace


class ErrorDetail(BaseModel):
    code: Literal[tuple(STATUS_OF_CODE)] = Field(description="Machine-readable, stable (docs/API.md).")  # type: ignore[valid-type]
    message: str = Field(description="Human-readable explanation; never echoes the request body.")
    field: str | None = Field(description="The request field at fault, if any.")


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_responses(*statuses: int) -> dict:
    """OpenAPI ``responses`` entries for error statuses (with Retry-After on 429)."""
    out: dict = {}
    for status in statuses:
        codes = sorted(c for c, st in STATUS_OF_CODE.items() if st == status)
        out[status] = {"model": ErrorBody, "description": "Error; code one of: " + ", ".join(codes)}
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
