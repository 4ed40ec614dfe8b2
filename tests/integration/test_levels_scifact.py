"""The certified-width kernel on real embeddings: exact mode returns the exhaustive top-10 of every test query.

SciFact (5,183 documents, 300 test queries; bundled) and LIMIT-small (46 documents, 1,000 queries; bundled)
always run; Cranfield (1,400 documents, 225 queries) runs from the shared data folder, and fails when it is missing
(``ADAWIDTH_SHARED_DATA``, default ``../shared/data`` beside the clone).  Embeddings come from the frozen encoder through the
embedding cache (``var/cache/embeddings.sqlite``), so each collection is encoded at most once per machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from adawidth import levels as lv
from engine.io.beir import load_collection
from adawidth.rotation import pca_rotation
from tests.conftest import SCIFACT, VAR
from trainer.embed_cache import EmbeddingCache, encode_with_cache

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("ADAWIDTH_SHARED_DATA", ROOT.parent / "shared" / "data"))  # ../shared beside the clone


def embed(encoder, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(documents (N, D), judged test queries (Q, D)), float32, PCA-rotated (fitted on the documents)."""
    col = load_collection(folder, "test")
    cache = EmbeddingCache(VAR / "cache" / "embeddings.sqlite", encoder.dimension)
    try:
        X, _ = encode_with_cache(encoder, [d.encoder_text() for d in col.corpus], cache, desc=f"{folder.name} corpus")
        qids = sorted(col.judged_queries())
        Q, _ = encode_with_cache(encoder, [col.queries[q] for q in qids], cache, desc=f"{folder.name} queries")
    finally:
        cache.close()
    R = pca_rotation(X)
    return (X @ R.T).astype(np.float32), (Q @ R.T).astype(np.float32)


def exhaustive(X: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exhaustive top-k by float32 inner product (ties to the lower row) and every document's score."""
    s = X @ q
    return np.lexsort((np.arange(len(X)), -s))[:k], s


def assert_identical_top_k(store: lv.LevelStore, X: np.ndarray, Q: np.ndarray, k: int = 10, **kw) -> float:
    """Every query's exact-mode top-k equals the exhaustive one (a float near tie, within 1e-6, may swap
    neighbours, as numpy and the kernel sum in different orders); returns the mean coordinate share."""
    shares, swapped = [], 0
    for q in Q:
        res = lv.search(store, q, k, **kw)
        ref, s = exhaustive(X, q, k)
        assert res.certified
        assert len(res.rows) == min(k, len(X))
        np.testing.assert_allclose(res.scores, s[res.rows], atol=1e-6)
        if not np.array_equal(res.rows, ref):
            assert np.allclose(s[res.rows], s[ref], atol=1e-6), (res.rows, ref)
            swapped += 1
        shares.append(res.coordinate_share)
    assert swapped <= max(1, len(Q) // 100)
    return float(np.mean(shares))


@pytest.fixture(scope="module")
def scifact(encoder):
    return embed(encoder, SCIFACT)


@pytest.mark.parametrize("layout", [lv.LevelLayout.default(384), lv.LevelLayout.uniform(384, 16)],
                         ids=["default-fp16", "uniform16-fp32"])
def test_exact_mode_is_exhaustive_on_every_scifact_test_query(scifact, layout):
    X, Q = scifact
    assert Q.shape == (300, 384)
    store = lv.LevelStore.build(X, layout)
    share = assert_identical_top_k(store, X, Q)
    assert share < 0.5  # PCA compacts energy: certifying the top-10 reads well under half the coordinates
    old = lv._kernel.set_min_rows_per_thread(1024)  # shard even 5,183 rows over two kernel threads
    try:
        assert_identical_top_k(store, X, Q[:60], threads=2)
    finally:
        lv._kernel.set_min_rows_per_thread(old)


def test_data_aware_bounds_on_scifact_trade_recall_for_work(scifact):
    X, Q = scifact
    store = lv.LevelStore.build(X)
    exact = [lv.search(store, q, 10) for q in Q]
    exact_share = np.mean([r.coordinate_share for r in exact])
    for bound in ("data_aware", "data_aware_doc"):
        recalls, shares = [], []
        for z in (2.0, 3.0, 5.0):
            res = [lv.search(store, q, 10, bound=bound, z=z) for q in Q]
            recalls.append(np.mean([len(set(r.rows) & set(e.rows)) / 10 for r, e in zip(res, exact)]))
            shares.append(np.mean([r.coordinate_share for r in res]))
        assert recalls == sorted(recalls) and shares == sorted(shares)  # a higher confidence keeps more
        assert shares[-1] < exact_share
        assert recalls[-1] >= 0.95, (bound, recalls)


def test_exact_mode_is_exhaustive_on_limit_small(encoder):
    X, Q = embed(encoder, ROOT / "data" / "limit-small")
    assert Q.shape[0] == 1000
    for layout in (lv.LevelLayout.default(384), lv.LevelLayout.uniform(384, 32)):
        assert_identical_top_k(lv.LevelStore.build(X, layout), X, Q)


def test_exact_mode_is_exhaustive_on_every_cranfield_query(encoder):
    # CI clones the repository beside ../shared; a missing collection fails here, it never skips
    assert (SHARED / "cranfield" / "corpus.jsonl").is_file(), \
        f"Cranfield is not in {SHARED} (set ADAWIDTH_SHARED_DATA to the shared data folder)"
    X, Q = embed(encoder, SHARED / "cranfield")
    assert X.shape == (1400, 384) and Q.shape[0] == 225
    for layout in (lv.LevelLayout.default(384), lv.LevelLayout.uniform(384, 16)):
        share = assert_identical_top_k(lv.LevelStore.build(X, layout), X, Q)
        assert share < 0.75
