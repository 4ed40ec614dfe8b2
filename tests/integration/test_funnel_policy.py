"""The per-query funnel policy end to end on SciFact: trained by the trainer, served as policy "funnel"
(width "auto"; the default "auto" is the declared recall).

The version uses the PCA rotation (label-free, so no adapter training) and the policy's label-free
agreement target; its build evaluates the served policy on the 300 SciFact test queries.
"""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from adawidth import stage1_policy as sp
from engine.index import IndexVersion
from engine.version.manifest import IndexVersionError, read_manifest
from engine.version.store import resolve_version_path
from service.app import create_app
from service.config import GatewaySettings
from tests.conftest import build_home

FULL_WIDTH_NDCG = 0.6451  # the frozen encoder, exhaustive (README, bench/results/scifact_demo.md)
QUERIES = ["statins reduce cardiovascular events", "BRCA1 mutation breast cancer risk",
           "vitamin D deficiency and bone fractures", "microRNA regulation of cell differentiation"]


@pytest.fixture(scope="module")
def funnel_home(tmp_path_factory, encoder_dir, encoder):
    return build_home(tmp_path_factory.mktemp("funnel-home"), encoder_dir, encoder, rotation="pca",
                      action_pairs=((64, 128),), default_pair=(64, 128), capacity=False, stage1_policy=True)


@pytest.fixture(scope="module")
def funnel_manifest(funnel_home):
    return read_manifest(resolve_version_path(funnel_home / "indexes", "scifact", None)).model_dump(mode="json")


@pytest.fixture(scope="module")
def client(funnel_home):
    app = create_app(GatewaySettings(home=funnel_home, collection="scifact", redis_url=None), CollectorRegistry())
    with TestClient(app) as c:
        yield c


def test_the_build_records_the_policy_and_its_quality_on_unseen_test_queries(funnel_manifest):
    meta = funnel_manifest["stage1_policy"]
    assert meta["tau"] == 0.95 and len(meta["grid"]) == 48 and meta["train_queries"] == 809
    ev = funnel_manifest["evaluation"]["stage1_policy"]
    # within 1 % of exhaustive full-width NDCG@10 on the test split, at a fraction of its work
    # (bench/results/adaptive/scifact_pca.md: 0.643 at 0.118 of the full-width multiply-adds at τ = 0.95)
    assert ev["ndcg@10"] >= 0.99 * FULL_WIDTH_NDCG
    assert ev["work_ratio_to_full"] <= 0.15
    # and at less work than the static funnel at m0 = 64, C = 500, rescored at 384 (0.247 of full)
    assert ev["mean_work"] < 5183 * 64 + 500 * (384 - 64)


def test_the_funnel_policy_is_served_by_name_and_the_trace_counts_its_work(client, funnel_home, encoder):
    version = IndexVersion.load(resolve_version_path(funnel_home / "indexes", "scifact", None))
    fp = version.funnel_policy
    grid = {(c.m1, c.shortlist, c.rescore_width) for c in sp.default_grid()}
    seen = set()
    for text in QUERIES:
        r = client.post("/v1/search", json={"query": text, "k": 10, "width": "auto", "policy": "funnel"})
        assert r.status_code == 200
        t = r.json()["trace"]
        assert t["policy"] == "funnel"
        assert (t["stage1_width"], t["shortlist"], t["width"]) in grid
        assert t["stage1_work"] == 5183 * t["stage1_width"] + sp.evidence_work()
        assert t["rescoring_work"] == t["shortlist"] * (t["width"] - t["stage1_width"])
        assert t["coordinates_scored"] == t["stage1_work"] + t["rescoring_work"]
        seen.add(t["stage1_width"])
        # the served ranking is the offline policy's ranking of the same query
        emb = encoder.encode([text])[0]
        res, cfg = sp.resolve_adaptive(fp.corpus, version.rotate(emb, version.dimension), fp.predict, fp.grid, fp.tau, 10)
        assert [h["id"] for h in r.json()["results"]] == [version.doc_ids[i] for i in res.rows]
        assert (cfg.m1, cfg.rescore_width) == (t["stage1_width"], t["width"])


