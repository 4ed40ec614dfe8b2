"""Stage ``stage1``: the first pass over the whole corpus (or the allowed part of it).

By policy (:mod:`engine.plan`):

- ``fixed``, ``router``: the m0-prefix shortlist of C = max(shortlist, depth) documents from the version's
  stage-1 backend (faiss ``IndexFlatIP`` in process, or Milvus) over the normalised m0-prefixes; scores are
  prefix cosines (Eq. (1) of 001).
- ``funnel``: the first coordinate block of every document and the policy's evidence
  (:func:`adawidth.stage1_policy.evidence`).
- ``recall`` on a version with an ANN first stage (:class:`engine.stage1.AnnStage1`, issue 19): the ANN
  candidates (``depth`` of them, with faiss's full-width scores) at the effort (nprobe or efSearch) its tuning
  curve or its per-query model gives the recall target;
  a target it cannot meet (1.0, or above what its tuning queries reached) or a filter that allows too few
  documents is served by the exact path instead (:func:`ann_or_exact`; the trace's ``served_exact_because``).
- ``exact``, ``recall``: the whole level scan in one compiled call (:func:`adawidth.levels.fused_search`: the
  first level(s), the seeds, the recall policy's confidence from the evidence, the pruning scan) where the version
  stores levels; route and rescore then record and rank its result.  Versions built before levels, and ``exact``
  on fewer than ``version.level_scan_min_docs`` documents (:data:`engine.index.LEVEL_SCAN_MIN_DOCS`; more for a
  deep request, :func:`flat_is_faster`), take the exhaustive full-width scan.

The allowed set (filter ∧ access policy ∧ quoted phrases, §20.2 of 003) is computed here once and applied
before any top-k: stage 1 only ever sees allowed documents.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from adawidth import levels
from adawidth import hybrid, stage1_policy
from adawidth.prefix import prefix_normalize
from engine.candidates import Candidates
from engine.plan import Plan


def allowed_mask(plan: Plan, version) -> np.ndarray | None:
    """(N,) bool of the documents the plan may return, or None when nothing restricts it.

    The plan has checked that the version has a lexical side and that filter fields exist.
    """
    if not plan.restricted:
        return None
    lex = version.lexical
    mask = hybrid.access_mask(lex.fields, plan.principal, tenant_field=plan.tenant_field, acl_field=plan.acl_field)
    if plan.filter:
        mask &= lex.fields.filter_mask(plan.filter)
    if plan.phrases:
        mask &= lex.phrase_mask(list(plan.phrases))
    return mask


LEVEL_SCAN_K_SCALE = 40
"""Above this many results the flat scan's advantage grows with k: the level scan seeds its threshold with 2k
exact scores (scattered reads) and prunes less against the k-th best.  Measured with the exact bound, one thread,
Gaussian corpora with SciFact's spectrum, µs per query, flat against the level scan: 10,000 documents k = 10:
409 vs 153, k = 50: 371 vs 276, k = 100: 331 vs 502; 20,000 k = 100: 1,163 vs 573; SciFact (5,183) k = 100:
134 vs 264."""


def flat_is_faster(n_docs: int, depth: int, min_docs: int) -> bool:
    """True when width ``full`` over ``n_docs`` documents for ``depth`` results is served by one flat scan rather
    than the certified level scan: below ``min_docs`` (:data:`engine.index.LEVEL_SCAN_MIN_DOCS`, measured at
    k = 10), scaled up by depth / :data:`LEVEL_SCAN_K_SCALE` for deeper requests."""
    return n_docs < min_docs * max(1.0, depth / LEVEL_SCAN_K_SCALE)


@dataclass(frozen=True)
class AnnState:
    """Stage 1's continuation on an ANN version: the candidates' rows (c,) int64 and their full-width scores (c,)
    float32, as faiss computed them (:class:`engine.ann.AnnHits`), for the rescore stage to rank."""

    rows: np.ndarray
    scores: np.ndarray


def ann_or_exact(plan: Plan, version, allowed: np.ndarray | None) -> tuple[Plan, str | None]:
    """The plan the dense stages run, and why it is the exact one when it is.

    A ``recall`` plan on a version with an ANN first stage whose backend cannot meet the target (or cannot
    serve the filter) runs as ``exact``; every other plan runs as it is.

    Returns:
        (plan to run, ``served_exact_because`` or None).
    """
    a = getattr(version, "ann", None)
    if plan.policy != "recall" or a is None:
        return plan, None
    because = a.exact_because(float(plan.recall_target), allowed)
    if because is None:
        return plan, None
    return replace(plan, policy="exact", width=version.dimension), because


def stage1(plan: Plan, version, query: np.ndarray, allowed: np.ndarray | None,
           embedding: np.ndarray | None = None) -> Candidates:
    """Run stage 1 of the plan's policy.

    Args:
        plan: the search.
        version: the index version this request holds.
        query: the rotated query, (>= reach,) float32 (:mod:`engine.stages.rotate`).
        allowed: (N,) bool or None (:func:`allowed_mask`).
        embedding: the query embedding, (D,) float32: what an ANN index over the documents as encoded is searched
            with (``version.ann.space == "embedding"``), ``query`` then being only its rotated evidence prefix.

    Returns:
        :class:`Candidates` with ``state`` for the route and rescore stages.

    Raises:
        engine.stage1.Stage1Unavailable: the external stage-1 engine did not answer.
        ValueError: an ANN index over the documents as encoded and no ``embedding``.
    """
    N = version.size
    n_allowed = N if allowed is None else int(allowed.sum())
    c = Candidates.empty()
    if plan.policy in ("exact", "recall"):
        levels_scan = getattr(version, "levels", None) is not None and not (
            plan.policy == "exact" and flat_is_faster(N, plan.depth, version.level_scan_min_docs))
        c.trace["stage1_backend"] = "levels" if levels_scan else "flat"
    else:
        c.trace["stage1_backend"] = getattr(getattr(version, "stage1", None), "kind", None)
    if plan.policy == "recall" and getattr(version, "ann", None) is not None:
        a = version.ann
        effort, probe_work = a.effort(float(plan.recall_target)), 0
        hits = None
        if n_allowed:
            vec, prefix = query, None
            if a.space == "embedding":  # the index holds the documents as encoded (engine.ann.index_space)
                if embedding is None:
                    raise ValueError("an ANN index over the documents as encoded is searched with the embedding")
                vec, prefix = embedding, (query if len(query) else None)  # none: the model reads no energy
            hits, effort, probe_work = a.per_query(vec, float(plan.recall_target), min(plan.depth, n_allowed),
                                                   allowed, prefix)
        rows = hits.rows if hits is not None else np.empty(0, np.int64)
        c.state = AnnState(rows, hits.scores if hits is not None else np.empty(0, np.float32))
        c.width = version.dimension
        c.work["stage1"] = int(hits.work) if hits is not None else 0
        c.trace.update(policy="recall", stage1_backend=a.kind, effort=int(effort), effort_name=a.effort_name,
                       effort_per_query=probe_work > 0, probe_coordinates=int(probe_work),
                       stage1_width=version.dimension, shortlist=int(len(rows)), bound=None, confidence=None)
        return c
    if plan.policy == "exact" and (getattr(version, "levels", None) is None
                                   or flat_is_faster(N, plan.depth, version.level_scan_min_docs)):
        rows, top = version.stage1.full(query, plan.depth, allowed)
        c.rows, c.scores, c.width = rows, top, version.dimension
        c.work["stage1"] = N * version.dimension
        c.trace.update(policy="exact", stage1_width=version.dimension, shortlist=N, certified=True)
        return c
    if plan.policy in ("exact", "recall"):
        # one compiled call (adawidth.levels.fused_search): the first level(s) of every candidate, the seeds, the
        # recall policy's evidence and confidence (route records it), the pruning scan (rescore ranks its result)
        store = version.levels
        bound, model, z, seeds = "exact", None, None, None
        if plan.policy == "recall":  # the per-query model or the target's one calibrated z, as measured
            # calibrated at the threads this scan runs on: more threads realise more recall at one z
            rp = version.recall_policy.at_threads(levels.kernel_threads(version.level_threads, store.N))
            bound, model, z = rp.serving(float(plan.recall_target), store.layout.L)
            seeds = rp.seeds_for(plan.depth)  # by the rule the policy was calibrated with
            c.trace["effort_per_query"] = model is not None if bound != "exact" else None
        res = levels.fused_search(store, query, plan.depth, bound=bound, model=model, z=z, allowed=allowed,
                                  threads=version.level_threads, seeds=seeds)
        c.state = res
        c.width = store.layout.bounds[store.layout.exact_first_levels if bound == "exact" else 1]
        c.work["stage1"] = int(res.first_coordinates)
        c.trace.update(policy=plan.policy, stage1_width=c.width, shortlist=int(res.scanned))
        return c
    if plan.policy == "funnel":
        fp = version.funnel_policy
        feats, state = stage1_policy.evidence(fp.corpus, query, version.theta)
        c.state = (feats, state)
        c.width = stage1_policy.BLOCK
        c.trace.update(policy="funnel")
        return c
    if plan.policy in ("fixed", "router"):
        size = min(max(version.shortlist, plan.depth), n_allowed)
        qp = prefix_normalize(query[None, :], version.m0)[0]
        c.work["stage1"] = N * version.m0  # a flat scan, wherever it runs
        c.width = version.m0
        c.trace.update(policy=plan.policy, stage1_width=version.m0, shortlist=size)
        if size == 0:  # nothing allowed: rescoring has nothing to do
            return c
        sl = version.stage1.shortlist(qp, size, allowed)
        c = c.ranked(sl.rows, sl.cosines.astype(np.float64))
        c.state = sl
        c.trace["shortlist"] = len(sl.rows)
        return c
    raise NotImplementedError(f"stage 1 of policy {plan.policy!r}")
