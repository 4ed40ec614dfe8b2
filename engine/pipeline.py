"""One query pipeline for the gateway, the trainer's evaluation and the benchmarks.

A search is a :class:`engine.plan.Plan` (resolved once, :func:`engine.plan.resolve_plan`) run through the
stages, one module each, passing one :class:`engine.candidates.Candidates` along::

    encode -> rotate -> stage1 -> route -> rescore -> fuse -> rerank -> render
    engine/stages/encode.py ... engine/stages/render.py

The gateway calls :meth:`Pipeline.run` with the index version a request holds and the ONNX encoder; the
trainer and the benchmarks call the same method with precomputed query embeddings (``embeddings=``) and an
in-memory version (:meth:`engine.index.IndexVersion.in_memory`), with either the served stage-1 backend
(faiss) or the exact one (brute force), so offline numbers are served numbers by construction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from adawidth.tiers import RERANK_DEPTH
from engine.candidates import Candidates
from engine.plan import Capabilities, Plan, PlanDefaults, SearchSpec, resolve_plan
from engine.query_cache import QueryEmbeddingCache
from engine.stages import STAGES
from engine.stages.encode import encode
from engine.stages.fuse import fuse
from engine.stages.render import Result, render
from engine.stages.rerank import rerank, served_tier
from engine.stages.rescore import rescore
from engine.stages.rotate import rotate
from engine.stages.route import route
from engine.stages.stage1 import allowed_mask, ann_or_exact, stage1

__all__ = ["Pending", "Pipeline", "Result", "capabilities", "STAGES"]

_DEFAULTS = PlanDefaults()  # frozen: one instance serves every offline call without its own defaults


def capabilities(version, rerankers: dict | None = None) -> Capabilities:
    """What ``version`` can serve on a replica holding ``rerankers`` (:meth:`Pipeline.rerankers`).

    Policies: ``recall`` needs the version's levels and recall policy, or an ANN first stage, ``router`` a router, ``funnel`` a funnel
    policy (in-process stage 1 only).  Tiers: ``maxsim`` needs the documents' encoder texts, ``cross_encoder``
    also a loaded cross-encoder, ``auto`` the difficulty head and the texts.
    """
    rerankers = rerankers or {}
    policies = set()
    if getattr(version, "levels", None) is not None and getattr(version, "recall_policy", None) is not None:
        policies.add("recall")
    if getattr(version, "ann", None) is not None:
        policies.add("recall")
    if version.routers:
        policies.add("router")
    if version.funnel_policy is not None:
        policies.add("funnel")
    default = version.manifest_default_policy if version.manifest_default_policy in policies else None
    if default is None:
        default = next((p for p in ("recall", "funnel", "router") if p in policies), None)
    tiers = {"mips"}
    if version.texts is not None:
        tiers |= {t for t in ("maxsim", "cross_encoder") if t in rerankers}
        if version.tier_head is not None:
            tiers.add("auto")
    lex = version.lexical
    return Capabilities(dimension=version.dimension, policies=frozenset(policies), default_policy=default,
                        router_pairs=frozenset(version.routers), default_pair=version.default_pair,
                        default_rho=version.default_rho,
                        filter_fields=None if lex is None else frozenset(lex.fields.field_names),
                        tiers=frozenset(tiers))


@dataclass
class Pending:
    """One plan run up to its rerank (:meth:`Pipeline.start`): its candidates, the tier that will serve it
    (``tier_predicted``: an ``auto`` plan's head's prediction, else None), its stage timings in seconds so far,
    the seconds its own stages took in :meth:`Pipeline.start` (not the other plans' of a batch, nor any wait
    before :meth:`Pipeline.finish`), the documents its restriction allows (None: no restriction) and its query
    embedding ((D,) float32, or None)."""

    plan: Plan
    version: object
    candidates: Candidates
    tier: str
    predicted: str | None
    timings: dict[str, float]
    started_s: float
    allowed_documents: int | None
    embedding: np.ndarray | None


class Pipeline:
    """The stages, bound to what a process holds.

    Args:
        encoder: query encoder (``encode(list[str]) -> (B, D) float32``), or None when every call passes
            ``embeddings``.
        rerankers: DART rerankers by tier name (``maxsim``, ``cross_encoder``), those loaded.
        query_cache: the query-embedding cache of the encode stage (:class:`engine.query_cache.QueryEmbeddingCache`),
            or None.
    """

    def __init__(self, encoder=None, rerankers: dict | None = None, query_cache: QueryEmbeddingCache | None = None):
        self.encoder = encoder
        self.rerankers = dict(rerankers or {})
        self.query_cache = query_cache

    def search(self, version, specs: Sequence[SearchSpec], *, embeddings: np.ndarray | None = None,
               defaults: PlanDefaults | None = None, allowed: np.ndarray | None = None) -> list[Result]:
        """Resolve and run requests offline (the trainer's evaluation, benchmarks, canaries).

        Args:
            version: the index version (loaded or :meth:`engine.index.IndexVersion.in_memory`).
            specs: one :class:`engine.plan.SearchSpec` per query.
            embeddings: (Q, D) float32 query embeddings (None: encode ``specs[i].query``).
            defaults: plan defaults (None: :class:`engine.plan.PlanDefaults` ()).
            allowed: (N,) bool, an in-process caller's own restriction (see :meth:`run`).

        Raises:
            engine.plan.PlanError: a spec the version cannot serve.
        """
        caps = capabilities(version, self.rerankers)
        defaults = defaults or _DEFAULTS
        plans = [resolve_plan(s, defaults, caps) for s in specs]
        return self.run(plans, version, embeddings=embeddings, allowed=allowed)

    def run(self, plans: Sequence[Plan], version, *, embeddings: np.ndarray | None = None,
            check: Callable[[], None] | None = None, allowed: np.ndarray | None = None) -> list[Result]:
        """Run every plan against ``version``; results in the order of ``plans``: :meth:`start`, then
        :meth:`finish` of each plan.  Arguments, returns and errors as :meth:`start`'s.
        """
        return [self.finish(p) for p in self.start(plans, version, embeddings=embeddings, check=check,
                                                    allowed=allowed)]

    def start(self, plans: Sequence[Plan], version, *, embeddings: np.ndarray | None = None,
              check: Callable[[], None] | None = None, allowed: np.ndarray | None = None) -> list[Pending]:
        """Every stage up to the rerank, for every plan: the candidates and the tier that will serve each (an
        ``auto`` plan's head decides it here).  :meth:`finish` reranks and renders one.

        Args:
            plans: resolved plans (:func:`engine.plan.resolve_plan` against ``capabilities(version)``).
            version: the index version (one reference held for the whole call).
            embeddings: (Q, D) float32 unit-norm query embeddings to use instead of encoding (offline).
            check: called between stages (the gateway's deadline check; it raises to stop).
            allowed: (N,) bool of the documents an in-process caller allows (ANDed with each plan's filters,
                access policy and phrases, before any top-k), or None.

        Returns:
            One :class:`Pending` per plan (:meth:`run`: one :class:`engine.stages.render.Result`).  Encoding is
            one call for all plans; its duration is reported as every plan's ``encode`` timing.

        Raises:
            engine.stage1.Stage1Unavailable: an external stage-1 engine did not answer.
            Whatever ``check`` raises.
        """
        check = check or (lambda: None)
        t_encode = 0.0
        dense = [p.dense or p.tier == "auto" for p in plans]
        E = None
        if embeddings is not None:
            E = np.asarray(embeddings, dtype=np.float32)
        elif any(dense):
            s = time.perf_counter()
            idx = [i for i, d in enumerate(dense) if d]
            got = encode([plans[i] for i in idx], self.encoder, self.query_cache)
            E = np.zeros((len(plans), got.shape[1]), np.float32)
            E[idx] = got
            t_encode = time.perf_counter() - s
            check()
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=bool)
            if allowed.shape != (version.size,):
                raise ValueError(f"allowed must be ({version.size},) bool, got shape {allowed.shape}")
        return [self._first(p, version, E[i] if E is not None and dense[i] else None, t_encode, check, allowed)
                for i, p in enumerate(plans)]

    def finish(self, pending: Pending, tier: str | None = None, because: str | None = None) -> Result:
        """The rerank and render of one :meth:`start` ed plan (the gateway runs a reranking tier's on its
        rerank workers).

        Args:
            pending: what :meth:`start` returned for the plan.
            tier: serve at this tier instead of ``pending.tier`` (the gateway's ``"mips"`` for an ``auto`` plan
                when its rerank workers are all taken), or None.
            because: why, for the trace's ``tier_fallback_because`` (with ``tier``).
        """
        c, timings = pending.candidates, pending.timings
        served = pending.tier if tier is None else tier
        if served != pending.tier:
            c.trace["tier_fallback_because"] = because
        t7 = time.perf_counter()
        c = rerank(pending.plan, pending.version, c, served, self.rerankers)
        timings["rerank"] = time.perf_counter() - t7
        c.trace.update(tier=served, tier_predicted=pending.predicted)
        # its own work: the batch's encoding, its stages in start, its rerank (a batch's later plans, and a
        # wait for a rerank worker, are not its work)
        timings["total"] = timings.get("encode", 0.0) + pending.started_s + timings["rerank"]
        return render(pending.plan, pending.version, c, allowed_documents=pending.allowed_documents,
                      embedding=pending.embedding if pending.plan.dense else None, timings=timings)

    def _first(self, plan: Plan, version, embedding: np.ndarray | None, t_encode: float, check,
               extra: np.ndarray | None) -> Pending:
        clock = time.perf_counter
        t0 = clock()
        timings: dict[str, float] = {}
        if embedding is not None and self.encoder is not None:
            timings["encode"] = t_encode
        allowed = allowed_mask(plan, version)
        if extra is not None:
            allowed = extra if allowed is None else allowed & extra
        c = None
        if plan.dense:
            # an ANN version serves a recall target it cannot meet by the exact path (the trace says why)
            run, exact_because = ann_or_exact(plan, version, allowed)
            t1 = clock()
            q = rotate(run, version, embedding)
            t2 = clock()
            c = stage1(run, version, q, allowed, embedding)
            t3 = clock()
            check()
            t4 = clock()
            c = route(run, version, c)
            t5 = clock()
            c = rescore(run, version, q, c)
            t6 = clock()
            if exact_because is not None:
                c.trace["served_exact_because"] = exact_because
            timings.update(stage1=t1 - t0 + t3 - t2, rotate=t2 - t1, route=t5 - t4, rescore=t6 - t5)
            check()
        else:
            t6 = clock()
            timings["stage1"] = t6 - t0  # the allowed set
        tier, predicted = served_tier(plan, version, embedding, capabilities(version, self.rerankers).tiers
                                      if plan.tier == "auto" else frozenset())
        if plan.mode != "dense":
            keep = plan.k if tier == "mips" else max(plan.k, RERANK_DEPTH)
            t6 = clock()
            c = fuse(plan, version, embedding, allowed, c, keep)
            timings["fuse"] = clock() - t6
        return Pending(plan, version, c, tier, predicted, timings, clock() - t0,
                       None if allowed is None else int(allowed.sum()), embedding)
