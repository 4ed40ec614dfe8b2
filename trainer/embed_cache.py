"""Document-embedding cache keyed by content hash, so a rebuild re-encodes only changed text.

One SQLite file per cache directory; the key of a text is
``sha256(onnx_sha256 | tokenizer_sha256 | max_tokens | text)``, so a new
encoder, tokenizer or truncation never reuses a stale vector.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import numpy as np
from tqdm import tqdm

from engine.encoder import encoder_fingerprint  # noqa: F401  (re-exported: the key's encoder part)


def content_key(text: str, encoder_fingerprint: str) -> str:
    """Hex sha256 of the encoder fingerprint and the text."""
    return hashlib.sha256(f"{encoder_fingerprint}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()


class EmbeddingCache:
    """Persistent map content key -> float32 vector of one dimension.

    Args:
        path: SQLite file (created with its parent folder).
        dimension: D; vectors of another size are refused.
    """

    def __init__(self, path: Path | str, dimension: int):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.dimension = dimension
        self.db = sqlite3.connect(str(path))
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for start in range(0, len(keys), 900):
            chunk = keys[start:start + 900]
            q = f"SELECT key, vec FROM emb WHERE key IN ({','.join('?' * len(chunk))})"
            for key, blob in self.db.execute(q, chunk):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.size == self.dimension:
                    out[key] = vec
        return out

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        rows = [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO emb (key, vec) VALUES (?, ?)", rows)

    def close(self) -> None:
        self.db.close()


def encode_with_cache(encoder, texts: list[str], cache: EmbeddingCache | None, *,
                      batch_size: int = 32, chunk: int = 256, desc: str = "encoding") -> tuple[np.ndarray, int]:
    """Embed ``texts``, reading cached vectors and encoding (then caching) the rest.

    Args:
        encoder: an object with ``encode(list[str], batch_size) -> (B, D) float32``
            and ``info`` (``onnx_sha256``, ``tokenizer_sha256``) and ``max_tokens``.
        texts: N strings.
        cache: the cache, or None to encode everything.

    Returns:
        (embeddings of shape (N, D) float32, number of texts actually encoded).
    """
    fp = encoder_fingerprint(encoder)
    keys = [content_key(t, fp) for t in texts]
    found = cache.get_many(list(dict.fromkeys(keys))) if cache else {}
    missing = [i for i, k in enumerate(keys) if k not in found]
    # long texts first so the progress bar's rate settles early
    missing.sort(key=lambda i: -len(texts[i]))
    with tqdm(total=len(missing), desc=desc, unit="doc", disable=not missing) as bar:
        for start in range(0, len(missing), chunk):
            idx = missing[start:start + chunk]
            vecs = encoder.encode([texts[i] for i in idx], batch_size=batch_size)
            new = {keys[i]: v for i, v in zip(idx, vecs)}
            if cache:
                cache.put_many(new)
            found.update(new)
            bar.update(len(idx))
    out = np.stack([found[k] for k in keys]).astype(np.float32) if texts else np.empty((0, 0), np.float32)
    return out, len(missing)
