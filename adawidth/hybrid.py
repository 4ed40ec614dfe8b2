"""Pure maths of the lexical and hybrid lanes: text normalisation, quoted-phrase constraints, rank fusion,
metadata filters and access policy (§20.2 of 003: "where dense wins and where BM25 wins").

Nothing here does I/O; the BM25 index itself (``bm25s``) lives in :mod:`engine.lexical`.

Declared normalisation (docs/API.md, "Exact phrases"):

* **text** -> ``normalize_text``: Unicode NFKC, then ``str.casefold``, then every run of whitespace
  becomes one space, leading/trailing whitespace dropped.
* **tokens** (BM25 analyzer) -> ``analyze``: the ``\\w+`` runs of the normalised text (letters, digits
  and underscore; no stemming, no stop words), as in the BM25 reference figures of the classic collections.
* **phrase constraint**: a double-quoted span of the query (``"..."`` or curly quotes) holds for a
  document iff the normalised phrase occurs in the normalised document text (title + " " + text) with no
  word character immediately before or after it.  ``"ERR_SSL_5417"`` therefore matches
  ``err_ssl_5417,`` but not ``ERR_SSL_54170``; punctuation inside a phrase must match exactly.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

RRF_K = 60
"""Reciprocal-rank-fusion constant of Cormack et al. (2009): score = sum 1 / (RRF_K + rank)."""

_WS = re.compile(r"\s+")
_TOKEN = re.compile(r"\w+")
_QUOTE_CHARS = frozenset("\"\u201c\u201d\u201e")
_QUOTED = re.compile(r"[\"\u201c\u201d\u201e]([^\"\u201c\u201d\u201e]*)[\"\u201c\u201d\u201e]")


def normalize_text(text: str) -> str:
    """NFKC, casefold, whitespace runs -> one space, stripped (the declared normalisation)."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def tokens(normalized: str) -> list[str]:
    """The ``\\w+`` runs of an already normalised text (:func:`normalize_text`), in order, repeats kept."""
    return _TOKEN.findall(normalized)


def analyze(text: str) -> list[str]:
    """BM25 tokens of ``text``: ``\\w+`` runs of :func:`normalize_text` (no stemming, no stop words)."""
    return tokens(normalize_text(text))


@dataclass(frozen=True)
class ParsedQuery:
    """A query split into free text and exact-phrase constraints.

    Attributes:
        text: the query with the quote characters removed (the phrases' words stay, so they still count
            for the dense encoder and for BM25).
        phrases: normalised phrases (non-empty, in order of appearance, duplicates removed).
    """

    text: str
    phrases: tuple[str, ...]


def parse_query(query: str) -> ParsedQuery:
    """Find the double-quoted phrases of ``query`` (straight or curly quotes).

    An unmatched quote character is ordinary text; an empty or blank phrase (``""``) is no constraint.
    """
    if not _QUOTE_CHARS.intersection(query):  # no quote character, no phrase (the common case)
        return ParsedQuery(query, ())
    phrases: list[str] = []
    for m in _QUOTED.finditer(query):
        p = normalize_text(m.group(1))
        if p and p not in phrases:
            phrases.append(p)
    text = _QUOTED.sub(lambda m: m.group(1), query) if phrases else query
    return ParsedQuery(text, tuple(phrases))


def phrase_pattern(phrase: str) -> re.Pattern:
    """Compiled pattern of a normalised phrase: the phrase with no word character on either side."""
    return re.compile(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)")


def contains_phrases(normalized_doc: str, phrases: Sequence[str]) -> bool:
    """True when every normalised phrase occurs in the normalised document text (see the module docstring)."""
    return all(phrase_pattern(p).search(normalized_doc) for p in phrases)


