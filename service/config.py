"""Typed configuration of the gateway; every field is also an env var ``ADAWIDTH_<NAME>``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.home import with_home_defaults
from engine.index import LEVEL_SCAN_MIN_DOCS
from engine.registry.state import COLLECTION_NAME
from engine.stage1 import Stage1Provider

MIN_SECRET_CHARS = 16
"""Shortest API key accepted outside local mode."""

PLACEHOLDER_SECRETS = frozenset({
    "changeme", "changeit", "secret", "password", "passwd", "admin", "apikey", "key", "token", "test", "testing",
    "default", "example", "placeholder", "dev", "development", "local", "letmein", "qwerty", "root", "todo",
    "xxx", "none", "null", "1234", "12345678", "0000",
})
"""Known placeholders (compared after lower-casing and removing non-alphanumerics)."""

_PLACEHOLDER_PARTS = ("changeme", "changeit", "placeholder", "example", "yourkey", "yoursecret", "insert", "replace")


def placeholder_reason(secret: str) -> str | None:
    """Why ``secret`` looks like a placeholder, or None when it does not.

    Refused: empty, shorter than :data:`MIN_SECRET_CHARS`, a known placeholder
    (after lower-casing and dropping non-alphanumerics, possibly repeated, e.g.
    ``secretsecretsecret``), text containing a placeholder word, or fewer than
    five distinct characters.
    """
    if not secret:
        return "is empty"
    if len(secret) < MIN_SECRET_CHARS:
        return f"is shorter than {MIN_SECRET_CHARS} characters"
    norm = "".join(c for c in secret.lower() if c.isalnum())
    for word in PLACEHOLDER_SECRETS:
        if norm and norm == word * (len(norm) // len(word)) and len(norm) % len(word) == 0:
            return "is a known placeholder"
    if any(part in norm for part in _PLACEHOLDER_PARTS):
        return "contains a placeholder word"
    if len(set(secret)) < 5:
        return "has fewer than 5 distinct characters"
    return None


class GatewaySettings(BaseSettings):
    """Built once in ``service.__main__`` (or by a test) and injected into :func:`service.app.create_app`.

    Raises:
        pydantic.ValidationError: at construction, for out-of-range values and,
            outside ``mode="local"``, for placeholder API keys or one key used
            for both search and admin.
    """

    model_config = SettingsConfigDict(env_prefix="ADAWIDTH_", extra="ignore")

    home: Path = Field(Path("var"), description="Working folder (indexes and models live under it by default).")
    index_root: Path | None = Field(None, description="Root of index versions (default <home>/indexes).")
    collection: str = Field("scifact", description="Default collection: the one POST /v1/search, "
                                                   "POST /v1/search/batch and /admin/* act on (it must be one of "
                                                   "`collections`).")
    collections: Annotated[tuple[str, ...] | None, NoDecode] = Field(
        None, description="Collections served, comma-separated (ADAWIDTH_COLLECTIONS=scifact,nfcorpus); each "
                          "follows its own registry entry (promote and roll back one without touching another). "
                          "Default: just `collection`.")
    version: str | None = Field(None, description="Version of the default collection to serve (pinned: that "
                                                  "collection follows no registry; the others still do); default: "
                                                  "the collection's registry live version (or LIVE pointer).")
    encoder_dir: Path | None = Field(None, description="ONNX encoder export (default <home>/models/minilm-onnx).")
    encoder_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads; 0 = ONNX Runtime's default.")
    level_threads: int = Field(0, ge=0, description="Threads of one query's level scan (width 'full', policy "
                                                   "'recall'); 0 = every core. The kernel keeps at least 32,768 "
                                                   "documents a thread, so small corpora scan on one. A declared "
                                                   "recall is served from the version's calibration at the largest "
                                                   "thread count it holds up to this (trainer build "
                                                   "--calibration-threads).")
    level_scan_min_docs: int = Field(LEVEL_SCAN_MIN_DOCS, ge=0, description="Documents from which width 'full' "
                                     "is served by the certified level scan; smaller versions answer it with one "
                                     "flat scan (the same exact answer, faster there). 0 = always the level scan.")
    faiss_threads: int = Field(1, ge=1, description="OpenMP threads for faiss; one is fastest for single queries.")
    prefer_gpu: bool = Field(True, description="Use CUDA for the encoder when onnxruntime-gpu and a GPU are present.")
    default_tier: Literal["mips", "auto", "maxsim", "cross_encoder"] = Field(
        "mips", description="DART tier of requests that give none: 'mips' (tiered routing off, the default), "
                            "'auto' (the version's difficulty head routes), or a fixed reranking tier.")
    cross_encoder_dir: Path | None = Field(
        None, description="Cross-encoder export of tier 'cross_encoder' (default <home>/models/minilm-cross-encoder; "
                          "absent: that tier answers 409 tier_unavailable).")
    maxsim_cache_documents: int = Field(2048, ge=0, description="Documents whose token matrices tier 'maxsim' keeps "
                                                                "in memory (about 192 KiB each at 256 tokens).")
    k_max: int = Field(1000, ge=1, description="Largest k a request may ask for.")
    k_default: int = Field(10, ge=1, description="k when a request does not give one.")
    default_policy: Literal["recall", "router", "funnel"] = Field(
        "recall", description="Policy of width 'auto' when a request names none: 'recall' (a declared recall@k "
                              "against exhaustive search), 'router' or 'funnel'. A version that cannot serve it "
                              "answers with its own default policy (the trace says which).")
    default_recall_target: float = Field(0.99, gt=0.0, le=1.0,
                                         description="recall@k target of policy 'recall' when a request gives none.")
    default_rho: float | None = Field(None, ge=0.0, le=1.0,
                                      description="Escalation fraction of policy 'router' when a request gives none "
                                                  "(default: the manifest's). Never changes the policy.")
    action_pair: tuple[int, int] | None = Field(None, description="Router action pair (l, h) (default: the manifest's).")
    max_query_chars: int = Field(20_000, ge=1,
                                 description="Longest query text accepted, in characters (413 query_too_long above); "
                                             "accepted text is truncated at the manifest's encoder max_tokens.")
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest request body accepted, in bytes (413 above).")
    online_cus_sample_rate: float = Field(0.05, ge=0.0, le=1.0,
                                          description="Fraction of served queries whose top-1 is compared with the "
                                                      "full-width top-1 off the request path (online CUS).")
    online_cus_queue_size: int = Field(1000, ge=1, description="Bound of the online-CUS sample queue; "
                                                               "samples beyond it are dropped and counted.")
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("redis_url", "ADAWIDTH_REDIS_URL", "REDIS_URL"),
        description="Redis URL of the version registry (env ADAWIDTH_REDIS_URL or REDIS_URL); unset: the file "
                    "registry on the index volume.")
    registry_poll_s: float = Field(1.0, gt=0, description="Seconds between reconciles with the registry when no "
                                   "change notification arrives (pub/sub with Redis wakes replicas at once).")
    registry_backoff_max_s: float = Field(5.0, gt=0, description="Longest wait between reconnect attempts while the "
                                          "registry is unreachable, in seconds (doubling from 0.2 s).")
    replica_id: str | None = Field(None, description="This replica's id in the registry (default <hostname>:<port>).")
    canary_queries: tuple[str, ...] = Field(
        ("what causes inflammation", "effect of vitamin d on bone density", "gene expression in cancer cells"),
        description="Queries run through the full path at every width policy before a new version counts as warm.")
    stage1_backend: Literal["faiss", "milvus"] = Field(
        "faiss", description="Where stage 1 runs: 'faiss' in process (from each version's stage1.faiss) or "
                             "'milvus' (each version's collection, written by the trainer; docs/SCALING.md).")
    milvus_uri: str | None = Field(
        None, description="Milvus of the 'milvus' backend: http://host:19530 (Milvus standalone, a cluster's proxy, "
                          "or `python -m milvus_lite server`), or a Milvus Lite path ending in .db opened in process "
                          "(one process at a time; default <home>/milvus.db).")
    milvus_token: SecretStr | None = Field(None, description="Milvus credentials ('user:password' or an API key).")
    milvus_prefix: str = Field("adawidth", description="Prefix of the Milvus collection names "
                                                       "(<prefix>_<collection>_<version>).")
    milvus_timeout_s: float = Field(2.0, gt=0, description="Longest wait for one Milvus call of a search, in "
                                                           "seconds (503 stage1_unavailable beyond it).")
    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port.")

    # overload
    max_concurrent_searches: int = Field(
        4, ge=1, description="Searches encoded and scored at once (worker threads), in requests.")
    max_queued_searches: int = Field(
        32, ge=0, description="Admitted searches waiting for a worker, in requests; beyond it 429 overloaded.")
    search_deadline_s: float = Field(
        10.0, gt=0.0, description="Per-request deadline of a search from its arrival, in seconds "
                                  "(503 deadline_exceeded when reached, queue wait included).")
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with 429 overloaded, in seconds.")
    write_body_timeout_s: float = Field(
        30.0, gt=0, le=600, description="Longest wait for the body of a write (PUT documents, delete), in seconds "
                                        "from the request's start; beyond it 408 body_timeout, so a client that "
                                        "stalls mid-body does not hold its connection.")
    max_concurrent_reranks: int = Field(
        1, ge=0, description="Requests with a reranking tier ('maxsim', 'cross_encoder') running at once, in "
                             "requests, on workers of their own, so they never hold the ordinary searches' "
                             "workers or queue; 0 refuses those tiers (409 tier_unavailable) and 'auto' serves "
                             "mips. 'auto' routing is not counted here (the difficulty head sends few queries to "
                             "a reranking tier; they run on the ordinary workers).")
    max_queued_reranks: int = Field(
        2, ge=0, description="Requests with a reranking tier waiting for a rerank worker, in requests; beyond it "
                             "429 overloaded.")

    # batch search and the query-embedding cache (issue 17)
    max_batch: int = Field(256, ge=1, description="Most queries one batch search may hold (413 batch_too_large "
                                                  "above); the batch takes one admission slot and one deadline.")
    query_cache_entries: int = Field(10_000, ge=0, description="Query embeddings the LRU cache keeps, in entries "
                                                              "(0 disables the cache).")
    query_cache_bytes: int = Field(64 * 1024 * 1024, ge=0,
                                   description="Bytes the query-embedding cache may hold (vectors + key texts), in "
                                               "bytes (0 disables the cache).")

    # authentication
    mode: Literal["production", "local"] = Field(
        "production", description="'local' allows placeholder API keys (development only).")
    admin_api_key: SecretStr | None = Field(
        None, description="Bearer key for /admin/* (reload, promote, rollback); unset: admin endpoints answer "
                          "403 admin_disabled.")
    search_api_key: SecretStr | None = Field(
        None, description="Bearer key required by POST /v1/search when set; unset: search is open.")
    write_api_key: SecretStr | None = Field(
        None, description="Bearer key of the document write routes (/v1/collections/{name}/documents*, /writes); "
                          "unset: they answer 403 writes_disabled.")

    # live documents (issue 18; docs/LIVE_DOCUMENTS.md)
    max_write_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest body of a document write, "
                                                                              "in bytes (413 body_too_large above).")
    max_write_batch: int = Field(1000, ge=1, description="Most documents (or ids) one write may hold (413 "
                                                         "batch_too_large above).")
    max_document_chars: int = Field(100_000, ge=1, description="Longest title + text of a written document, in "
                                                               "characters (413 document_too_long above).")
    wal_require_fsync: bool = Field(True, description="With REDIS_URL (the write-ahead log in a Redis stream): "
                                    "refuse writes (503 writes_unavailable) unless Redis runs with appendonly yes "
                                    "and appendfsync always; off: log a warning and accept them anyway.")
    wal_follow_block_s: float = Field(1.0, gt=0, le=10, description="With REDIS_URL: longest XREAD BLOCK of a "
                                      "collection's log follower, in seconds (other replicas' writes are applied "
                                      "as soon as they are appended).")
    wal_takeover_interval_s: float = Field(2.0, ge=0, le=60, description="Without REDIS_URL: how often, in "
                                           "seconds, a replica whose collection's file write-ahead log another "
                                           "process (the writer) holds tries to open it again, so that it takes the "
                                           "log over (replays it, then serves its writes) once the writer stops; "
                                           "0: never (a restart takes it over).")

    # lexical / hybrid lanes and access control (issue 6; docs/API.md)
    hybrid_fusion: Literal["rrf", "convex"] = Field(
        "rrf", description="Fusion of mode 'hybrid' when a request gives none: reciprocal rank fusion (k = 60) or "
                           "a min-max normalised convex combination.")
    hybrid_alpha: float = Field(0.5, ge=0.0, le=1.0, description="Weight of the dense lane in the convex fusion "
                                                                 "when a request gives none.")
    hybrid_depth: int = Field(100, ge=1, le=10_000, description="Candidates taken from each lane of mode 'hybrid' "
                                                                "(at least k), in documents.")
    access_policy: Literal["none", "header", "api_key"] = Field(
        "none", description="Tenant/ACL enforcement: 'none'; 'header' (tenant and groups from trusted headers set by "
                            "a proxy); 'api_key' (the search key's principal in `principals`).")
    tenant_header: str = Field("X-Tenant", description="Header naming the tenant under access_policy 'header'.")
    groups_header: str = Field("X-Groups", description="Header with comma-separated ACL groups under access_policy "
                                                       "'header'.")
    principals: dict[str, dict] = Field(
        {}, description="access_policy 'api_key': sha256 hex digest of an API key -> {\"tenant\": str, "
                        "\"groups\": [str]} (digests, so the configuration holds no key).")
    tenant_field: str = Field("tenant", description="Corpus field holding a document's tenant.")
    acl_field: str = Field("acl", description="Corpus field holding a document's ACL groups.")

    # privacy
    query_log_sample_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Fraction of successful queries whose text is logged (0 = never).")
    query_log_max_chars: int = Field(
        64, ge=1, le=1024, description="Characters of a sampled query that are logged, in characters.")

    @field_validator("collections", mode="before")
    @classmethod
    def _split_collections(cls, value):
        if isinstance(value, str):  # the env var: comma-separated names (blank: unset)
            value = value.strip()
            return tuple(part.strip() for part in value.split(",")) if value else None
        return value

    @model_validator(mode="after")
    def _collections_valid(self) -> "GatewaySettings":
        names = self.collections if self.collections else (self.collection,)
        for name in (self.collection, *names):
            if not COLLECTION_NAME.match(name or ""):
                raise ValueError(f"invalid collection name {name!r}: letters, digits, '.', '_' and '-', starting "
                                 f"with a letter or digit, at most 128 characters")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"collections lists {', '.join(duplicates)} more than once")
        if self.collection not in names:
            raise ValueError(f"the default collection {self.collection!r} is not among collections "
                             f"{', '.join(names)}; add it or set collection to one of them")
        self.collections = tuple(names)
        return self

    @model_validator(mode="after")
    def _default_tier_servable(self) -> "GatewaySettings":
        if self.default_tier in ("maxsim", "cross_encoder") and self.max_concurrent_reranks == 0:
            raise ValueError(f"default_tier {self.default_tier!r} needs a rerank worker, but max_concurrent_reranks "
                             "is 0 (every request without a tier would get 409 tier_unavailable); set default_tier "
                             "to 'mips' or 'auto', or max_concurrent_reranks to 1 or more")
        return self

    @model_validator(mode="after")
    def _access_policy_consistent(self) -> "GatewaySettings":
        if self.access_policy == "api_key" and self.search_api_key is not None:
            raise ValueError("access_policy 'api_key' takes its keys from `principals`; unset search_api_key")
        for digest, p in self.principals.items():
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("principals are keyed by the lower-case sha256 hex digest of an API key")
            if not isinstance(p.get("tenant"), str) or not p["tenant"]:
                raise ValueError("each principal needs a non-empty string 'tenant'")
        return self

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> "GatewaySettings":
        if self.mode == "local":
            return self
        keys = {"admin_api_key": self.admin_api_key, "search_api_key": self.search_api_key,
                "write_api_key": self.write_api_key}
        for name, key in keys.items():
            if key is None:
                continue
            reason = placeholder_reason(key.get_secret_value())
            if reason:
                raise ValueError(f"{name} {reason}; set a random key (e.g. `python -c \"import secrets; "
                                 f"print(secrets.token_urlsafe(32))\"`) or mode=local for development")
        if self.admin_api_key is not None and self.search_api_key is not None and \
                self.admin_api_key.get_secret_value() == self.search_api_key.get_secret_value():
            raise ValueError("admin_api_key and search_api_key must differ")
        if self.write_api_key is not None and any(
                k is not None and k.get_secret_value() == self.write_api_key.get_secret_value()
                for k in (self.admin_api_key, self.search_api_key)):
            raise ValueError("write_api_key must differ from admin_api_key and search_api_key")
        return self

    def resolved(self) -> "GatewaySettings":
        """A copy with every default path filled in under ``home`` (:func:`engine.home.home_defaults`)."""
        return with_home_defaults(self, ("index_root", "encoder_dir", "cross_encoder_dir", "milvus_uri"))

    def stage1_provider(self):
        """The :class:`engine.stage1.Stage1Provider` these settings describe (call on resolved settings)."""
        token = self.milvus_token.get_secret_value() if self.milvus_token else None
        return Stage1Provider(self.stage1_backend, self.milvus_uri, token, self.milvus_prefix, self.milvus_timeout_s)
