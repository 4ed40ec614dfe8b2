"""Embeddings shipped in the repository: a BEIR folder's document and query vectors, made by our own encoder.

A fresh clone would otherwise spend minutes encoding SciFact before the first
query (``make demo``).  ``python -m trainer ship-embeddings --dataset data/scifact``
writes ``<dataset>/embeddings/<fingerprint hash>.npz``; ``python -m trainer
seed-embeddings --dataset data/scifact`` (run by ``make index`` and ``make test``)
checks the file against the encoder at hand and, when it passes, copies its
vectors into the content-hash embedding cache (:mod:`trainer.embed_cache`), so
``trainer build`` and the tests find them there with no change of their own.

The file (``numpy.savez_compressed``, no pickle) holds

* ``meta``: a JSON string: format, encoder (model, ``onnx_sha256``, ``tokenizer_sha256``,
  ``max_tokens``), the fingerprint ``onnx_sha256|tokenizer_sha256|max_tokens``, counts;
* ``keys``: uint8 (N, 32), the sha256 digest of each vector's cache key
  (:func:`trainer.embed_cache.content_key` of the text and the fingerprint);
* ``kinds``: uint8 (N,), 0 for a document, 1 for a query;
* ``vectors``: the (N, D) float32 vectors, byte-shuffled for compression: uint8 (4, N·D), row j the
  j-th little-endian byte of every value.  float32, not float16: float16 would pass the cosine check
  below (cosine about 1 - 1e-7) but moves scores by about 1e-4, and the frozen-answer tests compare
  scores to 1e-6, so the cache must hold the encoder's own output.  A benchmark-only file (debdocs'
  encoded prefix, ``bench.encode_debdocs --ship``; no test reads it) may be float16 (meta ``dtype``,
  uint8 (2, N·D)): half the bytes in the repository, and every method of a benchmark reads the same
  rounded vectors.

The check before seeding (:func:`seed_cache`): the encoder's fingerprint must equal the file's, and a
seeded random sample of at least 32 documents (and a few queries) is re-encoded; the smallest cosine
to the shipped vectors must be at least 0.9999.  Otherwise nothing is seeded, a warning is logged and
the build encodes as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine.io.beir import load_corpus, load_queries
from trainer.embed_cache import EmbeddingCache, content_key, encode_with_cache, encoder_fingerprint

log = logging.getLogger(__name__)

FORMAT = "adawidth-shipped-embeddings"
FORMAT_VERSION = 1
DOCUMENT, QUERY = 0, 1
MIN_COSINE = 0.9999
SAMPLE_DOCUMENTS = 32
SAMPLE_QUERIES = 8


def shipped_dir(dataset: Path | str) -> Path:
    """Folder of a BEIR folder's shipped embedding files: ``<dataset>/embeddings``."""
    return Path(dataset) / "embeddings"


def shipped_path(dataset: Path | str, fingerprint: str) -> Path:
    """Where the file for an encoder fingerprint lives: ``<dataset>/embeddings/<sha256(fingerprint)[:16]>.npz``."""
    return shipped_dir(dataset) / f"{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}.npz"


def dataset_texts(dataset: Path | str) -> tuple[list[str], list[str]]:
    """Encoder texts of the corpus (file order) and query texts (file order) of a BEIR folder.

    Raises:
        engine.io.beir.DatasetFormatError: on a missing or malformed file.
    """
    return [d.encoder_text() for d in load_corpus(dataset)], list(load_queries(dataset).values())


@dataclass
class Shipped:
    """A shipped file in memory: ``meta`` (dict), ``keys`` (N hex cache keys), ``kinds`` (N,) uint8,
    ``vectors`` (N, D) float32."""

    meta: dict
    keys: list[str]
    kinds: np.ndarray
    vectors: np.ndarray


DTYPES = {"float32": "<f4", "float16": "<f2"}
"""Value types a shipped file may hold (float16 for benchmark-only files; see the module docstring)."""


