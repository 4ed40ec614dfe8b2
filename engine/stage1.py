"""Stage-1 backends: where the shortlist of one index version comes from.

Stage 1 ranks the whole corpus on the L2-normalised m0-prefix of the rotated
documents (inner product, so scores are prefix cosines, Eq. (1) of 001) and
keeps a shortlist of C.  Everything after it -- routing (§3.2.2 of 001) and
rescoring with reused partial sums (§3.2.1) -- is :func:`adawidth.funnel.resolve`,
run by the gateway whatever the backend.  A backend therefore hands back a
:class:`Shortlist`: the candidates, their stage-1 cosines and the rescoring
vectors (rotated document prefixes) the gateway rescores from.

Two implementations of :class:`Stage1Backend`:

``faiss``   (default) an ``IndexFlatIP`` in process, read from the version's
            ``stage1.faiss``; the rescoring vectors are the version's
            memory-mapped ``docs.npy``.
``milvus``  a Milvus collection per index version (Milvus Lite in process for
            one process, a Milvus standalone or cluster for many), written by the
            trainer (:mod:`trainer.milvus_stage1`): a FLAT index with metric IP
            over the same normalised m0-prefixes as faiss, the rescoring prefix
            as a second vector field and ``||d[:m0]||^2`` as a scalar field.  One
            search returns the shortlist with its rescoring vectors.

The version a request uses is resolved once, at its start, from our registry
(:meth:`service.version_manager.VersionManager.acquire`); each loaded version holds a
backend bound to *its own* Milvus collection name, so a request never re-resolves
mid-request and a Milvus alias is never consulted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import faiss
import numpy as np

from adawidth.prefix import prefix_normalize, top_k
from engine import ann
from engine.version.files import read_stage1_index
from engine.version.manifest import Manifest
from engine.version.milvus import (RESCORE_FIELD, ROW_FIELD, SQNORM_FIELD, STAGE1_FIELD, milvus_collection_name,
                                   read_description, version_description)


@dataclass(frozen=True)
class Shortlist:
    """Stage-1 output of one query, ready for :func:`adawidth.funnel.resolve`.

    Attributes:
        rows: (C,) int64 positions into ``docs``, best first (no -1 padding).
        cosines: (C,) float32 stage-1 prefix cosines of those positions (higher is better).
        docs: (N', H) float32 rotated documents the positions index (the whole
            corpus for faiss, N' = N; the C shortlisted vectors for Milvus).
        doc_sqnorm_m0: (N',) ``||d[:m0]||^2`` of the same rows.
        index_rows: (N',) int64 map from a position of ``docs`` to the document's
            row in the index version, or None when they are the same (faiss).
    """

    rows: np.ndarray
    cosines: np.ndarray
    docs: np.ndarray
    doc_sqnorm_m0: np.ndarray
    index_rows: np.ndarray | None = None

    def to_index_rows(self, positions: np.ndarray) -> np.ndarray:
        """Index-version rows of positions into ``docs``; (k,) int64 -> (k,) int64."""
        positions = np.asarray(positions, dtype=np.int64)
        return positions if self.index_rows is None else self.index_rows[positions]


@runtime_checkable
class Stage1Backend(Protocol):
    """Stage 1 of one index version (bound to that version's data, never to a "live" pointer)."""

    kind: str
    rescore_width: int

    def shortlist(self, query_prefix: np.ndarray, size: int, allowed: np.ndarray | None = None) -> Shortlist:
        """Top ``size`` documents by inner product with the normalised m0-prefix ``query_prefix`` ((m0,) float32),
        among the rows where ``allowed`` ((N,) bool, None = all) is true."""

    def full(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top ``k`` at full width D among ``allowed``: ``query`` (D,) float32 rotated -> (rows (k',) int64,
        scores (k',) float64)."""

    def close(self) -> None:
        """Release what the backend holds (connections); the version's files stay."""


NUMPY_SHORTLIST_MAX_DOCS = 50_000
"""Documents up to which :class:`FaissStage1` builds a shortlist with numpy instead of faiss's search.

Measured one query at a time, one thread, m0 = 64, shortlist 500 (CPU µs per query, faiss ``IndexFlatIP``
vs matrix-vector product + :func:`adawidth.prefix.top_k`): 5k docs 100 vs 52, 10k 134 vs 81, 20k 173 vs
112, 50k 287 vs 244, 100k 676 vs 952.
"""


def _exact_shortlist(prefixes: np.ndarray, query_prefix: np.ndarray, size: int, allowed: np.ndarray | None,
                     docs: np.ndarray, doc_sqnorm_m0: np.ndarray) -> Shortlist:
    """The ``size`` best rows of ``prefixes @ query_prefix`` among ``allowed`` (ties to the lower row).

    Args:
        prefixes: (N, m0) float32 normalised m0-prefixes; query_prefix: (m0,) float32.
        size: shortlist length (cut to the allowed count).
        allowed: (N,) bool or None.
    """
    scores = prefixes @ np.asarray(query_prefix, np.float32).reshape(-1)
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf).astype(np.float32)
        size = min(size, int(allowed.sum()))
    rows = top_k(scores, size)
    return Shortlist(rows, scores[rows].astype(np.float32), docs, doc_sqnorm_m0)


class FaissStage1:
    """faiss in process (the default): today's served path, unchanged.

    Args:
        index: a faiss index over the normalised m0-prefixes (``stage1.faiss``).
        docs: (N, D) float32 rotated documents (memory-mapped ``docs.npy``).
        doc_sqnorm_m0: (N,) float32.
    """

    kind = "faiss"

    def __init__(self, index, docs: np.ndarray, doc_sqnorm_m0: np.ndarray):
        self.index, self.docs, self.doc_sqnorm_m0 = index, docs, doc_sqnorm_m0
        self.rescore_width = int(docs.shape[1])
        # below NUMPY_SHORTLIST_MAX_DOCS the shortlist is one BLAS product over the index's own vectors (a view,
        # not a copy) and an O(N) selection: faiss's single-query flat search keeps a size-k heap, which at
        # k = 500 costs more than the scan there
        self._prefixes = None
        if isinstance(index, faiss.IndexFlat) and 0 < index.ntotal <= NUMPY_SHORTLIST_MAX_DOCS:
            self._prefixes = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal,
                                                                                               index.d)

    def shortlist(self, query_prefix: np.ndarray, size: int, allowed: np.ndarray | None = None) -> Shortlist:
        """See :meth:`Stage1Backend.shortlist`; a faiss ID selector restricts the scan to ``allowed``.

        Unrestricted, below :data:`NUMPY_SHORTLIST_MAX_DOCS` documents, the same inner products come from one
        matrix-vector product over the index's vectors and :func:`adawidth.prefix.top_k` (ties to the lower row).
        """
        if self._prefixes is not None and allowed is None:  # (a selector skips the disallowed rows: faiss)
            return _exact_shortlist(self._prefixes, query_prefix, size, allowed, self.docs, self.doc_sqnorm_m0)
        qp = np.asarray(query_prefix, np.float32)[None, :]
        if allowed is None:
            cos, rows = self.index.search(qp, int(size))
        else:  # faiss IDSelectorBitmap: bit i of byte i >> 3
            bits = np.packbits(np.asarray(allowed, dtype=bool), bitorder="little")
            sel = faiss.IDSelectorBitmap(int(self.docs.shape[0]), faiss.swig_ptr(bits))
            cos, rows = self.index.search(qp, int(size), params=faiss.SearchParameters(sel=sel))
        keep = rows[0] >= 0
        return Shortlist(rows[0][keep].astype(np.int64), cos[0][keep], self.docs, self.doc_sqnorm_m0)

    def full(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`Stage1Backend.full`: an exact scan at D over the memory-mapped documents (faiss's brute-force
        k-NN over the array itself, no copy: 0.42 ms against numpy's 1.06 ms on 5,183 x 384 when the documents
        are not in cache, as between a server's requests; ties by the lower row; numpy with a restriction)."""
        q = np.asarray(query, dtype=np.float32)
        if allowed is None and k > 0:
            D, I = faiss.knn(np.ascontiguousarray(q[None, :]), self.docs, int(min(k, len(self.docs))),
                             metric=faiss.METRIC_INNER_PRODUCT)
            keep = I[0] >= 0
            rows, top = I[0][keep].astype(np.int64), D[0][keep]
            order = np.lexsort((rows, -top))  # best first, ties by the lower row (as top_k)
            return rows[order], top[order].astype(np.float64)
        scores = self.docs @ q  # float32, ranked as is (widening keeps order)
        if allowed is not None:
            scores = np.where(allowed, scores, np.float32(-np.inf))
            k = min(k, int(allowed.sum()))
        rows = top_k(scores, k)
        return rows, scores[rows].astype(np.float64)

    def close(self) -> None:
        """Nothing to release (the index belongs to the version)."""
        pass


class ExactStage1:
    """Brute-force numpy stage 1: the reference faiss's ``IndexFlatIP`` must equal, for offline evaluation.

    Same contract as :class:`FaissStage1` (ranks by the inner product of normalised m0-prefixes; ties by the
    lower row), computed by a matrix product over the whole corpus instead of a faiss index.

    Args:
        docs: (N, D) float32 rotated documents.
        doc_sqnorm_m0: (N,) float32 ``||d[:m0]||^2``.
        m0: stage-1 width.
    """

    kind = "exact"

    def __init__(self, docs: np.ndarray, doc_sqnorm_m0: np.ndarray, m0: int):
        self.docs, self.doc_sqnorm_m0, self.m0 = docs, doc_sqnorm_m0, int(m0)
        self.prefixes = prefix_normalize(np.asarray(docs), self.m0)
        self.rescore_width = int(docs.shape[1])

    def shortlist(self, query_prefix: np.ndarray, size: int, allowed: np.ndarray | None = None) -> Shortlist:
        """See :meth:`Stage1Backend.shortlist` (one matrix-vector product, :func:`adawidth.prefix.top_k`)."""
        return _exact_shortlist(self.prefixes, query_prefix, size, allowed, self.docs, self.doc_sqnorm_m0)

    def full(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`Stage1Backend.full`; the same scan as :meth:`FaissStage1.full`."""
        return FaissStage1.full(self, query, k, allowed)

    def close(self) -> None:
        """Nothing to release."""
        pass


class Stage1Unavailable(RuntimeError):
    """The backend cannot serve this version.

    ``code`` is a refusal reason of :mod:`service.version_manager` (``missing``, ``schema``), or ``unreachable``: the
    engine did not answer -- transient, so the version is retried rather than refused, and a search that
    meets it answers 503 ``stage1_unavailable``.
    """

    def __init__(self, code: str, message: str):
        self.code = code
        self.transient = code == "unreachable"
        super().__init__(message)


def open_milvus_client(uri: str, token: str | None = None):
    """A ``pymilvus.MilvusClient``: ``uri`` is a Milvus Lite path ending in ``.db`` (in process; one process may
    open it) or ``http://host:19530`` (a Milvus Lite server, Milvus standalone or a Milvus cluster's proxy)."""
    from pymilvus import MilvusClient

    if uri.endswith(".db"):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    return MilvusClient(uri=uri, token=token or "")


class MilvusStage1:
    """Stage 1 of one version served by Milvus; the gateway routes and rescores the shortlist itself.

    Args:
        client: a ``pymilvus.MilvusClient`` (shared by the versions of a process).
        name: the version's Milvus collection (:func:`milvus_collection_name`).
        m0: stage-1 width.
        rescore_width: width H of the stored rescoring prefix.
        size: documents N of the version.
        timeout_s: longest wait for one Milvus call, in seconds (pymilvus retries within it).
    """

    kind = "milvus"

    def __init__(self, client, name: str, m0: int, rescore_width: int, size: int, timeout_s: float = 2.0):
        self.client, self.name, self.m0 = client, name, m0
        self.rescore_width, self.size, self.timeout_s = int(rescore_width), int(size), float(timeout_s)

    @classmethod
    def attach(cls, client, manifest: Manifest, prefix: str = "adawidth", timeout_s: float = 2.0) -> "MilvusStage1":
        """Check that the version's collection exists and matches the manifest, load it, return the backend.

        Raises:
            Stage1Unavailable: ``missing`` (no collection, or fewer rows than documents),
                ``schema`` (the collection describes another version, m0 or corpus) or ``unreachable``.
        """
        name = milvus_collection_name(manifest.collection, manifest.version, prefix)
        try:
            exists = client.has_collection(name, timeout=timeout_s)
        except Exception as e:  # connection refused, timeout: try again on the next reconcile
            raise Stage1Unavailable("unreachable", f"Milvus did not answer: {type(e).__name__}: {e}") from e
        if not exists:
            raise Stage1Unavailable("missing", f"Milvus has no collection {name} for version {manifest.version} "
                                               f"(write it: python -m trainer milvus-write {manifest.collection} "
                                               f"{manifest.version})")
        meta = read_description(client, name)
        want = json.loads(version_description(manifest, meta.get("rescore_width", manifest.dimension)))
        if meta != want:
            raise Stage1Unavailable("schema", f"Milvus collection {name} describes {meta}, the manifest {want}")
        client.load_collection(name)
        rows = int(client.get_collection_stats(name).get("row_count", -1))
        if rows != manifest.corpus.documents:
            raise Stage1Unavailable("missing", f"Milvus collection {name} holds {rows} rows, the version "
                                               f"{manifest.corpus.documents} documents")
        return cls(client, name, manifest.m0, meta["rescore_width"], rows, timeout_s)

    @staticmethod
    def _filter(allowed: np.ndarray | None) -> str:
        """Milvus boolean expression keeping the allowed rows ('' for all).  The row list travels with each
        request, so large allowed sets belong in a scalar field of the collection instead (not built yet)."""
        if allowed is None:
            return ""
        return f"{ROW_FIELD} in {np.flatnonzero(allowed).tolist()}"

    def _search(self, vector: np.ndarray, field: str, limit: int, output_fields: list[str], expr: str = ""):
        """One Milvus search; after a failure the collection is (re)loaded once -- a restarted Milvus may have
        forgotten it was loaded -- and the search retried.

        Raises:
            Stage1Unavailable: ``unreachable`` when Milvus still does not answer.
        """
        kw = dict(anns_field=field, limit=int(limit), output_fields=output_fields, search_params={"metric_type": "IP"},
                  timeout=self.timeout_s, filter=expr)
        data = [np.asarray(vector, np.float32).tolist()]
        try:
            return self.client.search(self.name, data, **kw)
        except Exception:
            try:
                self.client.load_collection(self.name, timeout=self.timeout_s)
                return self.client.search(self.name, data, **kw)
            except Exception as e:
                raise Stage1Unavailable("unreachable", f"Milvus search on {self.name} failed: "
                                                       f"{type(e).__name__}: {str(e)[:200]}") from e

    def shortlist(self, query_prefix: np.ndarray, size: int, allowed: np.ndarray | None = None) -> Shortlist:
        """See :meth:`Stage1Backend.shortlist`: one Milvus search returning the rescoring vectors; best first, ties by row."""
        hits = self._search(query_prefix, STAGE1_FIELD, min(size, self.size), [RESCORE_FIELD, SQNORM_FIELD],
                            self._filter(allowed))[0]
        C = len(hits)
        rows = np.empty(C, np.int64)
        cos = np.empty(C, np.float32)
        sq = np.empty(C, np.float32)
        vecs = np.empty((C, self.rescore_width), np.float32)
        for i, h in enumerate(hits):
            rows[i], cos[i] = h[ROW_FIELD], h["distance"]
            ent = h["entity"]
            vecs[i], sq[i] = ent[RESCORE_FIELD], ent[SQNORM_FIELD]
        # best first, ties by row (faiss's flat scan keeps the lower row first on equal scores)
        order = np.lexsort((rows, -cos))
        return Shortlist(np.arange(C, dtype=np.int64), cos[order], vecs[order], sq[order], rows[order])

    def full(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exhaustive search at D on the rescoring field (needs H = D: rotated documents are unit norm at D, so the
        inner product is the frozen encoder's cosine).

        Raises:
            ValueError: when the stored rescoring prefix is narrower than the query.
        """
        if query.shape[-1] > self.rescore_width:
            raise ValueError(f"full width {query.shape[-1]} exceeds the rescoring width {self.rescore_width} "
                             f"stored in Milvus")
        if allowed is not None:
            k = min(k, int(allowed.sum()))
        if k <= 0:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        res = self._search(query, RESCORE_FIELD, min(k, self.size), [], self._filter(allowed))
        rows = np.array([h[ROW_FIELD] for h in res[0]], dtype=np.int64)
        scores = np.array([h["distance"] for h in res[0]], dtype=np.float64)
        order = np.lexsort((rows, -scores))
        return rows[order], scores[order]

    def close(self) -> None:
        """Nothing to release here: loading and releasing a collection act on the whole Milvus deployment, and
        another replica may still be serving this version; the trainer drops collections of versions the
        registry no longer names (``trainer milvus-gc``)."""


class Stage1Provider:
    """Makes the stage-1 backend of each version a process loads (one per process, built from settings).

    Args:
        kind: ``faiss`` or ``milvus``.
        milvus_uri: see :func:`open_milvus_client` (``milvus`` only).
        milvus_token: Milvus credentials ``user:password`` or an API key (``milvus`` only).
        milvus_prefix: prefix of the collection names.
        milvus_timeout_s: longest wait for one Milvus call of a search, in seconds.
    """

    def __init__(self, kind: str = "faiss", milvus_uri: str | None = None, milvus_token: str | None = None,
                 milvus_prefix: str = "adawidth", milvus_timeout_s: float = 2.0):
        self.milvus_timeout_s = float(milvus_timeout_s)
        if kind not in ("faiss", "milvus"):
            raise ValueError(f"stage-1 backend must be 'faiss' or 'milvus', got {kind!r}")
        if kind == "milvus" and not milvus_uri:
            raise ValueError("the milvus stage-1 backend needs milvus_uri")
        self.kind, self.milvus_uri, self.milvus_token, self.milvus_prefix = kind, milvus_uri, milvus_token, milvus_prefix
        self._client = None

    @property
    def client(self):
        """The process's Milvus client, connected on first use.

        Raises:
            Stage1Unavailable: ``unreachable`` when Milvus does not answer (the next call tries again).
        """
        if self._client is None:
            try:
                self._client = open_milvus_client(self.milvus_uri, self.milvus_token)
            except Exception as e:
                raise Stage1Unavailable("unreachable", f"cannot connect to Milvus at {self.milvus_uri}: "
                                                       f"{type(e).__name__}: {e}") from e
        return self._client

    def attach(self, path: Path, manifest: Manifest, docs: np.ndarray, doc_sqnorm_m0: np.ndarray) -> Stage1Backend:
        """The backend of the version at ``path`` (verified ``manifest``).

        Raises:
            Stage1Unavailable: the Milvus collection is missing or describes another version.
        """
        if self.kind == "faiss":
            return FaissStage1(read_stage1_index(Path(path), manifest), docs, doc_sqnorm_m0)
        return MilvusStage1.attach(self.client, manifest, self.milvus_prefix, self.milvus_timeout_s)

    def close(self) -> None:
        """Close the Milvus client (the next use reconnects)."""
        if self._client is not None:
            self._client.close()
            self._client = None


class AnnStage1:
    """An ANN first stage over the full-width rotated documents (issue 19; :mod:`engine.ann`), served by policy
    ``recall``: per query an effort (nprobe or efSearch) for the recall target, the ANN candidates, ranked by
    faiss's full-width scores (every ANN kind stores the float32 vectors: no second scoring pass;
    :mod:`engine.stages.rescore`).

    Args:
        index: the faiss index (:func:`engine.ann.build_index`, or ``ann.faiss`` of the version).
        params: its :class:`engine.ann.AnnParams`.
        curve: its tuning curve (:func:`engine.ann.tune_effort`): ``[{"effort", "recall", ...}]`` increasing.
        margin_share: share of a target's miss budget added before reading the curve (:func:`engine.ann.goal`).
        bytes_per_document: the backend's memory by part (:func:`engine.ann.bytes_per_document`).
        min_allowed_share: below this share of allowed documents a filtered search goes to the exact path (a
            graph or a few lists find too few allowed neighbours).
        effort_policy: the per-query effort model (:class:`engine.recall.RecallPolicy` whose grid is the
            effort grid and whose evidence is :class:`engine.ann.AnnEvidence`), or None for one effort per
            target read from the curve.
        model_targets: target -> whether the per-query model serves it (the build timed both at these targets;
            a target in between follows the nearest one, the higher on a tie), or None: the model serves every
            target (benchmarks).
        target_policies: target -> the per-query effort model fitted for it (each with a probe effort of its own,
            :func:`trainer.recall_fit.fit_effort_models`; a target in between takes the nearest one's, the higher
            on a tie), or None: ``effort_policy`` for every target.
        space: what the index holds (:data:`engine.ann.INDEX_SPACES`): ``rotated`` documents, searched with the
            rotated query, or the documents as encoded (``embedding``), searched with the query embedding, the
            rotation read only for the effort model's evidence (:func:`engine.ann.index_space`).
        fused_choice: the probe's evidence and the model's choice in one compiled call where it applies
            (:func:`engine.ann.probe_and_choose`), and with ``resumable`` the probe, choice and continuation in
            one (:func:`engine.ann.serve_per_query`); False: the Python path (comparisons).
        one_call: False keeps the probe and choice apart from the continuation (:func:`engine.ann.probe_and_choose`,
            then :func:`engine.ann.continue_search`: the served path before 2026-12-07, for comparisons); the
            same answers.
        resumable: an unfiltered HNSW's continuation goes on from the probe's search through the model's grid
            (:class:`engine.ann.ResumableHnsw`), as a version built with ``manifest.ann.search = "resumable"``
            was calibrated; False: searches again with faiss and merges the probe (versions built before).

    Raises:
        ValueError: an unknown ``space``.
    """

    def __init__(self, index, params: ann.AnnParams, curve: list[dict], margin_share: float = 0.25,
                 bytes_per_document: dict | None = None, min_allowed_share: float = 0.1,
                 effort_policy=None, model_targets: dict[float, bool] | None = None,
                 target_policies: dict | None = None, space: str = "rotated", fused_choice: bool = True,
                 resumable: bool = True, one_call: bool = True):
        if space not in ann.INDEX_SPACES:
            raise ValueError(f"ANN index space must be one of {ann.INDEX_SPACES}, got {space!r}")
        self.index, self.params, self.kind, self.space = index, params, params.kind, space
        self.curve = [dict(p) for p in curve]
        self.margin_share = float(margin_share)
        self.effort_name = ann.EFFORT_NAME[self.kind]
        self.bytes_per_document = dict(bytes_per_document or {})
        self.min_allowed_share = float(min_allowed_share)
        self._efforts: dict[float, int | None] = {}
        self.fused_choice = bool(fused_choice)  # False: the Python probe and choice always (comparisons)
        # HNSW: the continuation goes on from the probe's search (ann.ResumableHnsw), as the model was calibrated
        self.resumable = bool(resumable) and self.kind in ann.RESUMABLE_KINDS
        self.one_call = bool(one_call)  # the probe, choice and continuation in one compiled call (serve_per_query)
        self._fused: dict[int, bool] = {}  # id(policy) -> ann.fused_applies, unfiltered
        self._prefix: dict[int, bool] = {}  # id(policy) -> it reads an energy feature (needs_prefix)
        self.effort_policy = effort_policy
        self.model_targets = None if model_targets is None else {float(t): bool(u) for t, u in model_targets.items()}
        self.target_policies = None if not target_policies else {float(t): p for t, p in target_policies.items()}
        if self.effort_policy is None and self.target_policies:
            self.effort_policy = self.target_policies[min(self.target_policies)]

    def policy_for(self, target: float):
        """The per-query effort model of ``target`` (see ``target_policies``), or None without one."""
        if not self.target_policies:
            return self.effort_policy
        nearest = min(self.target_policies, key=lambda t: (abs(t - float(target)), -t))
        return self.target_policies[nearest]

    def probe_effort(self, target: float) -> int | None:
        """The probe's effort (nprobe or efSearch) of ``target``'s per-query model, or None where no model serves
        it (:meth:`uses_model`)."""
        return int(self.policy_for(target).z_grid[0]) if self.uses_model(target) else None

    def needs_prefix(self, target: float) -> bool:
        """Whether serving ``target`` reads the query's leading rotated coordinates
        (:data:`engine.ann.ENERGY_PREFIX`): where the per-query model serves it and splits on an energy feature
        (a model fitted with them missing, :data:`engine.ann.ENERGY_FEATURES`, does not: its versions skip
        the rotation, the evidence's energies then read the query itself and no split reads them)."""
        if not self.uses_model(target):
            return False
        policy = self.policy_for(target)
        out = self._prefix.get(id(policy))
        if out is None:
            out = self._prefix[id(policy)] = any(policy.reads(n) for n in ann.ENERGY_FEATURES)
        return out

    def uses_model(self, target: float) -> bool:
        """Whether the per-query effort model serves ``target`` (see ``model_targets``)."""
        if self.effort_policy is None:
            return False
        if not self.model_targets:
            return self.model_targets is None
        nearest = min(self.model_targets, key=lambda t: (abs(t - float(target)), -t))
        return self.model_targets[nearest]

    @property
    def max_recall(self) -> float:
        """The highest mean recall@10 the tuning queries reached (0 for an empty curve)."""
        return max((float(p["recall"]) for p in self.curve), default=0.0)

    def effort(self, target: float) -> int | None:
        """The served effort of a recall target (cached), or None when the backend cannot meet it."""
        if target not in self._efforts:
            self._efforts[target] = ann.effort_for(self.curve, target, self.margin_share)
        return self._efforts[target]

    def exact_because(self, target: float, allowed: np.ndarray | None) -> str | None:
        """Why a request of ``target`` (over ``allowed``, (N,) bool or None) must be served exactly, or None when
        the ANN serves it."""
        if target >= 1.0:
            return f"recall_target {target:g}: the {self.kind} backend certifies nothing; the exact scan serves it"
        if self.effort(target) is None:
            return (f"recall_target {target:g} needs a tuning recall of {ann.goal(target, self.margin_share):.4f}; "
                    f"the {self.kind} backend reached {self.max_recall:.4f} at its largest {self.effort_name}")
        if allowed is not None:
            share = float(np.count_nonzero(allowed)) / max(len(allowed), 1)
            if share < self.min_allowed_share:
                return (f"the filter allows {share:.1%} of the documents (< {self.min_allowed_share:.0%}): "
                        f"the {self.kind} backend would miss allowed neighbours")
        return None

    def per_query(self, query: np.ndarray, target: float, k: int, allowed: np.ndarray | None = None,
                  prefix: np.ndarray | None = None) -> tuple[ann.AnnHits, int, int]:
        """The candidates of one query ((D,) float32 in the index's :attr:`space`; ``prefix``: its leading rotated
        coordinates for the model's evidence, None when ``query`` is rotated) at the effort the per-query model
        chooses for ``target``: the probe at the first effort of the target's model's grid (:meth:`policy_for`: the probe
        effort the build chose for it, :func:`trainer.recall_fit.fit_effort_models`), then the cheapest effort
        whose predicted recall clears the target's calibrated bar (:meth:`engine.recall.RecallPolicy.choose`),
        searched on from the probe (:func:`engine.ann.continue_search`); when that is the probe's effort the
        probe's candidates are the answer.  Returns (hits with the probe's work included, effort, probe's
        multiply-adds).  Where the model does not serve the target (:meth:`uses_model`), or at a k it was not
        calibrated at, it is :meth:`search` at :meth:`effort`."""
        policy = self.policy_for(target)
        if not self.uses_model(target) or int(k) != int(policy.k):  # calibrated at its k only
            effort = self.effort(target)
            return self.search(query, k, effort, allowed), int(effort), 0
        grid = policy.z_grid
        fused = self._fused.get(id(policy)) if allowed is None and self.fused_choice else False
        if fused is None:
            fused = self._fused[id(policy)] = ann.fused_applies(self.index, self.kind, policy, None)
        if fused and self.resumable and self.one_call:  # the probe, the choice and the continuation in one call
            out = ann.serve_per_query(self.index, query, k, policy, float(target), prefix)
            if out is not None:
                return out
        if fused:  # the probe, then one compiled call to the chosen effort
            ev, z = ann.probe_and_choose(self.index, self.kind, query, k, int(grid[0]), policy, float(target), prefix,
                                         resume=self.resumable)
        else:
            ev = ann.probe(self.index, self.kind, query, k, int(grid[0]), allowed, prefix,
                           resume_grid=grid if self.resumable and allowed is None else None)
            z = policy.choose(ev, float(target))[1]
        effort = max(int(grid[-1]) if z is None else int(z), int(grid[0]))
        # IVF and a resumable HNSW go on from the probe; faiss's HNSW searches again (ann.continue_search)
        return ann.continue_search(self.index, self.kind, query, k, ev, effort, allowed), effort, ev.work

    def search(self, query: np.ndarray, k: int, effort: int, allowed: np.ndarray | None = None) -> ann.AnnHits:
        """The ANN candidates of one query ((D,) float32 in the index's :attr:`space`) at ``effort``; see
        :func:`engine.ann.search`."""
        return ann.search(self.index, self.kind, query, k, effort, allowed)
