"""Typed configuration of the gateway; every field is also an env var ``ADAWIDTH_<NAME>``."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Built once in ``service.__main__`` (or by a test) and injected into :func:`service.app.create_app`."""

    model_config = SettingsConfigDict(env_prefix="ADAWIDTH_", extra="ignore")

    home: Path = Field(Path("var"), description="Working folder (indexes and models live under it by default).")
    index_root: Path | None = Field(None, description="Root of index versions (default <home>/indexes).")
    collection: str = Field("scifact", description="Collection served.")
    version: str | None = Field(None, description="Version to serve; default: the collection's LIVE pointer.")
    encoder_dir: Path | None = Field(None, description="ONNX encoder export (default <home>/models/minilm-onnx).")
    encoder_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads; 0 = ONNX Runtime's default.")
    faiss_threads: int = Field(1, ge=1, description="OpenMP threads for faiss; one is fastest for single queries.")
    prefer_gpu: bool = Field(True, description="Use CUDA for the encoder when onnxruntime-gpu and a GPU are present.")
    k_max: int = Field(1000, ge=1, description="Largest k a request may ask for.")
    k_default: int = Field(10, ge=1, description="k when a request does not give one.")
    default_rho: float | None = Field(None, ge=0.0, le=1.0,
                                      description="Target escalation fraction for width 'auto' (default: the manifest's).")
    action_pair: tuple[int, int] | None = Field(None, description="Router action pair (l, h) (default: the manifest's).")
    max_query_chars: int = Field(20_000, ge=1, description="Longest query text accepted, in characters (413 above).")
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest request body accepted, in bytes (413 above).")
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
    admin_api_key: SecretStr | None = Field(None, description="API key of the /admin endpoints (header "
                                            "'Authorization: Bearer <key>' or 'X-API-Key'); unset: they answer 404.")
    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port.")

    def resolved(self) -> "GatewaySettings":
        """A copy with every default path filled in under ``home``."""
        return self.model_copy(update={
            "index_root": self.index_root or self.home / "indexes",
            "encoder_dir": self.encoder_dir or self.home / "models" / "minilm-onnx",
        })
