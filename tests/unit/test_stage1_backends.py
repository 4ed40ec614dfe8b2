"""Stage-1 backends on a synthetic index version: Milvus Lite (in process) against faiss, and the refusals.

The version is written with :func:`engine.version.store.write_version` and the format's writers, like
the trainer's (rotated unit-norm documents, normalised m0-prefix faiss index), so
the Milvus writer and the gateway's loader run on real files.  No router here:
the routed policy is covered on SciFact in ``tests/integration/test_milvus_stage1.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from adawidth.prefix import exact_prefix_search, prefix_normalize
from engine.index import IndexVersion
from engine.stage1 import Stage1Provider, Stage1Unavailable
from engine.version.milvus import milvus_collection_name
from service.online_cus import OnlineCusMonitor, _Sample
from tests.conftest import served
from tests.hybrid_support import write_synthetic_version
from trainer.milvus_stage1 import write_version

N, D, M0 = 2000, 48, 16


def _synthetic_version(root, name="v1", seed=0):
    """N documents of a decaying spectrum (like a PCA rotation's), written by the format's writers."""
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((N, D)) * np.linspace(2.0, 0.2, D)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    path = write_synthetic_version(root, X=X, m0=M0, shortlist=100, lexical=False, name=name,
                                   adapter={"kind": "identity", "sha256": f"sha-{seed}"})
    return path, X


@pytest.fixture
def milvus(tmp_path):
    provider = Stage1Provider("milvus", str(tmp_path / "milvus.db"))
    yield provider
    provider.close()


def test_milvus_backend_equals_faiss_on_every_fixed_width_and_full(tmp_path, milvus):
    path, X = _synthetic_version(tmp_path)
    out = write_version(milvus.client, path)
    assert out["written"] and out["rows"] == N
    assert write_version(milvus.client, path)["written"] is False  # idempotent: publish after build is cheap
    vf = IndexVersion.load(path)
    vm = IndexVersion.load(path, stage1=milvus)
    assert (vf.stage1.kind, vm.stage1.kind) == ("faiss", "milvus") and vm.stage1_index is None
    rng = np.random.default_rng(1)
    Q = rng.standard_normal((40, D)).astype(np.float32)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    for q in Q:
        for width in (8, M0, 32, D, "full"):
            a, b = served(vf, q, 10, width), served(vm, q, 10, width)
            assert a.ids == b.ids, (width, a.ids, b.ids)
            assert np.allclose(a.scores, b.scores, atol=1e-6)
            assert a.trace["coordinates_scored"] == b.trace["coordinates_scored"] and a.trace["width"] == b.trace["width"]
    # and both equal the brute-force reference at full width
    ref = exact_prefix_search(Q, X, D, 10)
    assert all(served(vm, q, 10, "full").ids == [f"d{r}" for r in ref[i]] for i, q in enumerate(Q))


def test_milvus_shortlist_carries_rescoring_vectors_of_the_version(tmp_path, milvus):
    path, X = _synthetic_version(tmp_path)
    write_version(milvus.client, path)
    vm = IndexVersion.load(path, stage1=milvus)
    q = prefix_normalize(X[:1], M0)[0]
    sl = vm.stage1.shortlist(q, 100)
    rows = sl.to_index_rows(sl.rows)
    assert rows[0] == 0 and len(set(rows.tolist())) == 100
    assert np.array_equal(sl.docs, X[rows])  # bit-equal rescoring prefixes
    assert np.all(np.diff(sl.cosines) <= 0)


def test_gateway_refuses_a_version_without_or_with_a_foreign_milvus_collection(tmp_path, milvus):
    path, _ = _synthetic_version(tmp_path)
    with pytest.raises(Stage1Unavailable) as e:
        IndexVersion.load(path, stage1=milvus)
    assert e.value.code == "missing"
    # another version's data under this version's name (e.g. a hand-made copy) is refused too
    other, _ = _synthetic_version(tmp_path / "o", name="v1", seed=7)
    write_version(milvus.client, other)
    assert milvus_collection_name("synth", "v1") in milvus.client.list_collections()
    with pytest.raises(Stage1Unavailable) as e:
        IndexVersion.load(path, stage1=milvus)
    assert e.value.code == "schema"


def test_collection_names_are_valid_and_distinct():
    a = milvus_collection_name("scifact", "20261130T063214Z-fc31887d")
    assert a == "adawidth_scifact_20261130T063214Z_fc31887d"
    assert milvus_collection_name("scifact", "20261130T063214Z-fc31887e") != a
    assert milvus_collection_name("1x", "v", prefix="") .startswith("_")
    with pytest.raises(ValueError):
        milvus_collection_name("c", "v" * 300)


def test_online_cus_compares_through_the_version_backend(tmp_path, milvus):
    """The online CUS full-width top-1 comes from the version's backend (Milvus scans there, not docs.npy)."""
    path, X = _synthetic_version(tmp_path)
    write_version(milvus.client, path)
    mon = OnlineCusMonitor(CollectorRegistry(), 1.0, start=False)
    for v in (IndexVersion.load(path), IndexVersion.load(path, stage1=milvus)):
        for i in (3, 17, 1999):
            q = X[i] + 0.01 * np.random.default_rng(i).standard_normal(D).astype(np.float32)
            q /= np.linalg.norm(q)
            top1 = f"d{int(np.argmax(X @ q))}"
            assert mon.compare(_Sample(v, q, top1, "fixed")) and not mon.compare(_Sample(v, q, "d-other", "fixed"))


def test_allowed_sets_restrict_both_backends_alike(tmp_path, milvus):
    """A filter (allowed rows) is applied before the top-k by faiss (ID selector) and Milvus (expression) alike."""
    path, X = _synthetic_version(tmp_path)
    write_version(milvus.client, path)
    vf, vm = IndexVersion.load(path), IndexVersion.load(path, stage1=milvus)
    rng = np.random.default_rng(3)
    allowed = rng.random(N) < 0.1
    for q in X[:10]:
        for width in (8, 32, "full"):
            a, b = served(vf, q, 10, width, allowed=allowed), served(vm, q, 10, width, allowed=allowed)
            assert a.ids == b.ids and len(a.ids) == 10
            assert all(allowed[int(i[1:])] for i in b.ids)
    few = np.zeros(N, dtype=bool)
    few[[5, 700]] = True
    assert sorted(served(vm, X[0], 10, 32, allowed=few).ids) == ["d5", "d700"]
    assert served(vm, X[0], 10, "full", allowed=np.zeros(N, dtype=bool)).ids == []