def _shuffle(vectors: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """(N, D) float -> uint8 (B, N·D), B the value's bytes: byte j of every value in row j (little-endian)."""
    v = np.ascontiguousarray(vectors, dtype=DTYPES[dtype])
    return np.ascontiguousarray(v.view(np.uint8).reshape(-1, v.itemsize).T)


def _unshuffle(planes: np.ndarray, n: int, d: int, dtype: str = "float32") -> np.ndarray:
    return np.ascontiguousarray(planes.T).view(DTYPES[dtype]).reshape(n, d).astype(np.float32)


def write_shipped(dataset: Path | str, encoder, cache: EmbeddingCache | None, out: Path | str | None = None,
                  *, command: str = "", texts: tuple[list[str], list[str]] | None = None,
                  dtype: str = "float32", note: str = "") -> tuple[Path, dict]:
    """Encode (or read from ``cache``) every document and query of ``dataset`` and write the shipped file.

    Args:
        dataset: a BEIR folder.
        encoder: an encoder with ``encode``, ``info`` and ``max_tokens`` (``engine.encoder.OnnxEncoder``).
        cache: the embedding cache to read and fill, or None.
        out: output path (default :func:`shipped_path` of the encoder's fingerprint).
        command: the command line to record in the metadata.
        texts: (document texts, query texts) to ship instead of all of the dataset's (a subset).
        dtype: ``float32`` (the default, what tests need) or ``float16`` (benchmark-only files).
        note: a free-text description recorded in the metadata (e.g. which subset).

    Returns:
        (path written, its metadata).

    Raises:
        ValueError: an unknown ``dtype``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    docs, queries = dataset_texts(dataset) if texts is None else (list(texts[0]), list(texts[1]))
    fp = encoder_fingerprint(encoder)
    texts = list(dict.fromkeys(docs + queries))  # a query equal to a document text needs one vector
    doc_set = set(docs)
    vectors, _ = encode_with_cache(encoder, texts, cache, desc=f"encoding {Path(dataset).name}")
    keys = np.frombuffer(b"".join(bytes.fromhex(content_key(t, fp)) for t in texts), np.uint8).reshape(-1, 32)
    kinds = np.array([DOCUMENT if t in doc_set else QUERY for t in texts], dtype=np.uint8)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "dataset": Path(dataset).name,
            "encoder": {"model_name": encoder.info.model_name, "onnx_sha256": encoder.info.onnx_sha256,
                        "tokenizer_sha256": encoder.info.tokenizer_sha256, "max_tokens": int(encoder.max_tokens)},
            "fingerprint": fp, "count": len(texts), "documents": int((kinds == DOCUMENT).sum()),
            "queries": int((kinds == QUERY).sum()), "dimension": int(vectors.shape[1]), "dtype": dtype,
            "layout": f"vectors: uint8 ({np.dtype(DTYPES[dtype]).itemsize}, N*D), byte j (little-endian) of "
                      f"every {dtype} value in row j",
            "key": "keys[i] = sha256(fingerprint + '\\0' + text), trainer.embed_cache.content_key",
            "command": command, **({"note": note} if note else {})}
    path = Path(out) if out is not None else shipped_path(dataset, fp)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(meta)), keys=keys, kinds=kinds,
                        vectors=_shuffle(vectors, dtype))
    tmp.replace(path)
    return path, meta


def read_shipped(path: Path | str) -> Shipped:
    """Load a shipped file.

    Raises:
        ValueError: not a shipped-embeddings file of this format, or arrays that disagree with its metadata
            (a truncated or edited file).
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"{path} is not a {FORMAT} v{FORMAT_VERSION} file")
            n, d, dtype = int(meta["count"]), int(meta["dimension"]), meta.get("dtype", "float32")
            if dtype not in DTYPES:
                raise ValueError(f"{path}: unknown dtype {dtype!r}")
            keys, kinds, planes = z["keys"], z["kinds"], z["vectors"]
            width = np.dtype(DTYPES[dtype]).itemsize
            if keys.shape != (n, 32) or kinds.shape != (n,) or planes.shape != (width, n * d):
                raise ValueError(f"{path}: arrays do not match the metadata ({n} vectors of {d})")
            return Shipped(meta, [bytes(k).hex() for k in keys], kinds, _unshuffle(planes, n, d, dtype))
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{path} cannot be read as shipped embeddings: {type(e).__name__}: {e}") from None


@dataclass
class SeedReport:
    """What :func:`seed_cache` did.

    ``status``: ``seeded``; ``already_cached`` (nothing missing, nothing checked); ``no_file`` (the dataset
    ships none); and the fallbacks, each logged as a warning: ``encoder_mismatch``, ``check_failed``,
    ``unreadable``, ``no_match`` (no shipped key is a text of the dataset).
    """

    status: str
    file: str | None = None
    seeded: int = 0
    missing_before: int = 0
    checked_documents: int = 0
    checked_queries: int = 0
    min_cosine: float | None = None
    message: str = ""
    fallback: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _fallback(status: str, message: str, **kw) -> SeedReport:
    log.warning("%s; falling back to encoding the corpus with the encoder", message)
    return SeedReport(status, message=message + "; the corpus will be encoded instead", fallback=True, **kw)


