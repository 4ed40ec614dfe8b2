"""Pseudo-queries drawn from the corpus: label-free calibration data.

Most collections come with a corpus and no relevance labels.  Whatever must be
calibrated on queries (the declared-recall confidence of level pruning, a
rotation fitted to query statistics) then uses short texts drawn from the
corpus itself:

* **titles**, where the documents have informative titles (at least
  ``min_title_share`` of the documents have a title of 3–40 words and a body
  that is more than the title);
* otherwise **sentences held out of their documents**: one sentence of 4–40
  words chosen at random (seeded) from a document's text.  A document whose
  text has no sentence punctuation and is longer than 40 words gives a seeded
  **window** of consecutive words instead (e.g. NPL's unpunctuated abstracts).

"Held out" means the sentence is taken from the text; the indexed document is
not re-encoded without it.  A pseudo-query that is the whole of its
document's text (a one-sentence document, or a title-only document such as
CACM's) is marked ``whole_document`` in the record, because its source
document then scores it with cosine 1.

Pure: no file, clock or network access; deterministic for a seed.  The
sentence splitter is a regular expression (a sentence ends at ``.``, ``!`` or
``?`` followed by white space), which also splits the tokenised " . " style of
the classic collections.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MIN_TITLE_WORDS = 3
MIN_SENTENCE_WORDS = 4
MAX_WORDS = 40
SOURCES = ("title", "sentence", "window")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class PseudoQueries:
    """Query texts drawn from a corpus, with where each came from.

    Attributes:
        texts: Q query strings, in draw order (distinct after white-space and case normalisation).
        doc_rows: (Q,) int64, the row (position in the input corpus) of each query's source document.
        sources: Q strings, each one of ``"title"``, ``"sentence"``, ``"window"``.
        whole_document: (Q,) bool, True where the query is the whole text of its source document.
        record: manifest entry (see :func:`pseudo_queries`).
    """

    texts: list[str]
    doc_rows: np.ndarray
    sources: list[str]
    whole_document: np.ndarray
    record: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def informative_title(title: str, text: str) -> bool:
    """True when ``title`` has 3–40 words and the document has a body beyond its title.

    A title-only document (empty text, as in CACM) or a text equal to its title
    gives no separate query: the "title" would be the whole document.
    """
    n = len(title.split())
    body = _norm(text)
    return MIN_TITLE_WORDS <= n <= MAX_WORDS and len(body.split()) >= MIN_SENTENCE_WORDS and body != _norm(title)


def sentence_candidates(title: str, text: str, rng: np.random.Generator) -> list[tuple[str, str, bool]]:
    """A document's candidate pseudo-queries from its text, shuffled by ``rng``.

    The text is split into sentences; those of 4–40 words are candidates.  A
    document with an empty text uses its title as its text.  When no sentence
    qualifies and the longest one exceeds 40 words, one window of 40
    consecutive words at a seeded offset is the only candidate.

    Returns:
        list of ``(query text, source, whole_document)``, source ``"sentence"`` or ``"window"``.
    """
    body = text if text.strip() else title
    sentences = [" ".join(s.split()) for s in _SENTENCE_END.split(body) if s.strip()]
    whole = _norm(body)
    out = [(s, "sentence", _norm(s) == whole) for s in sentences if MIN_SENTENCE_WORDS <= len(s.split()) <= MAX_WORDS]
    if out:
        order = rng.permutation(len(out))
        return [out[i] for i in order]
    if sentences:
        words = max(sentences, key=lambda s: len(s.split())).split()
        if len(words) > MAX_WORDS:
            start = int(rng.integers(0, len(words) - MAX_WORDS + 1))
            return [(" ".join(words[start:start + MAX_WORDS]), "window", False)]
    return []


def pseudo_queries(titles: Sequence[str], texts: Sequence[str], count: int, seed: int = 0, *,
                   min_title_share: float = 0.5) -> PseudoQueries:
    """Draw up to ``count`` pseudo-queries from a corpus.

    Mode: ``"titles"`` when at least ``min_title_share`` of the documents have an
    :func:`informative_title`, else ``"sentences"``.  Documents are visited in a
    seeded random order, one query per document per round, so the first
    ``len(corpus)`` queries come from distinct documents:

    * in ``"titles"`` mode a round takes each informative title once; documents
      without one give a sentence (recorded as such);
    * later rounds (only when ``count`` exceeds what one round gives) take
      further unused sentences of the same documents;
    * queries equal (case and white space aside) to one already drawn are skipped.

    Args:
        titles: N document titles (``""`` where there is none).
        texts: N document texts.
        count: number of queries wanted (>= 0); fewer come back when the corpus has too few candidates.
        seed: seed of the document order and of each document's sentence choice.
        min_title_share: share of informative titles needed for ``"titles"`` mode, in [0, 1].

    Returns:
        :class:`PseudoQueries`; ``record`` holds ``mode`` (``"titles"`` / ``"sentences"``),
        ``counts`` per source, ``whole_document`` (count), ``documents`` (distinct source documents),
        ``requested``, ``returned``, ``seed``, ``informative_title_share`` and the word limits.

    Raises:
        ValueError: if ``titles`` and ``texts`` differ in length, ``count < 0`` or
            ``min_title_share`` is outside [0, 1].
    """
    if len(titles) != len(texts):
        raise ValueError(f"{len(titles)} titles but {len(texts)} texts")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 0.0 <= min_title_share <= 1.0:
        raise ValueError(f"min_title_share must be in [0, 1], got {min_title_share}")
    n = len(texts)
    rng = np.random.default_rng(seed)
    has_title = np.array([informative_title(t, x) for t, x in zip(titles, texts)], dtype=bool)
    share = float(has_title.mean()) if n else 0.0
    mode = "titles" if n and share >= min_title_share else "sentences"
    order = rng.permutation(n)
    pools: dict[int, list[tuple[str, str, bool]]] = {}
    for i in order:  # fixed visiting order, so each document's draw is reproducible
        cands = sentence_candidates(titles[i], texts[i], np.random.default_rng([seed, int(i)]))
        if mode == "titles" and has_title[i]:
            cands = [(" ".join(titles[i].split()), "title", False)] + cands
        pools[int(i)] = cands
    out_texts, rows, sources, whole = [], [], [], []
    seen: set[str] = set()
    depth = 0
    while len(out_texts) < count and any(len(p) > depth for p in pools.values()):
        for i in order:
            if len(out_texts) >= count:
                break
            pool = pools[int(i)]
            if depth < len(pool):
                q, src, is_whole = pool[depth]
                key = _norm(q)
                if key in seen:
                    continue
                seen.add(key)
                out_texts.append(q)
                rows.append(int(i))
                sources.append(src)
                whole.append(is_whole)
        depth += 1
    record = {
        "mode": mode,
        "counts": {s: sources.count(s) for s in SOURCES},
        "whole_document": int(sum(whole)),
        "documents": len(set(rows)),
        "requested": int(count),
        "returned": len(out_texts),
        "seed": int(seed),
        "informative_title_share": round(share, 4),
        "min_title_share": float(min_title_share),
        "words": {"title_min": MIN_TITLE_WORDS, "sentence_min": MIN_SENTENCE_WORDS, "max": MAX_WORDS},
    }
    return PseudoQueries(out_texts, np.array(rows, dtype=np.int64), sources, np.array(whole, dtype=bool), record)
