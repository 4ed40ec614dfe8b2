"""An ANN first stage built into a SciFact version (issue 19): build + load round trip, served recall of policy
``recall`` against exhaustive search, a target the backend cannot meet served exactly, and a version without
the ANN section (schema 3) still loading.

The version is built by the real trainer (PCA rotation, ``ann="hnsw_fp16"``, the kind ``--ann auto`` builds,
forced although SciFact's 5,183 documents are below ``ann_min_docs``; ``tests/integration/test_trainer_cli.py``
builds the float32 ``hnsw``) from the embedding cache; the effort curve is tuned on SciFact's 809
training queries and the recall is measured on its 300 test queries.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from engine import ann
from engine.index import IndexVersion
from engine.io.beir import load_collection
from engine.pipeline import Pipeline, capabilities
from engine.plan import PlanDefaults, SearchSpec, resolve_plan
from engine.stages.rotate import reach
from engine.version.manifest import SCHEMA_VERSION, read_manifest
from service.models import Trace
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from engine.version import store
from service.app import create_app
from service.config import GatewaySettings
from tests.conftest import SCIFACT, VAR, build_home
from trainer.embed_cache import EmbeddingCache, encode_with_cache

pytestmark = pytest.mark.integration
KIND = "hnsw_fp16"


@pytest.fixture(scope="module")
def ann_home(tmp_path_factory, encoder_dir, encoder):
    """A home whose live SciFact version has an HNSW first stage (PCA rotation, one router)."""
    return build_home(tmp_path_factory.mktemp("ann-home"), encoder_dir, encoder, rotation="pca", ann=KIND,
                      capacity=False, action_pairs=((64, 128),), default_pair=(64, 128))


@pytest.fixture(scope="module")
def ann_build(ann_home):
    coll = ann_home / "indexes" / "scifact"
    path = coll / store.read_live_pointer(coll)
    return path, read_manifest(path)


@pytest.fixture(scope="module")
def test_queries(encoder):
    col = load_collection(SCIFACT, "test")
    qids = sorted(q for q in col.qrels if q in col.queries)
    cache = EmbeddingCache(VAR / "cache" / "embeddings.sqlite", encoder.dimension)
    try:
        Q, _ = encode_with_cache(encoder, [col.queries[q] for q in qids], cache, desc="scifact test queries")
    finally:
        cache.close()
    return np.asarray(Q, np.float32)


def test_build_and_load_round_trip(ann_build):
    path, m = ann_build
    assert m.schema_version == SCHEMA_VERSION == 5
    assert m.ann is not None and m.ann.kind == KIND and m.ann.faiss_class == "IndexHNSWSQ"
    assert m.ann.file in m.files and m.files[m.ann.file].size_bytes == (path / m.ann.file).stat().st_size
    assert m.ann.params["M"] == 32 and m.ann.params["ef_construction"] == 80 and m.ann.effort_name == "efSearch"
    assert m.ann.space == "embedding"  # full-width inner products: the index holds the documents as encoded
    assert m.ann.tuning_source == "train" and m.ann.tuning_queries == 809
    efforts = [p["effort"] for p in m.ann.curve]
    assert efforts == sorted(efforts) and m.ann.targets["0.95"] is not None
    assert m.ann.targets["0.95"] <= (m.ann.targets["0.99"] or 10**9)
    assert m.backend.chosen == KIND and m.backend.requested == KIND
    assert set(m.backend.bytes_per_document) == {"flat", *ann.ANN_KINDS}
    assert m.ann.bytes_per_document["vectors"] == 2 * 384 and m.ann.bytes_per_document["graph"] > 0  # float16
    assert m.levels is None and m.recall_policy is None  # an ANN version holds no level store
    assert m.policy.default == "recall"
    v = IndexVersion.load(path)
    assert v.ann is not None and v.ann.kind == KIND and v.ann.index.ntotal == v.size == 5183
    assert v.ann.space == "embedding"
    assert m.ann.search == "resumable" and v.ann.resumable  # its effort model was calibrated on resumed searches
    for t in (0.95, 0.99):  # its effort models were fitted without the energy features: nothing is rotated
        policy = v.ann.policy_for(t)
        assert policy.reads("probe_s1") and not policy.reads("energy16") and not policy.reads("energy64")
        assert not v.ann.needs_prefix(t)
        spec = SearchSpec(query="q", k=10, width="auto", policy="recall", recall_target=t)
        assert reach(resolve_plan(spec, PlanDefaults(), capabilities(v)), v) == 0
    first = np.zeros((1, v.dimension), np.float32)
    v.ann.index.reconstruct_n(0, 1, first)  # the first document as encoded, not rotated (float16-rounded)
    np.testing.assert_allclose(first[0] @ v.rotation.T, v.docs[0], atol=2e-3)
    assert not np.allclose(first[0], v.docs[0], atol=2e-3)
    rep = v.backend_report()
    assert rep["backend"] == KIND and rep["bytes_per_document"]["total"] > 4 * 384
    assert rep["index_space"] == "embedding"


def _served(version, Q, **fields):
    return Pipeline().search(version, [SearchSpec(query="q", k=10, width="auto", policy="recall", **fields)] * len(Q),
                             embeddings=Q)


def test_served_recall_meets_095_on_scifact_test_queries(ann_build, test_queries):
    v = IndexVersion.load(ann_build[0])
    Q_rot = np.ascontiguousarray(test_queries @ v.rotation.T, np.float32)
    truth = ann.exhaustive_top_k(np.asarray(v.docs), Q_rot, 10)
    results = _served(v, test_queries, recall_target=0.95)
    recall = ann.recall_at([r.rows for r in results], truth)
    assert all(r.trace["stage1_backend"] == KIND and r.trace["served_exact_because"] is None for r in results)
    efforts = {r.trace["effort"] for r in results}
    if v.ann.uses_model(0.95):  # the build measured the per-query effort model faster at 0.95
        assert all(r.trace["effort_per_query"] for r in results) and len(efforts) > 1
    else:
        assert efforts == {v.ann.effort(0.95)} and not any(r.trace["effort_per_query"] for r in results)
    assert recall.mean() >= 0.95 - 0.01, recall.mean()
    share = np.mean([r.trace["coordinates_scored"] for r in results]) / (v.size * v.dimension)
    assert share < 0.5  # the graph visits a fraction of the corpus
    Trace(**results[0].trace)  # the gateway's response model takes the new fields


def test_the_per_query_effort_model_is_built_timed_and_meets_its_targets(ann_build, test_queries):
    path, m = ann_build
    e = m.ann.effort_model
    assert e is not None and e.feature_names == list(ann.EFFORT_FEATURES) and e.calibration_queries == 809
    assert e.margin_rule == "standard_error"
    # per target, the probe: the candidate whose calibrated median work at that target is lowest; targets that
    # chose the same probe share one model
    models = [e, *m.ann.more_effort_models]
    assert len(models) == len({x.z_grid[0] for x in models}) <= 2
    assert all(set(r["p50_work"]) == {"0.95", "0.99"} for r in e.probe_choice.values())
    assert len(e.probe_choice) > 1 and {int(p) for p in e.probe_choice} <= set(ann.HNSW_EF_GRID)
    probe_of = {}
    for x in models:
        assert x.file in m.files and x.calibration_file in m.files and x.probe_choice == e.probe_choice
        for t in (x.targets or [0.95, 0.99]):
            work = {int(p): r["p50_work"][f"{t:g}"] for p, r in e.probe_choice.items()}
            assert work[int(x.z_grid[0])] == min(work.values())
            probe_of[f"{t:g}"] = int(x.z_grid[0])
    assert sorted(probe_of) == ["0.95", "0.99"]
    measured = {t: got for x in models for t, got in x.measured.items()}
    per_query = {t for x in models for t in x.per_query_targets}
    assert set(measured) == {"0.95", "0.99"} and per_query <= {0.95, 0.99}
    for t, got in measured.items():  # both timed through the served pipeline; the model kept only where faster
        faster = got["per_query"]["p50_ms"] <= 0.95 * got["fixed"]["p50_ms"]
        assert (float(t) in per_query) == faster
    v = IndexVersion.load(path)
    assert v.ann.effort_policy is not None
    report = v.backend_report()
    assert report["effort_per_query"] == {str(t): float(t) in per_query for t in (0.95, 0.99)}
    assert report["probe_effort"] == {t: probe_of[t] if float(t) in per_query else None for t in ("0.95", "0.99")}
    # the model as loaded, serving every target: within 0.01 of each on the held-out test queries, efforts chosen
    # per query, the probe's work counted
    forced = IndexVersion.load(path)
    forced.ann.model_targets = None
    Q_rot = np.ascontiguousarray(test_queries @ v.rotation.T, np.float32)
    truth = ann.exhaustive_top_k(np.asarray(v.docs), Q_rot, 10)
    for target in (0.95, 0.99):
        results = _served(forced, test_queries, recall_target=target)
        recall = ann.recall_at([r.rows for r in results], truth).mean()
        assert recall >= target - 0.01, (target, recall)
        assert all(r.trace["effort_per_query"] and 0 < r.trace["probe_coordinates"] <= r.trace["coordinates_scored"]
                   for r in results)
        assert min(r.trace["effort"] for r in results) >= probe_of[f"{target:g}"]  # on from its own probe
        assert len({r.trace["effort"] for r in results}) > 1


def test_the_compiled_probe_and_choice_equal_the_python_path_on_scifact(ann_build, test_queries):
    """Each target's model as the version loads it: engine.ann.probe_and_choose gives the Python path's evidence
    (bit for bit), candidates and effort on all 300 SciFact test queries, the index over the documents as encoded
    and the evidence's energy read off the rotated prefix."""
    v = IndexVersion.load(ann_build[0])
    a = v.ann
    Q_rot = np.ascontiguousarray(test_queries @ v.rotation.T, np.float32)
    for target in (0.95, 0.99):
        policy = a.policy_for(target)
        probe = int(policy.z_grid[0])
        assert ann.fused_applies(a.index, a.kind, policy, None)
        chosen = []
        for q, qr in zip(test_queries, Q_rot):
            pre = qr[:ann.ENERGY_PREFIX]
            ev = ann.probe(a.index, a.kind, q, 10, probe, prefix=pre)
            z = policy.choose(ev, target)[1]
            fev, fz = ann.probe_and_choose(a.index, a.kind, q, 10, probe, policy, target, prefix=pre)
            np.testing.assert_array_equal(fev.vector, ev.vector)
            assert fev.rows.tolist() == ev.rows.tolist() and fev.work == ev.work and fz == z
            chosen.append(fz)
        assert len(set(chosen)) > 1, target


