"""One search over a loaded version in any lane: ``dense`` (the adaptive-width funnel), ``lexical`` (BM25)
or ``hybrid`` (union of both, fused), under filters, exact-phrase constraints and the access policy.

Order of work (§20.2 of 003: "enforce required filters and access constraints before allowing a result
into the serving set"):

1. parse the query's quoted phrases (:func:`adawidth.hybrid.parse_query`);
2. the *allowed* set = request filter ∧ access policy ∧ phrase constraints, as an (N,) mask;
3. every lane searches the allowed set only (stage 1 through a faiss ID selector; BM25 scores masked), so
   no result can come from outside it and no filtering happens after a top-k;
4. hybrid: dense list (rescored by the adaptive-width funnel at the width it chooses) and lexical list,
   each to ``depth = max(k, hybrid_depth)``, fused by RRF (k = 60) or a normalised convex combination.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
from pydantic import Field, StrictBool, StrictInt, StringConstraints

from adawidth import hybrid
from adawidth.prefix import top_k
from engine.index import IndexVersion, SearchOutcome
from service.errors import ApiError

FilterScalar = Annotated[str, StringConstraints(strict=True, max_length=256)] | StrictInt | StrictBool
FilterValues = Annotated[
    dict[Annotated[str, StringConstraints(min_length=1, max_length=64)],
         FilterScalar | Annotated[list[FilterScalar], Field(min_length=1, max_length=100)]],
    Field(max_length=16)]
"""Request filter: at most 16 fields (1..64 characters), each a keyword (string of at most 256 characters,
integer or boolean) or a list of 1..100 keywords (any of them matches)."""

MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("rrf", "convex")


@dataclass
class RetrievalOptions:
    """Per-request choices beyond the dense path's (validated by the gateway)."""

    mode: str = "dense"
    filter: Mapping[str, object] | None = None
    fusion: str = "rrf"
    alpha: float = 0.5
    depth: int = 100
    principal: hybrid.Principal | None = None
    tenant_field: str = "tenant"
    acl_field: str = "acl"


@dataclass
class RetrievalOutcome:
    """A served search: the dense outcome's fields plus lane information for the trace."""

    outcome: SearchOutcome
    mode: str
    fusion: str | None = None
    allowed_documents: int | None = None
    lanes: dict = field(default_factory=dict)


def needs_lexical(query: str, opts: RetrievalOptions) -> bool:
    """Whether the request needs the version's lexical side (BM25, texts or fields)."""
    return (opts.mode != "dense" or bool(opts.filter) or opts.principal is not None
            or bool(hybrid.parse_query(query).phrases))


def allowed_mask(version: IndexVersion, parsed: hybrid.ParsedQuery, opts: RetrievalOptions) -> np.ndarray | None:
    """(N,) bool of the documents this request may return, or None when nothing restricts it.

    Raises:
        ApiError: ``lexical_unavailable`` (the version has no lexical side to check against),
            ``unknown_filter_field`` (a filter names a field no document of the version has).
    """
    if not (opts.filter or opts.principal is not None or parsed.phrases):
        return None
    lex = version.lexical
    if lex is None:
        raise ApiError("lexical_unavailable", "this index version was built without the lexical side "
                                              "(BM25, texts, fields): filters, access policy and quoted phrases "
                                              "need a version built by a current trainer")
    known = set(lex.fields.field_names)
    for name in opts.filter or {}:
        if name not in known:
            raise ApiError("unknown_filter_field", "a filter names a field no document of this index has", "filter")
    mask = hybrid.access_mask(lex.fields, opts.principal, tenant_field=opts.tenant_field, acl_field=opts.acl_field)
    if opts.filter:
        mask &= lex.fields.filter_mask(opts.filter)
    if parsed.phrases:
        mask &= lex.phrase_mask(parsed.phrases)
    return mask


def _lexical_list(version: IndexVersion, text: str, allowed: np.ndarray | None, depth: int):
    scores = version.lexical.scores(text).astype(np.float64)
    ok = scores > 0.0  # a document sharing no analysed term with the query is not a lexical match
    if allowed is not None:
        ok &= allowed
    scores = np.where(ok, scores, -np.inf)
    rows = top_k(scores, min(depth, int(ok.sum())))
    return rows, scores


