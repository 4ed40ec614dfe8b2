"""Shipped embeddings on a tiny BEIR folder with a deterministic stand-in encoder: write, check, seed, and every
fallback (tampered vectors, another encoder, an unreadable file, another corpus) seeds nothing and warns."""

import dataclasses
import hashlib
import json
import logging

import numpy as np
import pytest

from trainer.embed_cache import EmbeddingCache, content_key, encode_with_cache, encoder_fingerprint
from trainer.shipped_embeddings import read_shipped, seed_cache, shipped_path, write_shipped


@dataclasses.dataclass(frozen=True)
class Info:
    model_name: str = "stand-in"
    onnx_sha256: str = "a" * 64
    tokenizer_sha256: str = "b" * 64


class HashEncoder:
    """Unit vectors drawn from a generator seeded by the text's sha256 (what an encoder would give: a function
    of the text), counting the texts it encodes."""

    dimension = 16
    max_tokens = 256

    def __init__(self, info=Info()):
        self.info, self.encoded = info, 0

    def encode(self, texts, batch_size=32):
        self.encoded += len(texts)
        out = np.stack([np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:12], 16))
                        .standard_normal(self.dimension) for t in texts]).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def beir(folder, n_docs=60, n_queries=12):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as fh:
        for i in range(n_docs):
            fh.write(json.dumps({"_id": f"d{i}", "title": f"title {i}", "text": f"document text number {i}"}) + "\n")
    with open(folder / "queries.jsonl", "w") as fh:
        for i in range(n_queries):
            fh.write(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n")
    return folder


@pytest.fixture()
def shipped(tmp_path):
    data = beir(tmp_path / "data")
    enc = HashEncoder()
    path, meta = write_shipped(data, enc, None)
    return data, enc, path, meta


def test_round_trip_is_lossless_and_keyed_by_the_encoder(shipped):
    data, enc, path, meta = shipped
    assert path == shipped_path(data, encoder_fingerprint(enc))
    assert meta["documents"] == 60 and meta["queries"] == 12 and meta["fingerprint"] == encoder_fingerprint(enc)
    s = read_shipped(path)
    texts = [f"title {i} document text number {i}" for i in range(60)] + [f"query {i}" for i in range(12)]
    fp = encoder_fingerprint(enc)
    assert s.keys == [content_key(t, fp) for t in texts]
    assert np.array_equal(s.vectors, enc.encode(texts))  # float32 bit for bit


def test_good_file_seeds_the_cache_so_the_build_encodes_nothing(shipped, tmp_path):
    data, _, path, _ = shipped
    enc = HashEncoder()
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    report = seed_cache(data, enc, cache, sample_documents=32, sample_queries=4)
    assert report.status == "seeded" and not report.fallback
    assert report.seeded == 72 and report.checked_documents == 32 and report.checked_queries == 4
    assert enc.encoded == 36 and report.min_cosine == pytest.approx(1.0, abs=1e-6)
    texts = [f"title {i} document text number {i}" for i in range(60)]
    X, n_encoded = encode_with_cache(enc, texts, cache)  # what trainer build does next
    assert n_encoded == 0 and enc.encoded == 36 and np.array_equal(X, read_shipped(path).vectors[:60])
    again = seed_cache(data, enc, cache)
    assert again.status == "already_cached" and enc.encoded == 36


def _rewrite(path, **arrays):
    with np.load(path) as z:
        content = {k: z[k] for k in z.files}
    content.update(arrays)
    np.savez_compressed(path, **content)


def _assert_fallback(report, status, cache, caplog):
    assert report.status == status and report.fallback and report.seeded == 0
    assert "encoded instead" in report.message
    assert cache.db.execute("SELECT COUNT(*) FROM emb").fetchone()[0] == 0
    assert any(r.levelno == logging.WARNING and "falling back to encoding" in r.getMessage() for r in caplog.records)


def test_tampered_vectors_fail_the_check_and_seed_nothing(shipped, tmp_path, caplog):
    data, enc, path, meta = shipped
    s = read_shipped(path)
    rng = np.random.default_rng(1)
    bad = s.vectors + 0.05 * rng.standard_normal(s.vectors.shape).astype(np.float32)  # cosine about 0.98
    from trainer.shipped_embeddings import _shuffle

    _rewrite(path, vectors=_shuffle(bad))
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    with caplog.at_level(logging.WARNING):
        report = seed_cache(data, HashEncoder(), cache)
    _assert_fallback(report, "check_failed", cache, caplog)
    assert report.min_cosine < 0.9999 and report.checked_documents == 32


def test_one_tampered_sampled_document_is_enough(shipped, tmp_path, caplog):
    """The threshold is on the smallest cosine: one sampled vector off by a small angle fails the file."""
    data, enc, path, _ = shipped
    s = read_shipped(path)
    bad = s.vectors.copy()
    bad[:60] = bad[:60] + 0.02 * np.roll(bad[:60], 1, axis=1)  # every document, cosine about 0.9998
    from trainer.shipped_embeddings import _shuffle

    _rewrite(path, vectors=_shuffle(bad))
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    with caplog.at_level(logging.WARNING):
        report = seed_cache(data, HashEncoder(), cache)
    _assert_fallback(report, "check_failed", cache, caplog)
    assert 0.999 < report.min_cosine < 0.9999


def test_another_encoder_falls_back(shipped, tmp_path, caplog):
    data, _, _, _ = shipped
    other = HashEncoder(Info(onnx_sha256="c" * 64))
    cache = EmbeddingCache(tmp_path / "cache.sqlite", other.dimension)
    with caplog.at_level(logging.WARNING):
        report = seed_cache(data, other, cache)
    _assert_fallback(report, "encoder_mismatch", cache, caplog)
    assert other.encoded == 0 and "another encoder" in report.message
    longer = HashEncoder()
    longer.max_tokens = 128  # another truncation is another encoder too
    with caplog.at_level(logging.WARNING):
        assert seed_cache(data, longer, cache).status == "encoder_mismatch"


def test_unreadable_or_edited_file_falls_back(shipped, tmp_path, caplog):
    data, enc, path, _ = shipped
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    _rewrite(path, kinds=np.zeros(3, np.uint8))  # arrays that disagree with the metadata
    with caplog.at_level(logging.WARNING):
        _assert_fallback(seed_cache(data, HashEncoder(), cache), "unreadable", cache, caplog)
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    with caplog.at_level(logging.WARNING):
        _assert_fallback(seed_cache(data, HashEncoder(), cache), "unreadable", cache, caplog)


def test_another_corpus_matches_nothing(shipped, tmp_path, caplog):
    _, enc, path, _ = shipped
    other = beir(tmp_path / "other", n_docs=5, n_queries=2)
    with open(other / "corpus.jsonl", "w") as fh:
        fh.write(json.dumps({"_id": "x", "title": "", "text": "unrelated"}) + "\n")
    with open(other / "queries.jsonl", "w") as fh:
        fh.write(json.dumps({"_id": "y", "text": "another question"}) + "\n")
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    with caplog.at_level(logging.WARNING):
        report = seed_cache(other, HashEncoder(), cache, path=path)
    _assert_fallback(report, "no_match", cache, caplog)


def test_dataset_without_a_file_is_not_a_warning(tmp_path, caplog):
    data = beir(tmp_path / "plain")
    enc = HashEncoder()
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    with caplog.at_level(logging.WARNING):
        report = seed_cache(data, enc, cache)
    assert report.status == "no_file" and not report.fallback and not caplog.records


def test_a_float16_subset_file_holds_its_texts_rounded_and_seeds_only_them(tmp_path):
    """bench.encode_debdocs --ship: a subset of the documents and some queries, float16 (half the bytes)."""
    data = beir(tmp_path / "data")
    enc = HashEncoder()
    docs = [f"title {i} document text number {i}" for i in range(10, 30)]
    queries = ["query 3", "query 7"]
    out = tmp_path / "chunk.npz"
    path, meta = write_shipped(data, enc, None, out, texts=(docs, queries), dtype="float16", note="docs 10..30")
    assert path == out and meta["dtype"] == "float16" and meta["note"] == "docs 10..30"
    assert meta["documents"] == 20 and meta["queries"] == 2
    s = read_shipped(path)
    want = enc.encode(docs + queries)
    assert s.vectors.dtype == np.float32 and np.array_equal(s.vectors, want.astype(np.float16).astype(np.float32))
    assert not np.array_equal(s.vectors, want)  # rounded, and within float16's relative precision
    assert np.abs(s.vectors - want).max() <= 2.0 ** -11 * np.abs(want).max()
    cache = EmbeddingCache(tmp_path / "cache.sqlite", enc.dimension)
    report = seed_cache(data, enc, cache, path=path)
    assert report.status == "seeded" and report.seeded == 22 and report.min_cosine >= 0.9999
    fp = encoder_fingerprint(enc)
    got = cache.get_many([content_key(t, fp) for t in docs + ["title 0 document text number 0"]])
    assert len(got) == 20  # the subset only
    with pytest.raises(ValueError, match="dtype"):
        write_shipped(data, enc, None, tmp_path / "x.npz", dtype="int8")
