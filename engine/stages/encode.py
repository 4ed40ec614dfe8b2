"""Stage ``encode``: query texts -> unit-norm embeddings, in one encoder call for a batch.

Every text is normalised first (:func:`engine.query_cache.normalize_query`: NFC, whitespace runs to one
space), with or without a query-embedding cache, so the cache's key is exactly the text the encoder sees.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.plan import Plan
from engine.query_cache import QueryEmbeddingCache, encoder_key, normalize_query


def encode(plans: Sequence[Plan], encoder, cache: QueryEmbeddingCache | None = None) -> np.ndarray:
    """Embed the dense text of every plan (quote marks dropped, words kept) in one call.

    Args:
        plans: the searches; plans without a dense lane still get a row (zeros are never used).
        encoder: an object with ``encode(texts: list[str]) -> (B, D) float32`` (unit-norm rows), e.g.
            the ONNX encoder; it truncates at the version's ``max_tokens``.
        cache: query-embedding cache (None or disabled: every text is encoded).  Hits are served from it;
            the distinct misses are encoded in one call and stored under the encoder's ONNX sha256.

    Returns:
        (Q, D) float32, row i the embedding of ``plans[i].text`` (normalised).
    """
    texts = [normalize_query(p.text) for p in plans]
    if cache is None or not cache.enabled:
        return np.asarray(encoder.encode(texts), dtype=np.float32)
    return cache.encode(encoder_key(encoder), texts, encoder.encode)