def test_recall_target_one_is_served_exactly_and_says_so(ann_build, test_queries):
    v = IndexVersion.load(ann_build[0])
    Q = test_queries[:20]
    Q_rot = np.ascontiguousarray(Q @ v.rotation.T, np.float32)
    truth = ann.exhaustive_top_k(np.asarray(v.docs), Q_rot, 10)
    for r, t in zip(_served(v, Q, recall_target=1.0), truth):
        assert r.trace["policy"] == "exact" and r.trace["recall_target"] == 1.0
        assert "certifies nothing" in r.trace["served_exact_because"]
        assert r.trace["stage1_backend"] == "flat" and r.trace["effort"] is None
        assert set(r.rows.tolist()) == set(t.tolist())


def test_a_version_without_the_ann_section_still_loads(ann_build, tmp_path):
    path = ann_build[0]
    old = tmp_path / path.name
    shutil.copytree(path, old)
    raw = json.loads((old / "manifest.json").read_text())
    (old / raw["ann"]["file"]).unlink()
    del raw["files"][raw["ann"]["file"]]
    raw.pop("ann"), raw.pop("backend")
    raw["schema_version"] = 3
    raw["policy"]["default"] = "router"
    (old / "manifest.json").write_text(json.dumps(raw))
    m = read_manifest(old)
    assert m.schema_version == 3 and m.ann is None and m.backend is None
    v = IndexVersion.load(old)
    assert v.ann is None and v.stage1_backend == "flat" and v.backend_report()["backend"] == "flat"
    r = Pipeline().search(v, [SearchSpec(query="q", k=10, width="full")], embeddings=np.asarray(v.docs[:1]) @ v.rotation)[0]
    assert r.rows[0] == 0 and r.trace["stage1_backend"] == "flat"


