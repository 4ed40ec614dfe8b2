"""Query-embedding cache: an LRU of encoder outputs keyed by (encoder ONNX sha256, normalised query text).

The encode stage (:mod:`engine.stages.encode`) normalises every query text with :func:`normalize_query`
and encodes the *normalised* text, whether the cache is on or off, so the key is exactly what the encoder
sees: a hit returns the very vector a miss of the same key stored (bit for bit), and serving with the cache
disabled encodes the same text.  Entries are never shared across encoders: the key holds the encoder's
ONNX sha256.

The bound is in entries and in bytes (each entry counts its vector's bytes plus its key text's UTF-8 bytes);
whichever is reached first evicts the least recently used entries.  All methods are thread-safe (one lock;
the encoder itself runs outside it).
"""

from __future__ import annotations

import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

_SPACE_CATEGORIES = frozenset({"Zs", "Zl", "Zp"})


def _is_space(ch: str) -> bool:
    # what BERT-style normalisers turn into a plain space: tab, newline, carriage return and the Unicode
    # space separators; other control characters (\v, \f, \x1c..\x1f, \x85) are left for the tokenizer,
    # which removes them instead of splitting on them
    return ch in "\t\n\r" or unicodedata.category(ch) in _SPACE_CATEGORIES


def normalize_query(text: str) -> str:
    """The query text as the cache keys it and as the encoder is given it.

    Unicode NFC, then every run of whitespace (tab, newline, carriage return, space separators, line and
    paragraph separators) becomes one ASCII space, and leading and trailing whitespace is dropped.  Case is
    kept (the tokenizer lower-cases if its model is uncased).  For the served WordPiece tokenizer (BERT
    normaliser, whitespace pre-splitting) the token ids of the result equal those of ``text``.

    Args:
        text: a query text (str).

    Returns:
        The normalised text (str).
    """
    text = unicodedata.normalize("NFC", text)
    out: list[str] = []
    pending = False
    for ch in text:
        if _is_space(ch):
            pending = bool(out)
            continue
        if pending:
            out.append(" ")
            pending = False
        out.append(ch)
    return "".join(out)


def encoder_key(encoder) -> str | None:
    """The cache key part naming ``encoder``: its ONNX sha256 (``encoder.info.onnx_sha256``), with its
    tokenizer's sha256 and its truncation (``max_tokens``) when it declares them, as
    ``"<onnx sha>[/<tokenizer sha>][/<max tokens>]"``; None when the encoder declares no ONNX sha256 (then
    nothing is cached for it)."""
    info = getattr(encoder, "info", None)
    sha = getattr(info, "onnx_sha256", None)
    if not isinstance(sha, str) or not sha:
        return None
    parts = [sha, getattr(info, "tokenizer_sha256", None), getattr(encoder, "max_tokens", None)]
    return "/".join(str(p) for p in parts if p is not None)


class QueryEmbeddingCache:
    """A thread-safe LRU of query embeddings, bounded in entries and in bytes.

    Args:
        max_entries: most entries held; 0 disables the cache.
        max_bytes: most bytes held (vector bytes + key text UTF-8 bytes); 0 disables the cache.
        on_lookup: called as ``on_lookup(hits, misses)`` after every :meth:`encode` (e.g. Prometheus counters).

    Raises:
        ValueError: a negative bound.
    """

    def __init__(self, max_entries: int, max_bytes: int,
                 on_lookup: Callable[[int, int], None] | None = None):
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("max_entries and max_bytes must be >= 0")
        self.max_entries, self.max_bytes = int(max_entries), int(max_bytes)
        self.on_lookup = on_lookup
        self._data: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        """False when either bound is 0 (nothing is stored or looked up)."""
        return self.max_entries > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes held now (vectors + key texts)."""
        with self._lock:
            return self._bytes

    @staticmethod
    def _size(key: tuple[str, str], vector: np.ndarray) -> int:
        return int(vector.nbytes) + len(key[1].encode("utf-8", "surrogatepass"))

    def get(self, encoder_sha: str, text: str) -> np.ndarray | None:
        """The cached vector of (``encoder_sha``, ``text``) (``text`` already normalised), or None; a hit
        becomes the most recently used.  The array is read-only; it is the stored one, not a copy."""
        if not self.enabled:
            return None
        key = (encoder_sha, text)
        with self._lock:
            vec = self._data.get(key)
            if vec is not None:
                self._data.move_to_end(key)
            return vec

    def put(self, encoder_sha: str, text: str, vector: np.ndarray) -> None:
        """Store a read-only copy of ``vector`` ((D,) float32) under (``encoder_sha``, ``text``), evicting the
        least recently used entries past either bound; an entry larger than ``max_bytes`` is not stored."""
        if not self.enabled:
            return
        key = (encoder_sha, text)
        vec = np.array(vector, dtype=np.float32, copy=True)
        vec.flags.writeable = False
        size = self._size(key, vec)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= self._size(key, old)
            self._data[key] = vec
            self._bytes += size
            while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
                k, v = self._data.popitem(last=False)
                self._bytes -= self._size(k, v)

    def clear(self) -> None:
        """Drop every entry (the hit and miss counts stay)."""
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def encode(self, encoder_sha: str | None, texts: Sequence[str],
               encode_fn: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """Embeddings of ``texts`` (already normalised): hits from the cache, every distinct miss encoded in
        one ``encode_fn`` call, then stored.

        Args:
            encoder_sha: the encoder's ONNX sha256 (:func:`encoder_key`); None: no caching, one plain call.
            texts: Q query texts.
            encode_fn: ``encode_fn(list[str]) -> (B, D) float32`` unit-norm rows (the encoder's ``encode``).

        Returns:
            (Q, D) float32, row i the embedding of ``texts[i]``.
        """
        texts = list(texts)
        if encoder_sha is None or not self.enabled or not texts:
            return np.asarray(encode_fn(texts), dtype=np.float32)
        found = [self.get(encoder_sha, t) for t in texts]
        missing = list(dict.fromkeys(t for t, v in zip(texts, found) if v is None))
        fresh: dict[str, np.ndarray] = {}
        if missing:
            got = np.asarray(encode_fn(missing), dtype=np.float32)
            for t, row in zip(missing, got):
                fresh[t] = row
                self.put(encoder_sha, t, row)
        hits = sum(v is not None for v in found)
        misses = len(texts) - hits
        with self._lock:
            self.hits += hits
            self.misses += misses
        if self.on_lookup is not None:
            self.on_lookup(hits, misses)
        dim = next(v for v in (*found, *fresh.values()) if v is not None).shape[0]
        out = np.empty((len(texts), dim), dtype=np.float32)
        for i, (t, v) in enumerate(zip(texts, found)):
            out[i] = v if v is not None else fresh[t]
        return out
