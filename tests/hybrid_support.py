"""A small synthetic index version (no encoder needed) written by the real artifact writer, with the
lexical side, keyword fields (tenant, acl, topic) and a seeded corpus, for the hybrid/filter tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.version import files, store
from engine.version.lexical import lexical_files

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "err_ssl_5417", "v1", "zeta")
TENANTS = ("acme", "globex", "initech")
GROUPS = ("eng", "legal", "hr")


def unit_data(seed: int = 0, n: int = 300, d: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Seeded unit-norm documents (n, d) float32 and one unit query (d,) float32."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    q = rng.standard_normal(d).astype(np.float32)
    return X, q / np.linalg.norm(q)


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
                            lexical: bool = True, seed: int = 0, X: np.ndarray | None = None, name: str = "v1",
                            adapter: dict | None = None, collection: str = "synth") -> Path:
    """Write version ``root/<collection>/<name>`` with the format's writers (identity rotation, flat stage 1, no router;
    documents ``X`` (n, dim) float32, default seeded unit Gaussians) and return its path."""
    if X is None:
        X = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    n, dim = X.shape
    writers, core, stage1 = files.dense_files(np.eye(dim), X, [f"d{i}" for i in range(n)], m0)
    manifest = {"collection": collection, "encoder": {"onnx_sha256": "synthetic"}, "dimension": dim, "m0": m0,
                "shortlist": shortlist, "core": core, "stage1": stage1, "router": None, "corpus": {"documents": n},
                "adapter": adapter}
    if lexical:
        lw, manifest["lexical"] = lexical_files(*synthetic_corpus(n, seed))
        writers.update(lw)
    return store.write_version(root / collection, name, writers, manifest)
