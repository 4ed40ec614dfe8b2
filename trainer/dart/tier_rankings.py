"""Rankings of the MIPS and MaxSim tiers (Algorithm 1 of 000) through a fine-tuned encoder's top layers.

The labels of the difficulty head (:mod:`trainer.dart.difficulty`) come from these rankings; the encoder is a
:class:`trainer.dart.finetune.TopEncoder` over cached frozen states.
"""

from __future__ import annotations

import numpy as np
import torch

from adawidth.tiers import maxsim
from trainer.dart.finetune import encode_states, rank


def token_embeddings(top, states, rows, batch_size: int = 64) -> list[np.ndarray]:
    """Unit-normalised last-layer token embeddings of ``rows`` through ``top`` (a
    :class:`trainer.dart.finetune.TopEncoder`): a list of (L_i, D) float16 arrays, padding dropped."""
    rows = np.asarray(rows)
    out: list[np.ndarray | None] = [None] * len(rows)
    lens = states.lengths()[rows]
    order = np.argsort(-lens, kind="stable")
    with torch.no_grad():
        for s in range(0, len(rows), batch_size):
            o = order[s:s + batch_size]
            h, m = states.batch(rows[o])
            t = torch.nn.functional.normalize(top.token_states(h, m), dim=-1).numpy()
            for r, i in enumerate(o):
                out[i] = t[r, :int(lens[i])].astype(np.float16)
    return out


def tier_rankings(top, qstates, qrows, dstates, X: np.ndarray, depth: int = 50) -> dict[str, np.ndarray]:
    """Rankings of the MIPS and MaxSim tiers (Algorithm 1 of 000) for the queries ``qrows``.

    MIPS: exact inner product of the pooled embeddings over the corpus ``X`` (N, D); MaxSim: the top ``depth``
    MIPS candidates reordered by :func:`adawidth.tiers.maxsim` over the same encoder's token embeddings.

    Returns ``{"mips": (Q, depth) int64 rows, "maxsim": (Q, depth) int64 rows}``, best first.
    """
    Q = encode_states(top, qstates, qrows)
    R = rank(Q, X, depth)
    cand = np.unique(R)
    dtok = dict(zip(cand.tolist(), token_embeddings(top, dstates, cand)))
    qtok = token_embeddings(top, qstates, qrows)
    M = np.empty_like(R)
    for i, r in enumerate(R):
        s = maxsim(qtok[i].astype(np.float32), [dtok[int(j)].astype(np.float32) for j in r])
        M[i] = r[np.argsort(-s, kind="stable")]
    return {"mips": R, "maxsim": M}
