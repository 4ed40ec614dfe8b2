"""The lexical side of an index version: a BM25 index (``bm25s``), the normalised document texts for
exact-phrase checks, and the keyword fields for filters and access control.

Files (all listed with their sha256 in the manifest, so :func:`engine.version.store.verify_version` checks
them; a version without them still loads and serves ``mode: "dense"``):

=====================  =====================================================================
bm25_data.npy,         the BM25 score matrix of ``bm25s`` (CSC: token -> documents), written
bm25_indices.npy,      and read by ``bm25s.BM25.save`` / ``load`` under these names
bm25_indptr.npy,
bm25_vocab.json,
bm25_params.json
doc_text.json          list of N normalised texts (:func:`adawidth.hybrid.normalize_text` of title + text)
doc_fields.json        list of N objects: the keyword fields of each document (``tenant``, ``acl``, ...)
=====================  =====================================================================

The manifest entry ``lexical`` records the analyzer and BM25 parameters; the gateway refuses to read a
version whose analyzer it does not implement.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adawidth import hybrid
from engine.version.store import IndexVersionError

ANALYZER = "nfkc-casefold-\\w+-v1"
"""Name of the declared analyzer (:func:`adawidth.hybrid.analyze`); stored in the manifest."""

BM25_FILES = {"data_name": "bm25_data.npy", "indices_name": "bm25_indices.npy", "indptr_name": "bm25_indptr.npy",
              "vocab_name": "bm25_vocab.json", "params_name": "bm25_params.json", "nnoc_name": "bm25_nnoc.npy"}


@dataclass(frozen=True)
class Bm25Params:
    """BM25 parameters (Lucene's variant); k1 = 0.9, b = 0.4 are Anserini's defaults and the reference
    figures' (shared/data/SOURCES.md)."""

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"


def lexical_writers(texts: Sequence[str], fields: Sequence[dict],
                    params: Bm25Params = Bm25Params()) -> tuple[dict[str, Callable[[Path], None]], dict]:
    """Build the BM25 index of a corpus and return the artifact writers and the manifest entry.

    Args:
        texts: N document texts (title + " " + text, the encoder's text).
        fields: N mappings of extra corpus fields (:attr:`engine.io.beir.Document.fields`); keyword
            values are kept (:func:`adawidth.hybrid.keyword_values`).
        params: BM25 parameters.

    Returns:
        (file name -> writer, the manifest's ``lexical`` entry).
    """
    import bm25s

    normalized = [hybrid.normalize_text(t) for t in texts]
    retriever = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
    retriever.index([hybrid._TOKEN.findall(t) for t in normalized], show_progress=False)
    tmp = Path(tempfile.mkdtemp(prefix="bm25-"))
    try:
        retriever.save(tmp, show_progress=False, **BM25_FILES)
        blobs = {p.name: p.read_bytes() for p in tmp.iterdir()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    kept = [{k: v for k, v in f.items() if hybrid.keyword_values(v) is not None} for f in fields]
    writers: dict[str, Callable[[Path], None]] = {
        name: (lambda data: (lambda p: p.write_bytes(data)))(data) for name, data in sorted(blobs.items())}
    writers["doc_text.json"] = lambda p: p.write_text(json.dumps(normalized, ensure_ascii=False), encoding="utf-8")
    writers["doc_fields.json"] = lambda p: p.write_text(json.dumps(kept, ensure_ascii=False), encoding="utf-8")
    names = sorted({k for f in kept for k in f})
    entry = {"kind": "bm25s", "analyzer": ANALYZER, "k1": params.k1, "b": params.b, "method": params.method,
             "vocabulary": len(retriever.vocab_dict), "files": sorted(blobs),
             "fields": names, "documents_with_fields": sum(1 for f in kept if f)}
    return writers, entry


class LexicalIndex:
    """BM25 scoring, phrase verification and keyword fields of one loaded version.

    Args:
        retriever: a loaded ``bm25s.BM25``.
        texts: N normalised document texts.
        fields: the :class:`adawidth.hybrid.FieldIndex` of the documents.
    """

    def __init__(self, retriever, texts: list[str], fields: hybrid.FieldIndex):
        self.retriever, self.texts, self.fields = retriever, texts, fields
        self.n_docs = len(texts)

    @classmethod
    def load(cls, path: Path, manifest: dict) -> "LexicalIndex | None":
        """The lexical side of a verified version, or None when the version has none (built before it).

        Raises:
            engine.version.store.IndexVersionError: ``schema`` for an unknown analyzer or inconsistent files.
        """
        import bm25s

        entry = manifest.get("lexical")
        if not entry:
            return None
        if entry.get("analyzer") != ANALYZER or entry.get("kind") != "bm25s":
            raise IndexVersionError("schema", f"lexical index {entry.get('kind')}/{entry.get('analyzer')} "
                                              f"is not the analyzer this gateway runs ({ANALYZER})")
        retriever = bm25s.BM25.load(path, mmap=True, load_corpus=False, show_progress=False, **BM25_FILES)
        texts = json.loads((path / "doc_text.json").read_text(encoding="utf-8"))
        fields = json.loads((path / "doc_fields.json").read_text(encoding="utf-8"))
        n = manifest["corpus"]["documents"]
        if len(texts) != n or len(fields) != n or retriever.scores["num_docs"] != n:
            raise IndexVersionError("schema", "lexical files do not have one entry per document")
        return cls(retriever, texts, hybrid.FieldIndex(fields, n))

    def scores(self, query_text: str) -> np.ndarray:
        """(N,) float32 BM25 scores of the query's analyzed tokens (0 where no query term occurs)."""
        vocab = self.retriever.vocab_dict
        tokens = [t for t in hybrid.analyze(query_text) if t in vocab]
        if not tokens:
            return np.zeros(self.n_docs, dtype=np.float32)
        return np.asarray(self.retriever.get_scores(tokens), dtype=np.float32)

    def _rows_with_token(self, token: str) -> np.ndarray | None:
        tid = self.retriever.vocab_dict.get(token)
        indptr = self.retriever.scores["indptr"]
        if tid is None or tid + 1 >= len(indptr):
            return None
        return np.asarray(self.retriever.scores["indices"][indptr[tid]:indptr[tid + 1]], dtype=np.int64)

    def phrase_mask(self, phrases: Sequence[str]) -> np.ndarray:
        """(N,) bool of documents containing every normalised phrase (:func:`adawidth.hybrid.contains_phrases`).

        The postings of the phrase's tokens narrow the candidates; each candidate's text is then verified
        with the exact pattern, so the answer does not depend on the BM25 analyzer.
        """
        mask = np.ones(self.n_docs, dtype=bool)
        for phrase in phrases:
            cand = np.ones(self.n_docs, dtype=bool)
            for tok in dict.fromkeys(hybrid._TOKEN.findall(phrase)):
                rows = self._rows_with_token(tok)
                sub = np.zeros(self.n_docs, dtype=bool)
                if rows is not None:
                    sub[rows] = True
                cand &= sub
            pattern = hybrid.phrase_pattern(phrase)
            ok = np.zeros(self.n_docs, dtype=bool)
            for row in np.flatnonzero(cand & mask):
                ok[row] = pattern.search(self.texts[row]) is not None
            mask &= ok
        return mask