def test_the_width_router_is_named_and_fixed_widths_are_unchanged(client):
    t = client.post("/v1/search", json={"query": QUERIES[0], "width": "auto", "policy": "router", "rho": 1.0}).json()["trace"]
    assert (t["policy"], t["width"], t["escalated"], t["stage1_width"]) == ("router", 128, True, 64)
    t = client.post("/v1/search", json={"query": QUERIES[0], "width": 96}).json()["trace"]
    assert (t["policy"], t["width"], t["stage1_width"], t["shortlist"]) == ("fixed", 96, 64, 500)
    lv = client.post("/v1/search", json={"query": QUERIES[0], "width": "full"}).json()
    t = lv["trace"]
    # SciFact is above LEVEL_SCAN_MIN_DOCS: the certified level scan, a fraction of the coordinates
    assert t["policy"] == "exact" and t["certified"] and t["coordinates_scored"] < 5183 * 384
    assert t["coordinates_scored"] == t["stage1_work"] + t["rescoring_work"] and len(t["alive_per_level"]) == 7
    # one flat scan of all 5183 x 384 coordinates (a gateway whose threshold is above SciFact): the same top-10
    flat_app = create_app(GatewaySettings(home=client.app.state.gw.settings.home, collection="scifact",
                                          redis_url=None, level_scan_min_docs=10_000), CollectorRegistry())
    with TestClient(flat_app) as c:
        full = c.post("/v1/search", json={"query": QUERIES[0], "width": "full"}).json()
    t = full["trace"]
    assert t["policy"] == "exact" and t["certified"] and t["coordinates_scored"] == 5183 * 384
    assert t["alive_per_level"] is None
    assert [h["id"] for h in lv["results"]] == [h["id"] for h in full["results"]]
    # a version's default 'auto' is the declared recall, whatever other policies it was built with
    t = client.post("/v1/search", json={"query": QUERIES[0]}).json()["trace"]
    assert (t["policy"], t["recall_target"]) == ("recall", 0.99)


def test_work_per_stage_is_a_prometheus_histogram(client):
    client.post("/v1/search", json={"query": QUERIES[1], "width": "auto", "policy": "funnel"})
    text = client.get("/metrics").text
    for stage in ("stage1", "rescoring"):
        line = next(x for x in text.splitlines()
                    if x.startswith(f'adawidth_search_stage_work_multiply_adds_count{{stage="{stage}"}}'))
        assert float(line.split()[-1]) >= 1


def test_a_version_whose_policy_features_differ_is_refused(funnel_home, tmp_path):
    src = resolve_version_path(funnel_home / "indexes", "scifact", None)
    bad = tmp_path / src.name
    shutil.copytree(src, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["stage1_policy"]["feature_names"] = list(reversed(m["stage1_policy"]["feature_names"]))
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexVersionError) as e:
        IndexVersion.load(bad)
    assert e.value.code == "schema"  # not a checksum failure: the manifest itself is not hashed


def test_only_router_queries_at_the_default_rho_feed_the_escalation_drift_ratio(client):
    """The drift alert divides escalations by routed queries and compares with the default ρ: funnel-policy
    queries (never 'escalated') and queries with a client's own ρ must not dilute it."""
    def counters():
        vals = {}
        for line in client.get("/metrics").text.splitlines():
            for name in ("adawidth_routed_queries_total", "adawidth_escalations_total"):
                if line.startswith(name + " "):
                    vals[name] = float(line.split()[-1])
        return vals

    before = counters()
    client.post("/v1/search", json={"query": QUERIES[2], "width": "auto"})              # the default, recall
    client.post("/v1/search", json={"query": QUERIES[2], "width": "auto", "policy": "router", "rho": 1.0})  # client rho
    assert counters() == before
