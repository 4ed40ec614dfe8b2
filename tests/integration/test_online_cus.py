"""Online label-free CUS: sampling off the request path, congruence with the trainer's baseline, and a degraded version.

The degraded version is the session's SciFact version served through a scrambling adapter: the PCA rotation of
its corpus with the coordinates reversed (R' = J P, J the reversal permutation), so the informative high-variance
directions sit in the tail and stage 1 and the routed widths read the least informative ones.  Full-width scores
are unchanged (R' is orthogonal).  It keeps the good version's manifest, capacity baseline included: the scenario
is a broken adapter deployed under an evaluated manifest, which only the online monitor can notice.  (Reversing
the served adapter's own coordinates is a weaker scramble here: the adapter starts from the identity, so its tail
is plain frozen-encoder coordinates, which still carry signal; measured online CUS 0.51 against 0.64.)
"""

import json
import os
import subprocess
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from adawidth.rotation import pca_rotation
from engine.io.beir import load_collection
from engine.version import files
from engine.version.manifest import read_manifest
from engine.version.store import write_version
from service.app import create_app
from service.config import GatewaySettings
from service.online_cus import OnlineCusMonitor
from tests.conftest import SCIFACT
from tests.integration.test_prometheus_rules import RULES, promtool

pytestmark = pytest.mark.integration


# ---- the monitor alone ------------------------------------------------------------------------------

def test_sampling_fraction_and_ineligible_queries():
    mon = OnlineCusMonitor(CollectorRegistry(), sample_rate=0.05, queue_size=100_000, seed=7, start=False)
    taken = sum(mon.offer(None, np.zeros(4, np.float32), ["d1"], "auto") for _ in range(4000))
    assert 140 <= taken <= 260  # Binomial(4000, 0.05): 200 ± 14
    assert not any(mon.offer(None, np.zeros(4), ["d1"], "full") for _ in range(200))
    assert not any(mon.offer(None, np.zeros(4), [], 64) for _ in range(200))
    off = OnlineCusMonitor(CollectorRegistry(), sample_rate=0.0, start=False)
    assert not any(off.offer(None, np.zeros(4), ["d1"], "auto") for _ in range(500))
    with pytest.raises(ValueError):
        OnlineCusMonitor(CollectorRegistry(), sample_rate=1.5, start=False)


def test_a_full_queue_drops_and_never_blocks():
    reg = CollectorRegistry()
    mon = OnlineCusMonitor(reg, sample_rate=1.0, queue_size=5, start=False)  # no worker: the queue fills up
    t0 = time.perf_counter()
    queued = [mon.offer(None, np.zeros(384, np.float32), ["d1"], "auto") for _ in range(50)]
    per_offer_s = (time.perf_counter() - t0) / 50
    assert sum(queued) == 5 and per_offer_s < 0.002
    assert reg.get_sample_value("adawidth_online_cus_dropped_total") == 45
    assert reg.get_sample_value("adawidth_online_cus_queue_depth") == 5


# ---- the gateway on a good and a degraded version --------------------------------------------------

def make_degraded_version(good: os.PathLike, home) -> str:
    """Copy ``good`` into ``home`` with the scrambling rotation J·PCA; returns the new version id."""
    good_manifest = read_manifest(good)
    R_good = np.load(os.path.join(good, "rotation.npy")).astype(np.float64)
    X = np.load(os.path.join(good, "docs.npy")).astype(np.float64) @ R_good  # the frozen embeddings back
    R = np.ascontiguousarray(pca_rotation(X)[::-1]).astype(np.float32)
    docs = np.ascontiguousarray(X @ R.T.astype(np.float64), dtype=np.float32)
    m0 = good_manifest.m0
    writers, _, _ = files.dense_files(R, docs, json.loads((good / "doc_ids.json").read_text()), m0)
    for meta in good_manifest.router.pairs.values():
        writers[meta.file] = (lambda src: (lambda p: p.write_bytes(src.read_bytes())))(good / meta.file)
    # a dense-only copy: the lexical lane's and the rerank tiers' files are not copied, so the manifest must not
    # announce them
    # nor the level store and recall policy (the degraded version serves 'auto' by the router, as the copy's
    # routers were fitted on the good rotation's scores)
    manifest = good_manifest.model_dump(mode="json", exclude={"files", "schema_version", "version", "lexical",
                                                               "rerank", "tiers", "levels", "recall_policy",
                                                               "policy"})
    manifest["adapter"] = dict(manifest["adapter"], kind="degraded: PCA rotation with coordinates reversed")
    version = "99991231T000000Z-degraded"
    write_version(home / "indexes" / "scifact", version, writers, manifest)
    return version


def online_counts(client) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if s.name.startswith(("adawidth_online_cus", "adawidth_escalation_target")):
                out[s.name + ("" if "policy" not in s.labels else "/" + s.labels["policy"])] = s.value
    return out