def seed_cache(dataset: Path | str, encoder, cache: EmbeddingCache, *, sample_documents: int = SAMPLE_DOCUMENTS,
               sample_queries: int = SAMPLE_QUERIES, seed: int = 0, min_cosine: float = MIN_COSINE,
               path: Path | str | None = None) -> SeedReport:
    """Check ``dataset``'s shipped embeddings against ``encoder`` and copy them into ``cache``.

    Steps: skip when the cache already holds every text of the dataset; pick the shipped file whose
    fingerprint is the encoder's (else warn ``encoder_mismatch``); re-encode a random sample
    (``numpy.random.default_rng(seed)``) of ``sample_documents`` documents and ``sample_queries``
    queries among the dataset texts the file holds; if any cosine to its shipped vector is below
    ``min_cosine`` warn ``check_failed``; else write the file's vectors of the dataset's texts into the
    cache.  Nothing is written on any fallback.

    Args:
        dataset: a BEIR folder.
        encoder: the encoder the build will use (``encode``, ``info``, ``max_tokens``).
        cache: the content-hash embedding cache.
        sample_documents: documents to re-encode (at least 32 by default; all matched ones if fewer).
        min_cosine: smallest acceptable cosine (unitless, 1 = identical direction).
        path: a shipped file to use instead of looking in ``<dataset>/embeddings``.

    Returns:
        :class:`SeedReport`.

    Raises:
        engine.io.beir.DatasetFormatError: on a malformed dataset.
    """
    fp = encoder_fingerprint(encoder)
    docs, queries = dataset_texts(dataset)
    key_of = {t: content_key(t, fp) for t in dict.fromkeys(docs + queries)}
    cached = cache.get_many(list(key_of.values()))
    missing = [k for k in key_of.values() if k not in cached]
    if not missing:
        return SeedReport("already_cached", message=f"the cache already holds all {len(key_of)} embeddings of "
                                                    f"{Path(dataset).name}")
    files = [Path(path)] if path is not None else sorted(shipped_dir(dataset).glob("*.npz"))
    if not files:
        return SeedReport("no_file", missing_before=len(missing),
                          message=f"{Path(dataset).name} ships no embeddings ({shipped_dir(dataset)})")
    shipped, others, unreadable = None, [], []
    for f in files:
        try:
            s = read_shipped(f)
        except ValueError as e:
            unreadable.append(str(e))
            continue
        if s.meta["fingerprint"] == fp:
            shipped, chosen = s, f
            break
        others.append(f"{f.name} ({s.meta['fingerprint'][:12]}…)")
    if shipped is None:
        if others:
            return _fallback("encoder_mismatch", f"shipped embeddings of {Path(dataset).name} were made by another "
                             f"encoder: {', '.join(others)}, this encoder is {fp[:12]}… (onnx|tokenizer|max_tokens)",
                             missing_before=len(missing))
        return _fallback("unreadable", "; ".join(unreadable), missing_before=len(missing))
    row_of = {k: i for i, k in enumerate(shipped.keys)}
    doc_texts = [t for t in dict.fromkeys(docs) if key_of[t] in row_of]
    doc_set = set(doc_texts)
    query_texts = [t for t in dict.fromkeys(queries) if key_of[t] in row_of and t not in doc_set]
    if not doc_texts and not query_texts:
        return _fallback("no_match", f"{chosen.name} holds no text of {Path(dataset).name} (another corpus?)",
                         file=str(chosen), missing_before=len(missing))
    rng = np.random.default_rng(seed)
    picked_docs = [doc_texts[i] for i in rng.choice(len(doc_texts), min(sample_documents, len(doc_texts)),
                                                    replace=False)]
    picked_queries = [query_texts[i] for i in rng.choice(len(query_texts), min(sample_queries, len(query_texts)),
                                                         replace=False)] if query_texts else []
    sample = picked_docs + picked_queries
    fresh = encoder.encode(sample)
    old = shipped.vectors[[row_of[key_of[t]] for t in sample]]
    cos = np.einsum("ij,ij->i", fresh, old) / np.maximum(
        np.linalg.norm(fresh, axis=1) * np.linalg.norm(old, axis=1), 1e-12)
    cos = np.where(np.isfinite(cos), cos, -1.0)
    checked = {"file": str(chosen), "missing_before": len(missing), "checked_documents": len(picked_docs),
               "checked_queries": len(picked_queries), "min_cosine": float(cos.min())}
    if cos.min() < min_cosine:
        return _fallback("check_failed", f"shipped embeddings {chosen.name} fail the check: re-encoding "
                         f"{len(sample)} sampled texts gives a cosine of {cos.min():.6f} < {min_cosine} "
                         f"({int((cos < min_cosine).sum())} below)", **checked)
    wanted = set(key_of.values())
    items = {k: shipped.vectors[i] for k, i in row_of.items() if k in wanted}
    cache.put_many(items)
    log.info("seeded %d embeddings of %s from %s (sample of %d re-encoded, min cosine %.7f)", len(items),
             Path(dataset).name, chosen.name, len(sample), cos.min())
    return SeedReport("seeded", seeded=len(items), message=f"seeded {len(items)} embeddings from {chosen.name} "
                      f"after re-encoding {len(sample)} sampled texts (min cosine {cos.min():.7f})", **checked)
