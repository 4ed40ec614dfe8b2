"""The ANN first stage (issue 19, :mod:`engine.ann`): backend selection by size and memory budget, memory per
document, effort tuning and choice, and policy ``recall`` through an ANN version (exact rescoring, targets the
backend cannot meet served exactly, restrictive filters)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engine import ann
from engine.index import IndexVersion
from engine.pipeline import Pipeline, capabilities
from engine.plan import SearchSpec
from engine.stage1 import AnnStage1
from service.models import Trace
from trainer.cli import ANN_CHOICES


def test_cli_choices_are_the_engines():
    assert ANN_CHOICES == ann.BACKEND_CHOICES


def test_auto_is_flat_below_ann_min_docs_and_float16_hnsw_above():
    small = ann.select_backend("auto", 199_999, 384, ann_min_docs=200_000)
    assert small.backend == "flat" and "ann_min_docs" in small.reason
    big = ann.select_backend("auto", 200_000, 384, ann_min_docs=200_000)
    assert big.backend == "hnsw_fp16"
    f32 = ann.select_backend("hnsw", 200_000, 384).bytes_per_document
    assert big.bytes_per_document["vectors"] == 2 * 384 and f32["vectors"] == 4 * 384
    assert big.bytes_per_document["graph"] == f32["graph"]
    assert big.needed_bytes == pytest.approx(big.bytes_per_document["total"] * 200_000, rel=1e-6)


def test_auto_above_ann_min_docs_also_times_the_level_scan_when_it_fits():
    n, d, level_bpd = 1_000_000, 384, 4.0 * 384 + 2 * 96 + 4 * 9
    got = ann.select_backend("auto", n, d, level_bytes_per_document=level_bpd, fp16_width=96)
    assert got.backend == "hnsw_fp16" and got.alternatives == ("flat",)
    flat = ann.select_backend("none", n, d, level_bytes_per_document=level_bpd, fp16_width=96).needed_bytes
    tight = ann.select_backend("auto", n, d, level_bytes_per_document=level_bpd, fp16_width=96,
                               memory_budget_bytes=flat - 1)
    assert tight.alternatives == ()  # the level scan does not fit: nothing to time it against
    assert ann.select_backend("hnsw", n, d, level_bytes_per_document=level_bpd).alternatives == ()  # forced kind
    assert ann.select_backend("auto", n, d).alternatives == ()  # built without levels


def test_pick_by_latency_keeps_the_lowest_p50_and_says_by_how_much():
    best, why = ann.pick_by_latency({"hnsw": {"p50_ms": 26.7, "recall_at_10": 0.991},
                                     "flat": {"p50_ms": 5.58, "recall_at_10": 0.990}})
    assert best == "flat" and "5.58 ms" in why and "hnsw 26.7 ms" in why
    assert ann.pick_by_latency({"ivf": {"p50_ms": 1.0, "recall_at_10": 0.99}})[0] == "ivf"
    with pytest.raises(ValueError, match="no backend"):
        ann.pick_by_latency({})
    with pytest.raises(ValueError, match="p50_ms"):
        ann.pick_by_latency({"flat": {"p50_ms": float("nan"), "recall_at_10": 1.0}})


def test_auto_falls_back_to_ivf_when_hnsw_does_not_fit():
    n, d = 1_000_000, 384
    ivf = ann.select_backend("ivf", n, d).needed_bytes
    assert ann.select_backend("hnsw_fp16", n, d).needed_bytes < ivf < ann.select_backend("hnsw", n, d).needed_bytes
    wide = {"M": 128}  # a graph of 2 x 128 links a node outweighs the float16 saving
    hnsw = ann.select_backend("hnsw_fp16", n, d, params=wide).needed_bytes
    assert ivf < hnsw
    got = ann.select_backend("auto", n, d, memory_budget_bytes=(ivf + hnsw) // 2, params=wide)
    assert got.backend == "ivf" and got.needed_bytes == ivf


def test_a_backend_over_budget_raises_with_the_bytes_needed():
    need = ann.select_backend("hnsw_fp16", 1_000_000, 384).needed_bytes  # the smallest of auto's candidates
    with pytest.raises(ann.MemoryBudgetError) as e:
        ann.select_backend("auto", 1_000_000, 384, memory_budget_bytes=10**9)
    assert isinstance(e.value, ValueError) and e.value.needed_bytes == need and e.value.budget_bytes == 10**9
    assert f"{need:,}" in str(e.value) and "1,000,000,000" in str(e.value)
    with pytest.raises(ann.MemoryBudgetError, match="flat needs"):
        ann.select_backend("none", 10_000, 384, memory_budget_bytes=1000)
    with pytest.raises(ValueError, match="--ann must be one of"):
        ann.select_backend("annoy", 10, 384)


def test_bytes_per_document_by_part():
    p = ann.default_params("hnsw_panorama", 1_000_000, M=16)
    b = ann.bytes_per_document("hnsw_panorama", 1_000_000, 384, p)
    assert b["vectors"] == 1536 and b["documents"] == 1536 and b["panorama"] == 4 * 9
    assert b["graph"] == pytest.approx(4 * (32 + 16 / 15) + 12, abs=0.01)
    assert b["total"] == pytest.approx(sum(v for k, v in b.items() if k != "total"), abs=0.05)
    ivf = ann.bytes_per_document("ivf", 1_000_000, 384, ann.default_params("ivf", 1_000_000))
    assert ivf["ids"] == 8 and ivf["graph"] == pytest.approx(4 * 384 * 4000 / 1e6, abs=0.01)
    flat = ann.bytes_per_document("flat", 1000, 384, level_bytes_per_document=2000.0, fp16_width=128)
    assert flat["float16"] == 256 and flat["levels"] == 1744 and flat["vectors"] == 0


def test_default_params():
    assert ann.default_params("ivf", 1_000_000).nlist == 4000
    assert ann.default_params("ivf", 1000).nlist == 25  # 1000 // 39: k-means keeps 39 points a list
    assert ann.default_params("hnsw", 10).M == 32 and ann.default_params("hnsw", 10).nlist == 0
    assert ann.effort_grid(ann.default_params("ivf", 20_000))[-1] == 512  # 20000 // 39
    with pytest.raises(ValueError):
        ann.default_params("lsh", 10)


def test_effort_for_reads_the_curve_with_its_margin():
    curve = [{"effort": 8, "recall": 0.9}, {"effort": 16, "recall": 0.96}, {"effort": 32, "recall": 0.994}]
    assert ann.effort_for(curve, 0.95) == 16
    assert ann.effort_for(curve, 0.95, margin_share=0.25) == 32  # goal 0.9625: 0.96 falls short
    assert ann.effort_for(curve, 0.99, 0.25) == 32 and ann.effort_for(curve, 0.99, 0.5) is None
    assert ann.effort_for(curve, 1.0) is None


def test_the_models_grid_stops_at_twice_the_tuned_effort_of_the_highest_target():
    hnsw = ann.default_params("hnsw", 10_000)
    curve = [{"effort": 64, "recall": 0.95}, {"effort": 128, "recall": 0.985}, {"effort": 192, "recall": 0.992}]
    grid = ann.model_efforts(hnsw, curve)  # 0.99 tuned at 192: the grid's first effort >= 384 ends it
    assert grid == tuple(e for e in ann.HNSW_EF_GRID if e <= 384)
    assert ann.model_efforts(hnsw, curve, margin_share=0.5) == ann.HNSW_EF_GRID  # goal 0.995: nothing reaches it
    ivf = ann.default_params("ivf", 10_000)  # nlist 256, nprobe 1, 2, 3, 4, 5, 7, 9, ...
    assert ann.model_efforts(ivf, [{"effort": 300, "recall": 0.991}]) == ann.effort_grid(ivf)  # 2 x 300 > nlist
    assert ann.model_efforts(ivf, [{"effort": 4, "recall": 0.991}])[-1] == 9
    assert ann.model_efforts(hnsw, curve, probe=32) == tuple(e for e in ann.HNSW_EF_GRID if 32 <= e <= 384)
    with pytest.raises(ValueError, match="not on the grid"):
        ann.model_efforts(hnsw, curve, probe=33)
    lower = ann.model_efforts(hnsw, curve, cap=1.25)  # 1.25 x 192 = 240: the grid's first effort >= 240 ends it
    assert lower == tuple(e for e in ann.HNSW_EF_GRID if e < 240) + tuple(e for e in ann.HNSW_EF_GRID if e >= 240)[:1]
    assert len(lower) < len(grid)
    with pytest.raises(ValueError, match="cap must be positive"):
        ann.model_efforts(hnsw, curve, cap=0)


def test_probe_candidates_span_the_grid_up_to_the_lowest_targets_effort_for_hnsw_only():
    hnsw = ann.default_params("hnsw", 10_000)
    curve = [{"effort": 10, "recall": 0.7}, {"effort": 99, "recall": 0.951}, {"effort": 516, "recall": 0.99}]
    got = ann.probe_candidates(hnsw, curve)  # 0.95 tuned at 99: grid efforts 10 .. 96, six of them
    assert got[0] == ann.HNSW_EF_GRID[0] and got[-1] == 96 and len(got) == ann.PROBE_CANDIDATES
    assert list(got) == sorted(set(got)) and set(got) <= set(ann.HNSW_EF_GRID)
    assert ann.probe_candidates(hnsw, [{"effort": 12, "recall": 0.96}]) == (10, 12)
    assert len(ann.probe_candidates(hnsw, [{"effort": 4096, "recall": 0.9}])) == ann.PROBE_CANDIDATES  # none tuned
    ivf = ann.default_params("ivf", 10_000)
    assert ann.probe_candidates(ivf, curve) == (1,)  # IVF resumes its probe: the cheapest only


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((40, 32))
    X = (centers[rng.integers(0, 40, 4000)] + 0.5 * rng.standard_normal((4000, 32))).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = (centers[rng.integers(0, 40, 300)] + 0.5 * rng.standard_normal((300, 32))).astype(np.float32)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    return X, Q[:200], Q[200:]


@pytest.mark.parametrize("kind", ann.ANN_KINDS)
def test_every_kind_tunes_and_serves_its_target(corpus, kind):
    X, Qt, Qe = corpus
    p = ann.default_params(kind, len(X), M=16)
    index = ann.build_index(X, p)
    curve = ann.tune_effort(index, p, X, Qt)
    assert [c["effort"] for c in curve] == sorted(c["effort"] for c in curve) and curve[-1]["recall"] > 0.95
    a = AnnStage1(index, p, curve, margin_share=0.25)
    v = IndexVersion.in_memory(X, np.eye(32, dtype=np.float32), [f"d{i}" for i in range(len(X))], m0=16,
                               ann=a)
    assert "recall" in capabilities(v).policies and v.stage1_backend == kind
    res = Pipeline().search(v, [SearchSpec("q", k=10, width="auto", recall_target=0.95)] * len(Qe), embeddings=Qe)
    truth = ann.exhaustive_top_k(X, Qe)
    assert ann.recall_at([r.rows for r in res], truth).mean() >= 0.94
    # exact up to float32 rounding; float16 documents: each coordinate within 2^-11 relative, so a unit query's
    # score within 2^-11 (Cauchy-Schwarz)
    atol = 2.0 ** -11 if kind == "hnsw_fp16" else 1e-6
    for r, q in zip(res, Qe):
        assert r.trace["policy"] == "recall" and r.trace["stage1_backend"] == kind
        assert r.trace["effort"] == a.effort(0.95) and r.trace["effort_name"] == ann.EFFORT_NAME[kind]
        np.testing.assert_allclose(r.scores, X[r.rows] @ q, rtol=1e-5, atol=atol)  # full width, as stored
        assert list(r.scores) == sorted(r.scores, reverse=True)
    Trace(**res[0].trace)


def test_refinement_bisects_between_grid_points_and_lands_nearer_the_goal(corpus):
    X, Qt, _ = corpus
    p = ann.default_params("hnsw", len(X), M=4, ef_construction=16)  # a weak graph: recall climbs over many efforts
    index = ann.build_index(X, p)
    grid = ann.tune_effort(index, p, X, Qt, stop_at=0.999)
    # a goal between two grid points that are at least 4 efforts apart
    i = next(i for i in range(1, len(grid)) if grid[i]["effort"] - grid[i - 1]["effort"] >= 4
             and grid[i]["recall"] - grid[i - 1]["recall"] > 0.002)
    g = (grid[i - 1]["recall"] + grid[i]["recall"]) / 2
    refined = ann.tune_effort(index, p, X, Qt, stop_at=0.999, refine_for=(g,), refine_steps=3)
    efforts = [c["effort"] for c in refined]
    assert efforts == sorted(set(efforts)) and set(c["effort"] for c in grid) < set(efforts)
    added = [e for e in efforts if grid[i - 1]["effort"] < e < grid[i]["effort"]]
    assert 1 <= len(added) <= 3  # one pass over the tuning queries per bisection
    for c in refined:  # the grid's points are measured as before
        same = next((x for x in grid if x["effort"] == c["effort"]), None)
        assert same is None or same == c
    e = ann.effort_for(refined, g)
    assert e <= ann.effort_for(grid, g) and next(c["recall"] for c in refined if c["effort"] == e) >= g
    assert ann.tune_effort(index, p, X, Qt, stop_at=0.999, refine_for=(1.01,)) == grid  # unreachable: unchanged


def test_targets_it_cannot_meet_and_thin_filters_are_served_exactly(corpus):
    X, Qt, Qe = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=20)
    index = ann.build_index(X, p)
    curve = [c for c in ann.tune_effort(index, p, X, Qt) if c["effort"] <= 16]  # a backend that tops out early
    a = AnnStage1(index, p, curve)
    v = IndexVersion.in_memory(X, np.eye(32, dtype=np.float32), [f"d{i}" for i in range(len(X))], m0=16,
                               ann=a)
    truth = ann.exhaustive_top_k(X, Qe[:5])
    pipe = Pipeline()
    for target, phrase in ((1.0, "certifies nothing"), (0.9999, "reached")):
        for r, t in zip(pipe.search(v, [SearchSpec("q", k=10, recall_target=target)] * 5, embeddings=Qe[:5]), truth):
            assert r.trace["policy"] == "exact" and phrase in r.trace["served_exact_because"]
            assert r.trace["recall_target"] == target and r.trace["stage1_backend"] == "flat"
            assert set(r.rows.tolist()) == set(t.tolist())
    allowed = np.zeros(len(X), bool)
    allowed[::50] = True  # 2 % of the documents
    r = pipe.search(v, [SearchSpec("q", k=10, recall_target=0.5)], embeddings=Qe[:1], allowed=allowed)[0]
    assert "filter allows 2.0%" in r.trace["served_exact_because"] and allowed[r.rows].all()
    allowed[::2] = True
    r = pipe.search(v, [SearchSpec("q", k=10, recall_target=0.5)], embeddings=Qe[:1], allowed=allowed)[0]
    assert r.trace["served_exact_because"] is None and allowed[r.rows].all() and len(r.rows) == 10


def test_exact_rerank_orders_ties_by_row():
    docs = np.array([[1, 0], [1, 0], [0, 1]], np.float32)
    rows, scores = ann.exact_rerank(docs, np.array([1, 0], np.float32), np.array([2, 1, 0]), 2)
    assert rows.tolist() == [0, 1] and scores.tolist() == [1.0, 1.0]
    rows, scores = ann.exact_rerank(docs, np.array([1, 0], np.float32), np.empty(0, np.int64), 2)
    assert len(rows) == 0 and scores.dtype == np.float64


def test_ranked_keeps_each_row_once_at_its_best_place_and_orders_ties_by_row():
    rows, scores = ann.ranked(np.array([7, 3, 5, 3, 9]), np.array([0.5, 0.9, 0.9, 0.9, 0.1], np.float32), 3)
    assert rows.tolist() == [3, 5, 7] and scores.tolist() == pytest.approx([0.9, 0.9, 0.5])
    rows, scores = ann.ranked(np.empty(0, np.int64), np.empty(0, np.float32), 3)
    assert len(rows) == 0 and scores.dtype == np.float64


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9])), max_size=30),
       st.integers(1, 12), st.booleans())
def test_ranked_matches_a_reference_sort_on_presorted_and_shuffled_input(pairs, k, presort):
    # presorted input takes the already-ordered fast path when scores strictly fall over distinct rows; either
    # path must give what a plain sort gives: each row at its best score, best first, ties by the lower row
    if presort:
        pairs = sorted(pairs, key=lambda p: -p[1])
    best = {}
    for r, s in pairs:
        best[r] = max(best.get(r, -1.0), s)
    expect = sorted(best.items(), key=lambda p: (-p[1], p[0]))[:k]
    rows, scores = ann.ranked(np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.float32), k)
    assert rows.dtype == np.int64 and scores.dtype == np.float64
    assert rows.tolist() == [r for r, _ in expect]
    assert scores.tolist() == pytest.approx([s for _, s in expect])


def test_the_per_query_effort_model_probes_chooses_and_meets_its_target(corpus):
    from trainer.recall_fit import effort_table, fit_recall_policy
    from engine.recall import RecallPolicy

    X, Qt, Qe = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    table = effort_table(index, p, X, Qt, k=10)
    assert table.recall.shape == (len(Qt), len(ann.HNSW_EF_GRID)) and table.feature_names == list(ann.EFFORT_FEATURES)
    assert np.all(np.diff(table.coordinates.mean(axis=0)[1:]) > 0)  # more effort, more work
    ev = ann.probe(index, "hnsw", Qe[0], 10, 10)
    assert ev.values["probe_s1"] >= ev.values["probe_sk"] and 0 <= ev.values["energy16"] <= ev.values["energy64"] <= 1 + 1e-5
    np.testing.assert_allclose(ev.values["probe_s1"], X[ev.rows[0]] @ Qe[0], rtol=1e-5)
    booster, oof = fit_recall_policy(table)
    policy = RecallPolicy(booster, table.feature_names, table.z_grid, "ann", oof, table.recall, k=10)
    curve = ann.tune_effort(index, p, X, Qt)
    a = AnnStage1(index, p, curve, effort_policy=policy)
    v = IndexVersion.in_memory(X, np.eye(32, dtype=np.float32), [f"d{i}" for i in range(len(X))], m0=16, ann=a)
    res = Pipeline().search(v, [SearchSpec("q", k=10, width="auto", recall_target=0.95)] * len(Qe), embeddings=Qe)
    truth = ann.exhaustive_top_k(X, Qe)
    assert ann.recall_at([r.rows for r in res], truth).mean() >= 0.94
    efforts = {r.trace["effort"] for r in res}
    assert efforts <= set(ann.HNSW_EF_GRID) and len(efforts) > 1  # chosen per query, not one effort
    for r in res:
        assert r.trace["effort_per_query"] is True and r.trace["probe_coordinates"] > 0
        assert r.trace["coordinates_scored"] >= r.trace["probe_coordinates"]
    Trace(**res[0].trace)
    # a k the model was not calibrated at: the target's one tuned effort
    r = Pipeline().search(v, [SearchSpec("q", k=20, width="auto", recall_target=0.95)], embeddings=Qe[:1])[0]
    assert r.trace["effort"] == a.effort(0.95)


@pytest.fixture(scope="module")
def hnsw_policy(corpus):
    """An HNSW index over the corpus and its per-query effort model (the trainer's table and fit)."""
    from trainer.recall_fit import effort_table, fit_recall_policy
    from engine.recall import RecallPolicy

    X, Qt, Qe = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    table = effort_table(index, p, X, Qt, k=10)
    booster, oof = fit_recall_policy(table)
    policy = RecallPolicy(booster, table.feature_names, table.z_grid, "ann", oof, table.recall, k=10)
    return index, policy


def test_the_compiled_probe_and_choice_equal_the_python_path(corpus, hnsw_policy):
    """engine.ann.probe_and_choose (faiss's probe, then adawidth._effort in one call) gives the Python path's
    evidence to the last bit, its candidates and its chosen effort, query by query, at both targets; a filtered
    request or a model over other features keeps the Python path."""
    X, Qt, Qe = corpus
    index, policy = hnsw_policy
    assert ann.fused_applies(index, "hnsw", policy, None)
    assert not ann.fused_applies(index, "hnsw", policy, np.ones(len(X), bool))
    probe = int(policy.z_grid[0])
    for target in (0.95, 0.99):
        chosen = []
        for q in Qe:
            ev = ann.probe(index, "hnsw", q, 10, probe)
            z = policy.choose(ev, target)[1]
            fev, fz = ann.probe_and_choose(index, "hnsw", q, 10, probe, policy, target)
            np.testing.assert_array_equal(fev.vector, ev.vector)  # bit for bit, NaN where the Python path has NaN
            assert fev.rows.tolist() == ev.rows.tolist() and fev.scores.tolist() == ev.scores.tolist()
            assert fev.work == ev.work and fev.effort == ev.effort and fz == z
            chosen.append(fz)
        assert len(set(chosen)) > 1  # chosen per query
    # a target no confidence meets on the calibration queries: exact, as RecallPolicy.choose says
    assert ann.probe_and_choose(index, "hnsw", Qe[0], 10, probe, policy, 1.0)[1] is None


def _two_calls(index, q, policy, target, prefix=None):
    """What AnnStage1.per_query served before serve_per_query: the compiled probe and choice, then the
    continuation on from the probe's search (rows, scores, efSearch, work, probe's work)."""
    grid = policy.z_grid
    ev, z = ann.probe_and_choose(index, "hnsw", q, 10, int(grid[0]), policy, target, prefix, resume=True)
    effort = max(int(grid[-1]) if z is None else int(z), int(grid[0]))
    hits = ann.continue_search(index, "hnsw", q, 10, ev, effort)
    return hits.rows.tolist(), np.asarray(hits.scores, np.float64).tolist(), effort, hits.work, ev.work


def test_the_one_call_per_query_serves_what_the_probe_then_the_continuation_serve(corpus, hnsw_policy):
    """engine.ann.serve_per_query (adawidth._hnsw Search.serve: probe, evidence, choice and continuation in one
    call) serves each query's rows, scores, efSearch and work exactly as probe_and_choose then continue_search do,
    at both targets, with and without an energy prefix; the efforts differ per query and some go past the probe."""
    X, Qt, Qe = corpus
    index, policy = hnsw_policy
    for target in (0.95, 0.99):
        efforts = []
        for i, q in enumerate(Qe):
            pre = None if i % 2 else Qe[(i + 1) % len(Qe)]  # another query's coordinates: the energies differ
            hits, effort, probe_work = ann.serve_per_query(index, q, 10, policy, target, pre)
            got = (hits.rows.tolist(), np.asarray(hits.scores, np.float64).tolist(), effort, hits.work, probe_work)
            assert got == _two_calls(index, q, policy, target, pre)
            efforts.append(effort)
        assert len(set(efforts)) > 1 and max(efforts) > policy.z_grid[0]
    assert ann.serve_per_query(index, Qe[0], 10, policy, 1.0) is None  # served exactly: not this call's
    # the stage serves it (one_call, the default) and answers as its two-call comparison does
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    curve = ann.tune_effort(index, p, X, Qt)
    one, two = (AnnStage1(index, p, curve, effort_policy=policy, one_call=c) for c in (True, False))
    for q in Qe[:30]:
        (h1, e1, w1), (h2, e2, w2) = one.per_query(q, 0.95, 10), two.per_query(q, 0.95, 10)
        assert (h1.rows.tolist(), h1.work, e1, w1) == (h2.rows.tolist(), h2.work, e2, w2)
    f, v = policy.forest, np.empty(len(ann.EFFORT_FEATURES))
    D, I = np.empty(10, np.float32), np.empty(10, np.int64)
    for bad in ({"threshold": f.threshold.astype(np.float32)}, {"D": D.astype(np.float64)}, {"I": I[:5]}):
        args = {"threshold": f.threshold, "D": D, "I": I, **bad}
        with pytest.raises(ValueError):
            ann.ResumableHnsw(ann.graph_of(index), Qe[0], 10).search.serve(
                f.feature, args["threshold"], f.left, f.right, f.flags, f.roots, f.leaves, f.n_features, Qe[0],
                policy.z_grid, 0.5, False, v, args["D"], args["I"])


def test_the_one_call_hands_tied_probes_to_the_python_choice_on_the_same_search(corpus):
    """An index holding every document twice ties every probe's scores: Search.serve returns -2 after the probe,
    and serve_per_query ranks it and goes on from the same search as the two calls do."""
    from trainer.recall_fit import effort_table, fit_recall_policy
    from engine.recall import RecallPolicy

    X, Qt, Qe = corpus
    X2 = np.repeat(X[:1500], 2, axis=0)
    p = ann.default_params("hnsw", len(X2), M=8, ef_construction=40)
    index = ann.build_index(X2, p)
    table = effort_table(index, p, X2, Qt[:100], k=10)
    booster, oof = fit_recall_policy(table)
    policy = RecallPolicy(booster, table.feature_names, table.z_grid, "ann", oof, table.recall, k=10)
    g = ann.graph_of(index)
    f = policy.forest
    for q in Qe[:20]:
        state = ann.ResumableHnsw(g, q, 10)
        D, I, v = np.empty(10, np.float32), np.empty(10, np.int64), np.empty(len(ann.EFFORT_FEATURES))
        j = state.search.serve(f.feature, f.threshold, f.left, f.right, f.flags, f.roots, f.leaves, f.n_features,
                               q, policy.z_grid, float(policy.bar(0.95)), policy.monotone_z, v, D, I)[0]
        assert j == -2 and state.search.ef == max(int(policy.z_grid[0]), 10)  # the probe only
        hits, effort, probe_work = ann.serve_per_query(index, q, 10, policy, 0.95)
        got = (hits.rows.tolist(), np.asarray(hits.scores, np.float64).tolist(), effort, hits.work, probe_work)
        assert got == _two_calls(index, q, policy, 0.95)
    with pytest.raises(ValueError, match="has run already"):
        state.search.serve(f.feature, f.threshold, f.left, f.right, f.flags, f.roots, f.leaves, f.n_features,
                           q, policy.z_grid, 0.5, False, v, D, I)


def test_the_compiled_choice_hands_answers_that_need_ranking_back_to_python():
    """adawidth._effort.probe_choice returns -2 (the Python path ranks the answer) for tied scores, a row twice
    or a -1 before a label, and counts the candidates before faiss's -1 padding."""
    from adawidth import _effort

    one = np.zeros(1, np.int32)  # a one-leaf forest: every row scores 1.0
    forest = (np.zeros(0, np.int32), np.zeros(0), one[:0], one[:0], one[:0], np.array([~0], np.int32),
              np.array([1.0]))
    F = len(ann.EFFORT_FEATURES)
    prefix = np.full(64, 0.125, np.float32)
    z = np.array([10.0, 20.0])

    def call(D, I, bar=0.5):
        v = np.empty(F)
        j, n = _effort.probe_choice(*forest, F + 1, np.asarray(D, np.float32), np.asarray(I, np.int64), 7.0,
                                    prefix, z, bar, False, v)
        return j, n, v

    j, n, v = call([0.9, 0.8, 0.0], [5, 3, -1])
    assert (j, n) == (0, 2) and v[6] == 2 and v[7] == 7.0 and v[0] == np.float32(0.9) and v[9] == 64 * 0.125 ** 2
    assert np.isnan(v[10:]).all()
    assert call([0.9, 0.8, 0.7], [5, 3, 1], bar=2.0)[0] == -1  # nothing clears the bar
    assert call([0.9, 0.9, 0.7], [5, 3, 1])[0] == -2  # a tie
    assert call([0.9, 0.8, 0.7], [5, 5, 1])[0] == -2  # a row twice
    assert call([0.9, 0.0, 0.7], [5, -1, 1])[0] == -2  # a label after the padding
    with pytest.raises(ValueError):
        call([0.9], [5, 3])


def test_merging_a_probe_into_its_continuation_ranks_the_union_with_or_without_the_shortcut():
    """merge_with_probe skips the concatenation when the continuation already holds every probe candidate; both
    ways give the best k of the union, a row found twice counted once, ties by the lower row."""
    ev = ann.AnnEvidence(np.zeros(len(ann.EFFORT_FEATURES)), np.array([4, 9, 2], np.int64),
                         np.array([0.9, 0.8, 0.7]), work=30, effort=10)
    covered = ann.AnnHits(np.array([4, 7, 9, 2], np.int64), 50, scores=np.array([0.9, 0.85, 0.8, 0.7], np.float32))
    got = ann.merge_with_probe(ev, covered, 3)
    assert got.rows.tolist() == [4, 7, 9] and got.work == 80
    missed = ann.AnnHits(np.array([7, 4, 1], np.int64), 50, scores=np.array([0.85, 0.9, 0.8], np.float32))
    got = ann.merge_with_probe(ev, missed, 4)  # 9 only in the probe, tied with 1 at 0.8: the lower row first
    assert got.rows.tolist() == [4, 7, 1, 9] and got.work == 80
    np.testing.assert_allclose(got.scores, [0.9, 0.85, 0.8, 0.8], rtol=1e-6)


def test_the_effort_models_rows_are_the_evidence_beside_each_effort_in_any_feature_order(corpus, hnsw_policy):
    """RecallPolicy._rows: the evidence in the model's own order goes in as it is; another order (or a feature
    the evidence lacks, NaN) is gathered by name; both give the same prediction."""
    X, Qt, Qe = corpus
    index, policy = hnsw_policy
    ev = ann.probe(index, "hnsw", Qe[0], 10, 10)
    rows = policy._rows(ev)
    assert rows.shape == (len(policy.z_grid), len(ann.EFFORT_FEATURES) + 1)
    np.testing.assert_array_equal(rows[:, :-1], np.broadcast_to(ev.vector, rows[:, :-1].shape))
    np.testing.assert_array_equal(rows[:, -1], policy.z_grid)

    class Reordered:  # the same evidence, its features reversed and the last one missing
        def features(self, k):
            return {n: v for n, v in reversed(list(ev.values.items())[:-1])}

    other = policy._rows(Reordered())
    np.testing.assert_array_equal(other[:, :-2], rows[:, :-2])
    assert np.isnan(other[:, -2]).all()
    np.testing.assert_array_equal(policy.predict(ev), policy.forest.predict(rows))


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_effort_tables_per_probe_equal_the_served_continuation(corpus, kind):
    """Every probe's table, reassembled from one search per effort (HNSW), is what continue_search serves."""
    from trainer.recall_fit import effort_table, effort_tables

    X, Qt, _ = corpus
    p = ann.default_params(kind, len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    grid = ann.effort_grid(p)[:8]
    probes = (grid[0], grid[2], grid[5])
    tables = effort_tables(index, p, X, Qt[:40], k=10, efforts=grid, probes=probes)
    assert set(tables) == set(probes)
    for probe in probes:
        alone = effort_table(index, p, X, Qt[:40], k=10, efforts=tuple(e for e in grid if e >= probe))
        got = tables[probe]
        assert got.z_grid.tolist() == alone.z_grid.tolist() and got.z_grid[0] == probe
        np.testing.assert_array_equal(got.recall, alone.recall)
        np.testing.assert_array_equal(got.coordinates, alone.coordinates)
        np.testing.assert_array_equal(got.features, alone.features)
    with pytest.raises(ValueError, match="not on the effort grid"):
        effort_tables(index, p, X, Qt[:4], efforts=grid, probes=(grid[1] + 10_000,))


def test_each_target_probes_where_its_calibrated_median_work_is_lowest(corpus):
    from trainer.recall_fit import calibrated_p50_work, effort_tables, fit_effort_models

    X, Qt, _ = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    curve = ann.tune_effort(index, p, X, Qt)
    targets = (0.9, 0.95, 0.99)
    fits = fit_effort_models(index, p, X, Qt, curve, k=10, targets=targets)
    report = fits[0].probes
    assert set(report) == {str(e) for e in ann.probe_candidates(p, curve)}
    assert sorted(t for f in fits for t in f.targets) == list(targets)  # every target in exactly one model
    assert len({f.probe for f in fits}) == len(fits)  # one model per probe
    assert [f.targets[0] for f in fits] == sorted(f.targets[0] for f in fits)
    for f in fits:
        assert f.table.z_grid[0] == f.probe and f.oof.shape == f.table.recall.shape
        assert f.booster.num_feature() == len(ann.EFFORT_FEATURES) + 1
        for t in f.targets:  # the probe with the lowest calibrated median work at the target
            work = {int(e): r["p50_work"][f"{t:g}"] for e, r in report.items()}
            assert work[f.probe] == min(work.values())
    # the report's figures are calibrated_p50_work on the probe's own table (as served from that probe)
    probes = tuple(int(e) for e in report)
    grid = tuple(sorted(set(ann.model_efforts(p, curve)) | set(probes)))
    table = effort_tables(index, p, X, Qt, k=10, efforts=grid, probes=probes)[fits[0].probe]
    assert calibrated_p50_work(table, fits[0].oof, fits[0].targets[0]) == pytest.approx(
        report[str(fits[0].probe)]["p50_work"][f"{fits[0].targets[0]:g}"], abs=0.1)
    with pytest.raises(ValueError, match="at least one recall target"):
        fit_effort_models(index, p, X, Qt, curve, targets=())
    # a fixed probe (bench.probe_sweep): one model for every target, probing there, with that probe's figures
    other = next(e for e in probes if e != fits[0].probe)
    (alone,) = fit_effort_models(index, p, X, Qt, curve, k=10, targets=targets, probes=(other,))
    assert alone.probe == other and alone.targets == targets and alone.table.z_grid[0] == other
    assert alone.probes[str(other)] == report[str(other)]
    for bad in ((), (0, other)):
        with pytest.raises(ValueError, match="probes must be positive efforts"):
            fit_effort_models(index, p, X, Qt, curve, targets=targets, probes=bad)


def test_each_target_is_served_by_its_own_models_probe(corpus):
    """Two models with different probes: a request takes the nearest target's model, and its probe is the one
    searched first."""
    from trainer.recall_fit import effort_tables, fit_recall_policy
    from engine.recall import RecallPolicy

    X, Qt, Qe = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    curve = ann.tune_effort(index, p, X, Qt)
    grid = ann.effort_grid(p)[:10]
    tables = effort_tables(index, p, X, Qt, k=10, efforts=grid, probes=(grid[0], grid[3]))
    pol = {}
    for probe, table in tables.items():
        booster, oof = fit_recall_policy(table)
        pol[probe] = RecallPolicy(booster, table.feature_names, table.z_grid, "ann", oof, table.recall, k=10)
    a = AnnStage1(index, p, curve, target_policies={0.95: pol[grid[3]], 0.99: pol[grid[0]]})
    assert a.effort_policy is pol[grid[3]]  # the lowest target's model stands for the version's model
    assert [a.probe_effort(t) for t in (0.9, 0.95, 0.969, 0.97, 0.99)] == [grid[3]] * 3 + [grid[0]] * 2
    for target, probe in ((0.95, grid[3]), (0.99, grid[0])):
        hits, effort, probe_work = a.per_query(Qe[0], target, 10)
        assert effort >= probe and probe_work == ann.probe(index, "hnsw", Qe[0], 10, probe).work
    assert AnnStage1(index, p, curve).probe_effort(0.95) is None


def test_a_version_keeps_every_targets_model_and_loads_each_with_its_probe(corpus, tmp_path):
    """Two effort models written by the version's writers (manifest, checksummed files) load back as they were
    fitted: each target's model, its probe, which targets the model serves."""
    from engine.version import files, store
    from trainer.recall_fit import effort_tables, fit_recall_policy

    X, Qt, Qe = corpus
    N, D = X.shape
    p = ann.default_params("hnsw", N, M=8, ef_construction=40)
    index = ann.build_index(X, p)
    curve = ann.tune_effort(index, p, X, Qt)
    grid = ann.effort_grid(p)[:10]
    tables = effort_tables(index, p, X, Qt, k=10, efforts=grid, probes=(grid[0], grid[3]))
    models = []
    for probe, target in ((grid[3], 0.95), (grid[0], 0.99)):
        t = tables[probe]
        booster, oof = fit_recall_policy(t)
        models.append({"booster": booster, "oof": oof, "recall": t.recall, "coordinates": t.coordinates,
                       "section": {"feature_names": list(t.feature_names), "z_grid": [float(z) for z in t.z_grid],
                                   "targets": [target], "per_query_targets": [target],
                                   "measured": {f"{target:g}": {}}}})
    writers, core, stage1 = files.dense_files(np.eye(D), X, [f"d{i}" for i in range(N)], 16)
    ann_writers, section = files.ann_files(index, p, curve, effort_model=models,
                                           targets={"0.95": ann.effort_for(curve, 0.95)})
    writers.update(ann_writers)
    assert section.effort_model.targets == [0.95] and [m.targets for m in section.more_effort_models] == [[0.99]]
    manifest = {"collection": "c", "encoder": {"onnx_sha256": "abc", "max_tokens": 256}, "dimension": D, "m0": 16,
                "shortlist": 50, "core": core, "stage1": stage1, "corpus": {"documents": N}, "ann": section}
    path = store.write_version(tmp_path / "c", "v1", writers, manifest)
    v = IndexVersion.load(path)
    m = v.manifest.ann
    assert {m.effort_model.file, m.more_effort_models[0].file} == {"ann_effort.txt", "ann_effort_1.txt"}
    assert {"ann_effort_calibration.npy", "ann_effort_calibration_1.npy"} <= set(v.manifest.files)
    assert v.backend_report()["probe_effort"] == {"0.95": grid[3], "0.99": grid[0]}
    for target, probe, t in ((0.95, grid[3], tables[grid[3]]), (0.99, grid[0], tables[grid[0]])):
        pol = v.ann.policy_for(target)
        assert int(pol.z_grid[0]) == probe
        np.testing.assert_array_equal(pol.calibration_recall, t.recall)
        _, effort, probe_work = v.ann.per_query(np.ascontiguousarray(Qe[0] @ v.rotation.T, np.float32), target, 10)
        assert effort >= probe and probe_work == ann.probe(index, "hnsw", Qe[0], 10, probe).work


def test_the_model_serves_the_targets_the_build_measured_it_faster_at_and_their_neighbours(corpus):
    X, Qt, Qe = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    curve = ann.tune_effort(index, p, X, Qt)
    assert not AnnStage1(index, p, curve).uses_model(0.95)  # no model
    a = AnnStage1(index, p, curve, effort_policy=object(), model_targets={0.95: False, 0.99: True})
    assert [a.uses_model(t) for t in (0.9, 0.95, 0.969, 0.97, 0.99, 0.999)] == [False, False, False, True, True, True]
    assert AnnStage1(index, p, curve, effort_policy=object()).uses_model(0.5)  # None: every target
    assert not AnnStage1(index, p, curve, effort_policy=object(), model_targets={}).uses_model(0.99)  # none measured
    # a target the model does not serve: the one tuned effort, no probe
    hits, effort, probe_work = a.per_query(Qe[0], 0.95, 10)
    assert effort == a.effort(0.95) and probe_work == 0


@pytest.mark.parametrize("kind", ["ivf", "ivf_panorama"])
def test_an_ivf_probe_resumes_and_costs_what_one_search_at_its_effort_costs(corpus, kind):
    X, Qt, Qe = corpus
    p = ann.default_params(kind, len(X))
    index = ann.build_index(X, p)
    truth = ann.exhaustive_top_k(X, Qe)
    allowed = np.ones(len(X), bool)
    allowed[1::3] = False
    for q in Qe[:20]:
        ev = ann.probe(index, kind, q, 10, 2)
        assert ev.effort == 2 and len(ev.centroid_lists) == p.nlist == len(set(ev.centroid_lists.tolist()))
        assert np.all(np.diff(ev.centroid_scores) <= 0)  # every centroid, best first
        assert ann.continue_search(index, kind, q, 10, ev, 1).rows is ev.rows  # at or below the probe's effort
        for effort in (2, 3, 5, p.nlist):
            one = ann.search(index, kind, q, 10, effort)
            got = ann.continue_search(index, kind, q, 10, ev, effort)
            # the same lists, each scanned once: the same top 10 and the same work as one search at that effort
            assert ann.exact_rerank(X, q, got.rows, 10)[0].tolist() == ann.exact_rerank(X, q, one.rows, 10)[0].tolist()
            assert got.work == one.work
        fev = ann.probe(index, kind, q, 10, 2, allowed)
        got = ann.continue_search(index, kind, q, 10, fev, p.nlist, allowed)
        assert allowed[got.rows].all() and len(got.rows) >= 10
    # scanning on to every list is exhaustive search
    ev = ann.probe(index, kind, Qe[0], 10, 1)
    rows = ann.exact_rerank(X, Qe[0], ann.continue_search(index, kind, Qe[0], 10, ev, p.nlist).rows, 10)[0]
    assert set(rows.tolist()) == set(truth[0].tolist())


def test_the_probe_reads_centroid_distances_for_ivf_and_leaves_them_missing_for_hnsw(corpus):
    X, Qt, Qe = corpus
    ivf = ann.build_index(X, ann.default_params("ivf", len(X)))
    ev = ann.probe(ivf, "ivf", Qe[0], 10, 1)
    assert tuple(ev.values) == ann.EFFORT_FEATURES
    c = ev.centroid_scores
    assert ev.values["centroid_c1"] == pytest.approx(float(c[0])) and ev.values["centroid_gap2"] >= 0
    gaps = [ev.values[f"centroid_gap{j}"] for j in ann.CENTROID_RANKS]
    assert gaps == sorted(gaps)  # gaps grow with the rank
    above = [ev.values[f"centroids_above_sk_{d:g}"] for d in ann.CENTROID_MARGINS]
    assert above == sorted(above) and above[0] == np.count_nonzero(c[:64] >= ev.values["probe_sk"])
    assert len(c) == 102 and ev.values["centroid_gap64"] == pytest.approx(float(c[0] - c[63]))  # nlist 102
    hnsw = ann.build_index(X, ann.default_params("hnsw", len(X), M=8))
    hv = ann.probe(hnsw, "hnsw", Qe[0], 10, 10)
    assert all(np.isnan(hv.values[n]) for n in ann.EFFORT_FEATURES if n.startswith("centroid"))
    assert hv.centroid_lists is None and ann.continue_search(hnsw, "hnsw", Qe[0], 10, hv, 10).rows is hv.rows


def test_an_index_over_the_documents_as_encoded_serves_the_embedding_and_rotates_only_the_evidence_prefix():
    """engine.ann.index_space: HNSW scores at full width, so the build indexes the documents as encoded; the
    pipeline searches with the query embedding, rotates only the effort model's evidence prefix, and serves what
    the stage serves for that embedding and prefix; a model fitted without the energy features (as such a build
    fits it) rotates nothing."""
    from engine.stages import stage1 as stage1_mod
    from engine.stages.rotate import reach
    from engine.plan import PlanDefaults, resolve_plan
    from trainer.recall_fit import effort_table, fit_recall_policy
    from engine.recall import RecallPolicy

    assert [ann.index_space(k) for k in ann.ANN_KINDS] == ["embedding", "embedding", "rotated", "rotated",
                                                           "embedding"]
    with pytest.raises(ValueError, match="ANN kind"):
        ann.index_space("flat")
    rng = np.random.default_rng(3)
    D = 96
    centers = rng.standard_normal((30, D))
    X = (centers[rng.integers(0, 30, 3000)] + 0.6 * rng.standard_normal((3000, D))).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = (centers[rng.integers(0, 30, 260)] + 0.6 * rng.standard_normal((260, D))).astype(np.float32)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    R = np.linalg.qr(rng.standard_normal((D, D)))[0].astype(np.float32)
    X_rot, Q_rot = X @ R.T, Q @ R.T
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    table = effort_table(index, p, X, Q[:200], k=10, prefixes=Q_rot[:200, :ann.ENERGY_PREFIX])
    ev = ann.probe(index, "hnsw", Q[0], 10, 10, prefix=Q_rot[0, :ann.ENERGY_PREFIX])
    assert ev.values["energy16"] == pytest.approx(float(Q_rot[0, :16] @ Q_rot[0, :16]), rel=1e-5)
    assert ev.values["energy64"] == pytest.approx(float(Q_rot[0, :64] @ Q_rot[0, :64]), rel=1e-5)
    np.testing.assert_array_equal(table.features[0], ev.vector)
    booster, oof = fit_recall_policy(table)
    policy = RecallPolicy(booster, table.feature_names, table.z_grid, "ann", oof, table.recall, k=10)
    curve = ann.tune_effort(index, p, X, Q[:200])
    with pytest.raises(ValueError, match="index space"):
        AnnStage1(index, p, curve, space="raw")
    a = AnnStage1(index, p, curve, effort_policy=policy, space="embedding")
    v = IndexVersion.in_memory(X_rot, R, [f"d{i}" for i in range(len(X))], m0=16, ann=a)
    spec = SearchSpec("q", k=10, width="auto", recall_target=0.95)
    plan = resolve_plan(spec, PlanDefaults(), capabilities(v))
    assert reach(plan, v) == ann.ENERGY_PREFIX < D
    Qe = Q[200:]
    res = Pipeline().search(v, [spec] * len(Qe), embeddings=Qe)
    for r, q, qr in zip(res, Qe, Q_rot[200:]):
        hits, effort, _ = a.per_query(q, 0.95, 10, prefix=qr[:ann.ENERGY_PREFIX])
        assert r.rows.tolist() == hits.rows.tolist() and r.trace["effort"] == effort
    truth = ann.exhaustive_top_k(X_rot, Q_rot[200:])  # the rotated documents' exhaustive top 10: the same ranking
    assert ann.recall_at([r.rows for r in res], truth).mean() >= 0.94
    np.testing.assert_allclose(res[0].scores, X_rot[res[0].rows] @ Q_rot[200], rtol=1e-4)
    with pytest.raises(ValueError, match="searched with the embedding"):
        stage1_mod.stage1(plan, v, Q_rot[200, :ann.ENERGY_PREFIX], None)
    fixed = IndexVersion.in_memory(X_rot, R, v.doc_ids, m0=16, ann=AnnStage1(index, p, curve, space="embedding"))
    assert reach(plan, fixed) == 0  # one tuned effort: no evidence, nothing rotated
    r = Pipeline().search(fixed, [spec], embeddings=Qe[:1])[0]
    assert r.rows.tolist() == ann.search(index, "hnsw", Qe[0], 10, fixed.ann.effort(0.95)).rows.tolist()
    assert a.needs_prefix(0.95) == (policy.reads("energy16") or policy.reads("energy64")) is True
    # a model fitted with the energy features missing (engine.ann.ENERGY_FEATURES): nothing rotated, the
    # same answers as the stage given no prefix at all, whatever the energies read
    from trainer.recall_fit import effort_tables
    blind = effort_tables(index, p, X, Q[:200], k=10, efforts=tuple(table.z_grid.astype(int)), energy=False)
    blind = blind[int(table.z_grid[0])]
    cols = [ann.EFFORT_FEATURES.index(n) for n in ann.ENERGY_FEATURES]
    assert np.isnan(blind.features[:, cols]).all() and not np.isnan(blind.features[:, :6]).any()
    np.testing.assert_array_equal(np.delete(blind.features, cols, 1), np.delete(table.features, cols, 1))
    booster, oof = fit_recall_policy(blind)
    unaware = RecallPolicy(booster, blind.feature_names, blind.z_grid, "ann", oof, blind.recall, k=10)
    assert not unaware.reads("energy16") and not unaware.reads("energy64") and unaware.reads("probe_s1")
    b = AnnStage1(index, p, curve, effort_policy=unaware, space="embedding")
    assert not b.needs_prefix(0.95) and b.uses_model(0.95)
    w = IndexVersion.in_memory(X_rot, R, v.doc_ids, m0=16, ann=b)
    assert reach(plan, w) == 0
    res = Pipeline().search(w, [spec] * len(Qe), embeddings=Qe)
    for r, q, qr in zip(res, Qe, Q_rot[200:]):
        for pre in (None, qr[:ann.ENERGY_PREFIX]):  # the energies differ, no split reads them
            hits, effort, _ = b.per_query(q, 0.95, 10, prefix=pre)
            assert r.rows.tolist() == hits.rows.tolist() and r.trace["effort"] == effort
    assert len({r.trace["effort"] for r in res}) > 1  # the model still chooses per query
    assert ann.recall_at([r.rows for r in res], truth).mean() >= 0.94


@pytest.mark.parametrize("kind", ["hnsw", "hnsw_fp16"])
def test_the_resumable_search_is_faiss_s_beam_search(corpus, kind):
    """engine.ann.ResumableHnsw over faiss's own graph and vectors finds faiss's candidates with faiss's scores and
    distance count at every efSearch (a fresh search is the same algorithm), and a search widened from a probe
    through the grid ends as converged as a fresh one: recall within a query in a hundred of it."""
    import faiss

    X, Qt, Qe = corpus
    p = ann.default_params(kind, len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    g = ann.graph_of(index)
    assert g is not None and ann.graph_of(index) is g  # made once per index
    truth = ann.exhaustive_top_k(X, Qe)
    for ef in (10, 24, 64):
        ours, theirs, resumed, same = [], [], [], 0
        for q in Qe:
            D, I, ndis = ann.ResumableHnsw(g, q, 10).run(ef)
            fd, fi, fn = ann._hnsw_search(index, q[None], 10, ann._hnsw_params(ef))
            ours.append(I)
            theirs.append(fi[0])
            same += I.tolist() == fi[0].tolist() and ndis == fn
            np.testing.assert_allclose(D[I >= 0], fd[0][fi[0] >= 0], rtol=0, atol=1e-5)
            s = ann.ResumableHnsw(g, q, 10)
            s.run(10)
            for e in (16, ef):
                s.run(e)
            resumed.append(s.run(ef)[1])
        assert same >= 0.97 * len(Qe)  # the rest differ by float rounding of a near tie
        r_ours, r_theirs = ann.recall_at(ours, truth).mean(), ann.recall_at(theirs, truth).mean()
        assert abs(r_ours - r_theirs) <= 0.005
        assert ann.recall_at(resumed, truth).mean() >= r_ours - 0.01
    # the served search of an unfiltered HNSW is this one; a filtered one is faiss's
    hits = ann.search(index, kind, Qe[0], 10, 24)
    assert hits.rows.tolist() == ann.ResumableHnsw(g, Qe[0], 10).run(24)[1].tolist()
    assert ann.resumable_graph(faiss.IndexFlatIP(32)) is None


def test_the_resumable_search_keeps_its_state_and_rejects_bad_input(corpus):
    """A widened search never loses a candidate it had (its beam only improves), counts every distance once over
    its runs, answers a narrower ef from its state without searching, pads a short answer with -1; interleaved
    searches of one graph do not disturb each other (each takes a visited table of its own); bad shapes raise."""
    from adawidth import _hnsw

    X, _, Qe = corpus
    p = ann.default_params("hnsw", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    g = ann.graph_of(index)
    a, b = ann.ResumableHnsw(g, Qe[0], 10), ann.ResumableHnsw(g, Qe[1], 10)
    Da, Ia, na = a.run(16)
    Db, Ib, nb = b.run(16)
    Da2, Ia2, na2 = a.run(64)
    assert na2 > na and (Da2 >= Da - 1e-7).all()  # the k-th best only improves
    assert a.run(32)[2] == na2 and a.run(32)[1].tolist() == Ia2.tolist()  # narrower: no search, same answer
    assert ann.ResumableHnsw(g, Qe[1], 10).run(16)[1].tolist() == Ib.tolist()  # not disturbed by a's runs
    whole = ann.ResumableHnsw(g, Qe[0], 5000)
    D, I, _ = whole.run(5)
    assert (I >= 0).sum() <= len(X) and (I[I < 0] == -1).all() and np.isfinite(D[I >= 0]).all()
    with pytest.raises(ValueError):
        _hnsw.Search(g, np.zeros(31, np.float32))
    with pytest.raises(ValueError):
        a.search.run(0, None, None)
    with pytest.raises(ValueError):
        a.search.run(16, np.zeros(10, np.float64), np.zeros(10, np.int64))


def test_the_calibration_table_is_what_the_resumed_continuation_serves(corpus):
    """trainer.recall_fit.effort_tables widens one resumable search per query through the grid; the served
    path (a probe, then engine.ann.continue_search straight to the chosen effort through the same steps) finds
    the same candidates with the same work at every effort: the model is calibrated on what it serves.  The
    probe's work is paid once (the work at an effort is no more than a fresh search's plus the steps' slack)."""
    from trainer.recall_fit import effort_tables

    X, Qt, Qe = corpus
    p = ann.default_params("hnsw_fp16", len(X), M=8, ef_construction=40)
    index = ann.build_index(X, p)
    grid = (10, 16, 24, 40, 64)
    truth = ann.exhaustive_top_k(X, Qe[:40])
    table = effort_tables(index, p, X, Qe[:40], truth=truth, efforts=grid, probes=(16,))[16]
    assert table.z_grid.tolist() == [16, 24, 40, 64]
    for i, q in enumerate(Qe[:40]):
        for j, e in enumerate(table.z_grid):
            ev = ann.probe(index, "hnsw_fp16", q, 10, 16, resume_grid=table.z_grid)
            assert ev.state is not None and ev.steps == (16, 24, 40, 64)
            hits = ann.continue_search(index, "hnsw_fp16", q, 10, ev, int(e))
            rec = len(set(hits.rows.tolist()) & set(truth[i].tolist())) / 10
            assert rec == table.recall[i, j] and hits.work == table.coordinates[i, j]
            fresh = ann.search(index, "hnsw_fp16", q, 10, int(e))
            assert hits.work <= 1.5 * fresh.work + 16 * 32 * 8  # not a probe plus a search
    old = effort_tables(index, p, X, Qe[:40], truth=truth, efforts=grid, probes=(16,), resumable=False)[16]
    assert (old.coordinates[:, 1:] > table.coordinates[:, 1:]).mean() > 0.9  # faiss pays the probe again