def serve_queries(settings: GatewaySettings, queries: list[str]) -> tuple[dict, dict]:
    app = create_app(settings, CollectorRegistry())
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        widths = []
        for q in queries:
            r = client.post("/v1/search", json={"query": q, "k": 10})
            assert r.status_code == 200
            widths.append(r.json()["trace"]["width"])
        assert app.state.gw.online_cus.wait_idle(120)
        counts = online_counts(client)
        live = app.state.gw.live
    return counts, {"widths": widths, "manifest": live.manifest}


@pytest.fixture(scope="module")
def online_runs(scifact_home, scifact_version, encoder_dir, tmp_path_factory):
    test = load_collection(SCIFACT, "test")
    queries = [test.queries[q] for q in test.judged_queries()]
    good, good_info = serve_queries(GatewaySettings(home=scifact_home, collection="scifact",
                                                    online_cus_sample_rate=1.0), queries)
    home = tmp_path_factory.mktemp("degraded-home")
    version = make_degraded_version(scifact_version, home)
    bad, bad_info = serve_queries(GatewaySettings(home=home, collection="scifact", version=version,
                                                  encoder_dir=encoder_dir, online_cus_sample_rate=1.0), queries)
    return {"queries": len(queries), "good": good, "bad": bad, "good_info": good_info, "bad_info": bad_info}


def rate(c: dict) -> float:
    return c["adawidth_online_cus_agreements_total/auto"] / c["adawidth_online_cus_samples_total/auto"]


def test_online_cus_on_the_good_version_matches_the_trainer_baseline(online_runs):
    good = online_runs["good"]
    n = online_runs["queries"]
    assert good["adawidth_online_cus_samples_total/auto"] == n == 300  # sample rate 1: every query compared
    assert good["adawidth_online_cus_dropped_total"] == 0
    base = online_runs["good_info"]["manifest"].capacity["online_cus_baseline"]
    assert base["queries"] == 300
    assert good["adawidth_online_cus_baseline_ratio"] == pytest.approx(base["agreement"])
    assert good["adawidth_escalation_target_ratio"] == pytest.approx(0.2)
    # same queries, same resolve(): the live rate reproduces the offline baseline (faiss vs brute-force ties aside)
    assert abs(rate(good) - base["agreement"]) <= 0.02, (rate(good), base)


def test_degraded_version_shows_in_the_online_cus(online_runs):
    good, bad = rate(online_runs["good"]), rate(online_runs["bad"])
    print(f"online CUS over {online_runs['queries']} SciFact test queries: good {good:.3f}, degraded {bad:.3f}, "
          f"baseline {online_runs['good']['adawidth_online_cus_baseline_ratio']:.3f}")
    assert online_runs["bad"]["adawidth_online_cus_samples_total/auto"] == 300
    assert bad < good - 0.25, (good, bad)
    assert bad < online_runs["bad"]["adawidth_online_cus_baseline_ratio"] - 0.10


def test_the_alert_fires_on_the_degraded_series_and_not_on_the_good_one(online_runs, tmp_path):
    """Counter series at the measured agreement rates (60 samples a minute) through the real rule, with promtool."""
    base = online_runs["good"]["adawidth_online_cus_baseline_ratio"]
    per_min = 60
    series = []
    for inst, r in (("gw-good:8000", rate(online_runs["good"])), ("gw-degraded:8000", rate(online_runs["bad"]))):
        lab = f'job="adawidth-gateway",instance="{inst}"'
        series += [
            {"series": f'adawidth_online_cus_samples_total{{{lab},policy="auto"}}', "values": f"0+{per_min}x60"},
            {"series": f'adawidth_online_cus_agreements_total{{{lab},policy="auto"}}',
             "values": f"0+{round(per_min * r)}x60"},
            {"series": f"adawidth_online_cus_baseline_ratio{{{lab}}}", "values": f"{base:.6f}+0x60"},
        ]
    alert = {"exp_labels": {"severity": "warning", "job": "adawidth-gateway", "instance": "gw-degraded:8000"},
             "exp_annotations": {
                 "summary": "Online CUS of gw-degraded:8000 is more than 0.10 below its index version's baseline",
                 "description": "The served top-1 agrees with the full-width top-1 less often than the trainer "
                                "measured offline for this version (query drift, catalog growth or a broken adapter). "
                                "Check the capacity report of the live version and consider retraining."}}
    spec = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"name": "measured good and degraded versions", "interval": "1m", "input_series": series,
                       "alert_rule_test": [
                           {"eval_time": "10m", "alertname": "AdawidthOnlineCusBelowBaseline", "exp_alerts": []},
                           {"eval_time": "45m", "alertname": "AdawidthOnlineCusBelowBaseline",
                            "exp_alerts": [alert]}]}]}
    path = tmp_path / "measured.test.yml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    r = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
