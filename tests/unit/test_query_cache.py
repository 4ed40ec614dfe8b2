"""The query-embedding LRU (engine/query_cache.py) and the batch request model (service/models.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.io.beir import load_queries
from engine.plan import Plan
from engine.query_cache import QueryEmbeddingCache, encoder_key, normalize_query
from engine.stages.encode import encode
from service.errors import ApiError
from service.models import BatchItemError, BatchSearchRequest, SearchRequest
from tests.conftest import SCIFACT

D = 8


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(D).astype(np.float32)
    return v / np.linalg.norm(v)


class CountingEncoder:
    """encode(texts) -> one deterministic unit vector per text (seeded by the text); counts texts encoded."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return np.stack([vec(sum(map(ord, t))) for t in texts]) if texts else np.empty((0, D), np.float32)


def test_normalisation_is_nfc_and_collapses_whitespace_keeps_case():
    assert normalize_query("  Vitamin\tD \n\r and\u00a0\u3000MS  ") == "Vitamin D and MS"
    assert normalize_query("cafe\u0301") == normalize_query("caf\u00e9") == "caf\u00e9"
    assert normalize_query("ABC") == "ABC"  # never lower-cased here
    assert normalize_query("a\x1cb") == "a\x1cb"  # control characters are the tokenizer's business
    assert normalize_query(" \t ") == ""


def test_hit_returns_the_stored_vector_bit_for_bit_and_counts():
    enc, looked = CountingEncoder(), []
    cache = QueryEmbeddingCache(10, 1 << 20, on_lookup=lambda h, m: looked.append((h, m)))
    first = cache.encode("sha-a", ["q1", "q2", "q1"], enc)
    assert enc.calls == [["q1", "q2"]]  # distinct misses, one call
    again = cache.encode("sha-a", ["q2", "q1"], enc)
    assert len(enc.calls) == 1 and looked == [(0, 3), (2, 0)] and (cache.hits, cache.misses) == (2, 3)
    assert again.dtype == np.float32 and np.array_equal(again[0].view(np.uint32), first[1].view(np.uint32))
    assert np.array_equal(again[1], first[0]) and np.array_equal(first[0], first[2])
    stored = cache.get("sha-a", "q1")
    assert not stored.flags.writeable  # nobody can change a cached vector in place
    again[1] += 1.0  # the caller's copy is its own
    assert np.array_equal(cache.get("sha-a", "q1"), first[0])


def test_the_key_holds_the_encoder_hash():
    enc = CountingEncoder()
    cache = QueryEmbeddingCache(10, 1 << 20)
    cache.encode("sha-a", ["same text"], enc)
    cache.encode("sha-b", ["same text"], enc)
    assert enc.calls == [["same text"], ["same text"]] and cache.hits == 0
    assert cache.get("sha-a", "same text") is not None and cache.get("sha-c", "same text") is None
    cache.encode(None, ["same text"], enc)  # an encoder without a hash is never cached
    assert len(enc.calls) == 3 and len(cache) == 2


class Info:
    def __init__(self, onnx, tokenizer=None):
        self.onnx_sha256, self.tokenizer_sha256 = onnx, tokenizer


class WithInfo:
    def __init__(self, info, max_tokens=None):
        self.info, self.max_tokens = info, max_tokens


def test_encoder_key_names_the_onnx_hash_and_what_changes_the_input():
    assert encoder_key(WithInfo(Info("abc123"))) == "abc123" and encoder_key(object()) is None
    assert encoder_key(WithInfo(Info(""))) is None
    full = encoder_key(WithInfo(Info("abc123", "tok9"), 256))
    assert full == "abc123/tok9/256" and full != encoder_key(WithInfo(Info("abc123", "tok9"), 128))
    assert encoder_key(WithInfo(Info("def456", "tok9"), 256)) != full


def test_eviction_by_entries_is_least_recently_used():
    cache = QueryEmbeddingCache(3, 1 << 20)
    for i in range(3):
        cache.put("s", f"q{i}", vec(i))
    assert cache.get("s", "q0") is not None  # q0 is now the most recent: q1 goes first
    cache.put("s", "q3", vec(3))
    assert len(cache) == 3 and cache.get("s", "q1") is None
    assert all(cache.get("s", q) is not None for q in ("q0", "q2", "q3"))


def test_eviction_by_bytes():
    entry = D * 4 + 2  # a vector of D float32 + a 2-byte key text
    cache = QueryEmbeddingCache(1000, 3 * entry)
    for i in range(5):
        cache.put("s", f"q{i}", vec(i))
    assert len(cache) == 3 and cache.nbytes == 3 * entry
    assert cache.get("s", "q0") is None and cache.get("s", "q1") is None and cache.get("s", "q4") is not None
    cache.put("s", "x" * 1000, vec(9))  # larger than the whole bound: not stored, nothing evicted for it
    assert len(cache) == 3 and cache.get("s", "x" * 1000) is None
    cache.put("s", "q4", vec(4))  # replacing an entry does not count it twice
    assert cache.nbytes == 3 * entry