def retrieve(version: IndexVersion, query: str, k: int, width, embed: Callable[[str], np.ndarray],
             opts: RetrievalOptions, *, rho: float | None = None,
             pair: tuple[int, int] | None = None) -> tuple[RetrievalOutcome, np.ndarray | None]:
    """Serve one request in its lane.

    Args:
        version: the version this request holds.
        query: the request's query text (quoted phrases become constraints; their words still count).
        k: results wanted.
        width: the dense width policy ("auto", "full" or an int).
        embed: text -> unit-norm (D,) query embedding (the encoder; only called when a dense lane runs).
        opts: :class:`RetrievalOptions`.

    Returns:
        (the outcome with at most k results best first, the query embedding or None when no dense lane ran).
        ``lexical`` returns only documents sharing an analysed term with the query; ``dense`` and ``hybrid``
        return min(k, allowed documents) results.

    Raises:
        ApiError: ``lexical_unavailable``, ``unknown_filter_field``.
    """
    if opts.mode not in MODES or opts.fusion not in FUSIONS:
        raise ValueError(f"mode {opts.mode!r} / fusion {opts.fusion!r}")
    parsed = hybrid.parse_query(query)
    if opts.mode != "dense" and version.lexical is None:
        raise ApiError("lexical_unavailable", f"mode {opts.mode!r} needs a BM25 index; this index version was "
                                              "built without one (use mode 'dense' or rebuild)", "mode")
    allowed = allowed_mask(version, parsed, opts)
    n_allowed = None if allowed is None else int(allowed.sum())
    t0 = time.perf_counter()
    if opts.mode == "lexical":
        rows, scores = _lexical_list(version, parsed.text, allowed, k)
        t = {"lexical": time.perf_counter() - t0}
        out = SearchOutcome([version.doc_ids[r] for r in rows], [float(scores[r]) for r in rows], 0, False, None, 0,
                            t, rows=[int(r) for r in rows])
        return RetrievalOutcome(out, "lexical", None, n_allowed, {"lexical": len(rows)}), None
    emb = embed(parsed.text)
    if opts.mode == "dense":
        out = version.search(emb, k, width, rho=rho, pair=pair, allowed=allowed)
        return RetrievalOutcome(out, "dense", None, n_allowed), emb
    depth = max(k, opts.depth)
    dense = version.search(emb, depth, width, rho=rho, pair=pair, allowed=allowed)
    s = time.perf_counter()
    lex_rows, lex_scores = _lexical_list(version, parsed.text, allowed, depth)
    d_rows = np.asarray(dense.rows, dtype=np.int64)
    if opts.fusion == "rrf":
        rows, fused = hybrid.rrf_fuse([d_rows, lex_rows])
    else:
        union = np.asarray(list(dict.fromkeys([*d_rows.tolist(), *lex_rows.tolist()])), dtype=np.int64)
        score_width = version.dimension if width == "full" else dense.width
        dense_sc = version.dense_scores(emb, union, score_width) if len(union) else np.empty(0)
        lex_sc = np.where(np.isfinite(lex_scores[union]), lex_scores[union], 0.0) if len(union) else np.empty(0)
        rows, fused = hybrid.convex_fuse(union, dense_sc, lex_sc, opts.alpha)
    rows, fused = rows[:k], fused[:k]
    timings = dict(dense.timings_seconds, lexical_and_fusion=time.perf_counter() - s)
    out = dataclasses.replace(dense, ids=[version.doc_ids[r] for r in rows], scores=[float(x) for x in fused],
                              timings_seconds=timings, rows=[int(r) for r in rows])
    lanes = {"dense": len(d_rows), "lexical": len(lex_rows),
             "overlap": len(set(d_rows.tolist()) & set(lex_rows.tolist()))}
    return RetrievalOutcome(out, "hybrid", opts.fusion, n_allowed, lanes), emb