def rrf_fuse(ranked_lists: Sequence[np.ndarray], k: int = RRF_K) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of ranked row lists.

    Args:
        ranked_lists: each an (n_i,) int array of index rows, best first (rank 1 = position 0).
        k: the RRF constant (60).

    Returns:
        (rows (U,) int64, scores (U,) float64) over the union U of the lists, best first; score of a row
        is ``sum_i 1 / (k + rank_i)`` over the lists that contain it (higher is better).  Ties are
        broken by the best rank in the first list, then the second, ..., then by row.
    """
    score: dict[int, float] = {}
    for lst in ranked_lists:
        for rank, row in enumerate(np.asarray(lst, dtype=np.int64).tolist(), start=1):
            score[row] = score.get(row, 0.0) + 1.0 / (k + rank)
    if not score:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    pos = [{int(r): i for i, r in enumerate(np.asarray(lst).tolist())} for lst in ranked_lists]
    big = 1 << 62
    order = sorted(score, key=lambda r: (-score[r], *[p.get(r, big) for p in pos], r))
    return np.array(order, dtype=np.int64), np.array([score[r] for r in order], dtype=np.float64)


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scores rescaled to [0, 1] by their min and max (all zeros when they are all equal)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return s
    lo, hi = float(s.min()), float(s.max())
    return np.zeros_like(s) if hi <= lo else (s - lo) / (hi - lo)


def convex_fuse(rows: np.ndarray, dense: np.ndarray, lexical: np.ndarray,
                alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Normalised convex combination ``alpha * minmax(dense) + (1 - alpha) * minmax(lexical)``.

    Args:
        rows: (U,) int index rows of the candidate union.
        dense: (U,) dense scores of those rows (prefix cosines; higher is better).
        lexical: (U,) BM25 scores of those rows (0 for no term overlap; higher is better).
        alpha: weight of the dense lane in [0, 1].

    Returns:
        (rows, fused scores in [0, 1]) best first; ties broken by dense score, then by row.

    Raises:
        ValueError: when alpha is outside [0, 1] or the arrays differ in length.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha} outside [0, 1]")
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows) == len(dense) == len(lexical):
        raise ValueError("rows, dense and lexical must have one entry per candidate")
    fused = alpha * minmax(dense) + (1.0 - alpha) * minmax(lexical)
    order = np.lexsort((rows, -np.asarray(dense, np.float64), -fused))
    return rows[order], fused[order]


# ---------------------------------------------------------------------------------------------- filters


def value_key(value) -> str:
    """Canonical key of a keyword value (JSON text: ``"a"``, ``1`` and ``true`` are three different values)."""
    return json.dumps(value, ensure_ascii=True, sort_keys=True)


def keyword_values(value) -> list | None:
    """The keyword values of a document field: a str/int/bool or a list of them; None for anything else."""
    ok = (str, int, bool)
    if isinstance(value, ok) and not isinstance(value, float):
        return [value]
    if isinstance(value, list) and all(isinstance(v, ok) for v in value):
        return list(value)
    return None


class FieldIndex:
    """Inverted index of keyword fields: field -> value key -> sorted rows.

    Args:
        fields: one mapping per document (index order) of field name -> value; values that are not a
            keyword or a list of keywords (numbers with a fraction, objects, null) are ignored.
        n_docs: N.
    """

    def __init__(self, fields: Sequence[Mapping], n_docs: int):
        if len(fields) != n_docs:
            raise ValueError(f"{len(fields)} field maps for {n_docs} documents")
        self.n_docs = n_docs
        post: dict[str, dict[str, list[int]]] = {}
        for row, f in enumerate(fields):
            for name, value in f.items():
                vals = keyword_values(value)
                if vals is None:
                    continue
                per = post.setdefault(name, {})
                for v in dict.fromkeys(value_key(x) for x in vals):
                    per.setdefault(v, []).append(row)
        self.postings = {n: {v: np.asarray(r, np.int64) for v, r in per.items()} for n, per in post.items()}

    @property
    def field_names(self) -> list[str]:
        return sorted(self.postings)

    def rows_with(self, name: str, values: Sequence) -> np.ndarray:
        """(N,) bool: documents whose field ``name`` holds at least one of ``values``."""
        mask = np.zeros(self.n_docs, dtype=bool)
        per = self.postings.get(name, {})
        for v in values:
            rows = per.get(value_key(v))
            if rows is not None:
                mask[rows] = True
        return mask

    def rows_having(self, name: str) -> np.ndarray:
        """(N,) bool: documents that have field ``name`` with any keyword value."""
        mask = np.zeros(self.n_docs, dtype=bool)
        for rows in self.postings.get(name, {}).values():
            mask[rows] = True
        return mask

    def filter_mask(self, flt: Mapping[str, object] | None) -> np.ndarray:
        """(N,) bool of documents passing a request filter: for every field, the document's value (or one
        of its values) equals the requested value (or one of the requested values)."""
        mask = np.ones(self.n_docs, dtype=bool)
        for name, want in (flt or {}).items():
            mask &= self.rows_with(name, want if isinstance(want, list) else [want])
        return mask


@dataclass(frozen=True)
class Principal:
    """Who asks: a tenant and the ACL groups it belongs to.  ``tenant=None`` means no tenant policy."""

    tenant: str | None
    groups: tuple[str, ...] = ()


def access_mask(index: FieldIndex, principal: Principal | None, *, tenant_field: str = "tenant",
                acl_field: str = "acl") -> np.ndarray:
    """(N,) bool of documents ``principal`` may see (fail closed).

    Rules, when a principal is given: a document is visible iff its ``tenant_field`` equals the
    principal's tenant (a document without one is visible to nobody), and, when it carries an
    ``acl_field`` with at least one value, one of those values is one of the principal's groups.
    With ``principal=None`` (no policy configured) every document is visible.
    """
    if principal is None:
        return np.ones(index.n_docs, dtype=bool)
    if principal.tenant is None:
        return np.zeros(index.n_docs, dtype=bool)
    mask = index.rows_with(tenant_field, [principal.tenant])
    restricted = index.rows_having(acl_field)
    granted = index.rows_with(acl_field, list(principal.groups))
    return mask & (~restricted | granted)
