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
bm25_counts.npz        the term counts of each document (CSR: document -> token ids, counts) and the
                       vocabulary: what a fold (issue 18) reuses for unchanged documents, so it tokenizes only
                       new texts; absent in versions built before it (a fold then tokenizes every text)
doc_text.json          list of N normalised texts (:func:`adawidth.hybrid.normalize_text` of title + text)
doc_fields.json        list of N objects: the keyword fields of each document (``tenant``, ``acl``, ...)
=====================  =====================================================================

The manifest section ``lexical`` (:class:`engine.version.manifest.LexicalSection`) records the analyzer and
the BM25 parameters; :func:`engine.version.manifest.verify` refuses a version whose analyzer this build does not
implement.  The runtime that scores with these files is :class:`engine.lexical.LexicalIndex`.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np
import scipy.sparse as sp

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


COUNTS_FILE = "bm25_counts.npz"
"""The term counts of a version's documents (:class:`TermCounts`, ``numpy.savez``)."""


@dataclass(frozen=True)
class TermCounts:
    """Term counts of N documents over a vocabulary of V tokens, CSR by document.

    Attributes:
        vocab: V tokens; a token's id is its position.
        indptr: (N + 1,) int64; document i's entries are ``[indptr[i], indptr[i + 1])``.
        terms: (nnz,) int32 token ids, ascending within a document, unique.
        counts: (nnz,) int32 occurrences (>= 1) of each token in its document.
        lengths: (N,) int64 token count of each document (repeats counted), the BM25 document length.
    """

    vocab: list[str]
    indptr: np.ndarray
    terms: np.ndarray
    counts: np.ndarray
    lengths: np.ndarray

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(token ids, counts, length) of document ``i``."""
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.terms[a:b], self.counts[a:b], int(self.lengths[i])

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, indptr=self.indptr, terms=self.terms, counts=self.counts, lengths=self.lengths,
                 vocab=np.asarray(json.dumps(self.vocab, ensure_ascii=False)))
        return buf.getvalue()

    @staticmethod
    def read(path: Path) -> "TermCounts":
        with np.load(path, allow_pickle=False) as z:
            return TermCounts(json.loads(str(z["vocab"])), z["indptr"], z["terms"], z["counts"], z["lengths"])


def term_counts(normalized: Sequence[str], base: TermCounts | None = None,
                base_row_of: Mapping[str, int] | None = None) -> TermCounts:
    """Count the tokens (:func:`adawidth.hybrid.tokens`) of N normalised texts.

    Args:
        normalized: N texts already normalised (:func:`adawidth.hybrid.normalize_text`).
        base: a base version's counts (a fold): a text found in ``base_row_of`` takes its row as it is
            instead of being tokenized again.
        base_row_of: normalised text -> its row in ``base``.

    Returns:
        the counts over the tokens present (the base's vocabulary order, then new tokens in order of first
        appearance; tokens no document holds any more are dropped).
    """
    vocab: dict[str, int] = {t: i for i, t in enumerate(base.vocab)} if base is not None else {}
    rows_t, rows_c, lengths = [], [], np.empty(len(normalized), np.int64)
    for i, text in enumerate(normalized):
        r = base_row_of.get(text) if base is not None and base_row_of else None
        if r is not None:
            ids, cnt, lengths[i] = base.row(r)
        else:
            all_toks = hybrid.tokens(text)
            lengths[i] = len(all_toks)
            uniq: dict[str, int] = {}
            for t in all_toks:
                uniq[t] = uniq.get(t, 0) + 1
            ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in uniq), np.int32, len(uniq))
            cnt = np.fromiter(uniq.values(), np.int32, len(uniq))
            order = np.argsort(ids, kind="stable")
            ids, cnt = ids[order], cnt[order]
        rows_t.append(ids)
        rows_c.append(cnt)
    indptr = np.zeros(len(normalized) + 1, np.int64)
    np.cumsum([len(r) for r in rows_t], out=indptr[1:])
    cat = (lambda rows: np.concatenate(rows).astype(np.int32, copy=False) if rows else np.zeros(0, np.int32))
    terms, counts = cat(rows_t), cat(rows_c)
    words = list(vocab)
    present = np.bincount(terms, minlength=len(words)) > 0
    if not present.all():  # compact: a monotone renumbering keeps every row ascending
        new_id = np.cumsum(present, dtype=np.int64) - 1
        terms = new_id[terms].astype(np.int32)
        words = [w for w, keep in zip(words, present) if keep]
    return TermCounts(words, indptr, terms, counts, lengths)


def bm25_scores(tc: TermCounts, params: "Bm25Params") -> dict:
    """The BM25 score matrix of ``tc`` in ``bm25s``'s layout (CSC, shape (N, V): ``data`` (nnz,) float32
    scores, ``indices`` (nnz,) int32 document ids, ``indptr`` (V + 1,) int32, ``num_docs``), computed in a
    few vectorised passes instead of ``bm25s``'s per-document Python loop; equal to ``bm25s.BM25.index`` on
    the same tokens, score for score (``tests/unit/test_bm25_counts.py``).

    Lucene's BM25 (Kamphuis et al., ECIR 2020, the variant ``bm25s`` names ``lucene``):
    ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
    ``score(d, t) = idf(t) * tf / (k1 * ((1 - b) + b * |d| / avgdl) + tf)``, in bm25s's order of operations
    (idf rounded to float32, the rest in float64, the product rounded to float32).
    """
    if params.method != "lucene":
        raise ValueError(f"bm25_scores implements method 'lucene', not {params.method!r}")

    n, v = len(tc.lengths), len(tc.vocab)
    df = np.bincount(tc.terms, minlength=v)
    idf = np.zeros(v, np.float32)
    nz = df > 0
    idf[nz] = np.log(1 + (n - df[nz] + 0.5) / (df[nz] + 0.5)).astype(np.float32)
    avgdl = tc.lengths.mean()
    doc_of = np.repeat(np.arange(n, dtype=np.int32), np.diff(tc.indptr))
    dl = tc.lengths[doc_of].astype(np.float64)
    tf = tc.counts.astype(np.float32).astype(np.float64)
    tfc = tf / (params.k1 * ((1 - params.b) + params.b * dl / avgdl) + tf)
    data = (idf[tc.terms].astype(np.float64) * tfc).astype(np.float32)
    m = sp.csc_matrix((data, (doc_of, tc.terms)), shape=(n, v), dtype=np.float32)
    return {"data": m.data, "indices": m.indices, "indptr": m.indptr, "num_docs": n}


def lexical_files(texts: Sequence[str], fields: Sequence[dict], params: Bm25Params = Bm25Params(),
                  reuse: "LexicalReuse | None" = None) -> tuple[Files, LexicalSection]:
    """Build the BM25 index of a corpus; return the writers of its files and the manifest section.

    Args:
        texts: N document texts (title + " " + text, the encoder's text).
        fields: N mappings of extra corpus fields (:attr:`engine.io.beir.Document.fields`); keyword
            values are kept (:func:`adawidth.hybrid.keyword_values`).
        params: BM25 parameters.
        reuse: a base version's normalised texts and term counts (:func:`lexical_reuse`, a fold): a text the
            base holds is neither normalised nor tokenized again; the index is the same as without it.

    Returns:
        (file name -> writer, the manifest's ``lexical`` section).
    """
    if reuse is not None:
        normalized = [reuse.normalized.get(t) or hybrid.normalize_text(t) for t in texts]
    else:
        normalized = [hybrid.normalize_text(t) for t in texts]
    counts = (term_counts(normalized, reuse.counts, reuse.row_of) if reuse is not None
              else term_counts(normalized))
    retriever = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
    retriever.scores = bm25_scores(counts, params)
    retriever.vocab_dict = {t: i for i, t in enumerate(counts.vocab)}
    retriever.vocab_dict.setdefault("", len(counts.vocab))  # bm25s's empty token (index(create_empty_token))
    retriever.unique_token_ids_set = set(retriever.vocab_dict.values())
    retriever.nonoccurrence_array = None  # lucene needs none (bm25s sets it for BM25L and BM25+ only)
    with tempfile.TemporaryDirectory(prefix="bm25-") as tmp:
        retriever.save(tmp, show_progress=False, **BM25_FILES)
        blobs = {p.name: p.read_bytes() for p in Path(tmp).iterdir()}
    blobs[COUNTS_FILE] = counts.to_bytes()
    kept = [{k: v for k, v in f.items() if hybrid.keyword_values(v) is not None} for f in fields]
    section = LexicalSection(kind="bm25s", analyzer=LEXICAL_ANALYZER, k1=params.k1, b=params.b, method=params.method,
                             files=sorted(blobs), fields=sorted({k for f in kept for k in f}),
                             vocabulary=len(counts.vocab), documents_with_fields=sum(1 for f in kept if f),
                             counts_file=COUNTS_FILE)
    files: Files = {name: (lambda data: (lambda p: p.write_bytes(data)))(data) for name, data in sorted(blobs.items())}
    files[section.text_file] = lambda p: p.write_text(json.dumps(normalized, ensure_ascii=False), encoding="utf-8")
    files[section.fields_file] = lambda p: p.write_text(json.dumps(kept, ensure_ascii=False), encoding="utf-8")
    return files, section


@dataclass(frozen=True)
class LexicalReuse:
    """What a fold takes from its base version's lexical files (:func:`lexical_reuse`).

    Attributes:
        normalized: encoder text -> its normalised text.
        counts: the base's term counts.
        row_of: normalised text -> its row in ``counts``.
    """

    normalized: dict[str, str]
    counts: TermCounts
    row_of: dict[str, int]


def lexical_reuse(path: Path, m: Manifest, encoder_texts: Sequence[str]) -> LexicalReuse | None:
    """The normalised texts and term counts of the version at ``path``, keyed by its documents' encoder texts
    (``encoder_texts``, N, row order); None when the version has no lexical files or no term counts (built
    before them: the fold then tokenizes every text)."""
    section = m.lexical
    if section is None or not section.counts_file or not (path / section.counts_file).is_file():
        return None
    normalized = json.loads((path / section.text_file).read_text(encoding="utf-8"))
    tc = TermCounts.read(path / section.counts_file)
    if len(normalized) != len(encoder_texts) or len(tc.lengths) != len(normalized):
        return None
    return LexicalReuse(dict(zip(encoder_texts, normalized)), tc, {t: i for i, t in enumerate(normalized)})


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