def test_a_version_built_before_the_resumable_search_keeps_its_calibration_s_path(ann_build, test_queries,
                                                                                    tmp_path):
    """A manifest without ``ann.search`` (built before 2026-12-07, its effort model calibrated on faiss's fresh
    searches) is served that way: the continuation searches again (its work is a probe plus a fresh search) and
    the candidates are the same documents' best."""
    path = ann_build[0]
    old = tmp_path / path.name
    shutil.copytree(path, old)
    raw = json.loads((old / "manifest.json").read_text())
    raw["ann"].pop("search")
    (old / "manifest.json").write_text(json.dumps(raw))
    assert read_manifest(old).ann.search == "faiss"
    then, now = IndexVersion.load(old), IndexVersion.load(path)
    assert not then.ann.resumable and now.ann.resumable
    policy = now.ann.policy_for(0.99)
    grid = policy.z_grid
    wider = int(grid[min(3, len(grid) - 1)])
    for q in test_queries[:20]:
        ev = ann.probe(then.ann.index, KIND, q, 10, int(grid[0]), prefix=q[:ann.ENERGY_PREFIX])
        assert ev.state is None
        again = ann.continue_search(then.ann.index, KIND, q, 10, ev, wider)
        fresh = ann.search(then.ann.index, KIND, q, 10, wider)
        assert again.work == ev.work + fresh.work
        ev2 = ann.probe(now.ann.index, KIND, q, 10, int(grid[0]), prefix=q[:ann.ENERGY_PREFIX], resume_grid=grid)
        resumed = ann.continue_search(now.ann.index, KIND, q, 10, ev2, wider)
        assert resumed.work < again.work


