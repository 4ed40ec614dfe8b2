"""A small synthetic index version (no encoder needed) written by the real artifact writer, with the
lexical side, keyword fields (tenant, acl, topic) and a seeded corpus, for the hybrid/filter tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "err_ssl_5417", "v1", "zeta")
TENANTS = ("acme", "globex", "initech")
GROUPS = ("eng", "legal", "hr")


def synthetic_corpus(n: int, seed: int = 0) -> tuple[list[str], list[dict]]:
    """n texts of 3..12 words from :data:`WORDS` and their fields; a third of the documents carry an ACL,
    every tenth has no tenant (invisible under any policy)."""
    rng = np.random.default_rng(seed)
    texts, fields = [], []
    for i in range(n):
        texts.append(" ".join(rng.choice(WORDS, size=int(rng.integers(3, 13)))))
        f = {"topic": ["x", "y", "z"][i % 3], "year": int(2000 + i % 5)}
        if i % 10 != 9:
            f["tenant"] = TENANTS[int(rng.integers(len(TENANTS)))]
        if i % 3 == 0:
            f["acl"] = sorted({str(g) for g in rng.choice(GROUPS, size=int(rng.integers(1, 3)))})
        fields.append(f)
    return texts, fields


def write_synthetic_version(root: Path, *, n: int = 240, dim: int = 32, m0: int = 8, shortlist: int = 20,
                            lexical: bool = True, seed: int = 0) -> Path:
    """Write version ``root/synth/v1`` (identity rotation, flat stage 1, no router) and return its path."""
    import faiss

    from engine.version import store
    from adawidth.prefix import prefix_normalize
    from engine.lexical import lexical_writers

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    texts, fields = synthetic_corpus(n, seed)
    ids = [f"d{i}" for i in range(n)]
    index = faiss.IndexFlatIP(m0)
    index.add(prefix_normalize(X, m0))
    writers = {
        "rotation.npy": lambda p: np.save(p, np.eye(dim, dtype=np.float32)),
        "docs.npy": lambda p: np.save(p, X),
        "doc_sqnorm_m0.npy": lambda p: np.save(p, (X[:, :m0] ** 2).sum(1).astype(np.float32)),
        "doc_ids.json": lambda p: p.write_text(json.dumps(ids)),
        "stage1.faiss": lambda p: faiss.write_index(index, str(p)),
    }
    manifest = {"collection": "synth", "encoder": {"onnx_sha256": "synthetic"}, "dimension": dim, "m0": m0,
                "shortlist": shortlist, "router": None, "corpus": {"documents": n}}
    if lexical:
        lw, entry = lexical_writers(texts, fields)
        writers.update(lw)
        manifest["lexical"] = entry
    return store.write_version(root / "synth", "v1", writers, manifest)
