"""The vectorised BM25 builder (engine.version.lexical.bm25_scores) equals bm25s's own index on real text,
and a fold's reuse of a base version's term counts gives the same index as tokenizing everything again."""

from __future__ import annotations

import bm25s
import numpy as np
import pytest

from adawidth import hybrid
from engine.io.beir import load_corpus
from engine.version.lexical import Bm25Params, bm25_scores, term_counts
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def scifact_texts():
    docs = load_corpus(ROOT / "data" / "scifact")[:1500]
    return [hybrid.normalize_text(d.encoder_text()) for d in docs]


def _by_token(scores: dict, vocab: dict[str, int]) -> dict[str, dict[int, float]]:
    out = {}
    for tok, j in vocab.items():
        if j + 1 >= len(scores["indptr"]):
            continue
        a, b = scores["indptr"][j], scores["indptr"][j + 1]
        out[tok] = dict(zip(scores["indices"][a:b].tolist(), scores["data"][a:b].tolist()))
    return out


def test_vectorised_bm25_equals_bm25s_score_for_score(scifact_texts):
    params = Bm25Params()
    ref = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
    ref.index([hybrid.tokens(t) for t in scifact_texts], show_progress=False)
    tc = term_counts(scifact_texts)
    ours = bm25_scores(tc, params)
    vocab = {t: i for i, t in enumerate(tc.vocab)}
    assert ours["num_docs"] == ref.scores["num_docs"] == len(scifact_texts)
    assert set(vocab) == set(ref.vocab_dict) - {""}
    assert len(ours["data"]) == len(ref.scores["data"]) > 100_000
    a, b = _by_token(ours, vocab), _by_token(ref.scores, ref.vocab_dict)
    assert a == b  # bit for bit: same float32 score of every (token, document)
    # and a query scores the same through both
    q = hybrid.tokens(scifact_texts[7])[:12]
    s_ref = ref.get_scores_from_ids(ref.get_tokens_ids(q))
    ref.scores, ref.vocab_dict = ours, vocab
    np.testing.assert_array_equal(ref.get_scores_from_ids(ref.get_tokens_ids(q)), s_ref)


def test_reused_rows_give_the_index_of_a_full_tokenization(scifact_texts):
    base = term_counts(scifact_texts[:1000])
    # a fold: 50 deleted, 500 new texts appended
    corpus = scifact_texts[50:1500]
    folded = term_counts(corpus, base, {t: i for i, t in enumerate(scifact_texts[:1000])})
    fresh = term_counts(corpus)
    params = Bm25Params()
    fa, fb = bm25_scores(folded, params), bm25_scores(fresh, params)
    va = {t: i for i, t in enumerate(folded.vocab)}
    vb = {t: i for i, t in enumerate(fresh.vocab)}
    assert _by_token(fa, va) == _by_token(fb, vb)
    np.testing.assert_array_equal(folded.lengths, fresh.lengths)
    assert set(folded.vocab) == set(fresh.vocab)  # tokens only the deleted documents held are gone


def test_only_lucene_is_implemented():
    with pytest.raises(ValueError, match="lucene"):
        bm25_scores(term_counts(["a b"]), Bm25Params(method="robertson"))


def test_the_fold_drops_tokens_only_deleted_documents_held(scifact_texts):
    base = term_counts(scifact_texts[:1000])
    kept = scifact_texts[50:1000]
    folded = term_counts(kept, base, {t: i for i, t in enumerate(scifact_texts[:1000])})
    assert len(folded.vocab) < len(base.vocab)  # the deletions took tokens with them
    assert set(folded.vocab) == set(term_counts(kept).vocab)
