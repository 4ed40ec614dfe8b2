import gzip
from pathlib import Path

import pytest

from engine.io.beir import DatasetFormatError, load_collection, load_corpus, load_qrels, load_queries

ROOT = Path(__file__).resolve().parents[2]
SCIFACT = ROOT / "data" / "scifact"


def test_bundled_scifact_counts():
    col = load_collection(SCIFACT, "test")
    assert len(col.corpus) == 5183
    assert len(col.judged_queries()) == 300
    assert sum(len(j) for j in col.qrels.values()) == 339
    train = load_qrels(SCIFACT, "train")
    assert len(train) == 809 and sum(len(j) for j in train.values()) == 919
    assert len(col.queries) == 1109
    doc = col.corpus[0]
    assert doc.encoder_text() == f"{doc.title} {doc.text}".strip()


def _write(folder: Path, corpus: str, queries: str, qrels: str, gz: bool = False):
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(folder / "corpus.jsonl.gz", "wt", encoding="utf-8") as fh:
            fh.write(corpus)
    else:
        (folder / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (folder / "queries.jsonl").write_text(queries, encoding="utf-8")
    (folder / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")


GOOD_CORPUS = '{"_id": "d1", "title": "T", "text": "x", "tenant": "a"}\n{"_id": "d2", "text": "y"}\n'
GOOD_QUERIES = '{"_id": "q1", "text": "hello"}\n'
GOOD_QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\n"


def test_gz_and_extra_fields(tmp_path):
    _write(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS, gz=True)
    col = load_collection(tmp_path, "test")
    assert [d.doc_id for d in col.corpus] == ["d1", "d2"]
    assert col.corpus[0].fields == {"tenant": "a"}
    assert col.qrels == {"q1": {"d1": 1}}


@pytest.mark.parametrize("corpus,line,problem", [
    ('{"_id": "d1", "text": "x"}\n{"_id": "d2", "text": \n', 2, "invalid JSON"),
    ('{"_id": "d1"}\n', 1, "missing field 'text'"),
    ('{"_id": "d1", "text": "x"}\n{"_id": "d1", "text": "y"}\n', 2, "duplicate _id"),
    ('[1, 2]\n', 1, "expected a JSON object"),
    ('{"_id": "d1", "text": 5}\n', 1, "must be a string"),
])
def test_malformed_corpus_names_file_line_and_problem(tmp_path, corpus, line, problem):
    _write(tmp_path, corpus, GOOD_QUERIES, GOOD_QRELS)
    with pytest.raises(DatasetFormatError) as e:
        load_corpus(tmp_path)
    assert e.value.line == line and problem in str(e.value)
    assert str(tmp_path / "corpus.jsonl") in str(e.value)


@pytest.mark.parametrize("qrels,line,problem", [
    ("q\td\ts\nq1\td1\t1\n", 1, "header"),
    ("query-id\tcorpus-id\tscore\nq1\td1\n", 2, "3 tab-separated columns"),
    ("query-id\tcorpus-id\tscore\nq1\td1\thigh\n", 2, "not an integer"),
    ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t1\n", 3, "repeated pair"),
])
def test_malformed_qrels(tmp_path, qrels, line, problem):
    _write(tmp_path, GOOD_CORPUS, GOOD_QUERIES, qrels)
    with pytest.raises(DatasetFormatError) as e:
        load_qrels(tmp_path, "test")
    assert e.value.line == line and problem in str(e.value)


def test_not_utf8_and_missing_and_dangling(tmp_path):
    _write(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    (tmp_path / "queries.jsonl").write_bytes(b'{"_id": "q1", "text": "\xff"}\n')
    with pytest.raises(DatasetFormatError, match="not valid UTF-8"):
        load_queries(tmp_path)
    with pytest.raises(DatasetFormatError, match="file not found"):
        load_qrels(tmp_path, "dev")
    _write(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\tnope\t1\n")
    with pytest.raises(DatasetFormatError, match="'nope' is not in corpus.jsonl"):
        load_collection(tmp_path, "test")
