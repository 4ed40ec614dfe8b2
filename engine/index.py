"""A loaded, verified, immutable index version: what the query pipeline reads.

:meth:`IndexVersion.load` verifies the version (:func:`engine.version.manifest.verify`: checksums, encoder,
max tokens, dimension, router features, collection) before reading anything else, then reads each file
through the format's readers (:mod:`engine.version.files`, :mod:`engine.version.lexical`); documents and
levels are memory-mapped.  Queries run through :class:`engine.pipeline.Pipeline`, whose stages read the
version's stage-1 backend (:class:`engine.stage1.Stage1Backend`: faiss in process by default, or Milvus),
routers, funnel policy, level store and recall policy.  :meth:`IndexVersion.in_memory` holds a version that
was never written (the trainer's evaluation, the benchmarks).
"""

from __future__ import annotations

import functools

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adawidth.blocked import BlockedCorpus
from adawidth.levels import kernel_threads, legacy_seeds
from adawidth.router import FEATURE_NAMES, threshold_for_rate
from engine.lexical import LexicalIndex
from engine.recall import RecallPolicy
from engine import ann as ann_lib
from engine.stage1 import AnnStage1, ExactStage1, FaissStage1
from engine.version import files
from engine.version.manifest import (SCHEMA_VERSION, CorpusSection, EncoderSection, Expect, Manifest, RouterSection,
                                     verify)


@dataclass
class Router:
    """LightGBM gain regressor of one action pair with its calibration predictions."""

    pair: tuple[int, int]
    booster: object
    calibration: np.ndarray
    lock: threading.Lock = field(default_factory=threading.Lock)
    _thresholds: dict = field(default_factory=dict)

    def predict(self, features: np.ndarray) -> float:
        """Predicted NDCG@10 gain of escalating, for one (18,) float64 feature row (thread-safe)."""
        with self.lock:
            return float(self.booster.predict(features[None, :])[0])

    def threshold(self, rho: float) -> float:
        """Threshold escalating a fraction ``rho`` of calibration queries (cached per ρ)."""
        if rho not in self._thresholds:
            self._thresholds[rho] = threshold_for_rate(self.calibration, rho)
        return self._thresholds[rho]


@dataclass
class FunnelPolicy:
    """The per-query funnel policy of a version (``adawidth.stage1_policy``) and its blocked corpus."""

    booster: object
    grid: list
    tau: float
    corpus: BlockedCorpus
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.work = np.array([c.work(self.corpus.N) for c in self.grid], dtype=np.float64)  # per query, reused

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Predicted agreement of each (K, 26) design row, (K,) float64 (thread-safe)."""
        with self.lock:
            return self.booster.predict(rows)


LEVEL_SCAN_MIN_DOCS = 5_000
"""Documents from which width ``full`` is served by the certified level scan rather than one flat scan.

