"""Writer and reader of the lexical files of an index version: a BM25 index (``bm25s``), the normalised
document texts for exact-phrase checks, and the keyword fields for filters and access control.

Files (all listed with their sha256 in the manifest; a version without them still loads and serves
``mode: "dense"``):

=====================  =====================================================================
bm25_data.npy,         the BM25 score matrix of ``bm25s`` (CSC: token -> documents), written
bm25_indices.npy,      and read by ``bm25s.BM25.save`` / ``load`` under these names
bm25_indptr.npy,
bm25_vocab.json,
bm25_params.json
doc_text.json          list of N normalised texts (:func:`adawidth.hybrid.normalize_text` of title + text)
doc_fields.json        list of N objects: the keyword fields of each document (``tenant``, ``acl``, ...)
=====================  =====================================================================

The manifest section ``lexical`` (:class:`engine.version.manifest.LexicalSection`) records the analyzer and
the BM25 parameters; :func:`engine.version.manifest.verify` refuses a version whose analyzer this build does not
implement.  The runtime that scores with these files is :class:`engine.lexical.LexicalIndex`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from adawidth import hybrid
from engine.version.files import Files
from engine.version.manifest import LEXICAL_ANALYZER, IndexVersionError, LexicalSection, Manifest

BM25_FILES = {"data_name": "bm25_data.npy", "indices_name": "bm25_indices.npy", "indptr_name": "bm25_indptr.npy",
              "vocab_name": "bm25_vocab.json", "params_name": "bm25_params.json", "nnoc_name": "bm25_nnoc.npy"}
"""File names ``bm25s.BM25.save`` / ``load`` use (keyword arguments of both)."""


@dataclass(frozen=True)
class Bm25Params:
    """BM25 parameters (Lucene's variant); k1 = 0.9, b = 0.4 are Anserini's defaults and the reference
    figures' (shared/data/SOURCES.md)."""

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"


def lexical_files(texts: Sequence[str], fields: Sequence[dict],
                  params: Bm25Params = Bm25Params()) -> tuple[Files, LexicalSection]:
    """Build the BM25 index of a corpus; return the writers of its files and the manifest section.

    Args:
        texts: N document texts (title + " " + text, the encoder's text).
        fields: N mappings of extra corpus fields (:attr:`engine.io.beir.Document.fields`); keyword
            values are kept (:func:`adawidth.hybrid.keyword_values`).
        params: BM25 parameters.

    Returns:
        (file name -> writer, the manifest's ``lexical`` section).
    """
    normalized = [hybrid.normalize_text(t) for t in texts]
    retriever = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
    retriever.index([hybrid.tokens(t) for t in normalized], show_progress=False)
    with tempfile.TemporaryDirectory(prefix="bm25-") as tmp:
        retriever.save(tmp, show_progress=False, **BM25_FILES)
        blobs = {p.name: p.read_bytes() for p in Path(tmp).iterdir()}
    kept = [{k: v for k, v in f.items() if hybrid.keyword_values(v) is not None} for f in fields]
    section = LexicalSection(kind="bm25s", analyzer=LEXICAL_ANALYZER, k1=params.k1, b=params.b, method=params.method,
                             files=sorted(blobs), fields=sorted({k for f in kept for k in f}),
                             vocabulary=len(retriever.vocab_dict), documents_with_fields=sum(1 for f in kept if f))
    files: Files = {name: (lambda data: (lambda p: p.write_bytes(data)))(data) for name, data in sorted(blobs.items())}
    files[section.text_file] = lambda p: p.write_text(json.dumps(normalized, ensure_ascii=False), encoding="utf-8")
    files[section.fields_file] = lambda p: p.write_text(json.dumps(kept, ensure_ascii=False), encoding="utf-8")
    return files, section


@dataclass(frozen=True)
class LexicalFiles:
    """The loaded lexical files: a ``bm25s.BM25`` (memory-mapped), N normalised texts, N field objects."""

    retriever: bm25s.BM25
    texts: list[str]
    fields: list[dict]


def read_lexical(path: Path, m: Manifest) -> LexicalFiles | None:
    """The lexical files of a verified version, or None when it has none (built before them).

    Raises:
        IndexVersionError: ``schema`` when the files do not hold one entry per document.
    """
    section = m.lexical
    if section is None:
        return None
    retriever = bm25s.BM25.load(path, mmap=True, load_corpus=False, show_progress=False, **BM25_FILES)
    # plain ndarray views of the same mapped pages: np.memmap's subclass hooks cost ~1 µs per slice, and
    # BM25 scoring slices the postings once per query term
    retriever.scores = {key: np.asarray(val) if isinstance(val, np.memmap) else val
                        for key, val in retriever.scores.items()}
    texts = json.loads((path / section.text_file).read_text(encoding="utf-8"))
    fields = json.loads((path / section.fields_file).read_text(encoding="utf-8"))
    n = m.corpus.documents
    if len(texts) != n or len(fields) != n or retriever.scores["num_docs"] != n:
        raise IndexVersionError("schema", "lexical files do not have one entry per document")
    return LexicalFiles(retriever, texts, fields)