@pytest.mark.parametrize("entries,nbytes", [(0, 1 << 20), (10, 0)])
def test_zero_disables_the_cache(entries, nbytes):
    enc, looked = CountingEncoder(), []
    cache = QueryEmbeddingCache(entries, nbytes, on_lookup=lambda h, m: looked.append((h, m)))
    assert not cache.enabled
    a = cache.encode("s", ["q", "q"], enc)
    b = cache.encode("s", ["q"], enc)
    assert enc.calls == [["q", "q"], ["q"]] and len(cache) == 0 and looked == [] and cache.hits == 0
    assert np.array_equal(a[0], b[0])
    with pytest.raises(ValueError):
        QueryEmbeddingCache(-1, 10)


def test_thread_safety_smoke():
    cache = QueryEmbeddingCache(50, 1 << 20)
    enc = CountingEncoder()
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                texts = [f"q{int(i)}" for i in rng.integers(0, 120, size=4)]
                out = cache.encode("s", texts, enc)
                for t, row in zip(texts, out):
                    assert np.array_equal(row, vec(sum(map(ord, t))))
        except Exception as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(cache) <= 50
    assert cache.hits + cache.misses == 8 * 300 * 4 and cache.hits > 0
    assert cache.nbytes == sum(cache._size(k, v) for k, v in cache._data.items())


# ---------------------------------------------------------------------------------------------- batch model

def test_batch_envelope_is_checked_as_a_whole():
    ok = BatchSearchRequest.parse({"queries": [{"query": "a"}, {"query": "b", "k": 3}]}, max_batch=2)
    assert len(ok.queries) == 2
    for body, code in [({"queries": []}, "empty_batch"),
                       ({"queries": [{"query": "a"}] * 3}, "batch_too_large"),
                       ({}, "missing_field"),
                       ({"queries": {"query": "a"}}, "invalid_type"),
                       ({"queries": "a"}, "invalid_type"),
                       ({"queries": [{"query": "a"}], "k": 3}, "unknown_field"),
                       ([{"query": "a"}], "invalid_type")]:
        with pytest.raises(ApiError) as e:
            BatchSearchRequest.parse(body, max_batch=2)
        assert e.value.code == code, body
    assert ApiError("batch_too_large", "x").status == 413 and ApiError("empty_batch", "x").status == 422


def test_batch_items_are_typed_one_by_one():
    batch = BatchSearchRequest.parse({"queries": [
        {"query": "fine", "k": 5}, {"query": 42}, "not an object", {"query": "x", "colour": "red"}, {"k": 1},
        {"query": "y", "width": "wide"}, {"query": "z", "\ud800": 1}, {"query": "last"}]}, max_batch=256)
    items = batch.items()
    assert isinstance(items[0], SearchRequest) and items[0].k == 5 and isinstance(items[-1], SearchRequest)
    codes = [getattr(i, "code", None) for i in items]
    assert codes == [None, "invalid_type", "invalid_type", "unknown_field", "missing_field", "unknown_width",
                     "invalid_unicode", None]
    slot = BatchItemError.of(items[3])
    assert slot == {"error": {"code": "unknown_field", "message": "unknown field 'colour'", "field": "colour"},
                    "status": 422}
    assert BatchItemError.model_validate(slot).status == 422


# ---------------------------------------------------------------------------------------------- real encoder

def test_normalisation_keeps_the_served_tokenizers_ids_and_a_hit_equals_the_miss(encoder):
    """The key is the text as the encoder sees it: for SciFact queries and whitespace / composition variants
    of them, the WordPiece ids of the normalised text equal those of the raw text; through the encode stage a
    hit returns the miss's vector bit for bit."""
    texts = sorted(load_queries(SCIFACT).values())[:200]
    variants = [t.replace(" ", "  \t", 2) + "\n" for t in texts[:50]] + \
               [" \u00a0" + t.replace(" ", "\u3000", 1) for t in texts[50:100]] + \
               ["Cafe\u0301 au lait and " + t for t in texts[100:110]]
    raw = texts + variants
    ids = [e.ids for e in encoder.tokenizer.encode_batch(raw)]
    norm = [e.ids for e in encoder.tokenizer.encode_batch([normalize_query(t) for t in raw])]
    assert ids == norm

    def plan(text):
        return Plan(query=text, text=text, phrases=(), k=10, depth=10, policy="exact")

    cache = QueryEmbeddingCache(100, 1 << 20)
    miss = encode([plan(texts[0]), plan(texts[1])], encoder, cache)
    hit = encode([plan("  " + texts[1]), plan(texts[0] + "\t")], encoder, cache)
    assert cache.hits == 2 and np.array_equal(hit[0].view(np.uint32), miss[1].view(np.uint32))
    assert np.array_equal(hit[1], miss[0])
    assert np.array_equal(encode([plan(texts[2])], encoder, None), encode([plan(texts[2] + "  ")], encoder, None))
