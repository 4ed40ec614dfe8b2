"""The trainer's capacity report on real data: SciFact (the session's adapter version) and LIMIT-small (δ ≫ 1).

Expected values are computed by hand from the qrels (δ, d*, r*); quality assertions are bounds the method must
meet on these collections (see bench/results/capacity/ for the measured numbers).
"""

import json
import math

import numpy as np
import pytest

from engine.version.manifest import verify
from tests.conftest import ROOT, VAR
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_scifact_version_carries_its_capacity_report(scifact_version):
    manifest = verify(scifact_version)  # the report files are checksummed like the rest
    for name in ("capacity.json", "capacity.md", "capacity_cliff.png", "capacity_cus.png", "capacity_scaling.png"):
        assert name in manifest.files
    for png in ("capacity_cliff.png", "capacity_cus.png", "capacity_scaling.png"):
        assert (scifact_version / png).read_bytes()[:8] == PNG_MAGIC
    cap = manifest.capacity
    assert cap["pairs"] == 339 and cap["documents"] == 5183 and cap["queries"] == 300
    assert cap["delta"] == pytest.approx(339 / 5183)
    assert cap["warren_dstar"] == 1 and cap["regime"] == "vacuous" and cap["r_star"] == 64
    # the adapter's 64-prefix finds more relevant top-1s than full width does (FINDINGS.md): labelled CUS > 1
    assert cap["cus_labelled"] > 1.0
    assert 0.3 < cap["cus_label_free"] < 0.9
    # label-free signals predict full-width failure better than chance
    assert cap["failure_auc_top1_stability"] > 0.6
    assert cap["failure_auc_margin_reference"] > 0.75
    fit = cap["scaling_fit"]
    assert fit["b_positive"] and fit["c_negative"] and fit["r2_mean"] > 0.8  # measured 0.849 (001: 0.905-0.973)
    base = cap["online_cus_baseline"]
    # the default 'auto' is the declared recall 0.99 now: its top-1 is (nearly always) the full-width top-1
    assert base["queries"] == 300 and base["policy"] == "auto: recall" and 0.95 <= base["agreement"] <= 1.0
    report = json.loads((scifact_version / "capacity.json").read_text())
    pq = report["per_query"]
    assert len(pq["query_ids"]) == 300 and sum(pq["failure"]) == report["failure_prediction"]["failures"]
    assert all(v is None or 1 <= v <= 384 for v in pq["m_first_full_corpus"]["10"]["m_first"])
    md = (scifact_version / "capacity.md").read_text()
    for section in ("## Density regime", "## Capacity Utilization Score", "## Failure prediction",
                    "## Dimension cliff", "## Prefix sufficiency", "R²_mean"):
        assert section in md
    cliff = cap["cliff"]
    assert cliff["widths"][-1] == 384
    nd = cliff["ndcg@10"]
    assert nd["easiest_decile"][-1] > nd["all"][-1] > nd["hardest_decile"][-1]


@pytest.fixture(scope="module")
def limit_small_version(tmp_path_factory, encoder_dir, encoder):
    home = tmp_path_factory.mktemp("limit-home")
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    path, manifest = build_index(BuildOptions(dataset=ROOT / "data" / "limit-small", rotation="identity"),
                                 settings, encoder)
    return path, manifest


def test_limit_small_comes_out_moderate_with_a_cliff_below_dstar(limit_small_version):
    """δ = 2000/46 ≫ 1: the moderate regime; d* = ⌈43.48 ln 46 / ln 43.48⌉ = 45 and CUS is read there."""
    path, manifest = limit_small_version
    cap = manifest.capacity
    assert cap["pairs"] == 2000 and cap["documents"] == 46 and cap["queries"] == 1000
    assert cap["delta"] == pytest.approx(2000 / 46)
    assert cap["warren_dstar"] == math.ceil(2000 / 46 * math.log(46) / math.log(2000 / 46)) == 45
    assert cap["regime"] == "moderate" and cap["r_star"] == 45
    # the frozen encoder's truncations lose relevant top-1s below d*: the cliff is visible in NDCG@10
    nd = dict(zip(cap["cliff"]["widths"], cap["cliff"]["ndcg@10"]["all"]))
    assert nd[8] < 0.8 * nd[384] and nd[16] < nd[384]
    lab = dict(zip(cap["cus_by_width"]["widths"], cap["cus_by_width"]["labelled"]))
    assert lab[8] < lab[384] == 1.0
    # no train split: no router, but the declared-recall default (calibrated on pseudo-queries) is baselined
    assert cap["online_cus_baseline"]["policy"] == "auto: recall" and cap["online_cus_baseline"]["queries"] == 1000
    report = json.loads((path / "capacity.json").read_text())
    assert report["cliff"]["recall@100_trivial"] is True
    assert np.isfinite(report["scaling"]["fit"]["r2_mean"])
