"""Loader for BEIR-format collections.

Layout (``.gz`` accepted for every file)::

    <folder>/corpus.jsonl     {"_id": str, "title": str (optional), "text": str, ...}
    <folder>/queries.jsonl    {"_id": str, "text": str, ...}
    <folder>/qrels/<split>.tsv  header "query-id<TAB>corpus-id<TAB>score", then one pair a line

Every malformed line raises :class:`DatasetFormatError` naming the file, the
line number (1-based) and the problem.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class DatasetFormatError(ValueError):
    """A BEIR file is missing or malformed; the message names file, line and problem."""

    def __init__(self, path: Path | str, line: int | None, problem: str):
        self.path, self.line, self.problem = str(path), line, problem
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")


@dataclass
class Document:
    """One corpus entry; ``fields`` keeps any extra keys of the JSON line (e.g. tenant, acl)."""

    doc_id: str
    title: str
    text: str
    fields: dict = field(default_factory=dict)

    def encoder_text(self) -> str:
        """Text fed to the encoder: ``(title + " " + text).strip()``, BEIR's convention."""
        return (f"{self.title} {self.text}" if self.title else self.text).strip()


@dataclass
class Collection:
    """A BEIR collection: corpus in file order, queries, and qrels of one split."""

    name: str
    corpus: list[Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    split: str

    def judged_queries(self) -> dict[str, str]:
        """Queries that have at least one relevant (label > 0) document in the split's qrels."""
        return {q: self.queries[q] for q, j in self.qrels.items() if any(v > 0 for v in j.values())}


def _resolve(path: Path) -> Path:
    if path.exists():
        return path
    gz = path.with_name(path.name + ".gz")
    if gz.exists():
        return gz
    raise DatasetFormatError(path, None, "file not found (looked for it and for its .gz)")


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="strict")
    return open(path, encoding="utf-8", errors="strict")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with _open_text(path) as fh:
            for i, line in enumerate(fh, start=1):
                yield i, line
    except UnicodeDecodeError as e:
        raise DatasetFormatError(path, None, f"not valid UTF-8 ({e.reason} at byte {e.start})") from e
    except (OSError, EOFError) as e:
        raise DatasetFormatError(path, None, f"cannot read: {e}") from e


def _jsonl(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    seen: set[str] = set()
    for i, line in _lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetFormatError(path, i, f"invalid JSON: {e.msg} (column {e.colno})") from e
        if not isinstance(obj, dict):
            raise DatasetFormatError(path, i, f"expected a JSON object, got {type(obj).__name__}")
        for key in required:
            if key not in obj:
                raise DatasetFormatError(path, i, f"missing field {key!r}")
        for key in ("_id", "title", "text"):
            if key in obj and not isinstance(obj[key], str):
                if key == "_id" and isinstance(obj[key], int):
                    obj[key] = str(obj[key])
                else:
                    raise DatasetFormatError(path, i, f"field {key!r} must be a string, got {type(obj[key]).__name__}")
        if obj["_id"] in seen:
            raise DatasetFormatError(path, i, f"duplicate _id {obj['_id']!r}")
        seen.add(obj["_id"])
        yield i, obj


def load_corpus(folder: Path | str) -> list[Document]:
    """Read ``corpus.jsonl`` (or ``.gz``) in file order.  Raises :class:`DatasetFormatError`."""
    path = _resolve(Path(folder) / "corpus.jsonl")
    docs = []
    for _, obj in _jsonl(path, ("_id", "text")):
        extra = {k: v for k, v in obj.items() if k not in ("_id", "title", "text")}
        docs.append(Document(obj["_id"], obj.get("title", "") or "", obj["text"], extra))
    if not docs:
        raise DatasetFormatError(path, None, "the corpus is empty")
    return docs


def load_queries(folder: Path | str) -> dict[str, str]:
    """Read ``queries.jsonl`` (or ``.gz``): query id -> text.  Raises :class:`DatasetFormatError`."""
    path = _resolve(Path(folder) / "queries.jsonl")
    return {obj["_id"]: obj["text"] for _, obj in _jsonl(path, ("_id", "text"))}


def load_qrels(folder: Path | str, split: str) -> dict[str, dict[str, int]]:
    """Read ``qrels/<split>.tsv`` (or ``.gz``): query id -> {doc id -> integer label}.

    The header line ``query-id corpus-id score`` is required (BEIR writes it).
    Raises :class:`DatasetFormatError` for a missing file, bad header, wrong
    column count, non-integer score or a repeated pair.
    """
    path = _resolve(Path(folder) / "qrels" / f"{split}.tsv")
    qrels: dict[str, dict[str, int]] = {}
    header_seen = False
    for i, line in _lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        cols = line.split("\t")
        if not header_seen:
            header_seen = True
            if [c.strip() for c in cols] != ["query-id", "corpus-id", "score"]:
                raise DatasetFormatError(path, i, "expected the header 'query-id<TAB>corpus-id<TAB>score'")
            continue
        if len(cols) != 3:
            raise DatasetFormatError(path, i, f"expected 3 tab-separated columns, got {len(cols)}")
        qid, did, score = (c.strip() for c in cols)
        try:
            label = int(score)
        except ValueError as e:
            raise DatasetFormatError(path, i, f"score {score!r} is not an integer") from e
        if did in qrels.setdefault(qid, {}):
            raise DatasetFormatError(path, i, f"repeated pair ({qid!r}, {did!r})")
        qrels[qid][did] = label
    if not header_seen:
        raise DatasetFormatError(path, None, "the qrels file is empty")
    return qrels


def available_splits(folder: Path | str) -> list[str]:
    """Names of the qrels splits present in ``folder/qrels``."""
    q = Path(folder) / "qrels"
    return sorted({p.name.split(".")[0] for p in q.glob("*.tsv*")}) if q.is_dir() else []


def load_collection(folder: Path | str, split: str = "test", *, strict: bool = True) -> Collection:
    """Load corpus, queries and the qrels of ``split``.

    Args:
        folder: a BEIR folder.
        split: qrels split name (file ``qrels/<split>.tsv``).
        strict: if True, a qrels line naming an unknown query or document raises.

    Raises:
        DatasetFormatError: on any missing or malformed file, or (strict) dangling ids.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetFormatError(folder, None, "not a directory")
    corpus = load_corpus(folder)
    queries = load_queries(folder)
    qrels = load_qrels(folder, split)
    if strict:
        ids = {d.doc_id for d in corpus}
        qpath = _resolve(folder / "qrels" / f"{split}.tsv")
        for qid, judg in qrels.items():
            if qid not in queries:
                raise DatasetFormatError(qpath, None, f"query id {qid!r} is not in queries.jsonl")
            missing = [d for d in judg if d not in ids]
            if missing:
                raise DatasetFormatError(qpath, None, f"document id {missing[0]!r} is not in corpus.jsonl")
    return Collection(folder.name, corpus, queries, qrels, split)
