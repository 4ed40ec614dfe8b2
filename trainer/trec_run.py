"""TREC run files: ``qid Q0 docid rank score tag``, one line per retrieved document.

Any ranking source can write one (the offline evaluation, the gateway's answers, a baseline), so
trec_eval, ranx or pytrec_eval users can score our rankings with their own tools.  The writer keeps
the list order: trec_eval ranks by the score column (ties broken by document id), not by the rank
column, and it holds scores in single precision (pytrec_eval ties 0.3 and 0.3 - 1e-9).  So every score
is written as a float32 value (``repr`` of it, which parses back to the same float32), and where a
query's float32 scores are not strictly decreasing down its list, the offending score is lowered to the
next float32 below the previous one (about 6e-8 relative; the count is returned).  Scores that are
already float32 (the gateway's) and strictly decreasing are written unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np


def _check_token(value: str, what: str) -> str:
    value = str(value)
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{what} {value!r} is empty or holds whitespace: it cannot be a TREC run field")
    return value


def trec_lines(run: Mapping[str, Sequence[tuple[str, float]]], tag: str = "adawidth") -> tuple[list[str], int]:
    """The lines of a run file and the number of scores lowered to keep the list order.

    Args:
        run: query id -> ranked (document id, score) pairs, best first (score: higher is better).
        tag: run tag (last column), no whitespace.

    Returns:
        (lines without newline, queries in ``run`` order, ranks from 1; count of adjusted scores).

    Raises:
        ValueError: an id or the tag is empty or holds whitespace, a score is not finite, or a query
            lists a document twice.
    """
    tag = _check_token(tag, "tag")
    lines, adjusted = [], 0
    for qid, ranked in run.items():
        qid = _check_token(qid, "query id")
        seen, prev = set(), np.float32(np.inf)
        for rank, (doc, score) in enumerate(ranked, start=1):
            doc = _check_token(doc, "document id")
            if doc in seen:
                raise ValueError(f"query {qid!r} lists document {doc!r} twice")
            seen.add(doc)
            if not math.isfinite(float(score)) or not np.isfinite(np.float32(score)):
                raise ValueError(f"query {qid!r}, document {doc!r}: score {score} is not finite in float32")
            value = np.float32(score)
            if value >= prev:
                value = np.nextafter(prev, np.float32(-np.inf))
                adjusted += 1
            prev = value
            lines.append(f"{qid} Q0 {doc} {rank} {float(value)!r} {tag}")
    return lines, adjusted


def write_trec_run(path: Path | str, run: Mapping[str, Sequence[tuple[str, float]]], tag: str = "adawidth") -> int:
    """Write ``run`` (query id -> ranked (document id, score) pairs) as a TREC run file, atomically.

    Returns the number of scores lowered to keep the list order (see the module docstring).

    Raises:
        ValueError: see :func:`trec_lines`.
    """
    lines, adjusted = trec_lines(run, tag)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return adjusted


def run_from_lists(qids: Iterable[str], ids: Iterable[Sequence[str]],
                   scores: Iterable[Sequence[float]]) -> dict[str, list[tuple[str, float]]]:
    """Zip parallel lists (query ids; ranked document ids per query; their scores) into a run mapping.

    Raises:
        ValueError: a query's ids and scores differ in length.
    """
    run = {}
    for q, d, s in zip(qids, ids, scores, strict=True):
        if len(d) != len(s):
            raise ValueError(f"query {q!r}: {len(d)} ids but {len(s)} scores")
        run[q] = list(zip(d, (float(x) for x in s)))
    return run