Both return exactly the exhaustive top-k; below this size the level scan's fixed costs (seeding, bounds,
heaps) outweigh the coordinates it skips.  Measured one query at a time, one thread, the best of 5 medians of
µs per query, a flat scan (matrix-vector product + :func:`adawidth.prefix.top_k`) against
:func:`adawidth.levels.fused_search` (exact), on the 2-core AMD EPYC (Zen 4) machine: SciFact (5,183 documents,
PCA) 152 vs 117; Gaussian corpora with SciFact's spectrum, 2,000: 67 vs 85, 4,000: 116 vs 126, 8,000: 167 vs
114.  (Before the fused call and the eight-row kernels the crossover was near 10,000.)  Gateways set it with
``ADAWIDTH_LEVEL_SCAN_MIN_DOCS`` (0: always the level scan).
"""


class IndexVersion:
    """One immutable, loaded version (its files: :mod:`engine.version.manifest`)."""

    def __init__(self, path: Path, manifest: Manifest, rotation: np.ndarray, docs: np.ndarray,
                 doc_sqnorm_m0: np.ndarray, doc_ids: list[str], stage1_index, routers: dict,
                 funnel_policy: FunnelPolicy | None = None, lexical=None, stage1=None):
        self.path, self.manifest = path, manifest
        self.version: str = manifest.version
        self.collection: str = manifest.collection
        self.rotation = rotation
        self.docs = docs
        self.doc_sqnorm_m0 = doc_sqnorm_m0
        self.doc_ids = doc_ids
        self.stage1_index = stage1_index  # the faiss index (None when stage 1 runs elsewhere)
        self.stage1 = stage1 if stage1 is not None else FaissStage1(stage1_index, docs, doc_sqnorm_m0)
        self.routers: dict[tuple[int, int], Router] = routers
        self.funnel_policy = funnel_policy
        self.m0: int = manifest.m0
        self.shortlist: int = manifest.shortlist
        self.dimension: int = manifest.dimension
        self.theta: float = manifest.theta
        r = manifest.router
        self.default_pair = tuple(r.default_pair) if r is not None and r.default_pair else None
        self.default_rho: float = r.default_rho if r is not None else 0.2
        self.lexical = lexical  # engine.lexical.LexicalIndex, None for versions built without it
        self.texts: list[str] | None = None  # encoder texts of the documents (DART rerank tiers), when built with them
        self.tier_head: np.ndarray | None = None  # (T, D) float32 difficulty head W_t (tier 'auto'), when trained
        self.levels = None  # adawidth.levels.LevelStore (certified level scan), when the version stores levels
        self.recall_policy = None  # engine.recall.RecallPolicy: per-query confidence of policy 'recall'
        self.ann: AnnStage1 | None = None  # an ANN first stage over the full-width documents (policy 'recall')
        self.level_threads = 1  # kernel threads of one query's level scan (the gateway sets it from N and cores)
        # width 'full' on fewer documents is one flat scan (the same exact answer; faster there)
        self.level_scan_min_docs = LEVEL_SCAN_MIN_DOCS
        # the 'auto' policy this version was built to serve by default (versions before levels: funnel or router)
        self.manifest_default_policy: str | None = (manifest.policy.default if manifest.policy is not None else None) or (
            "funnel" if funnel_policy is not None else "router" if routers else None)

    @property
    def stage1_backend(self) -> str:
        """The stage-1 backend of policy ``recall``: an ANN kind (:data:`engine.ann.ANN_KINDS`), ``levels`` (the
        certified level scan) or ``flat`` (the exhaustive scan of versions without levels)."""
        if self.ann is not None:
            return self.ann.kind
        return "levels" if self.levels is not None else "flat"

    def backend_report(self) -> dict:
        """``{"backend", "bytes_per_document", "effort_name", "targets", "effort_per_query", "probe_effort",
        "chosen_because"}``: the stage-1 backend and its bytes per document by part (vectors, graph, ids, panorama,
        levels, float16, documents, total; :func:`engine.ann.bytes_per_document`), an ANN's tuned effort per
        target, whether its per-query effort model serves the target and at which probe effort (None: it does
        not), what its index holds (``index_space``: :data:`engine.ann.INDEX_SPACES`), and the build's reason for the backend (``--ann auto``: the timings of the backends it measured), for
        ``/readyz``; with a level store also ``level_threads_configured`` (what the gateway gives the scan),
        ``level_threads`` (the kernel threads one query's scan runs on: at most one per 32,768 documents) and
        ``recall_calibration_threads`` (the thread count whose recall calibration serves there,
        :meth:`engine.recall.RecallPolicy.at_threads`)."""
        N, D = max(self.size, 1), self.dimension
        b = getattr(self.manifest, "backend", None)
        why = {"chosen_because": b.reason if b is not None else None}
        if b is not None and b.measured:
            why["measured"] = b.measured
        if self.ann is not None:
            per = self.ann.bytes_per_document or ann_lib.bytes_per_document(self.ann.kind, N, D, self.ann.params)
            return {"backend": self.ann.kind, "index_space": self.ann.space, "bytes_per_document": per,
                    "effort_name": self.ann.effort_name,
                    "targets": {str(t): self.ann.effort(t) for t in ann_lib.DEFAULT_TARGETS},
                    "effort_per_query": {str(t): self.ann.uses_model(t) for t in ann_lib.DEFAULT_TARGETS},
                    "probe_effort": {str(t): self.ann.probe_effort(t) for t in ann_lib.DEFAULT_TARGETS}, **why}
        lv = self.levels
        per = ann_lib.bytes_per_document("flat", N, D, level_bytes_per_document=lv.nbytes / N if lv is not None else 0.0,
                                         fp16_width=lv.layout.fp16_width if lv is not None else 0)
        out = {"backend": self.stage1_backend, "bytes_per_document": per, **why}
        if lv is not None:  # the threads one query's level scan runs on, and the recall calibration served there
            threads = kernel_threads(self.level_threads, lv.N)
            out["level_threads_configured"] = int(self.level_threads)
            out["level_threads"] = threads
            if self.recall_policy is not None:
                out["recall_calibration_threads"] = self.recall_policy.at_threads(threads).calibration_threads
        return out

    @property
    def size(self) -> int:
        """Documents N of the version."""
        return len(self.doc_ids)

    @classmethod
    def load(cls, path: Path | str, *, expect: Expect = Expect(), stage1=None, lexical: bool = True) -> "IndexVersion":
        """Verify and load a version directory.

        Args:
            path: the version directory.
            expect: what the caller runs (:meth:`engine.version.manifest.Expect.of_encoder`); the default checks
                only the version's own consistency and this build's router features.
            stage1: a :class:`engine.stage1.Stage1Provider` (None: faiss in process from ``stage1.faiss``).
            lexical: load the BM25 index and keyword fields (False: a dense-only view, e.g. a fold's base,
                whose lexical files the fold reads itself).

        Raises:
            engine.version.manifest.IndexVersionError: every refusal of :func:`engine.version.manifest.verify`,
                and ``schema`` / ``dimension_mismatch`` for a file whose contents disagree with the manifest.
            engine.stage1.Stage1Unavailable: the provider cannot serve this version (e.g. no Milvus collection).
        """
        path = Path(path)
        manifest = verify(path, expect)
        core = files.read_core(path, manifest)
        routers = {pair: Router(pair, r.booster, r.calibration) for pair, r in files.read_routers(path, manifest).items()}
        in_process = stage1 is None or stage1.kind == "faiss"
        policy = None
        # the per-query funnel policy scans blocks of the whole corpus in process; with stage 1 on an external
        # engine (one m0-prefix field) the version serves 'auto' through its width router instead
        if in_process:
            fp = files.read_funnel_policy(path, manifest)
            if fp is not None:
                policy = FunnelPolicy(fp.booster, fp.grid, fp.tau, BlockedCorpus(np.asarray(core.docs), fp.block))
        rotation = core.rotation
        query_map = files.read_cars_query_map(path, manifest)
        if query_map is not None:
            # CARS (docs/METHOD.md): documents were stored through the doc map; queries go through the
            # query map, then the rotation.  Folding both into one (D, D) query-side matrix keeps every
            # query path (stage 1, rescoring, full width, funnel policy, online CUS) unchanged.
            rotation = (rotation.astype(np.float64) @ query_map).astype(np.float32)
        lexical = LexicalIndex.load(path, manifest) if lexical else None
        if in_process:
            version = cls(path, manifest, rotation, core.docs, core.doc_sqnorm_m0, core.doc_ids,
                          files.read_stage1_index(path, manifest), routers, policy, lexical)
        else:
            version = cls(path, manifest, rotation, core.docs, core.doc_sqnorm_m0, core.doc_ids, None, routers, None,
                          lexical, stage1=stage1.attach(path, manifest, core.docs, core.doc_sqnorm_m0))
        version.texts = files.read_rerank_texts(path, manifest)
        version.tier_head = files.read_tier_head(path, manifest)
        if in_process:  # the level scan reads the version's level-major files in process (memory-mapped)
            version.levels = files.read_levels(path, manifest)
            rp = files.read_recall_policy(path, manifest)
            if rp is not None:
                s = rp.section
                version.recall_policy = RecallPolicy(rp.booster, list(s.feature_names), np.asarray(s.z_grid), s.bound,
                                                     rp.calibration_pred, rp.calibration_recall,
                                                     rp.calibration_coordinates, k=s.k, margin_share=s.margin_share,
                                                     margin_rule=s.margin_rule,
                                                     seeds=s.seeds if s.seeds is not None else legacy_seeds(s.k),
                                                     calibration_by_threads=rp.by_threads)
            got = files.read_ann(path, manifest)
            if got is not None:
                a = manifest.ann
                effort, targets, by_target = None, None, None
                ef = files.read_ann_effort(path, manifest)
                if ef is not None:
                    models = [ef] + files.read_more_ann_efforts(path, manifest)
                    policies = [RecallPolicy(m.booster, list(m.section.feature_names),
                                             np.asarray(m.section.z_grid, np.float64), "ann", m.calibration_pred,
                                             m.calibration_recall, m.calibration_coordinates, k=m.section.k,
                                             margin_share=m.section.margin_share, margin_rule=m.section.margin_rule)
                              for m in models]
                    effort = policies[0]
                    targets = {float(t): float(t) in m.section.per_query_targets
                               for m in models for t in (m.section.measured or {})}
                    if len(models) > 1:  # one model per group of targets, each with its own probe
                        by_target = {float(t): p for m, p in zip(models, policies) for t in m.section.targets}
                version.ann = AnnStage1(got[0], got[1], a.curve, a.margin_share, a.bytes_per_document,
                                        effort_policy=effort, model_targets=targets, target_policies=by_target,
                                        space=a.space, resumable=a.search == "resumable")
        return version

    @classmethod
    def in_memory(cls, X_rot: np.ndarray, rotation: np.ndarray, doc_ids: list[str], *, m0: int = 64,
                  shortlist: int = 500, routers: dict | None = None, default_pair: tuple[int, int] | None = None,
                  default_rho: float = 0.2, funnel_policy: "FunnelPolicy | None" = None, lexical=None,
                  backend: str = "exact", collection: str = "offline", version: str = "offline",
                  theta: float = 0.05, levels=None, recall_policy=None, level_threads: int = 1,
                  ann: AnnStage1 | None = None) -> "IndexVersion":
        """A version held in memory, never written: what the trainer evaluates and the benchmarks time, through
        the same :class:`engine.pipeline.Pipeline` the gateway runs.

        Args:
            X_rot: (N, D) float32 rotated documents (unit norm at D).
            rotation: (D, D) float32 R (queries are rotated by it).
            doc_ids: N ids.
            m0, shortlist: stage-1 width and shortlist size C.
            routers: action pair -> :class:`Router` (policy ``router``).
            funnel_policy: a :class:`FunnelPolicy` (policy ``funnel``).
            lexical: a lexical index (modes ``lexical``/``hybrid``, filters).
            levels: an :class:`adawidth.levels.LevelStore` of ``X_rot`` (policies ``exact`` and ``recall``).
            recall_policy: an :class:`engine.recall.RecallPolicy` (policy ``recall``).
            level_threads: kernel threads of one query's level scan.
            ann: an :class:`engine.stage1.AnnStage1` over ``X_rot`` (policy ``recall`` through an ANN first stage).
            backend: ``exact`` (brute-force numpy stage 1, the reference) or ``faiss`` (an ``IndexFlatIP`` over
                the normalised m0-prefixes, as served).
        """
        X_rot = np.ascontiguousarray(X_rot, dtype=np.float32)
        N, D = X_rot.shape
        sq = files.doc_sqnorm(X_rot, m0)
        manifest = Manifest(schema_version=SCHEMA_VERSION, version=version, collection=collection,
                            encoder=EncoderSection(onnx_sha256="in-memory"), dimension=D, m0=m0, shortlist=shortlist,
                            theta=theta, corpus=CorpusSection(documents=N),
                            router=RouterSection(feature_names=list(FEATURE_NAMES), default_rho=default_rho,
                                                 default_pair=tuple(default_pair) if default_pair else None))
        if backend == "exact":
            stage1, index = ExactStage1(X_rot, sq, m0), None
        elif backend == "faiss":
            index, stage1 = files.stage1_index(X_rot, m0), None
        else:
            raise ValueError(f"backend must be 'exact' or 'faiss', got {backend!r}")
        v = cls(None, manifest, np.asarray(rotation, dtype=np.float32), X_rot, sq, list(doc_ids), index,
                dict(routers or {}), funnel_policy, lexical, stage1=stage1)
        v.levels, v.recall_policy, v.level_threads = levels, recall_policy, int(level_threads)
        v.ann = ann
        if (levels is not None and recall_policy is not None) or ann is not None:
            v.manifest_default_policy = "recall"
        return v

    @functools.cached_property
    def row_of(self) -> dict[str, int]:
        """Document id -> index row (built on first use: the versions' ids never change)."""
        return {d: r for r, d in enumerate(self.doc_ids)}

    def rotate(self, embedding: np.ndarray, width: int) -> np.ndarray:
        """Leading ``width`` coordinates of ``R @ q``; embedding (D,) -> (width,) float32 (costs D × width)."""
        return (self.rotation[:width] @ embedding).astype(np.float32)

