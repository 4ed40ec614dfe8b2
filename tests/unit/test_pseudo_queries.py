import numpy as np
import pytest

from adawidth.pseudo_queries import informative_title, pseudo_queries, sentence_candidates

BODY = ("Cells divide by mitosis in most tissues. Short one. "
        "The spindle checkpoint delays anaphase until every chromosome is attached! "
        "Is the checkpoint also active in meiosis of oocytes?")


def _titled(n=6):
    titles = [f"Study number {i} of cell division" for i in range(n)]
    texts = [f"Document {i}. " + BODY for i in range(n)]
    return titles, texts


def test_titles_mode_takes_each_title_once_then_sentences():
    titles, texts = _titled()
    pq = pseudo_queries(titles, texts, 6, seed=3)
    assert pq.record["mode"] == "titles"
    assert pq.sources == ["title"] * 6
    assert sorted(pq.texts) == sorted(titles)
    assert sorted(pq.doc_rows.tolist()) == list(range(6))  # one per document in the first round
    for q, r in zip(pq.texts, pq.doc_rows):
        assert q == titles[r]
    more = pseudo_queries(titles, texts, 9, seed=3)
    assert more.texts[:6] == pq.texts and more.sources[6:] == ["sentence"] * 3
    assert more.record["counts"] == {"title": 6, "sentence": 3, "window": 0}


def test_sentences_mode_when_titles_are_missing_or_uninformative():
    texts = ["Alpha beta gamma delta. " + BODY, BODY, "tiny"]
    titles = ["", "Two words", ""]  # two words: not informative
    pq = pseudo_queries(titles, texts, 10, seed=0)
    assert pq.record["mode"] == "sentences"
    assert set(pq.sources) == {"sentence"}
    assert 2 not in pq.doc_rows  # "tiny" has no sentence of 4-40 words
    for q, r in zip(pq.texts, pq.doc_rows):
        assert q in texts[r]
        assert 4 <= len(q.split()) <= 40
    assert "Short one." not in pq.texts  # two words: below the minimum
    # distinct texts: the shared BODY sentences appear once although two documents contain them
    assert len(set(pq.texts)) == len(pq.texts)
    assert pq.record["returned"] == len(pq) < 10


def test_deterministic_for_a_seed_and_varies_with_it():
    titles = [""] * 40
    texts = [f"Sentence {i} one is here. " + BODY for i in range(40)]
    a = pseudo_queries(titles, texts, 25, seed=7)
    b = pseudo_queries(titles, texts, 25, seed=7)
    c = pseudo_queries(titles, texts, 25, seed=8)
    assert a.texts == b.texts and np.array_equal(a.doc_rows, b.doc_rows) and a.record == b.record
    assert a.texts != c.texts


def test_title_only_documents_give_whole_document_queries():
    titles = ["An algebraic language for digital computers", "Roots by repeated subtraction methods"]
    pq = pseudo_queries(titles, ["", ""], 5, seed=0)  # CACM-like: the title is the whole document
    assert not informative_title(titles[0], "")
    assert pq.record["mode"] == "sentences"
    assert sorted(pq.texts) == sorted(titles)
    assert pq.whole_document.all() and pq.record["whole_document"] == 2


def test_unpunctuated_long_text_gives_a_seeded_window():
    words = [f"w{i}" for i in range(100)]
    text = " ".join(words)
    cands = sentence_candidates("", text, np.random.default_rng(0))
    assert len(cands) == 1
    q, src, whole = cands[0]
    assert src == "window" and not whole
    got = q.split()
    assert len(got) == 40
    start = words.index(got[0])
    assert got == words[start:start + 40]
    pq = pseudo_queries([""], [text], 3, seed=1)
    assert pq.sources == ["window"] and pq.record["counts"]["window"] == 1


def test_min_title_share_switches_mode():
    titles, texts = _titled(4)
    titles[0] = titles[1] = ""
    assert pseudo_queries(titles, texts, 4, seed=0, min_title_share=0.5).record["mode"] == "titles"
    assert pseudo_queries(titles, texts, 4, seed=0, min_title_share=0.75).record["mode"] == "sentences"
    pq = pseudo_queries(titles, texts, 4, seed=0, min_title_share=0.5)
    assert pq.record["counts"] == {"title": 2, "sentence": 2, "window": 0}  # untitled documents give sentences


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        pseudo_queries(["a"], [], 1)
    with pytest.raises(ValueError):
        pseudo_queries(["a"], ["b"], -1)
    with pytest.raises(ValueError):
        pseudo_queries(["a"], ["b"], 1, min_title_share=1.5)
    empty = pseudo_queries([], [], 5)
    assert len(empty) == 0 and empty.doc_rows.dtype == np.int64 and empty.record["returned"] == 0