def test_the_gateway_reports_the_backend_and_serves_an_unmeetable_target_exactly(ann_home):
    app = create_app(GatewaySettings(home=ann_home, collection="scifact", redis_url=None), CollectorRegistry())
    with TestClient(app) as client:
        ready = client.get("/readyz").json()
        assert ready["stage1"]["backend"] == KIND and ready["stage1"]["effort_name"] == "efSearch"
        assert ready["stage1"]["bytes_per_document"]["vectors"] == 2 * 384  # float16
        r = client.post("/v1/search", json={"query": "vitamin D and multiple sclerosis", "k": 5, "recall_target": 1.0})
        assert r.status_code == 200, r.text
        t = r.json()["trace"]
        assert t["policy"] == "exact" and "certifies nothing" in t["served_exact_because"]
        r = client.post("/v1/search", json={"query": "vitamin D and multiple sclerosis", "k": 5, "recall_target": 0.95})
        t = r.json()["trace"]
        assert r.status_code == 200 and t["policy"] == "recall" and t["stage1_backend"] == KIND
        assert t["effort"] == app.state.gw.live.ann.effort(0.95) and t["served_exact_because"] is None


def test_auto_times_hnsw_against_the_level_scan_and_keeps_only_the_faster(tmp_path, encoder_dir, encoder):
    """``--ann auto`` with ``ann_min_docs`` below SciFact's 5,183 documents: both backends are built, timed
    through the served pipeline at the default recall target, the faster is kept and the manifest says why."""
    from threadpoolctl import threadpool_limits

    from trainer.build import BuildOptions, build_index
    from trainer.config import TrainerSettings

    settings = TrainerSettings(home=tmp_path, encoder_dir=encoder_dir, redis_url=None, ann_min_docs=1000,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    with threadpool_limits(limits=1):
        path, m = build_index(BuildOptions(dataset=SCIFACT, rotation="pca", ann="auto", capacity=False,
                                           action_pairs=((64, 128),), default_pair=(64, 128), publish=False),
                              settings, encoder)
    meas = m.backend.measured
    assert meas is not None and set(meas["backends"]) == {"hnsw_fp16", "flat"} and meas["queries"] == 200
    assert meas["recall_target"] == 0.99 and meas["chosen"] == m.backend.chosen
    p50 = {b: x["p50_ms"] for b, x in meas["backends"].items()}
    assert m.backend.chosen == min(p50, key=p50.get) and "faster than" in m.backend.reason
    for x in meas["backends"].values():  # both are served at the target on the tuning queries
        assert x["recall_at_10"] >= 0.98, meas
    v = IndexVersion.load(path)
    if m.backend.chosen == "flat":  # only the kept backend's files are written
        assert m.ann is None and m.levels is not None and m.recall_policy is not None and v.ann is None
    else:
        assert m.levels is None and m.recall_policy is None and v.ann is not None and v.levels is None
    rep = v.backend_report()  # what /readyz shows
    assert "faster than" in rep["chosen_because"] and rep["measured"]["chosen"] == m.backend.chosen
    r = Pipeline().search(v, [SearchSpec(query="q", k=10)], embeddings=np.asarray(v.docs[:1]) @ v.rotation)[0]
    assert r.trace["policy"] == "recall" and r.trace["stage1_backend"] == ("levels" if m.backend.chosen == "flat"
                                                                           else "hnsw_fp16")
    assert r.rows[0] == 0
