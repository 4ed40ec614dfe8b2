"""The lexical lane of a loaded version: BM25 scoring (``bm25s``), exact-phrase verification and keyword fields.

The files are written and read by :mod:`engine.version.lexical`; this module scores with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from adawidth import hybrid
from engine.version.lexical import read_lexical
from engine.version.manifest import Manifest


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
    def load(cls, path: Path, manifest: Manifest) -> "LexicalIndex | None":
        """The lexical side of a verified version, or None when the version has none (built before it).

        Raises:
            engine.version.manifest.IndexVersionError: ``schema`` for inconsistent files.
        """
        files = read_lexical(path, manifest)
        if files is None:
            return None
        return cls(files.retriever, files.texts, hybrid.FieldIndex(files.fields, len(files.texts)))

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
            for tok in dict.fromkeys(hybrid.tokens(phrase)):
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
