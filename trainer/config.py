"""Typed configuration of the trainer process; every field is also an env var ``ADAWIDTH_<NAME>``."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.home import with_home_defaults


class TrainerSettings(BaseSettings):
    """Built once in the CLI and passed down; nothing reads the environment at import time."""

    model_config = SettingsConfigDict(env_prefix="ADAWIDTH_", extra="ignore")

    home: Path = Field(Path("var"), description="Working folder for models, caches and indexes.")
    index_root: Path | None = Field(None, description="Root of index versions (default <home>/indexes).")
    encoder_dir: Path | None = Field(None, description="ONNX encoder export (default <home>/models/minilm-onnx).")
    embedding_cache: Path | None = Field(None, description="SQLite embedding cache (default <home>/cache/embeddings.sqlite).")
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("redis_url", "ADAWIDTH_REDIS_URL", "REDIS_URL"),
        description="Redis URL of the version registry (env ADAWIDTH_REDIS_URL or REDIS_URL); unset: the file "
                    "registry on the index volume.")
    encoder_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads; 0 = all cores.")
    encode_batch_size: int = Field(32, ge=1, description="Texts per ONNX call when encoding the corpus.")
    stage1_backend: str = Field("faiss", description="'milvus': also write each built or published version's "
                                "stage-1 and rescoring prefixes to a Milvus collection named by the version.")
    milvus_uri: str | None = Field(None, description="Milvus URI (http://host:19530, or a Milvus Lite .db path; "
                                   "default <home>/milvus.db).")
    milvus_token: str | None = Field(None, description="Milvus credentials ('user:password' or an API key).")
    milvus_prefix: str = Field("adawidth", description="Prefix of the Milvus collection names.")
    ann_min_docs: int = Field(200_000, ge=0, description="`build --ann auto`: corpora of at least this many documents "
                              "get an ANN first stage (HNSW with float16 vectors, else IVF when it does not fit the memory budget); "
                              "smaller ones the flat certified level scan.")
    memory_budget_bytes: int | None = Field(None, ge=1, description="Bytes a built version's stage 1 may hold "
                                            "(documents, level store or ANN index); a build whose backend does not "
                                            "fit exits 2 with the bytes needed.  Unset: no budget.")
    ray_address: str | None = Field(None, description="Ray cluster of `trainer encode --ray` (e.g. ray://head:10001); "
                                    "unset: a local Ray started in process.")

    fold_min_writes: int = Field(1000, ge=1, description="The trainer daemon folds once this many documents "
                                 "were written (upserted or deleted ids) after the live version's folded sequence.")
    fold_interval_seconds: float = Field(3600.0, ge=0, description="The daemon also folds any pending write once "
                                         "this long since its last fold (or its start); 0: by size only.")
    fold_drift_threshold: float = Field(0.05, ge=0, description="A fold refits (rotation, routers, recall policy) "
                                        "instead of reusing them when the online-CUS agreement moves more than this.")

    keep_versions: int = Field(3, ge=1, description="Version retention: besides the live, previous, candidate and "
                               "leased versions, keep this many of the newest versions of a collection; older ones "
                               "are deleted after every build and fold (docs/LIVE_DOCUMENTS.md).")
    lease_fresh_seconds: float = Field(60.0, gt=0, description="A replica report younger than this leases the "
                                       "versions it names as live or warm: retention never deletes them.")
    disk_margin_bytes: int = Field(512 * 1024 * 1024, ge=0, description="Bytes a build or fold leaves free on the "
                                   "index volume: one whose estimated version does not fit in the free bytes less "
                                   "this is refused before it starts (exit 2).")

    def resolved(self) -> "TrainerSettings":
        """A copy with every default path filled in under ``home`` (:func:`engine.home.home_defaults`)."""
        return with_home_defaults(self, ("index_root", "encoder_dir", "embedding_cache", "milvus_uri"))
