import math

import numpy as np
import pytest
import pytrec_eval

from adawidth.metrics import mean_metric, ndcg_at_k, per_query, ranking_metric, recall_at_k


def test_ndcg_hand_computed():
    # relevant: a (2), b (1); ranking b, x, a
    got = ndcg_at_k(["b", "x", "a"], {"a": 2, "b": 1, "c": 0}, 10)
    dcg = 1 / math.log2(2) + 2 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert got == pytest.approx(dcg / idcg, abs=1e-12)


def test_ndcg_cutoff_and_no_relevant():
    assert ndcg_at_k(["x", "y", "a"], {"a": 1}, 2) == 0.0
    assert ndcg_at_k(["a"], {"a": 0}, 10) == 0.0
    assert ndcg_at_k(["a", "b"], {"a": 1, "b": 1}, 10) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        ndcg_at_k(["a"], {"a": 1}, 0)


def test_recall_hand_computed():
    assert recall_at_k(["a", "x", "y"], {"a": 1, "b": 1, "c": 0}, 2) == 0.5
    assert recall_at_k(["a", "b"], {"a": 1, "b": 3}, 100) == 1.0
    assert recall_at_k([], {"a": 1}, 100) == 0.0


def test_per_query_skips_unjudged_and_scores_missing_as_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}, "q3": {"c": 1}}
    out = per_query({"q1": ["a"]}, qrels, "ndcg", 10)
    assert out == {"q1": 1.0, "q3": 0.0}
    assert mean_metric({"q1": ["a"]}, qrels, "ndcg", 10) == 0.5
    with pytest.raises(ValueError):
        per_query({}, qrels, "map", 10)


@pytest.mark.parametrize("seed", range(5))
def test_congruent_with_pytrec_eval_on_random_graded_runs(seed):
    """Our NDCG@10 and Recall@100 equal pytrec_eval's within 1e-6 on the same run."""
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(300)]
    qrels, run = {}, {}
    for q in range(40):
        judged = rng.choice(docs, size=rng.integers(1, 30), replace=False)
        qrels[f"q{q}"] = {d: int(rng.integers(0, 4)) for d in judged}
        ranked = list(rng.choice(docs, size=150, replace=False))
        run[f"q{q}"] = ranked
    # distinct scores by rank, so pytrec_eval ranks exactly as we do
    trec_run = {q: {d: float(len(r) - i) for i, d in enumerate(r)} for q, r in run.items()}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(trec_run)
    ours_ndcg = per_query(run, qrels, "ndcg", 10)
    ours_rec = per_query(run, qrels, "recall", 100)
    for q in ours_ndcg:
        assert ours_ndcg[q] == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-6)
        assert ours_rec[q] == pytest.approx(ref[q]["recall_100"], abs=1e-6)
    # queries with only non-relevant judgments are skipped by us; pytrec_eval scores them 0
    assert set(ours_ndcg) == {q for q, j in qrels.items() if any(v > 0 for v in j.values())}


def test_ranking_metric_is_rows_to_ids_to_metric():
    """The one "ranking -> metric" helper equals the per-list metrics, from ids or from index rows."""
    doc_ids = ["a", "b", "c", "d"]
    judgments = [{"a": 2, "c": 1}, {"d": 1}, {}]
    rows = np.array([[2, 0, 1], [0, 1, 2], [3, 2, 1]])
    ids = [[doc_ids[r] for r in row] for row in rows]
    for metric, fn, k in (("ndcg", ndcg_at_k, 2), ("recall", recall_at_k, 2)):
        want = np.array([fn(r, j, k) for r, j in zip(ids, judgments)])
        np.testing.assert_array_equal(ranking_metric(rows, judgments, metric, k, doc_ids), want)
        np.testing.assert_array_equal(ranking_metric(ids, judgments, metric, k), want)
    assert ranking_metric([], [], "ndcg", 10).shape == (0,)
    for bad in (dict(metric="map"), dict(k=0)):
        with pytest.raises(ValueError):
            ranking_metric(ids, judgments, **{"metric": "ndcg", "k": 10, **bad})
    with pytest.raises(ValueError):
        ranking_metric(ids, judgments[:2])
