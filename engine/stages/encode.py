"""Stage ``encode``: query texts -> unit-norm embeddings, in one encoder call for a batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.plan import Plan


def encode(plans: Sequence[Plan], encoder) -> np.ndarray:
    """Embed the dense text of every plan (quote marks dropped, words kept) in one call.

    Args:
        plans: the searches; plans without a dense lane still get a row (zeros are never used).
        encoder: an object with ``encode(texts: list[str]) -> (B, D) float32`` (unit-norm rows), e.g.
            the ONNX encoder; it truncates at the version's ``max_tokens``.

    Returns:
        (Q, D) float32, row i the embedding of ``plans[i].text``.
    """
    return np.asarray(encoder.encode([p.text for p in plans]), dtype=np.float32)
