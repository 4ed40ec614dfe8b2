"""Stage ``delta``: merge a collection's delta segment (:mod:`engine.delta`) into one finished search.

Run by the gateway after :meth:`engine.pipeline.Pipeline.run`, which it called with
``allowed=snapshot.allowed(version)``, so the version's results already exclude every id the segment
overrides (deleted or upserted again) and still hold k of them.  This stage then returns the exact top-k of
(version results) ∪ (the delta documents, scored exactly against the query):

* at full width (policies ``exact``, ``recall``) a delta score is the inner product ⟨q, e⟩ of unit vectors;
  the version's score is ⟨Rq, Rx⟩ = ⟨q, x⟩ (R orthogonal), so both are the same quantity;
* at a prefix width m < D (``fixed``, ``router``, ``funnel``) a delta score is the prefix cosine of
  (Rq)[:m] and (Re)[:m], the quantity the version's rescoring reports (Eq. (1) of 001).

Delta documents are added only to dense searches on tier ``mips`` with nothing restricting them (no filter,
access policy or phrase): lexical, hybrid and reranked scores are on other scales, and the segment keeps no
lexical or field index yet, so a delta document is dense-only and unrestricted-only until it is folded into a
version.  On a CARS version (documents stored through a doc map) delta documents are not added at all yet.
The mask (deletes and overrides) applies to every mode.
"""

from __future__ import annotations

import numpy as np

from adawidth.prefix import EPS, top_k
from engine.delta import DeltaSnapshot
from engine.plan import Plan
from engine.stages.render import Result


def delta_applies(plan: Plan, result: Result, version=None) -> bool:
    """True when ``plan``'s search takes delta documents (dense, tier ``mips``, unrestricted, embedded) on
    ``version`` (not a CARS version: its documents went through a doc map the segment does not apply yet)."""
    cars = getattr(getattr(version, "manifest", None), "cars", None)
    return (plan.mode == "dense" and not plan.restricted and result.embedding is not None
            and result.trace.get("tier", "mips") == "mips" and cars is None)


def delta_scores(version, snapshot: DeltaSnapshot, embedding: np.ndarray, width: int) -> np.ndarray:
    """Scores of every delta document for one query, on the version's scale at ``width``.

    Args:
        version: the index version of the search (its ``rotation``, (D, D) float32, and ``dimension``).
        snapshot: the delta view the search holds.
        embedding: (D,) float32 unit-norm query embedding.
        width: coordinates of the version's scores (the trace's ``width``).

    Returns:
        (M,) float64, in the order of ``snapshot.ids``.
    """
    q = np.asarray(embedding, np.float32)
    if width >= version.dimension:
        return (snapshot.embeddings @ q).astype(np.float64)
    E = snapshot.rotated(version)[:, :width].astype(np.float64)
    qr = (np.asarray(version.rotation, np.float32)[:width] @ q).astype(np.float64)
    denom = np.sqrt(np.maximum((E * E).sum(axis=1) * float(qr @ qr), EPS * EPS))
    return (E @ qr) / denom


def merge_delta(plan: Plan, version, result: Result, snapshot: DeltaSnapshot) -> Result:
    """The search's result with the delta segment merged in (see the module docstring).

    Args:
        plan: the resolved search (``k``).
        version: its index version.
        result: the pipeline's result, run with the snapshot's mask.
        snapshot: the delta view (the same one whose mask the pipeline ran with).

    Returns:
        A :class:`Result` of at most k hits, best first; delta hits have row -1.  The trace gains ``delta``:
        ``{"documents": M, "returned": n, "masked": bool}``.  ``embedding`` is cleared when the segment is
        not empty (the online CUS compares with the version alone).
    """
    if snapshot.empty:
        return result
    trace = dict(result.trace)
    masked = snapshot.allowed(version) is not None
    if not delta_applies(plan, result, version) or not snapshot.ids:
        trace["delta"] = {"documents": len(snapshot.ids), "returned": 0, "masked": masked}
        return Result(result.rows, result.ids, result.scores, trace, None)
    width = int(trace.get("width") or version.dimension)
    ds = delta_scores(version, snapshot, result.embedding, width)
    scores = np.concatenate([np.asarray(result.scores, np.float64), ds])
    pos = top_k(scores, plan.k)
    n = len(result.ids)
    rows = np.array([result.rows[p] if p < n else -1 for p in pos], np.int64)
    ids = [result.ids[p] if p < n else snapshot.ids[p - n] for p in pos]
    trace["delta"] = {"documents": len(snapshot.ids), "returned": int(sum(1 for p in pos if p >= n)),
                      "masked": masked}
    return Result(rows, ids, scores[pos], trace, None)
