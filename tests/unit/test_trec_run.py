"""TREC run files: the format, the list order kept through ties, and pytrec_eval scoring them to our NDCG@10."""

import numpy as np
import pytest
import pytrec_eval

from adawidth.metrics import ndcg_at_k
from trainer.trec_run import run_from_lists, trec_lines, write_trec_run


def score_file(path, qrels):
    with open(path) as fh:
        run = pytrec_eval.parse_run(fh)
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return {q: v["ndcg_cut_10"] for q, v in per_query.items()}


def test_lines_have_six_columns_ranks_from_one_and_exact_scores():
    lines, adjusted = trec_lines({"q1": [("d3", 0.75), ("d1", 0.25)], "q2": [("d2", 1.0)]}, tag="t")
    assert lines == ["q1 Q0 d3 1 0.75 t", "q1 Q0 d1 2 0.25 t", "q2 Q0 d2 1 1.0 t"] and adjusted == 0
    gateway_score = float(np.float32(0.7123456))  # the gateway's scores are float32 values
    lines, _ = trec_lines({"q": [("d", gateway_score)]})
    assert float(lines[0].split()[4]) == gateway_score


def test_ties_keep_the_list_order_where_trec_eval_would_sort_by_docid(tmp_path):
    """Equal scores: trec_eval breaks ties by document id, so without the adjustment the relevant "a" listed
    last would be ranked first.  The writer keeps the list order and counts the scores it lowered."""
    qrels = {"q": {"a": 1}}
    ranked = ["z", "y", "a"]
    run = {"q": [(d, 0.5) for d in ranked]}
    path = tmp_path / "run.trec"
    assert write_trec_run(path, run) == 2
    scores = [float(line.split()[4]) for line in path.read_text().splitlines()]
    assert scores[0] == 0.5 and scores[0] > scores[1] > scores[2] and scores[0] - scores[2] < 1e-7
    assert score_file(path, qrels)["q"] == pytest.approx(ndcg_at_k(ranked, qrels["q"], 10), abs=1e-12)
    assert ndcg_at_k(ranked, qrels["q"], 10) < 1.0  # the relevant document really is third
    increasing = {"q": [("z", 0.1), ("y", 0.2), ("a", 0.3)]}  # a reranker's scores out of list order
    assert write_trec_run(path, increasing) == 2
    assert score_file(path, qrels)["q"] == pytest.approx(ndcg_at_k(ranked, qrels["q"], 10), abs=1e-12)


def test_pytrec_eval_scores_random_runs_to_our_ndcg(tmp_path):
    rng = np.random.default_rng(0)
    docs = [f"D{i}" for i in range(200)]
    qrels, run = {}, {}
    for q in range(50):
        rel = rng.choice(200, rng.integers(1, 6), replace=False)
        qrels[f"Q{q}"] = {docs[j]: int(rng.integers(1, 3)) for j in rel}
        ranked = [docs[j] for j in rng.permutation(200)[:30]]
        scores = np.sort(rng.choice([0.1, 0.2, 0.3, 0.4], 30))[::-1]  # many ties
        scores[scores == 0.2] += rng.uniform(0, 1e-9, int((scores == 0.2).sum()))  # distinct in float64 only
        run[f"Q{q}"] = list(zip(ranked, scores))
    path = tmp_path / "run.trec"
    write_trec_run(path, run, tag="random")
    theirs = score_file(path, qrels)
    ours = {q: ndcg_at_k([d for d, _ in r], qrels[q], 10) for q, r in run.items()}
    assert set(theirs) == set(ours)
    for q in ours:
        assert theirs[q] == pytest.approx(ours[q], abs=1e-12), q


def test_bad_fields_are_refused(tmp_path):
    with pytest.raises(ValueError, match="whitespace"):
        trec_lines({"q 1": [("d", 1.0)]})
    with pytest.raises(ValueError, match="whitespace"):
        trec_lines({"q": [("d\t1", 1.0)]})
    with pytest.raises(ValueError, match="tag"):
        trec_lines({"q": [("d", 1.0)]}, tag="my run")
    with pytest.raises(ValueError, match="twice"):
        trec_lines({"q": [("d", 1.0), ("d", 0.5)]})
    with pytest.raises(ValueError, match="finite"):
        trec_lines({"q": [("d", float("nan"))]})
    with pytest.raises(ValueError, match="2 ids but 1 scores"):
        run_from_lists(["q"], [["a", "b"]], [[1.0]])
    assert not list(tmp_path.iterdir())
