"""The layout of a home folder (``ADAWIDTH_HOME``), shared by the gateway's and the trainer's settings."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel


def home_defaults(home: Path) -> dict[str, Path | str]:
    """Default locations under ``home``: index versions, the ONNX encoder and cross-encoder exports, the
    embedding cache and the Milvus Lite file (a path string, as ``milvus_uri`` is a URI)."""
    return {"index_root": home / "indexes", "encoder_dir": home / "models" / "minilm-onnx",
            "cross_encoder_dir": home / "models" / "minilm-cross-encoder",
            "embedding_cache": home / "cache" / "embeddings.sqlite", "milvus_uri": str(home / "milvus.db")}


def with_home_defaults(settings: BaseModel, fields: Iterable[str]):
    """A copy of ``settings`` (with a ``home`` field) where each of ``fields`` left unset (None or empty) is
    filled with its :func:`home_defaults` location."""
    defaults = home_defaults(Path(settings.home))
    return settings.model_copy(update={f: getattr(settings, f) or defaults[f] for f in fields})
