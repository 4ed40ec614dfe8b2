"""ANN first stages over the full-width documents (issue 19): building, effort tuning, memory, selection.

Five kinds of faiss index over the (N, D) documents (unit norm at D, so the inner product is the frozen encoder's
cosine and the ranking by L2 distance is the same ranking), as encoded or rotated ``R d`` (:func:`index_space`),
float32 but for ``hnsw_fp16``:

==================  =========================================  ============================================
kind                faiss class                                effort (per query)
==================  =========================================  ============================================
``ivf``             ``IndexIVFFlat`` (inner product)           ``nprobe``: inverted lists scanned
``ivf_panorama``    ``IndexIVFFlatPanorama`` (inner product)   ``nprobe``; level pruning inside each list
``hnsw``            ``IndexHNSWFlat`` (inner product)          ``efSearch``: the search beam
``hnsw_fp16``       ``IndexHNSWSQ`` fp16 (inner product)       ``efSearch``; vectors stored in float16
``hnsw_panorama``   ``IndexHNSWFlatPanorama`` (L2: faiss        ``efSearch``; level pruning of each distance
                    1.15 builds it for L2 only; equal ranking
                    on unit vectors)
==================  =========================================  ============================================

``hnsw_fp16`` holds the vectors in float16 (faiss's ``ScalarQuantizer.QT_fp16``): 2 D bytes a document instead
of 4 D, and each distance reads half the memory.  On debdocs' 221,170 passages (M = 32, one thread) it realised
the same recall@10 as ``hnsw`` at every efSearch tried (0.9488 / 0.9836 / 0.9925 / 0.9946 at 96 / 256 / 480 /
640) at 0.66-0.70x its p50 and 0.58x its bytes (219 against 381 MiB) on an AMD EPYC, so ``auto`` builds it in
place of ``hnsw`` (docs/SCALING.md).  On an Intel Xeon it was slower than ``hnsw`` (faiss's float16 HNSW 1.02-1.20x
faiss's float32 one's p50 at 0.99, two runs): the bytes are saved everywhere, the time only on some machines.  Its scores are inner products with the float16-rounded documents (relative error
of a coordinate at most 2^-11).

An unfiltered inner-product HNSW (``hnsw``, ``hnsw_fp16``: :data:`RESUMABLE_KINDS`) is searched by
:class:`ResumableHnsw` (``adawidth/_hnsw.c``): faiss's own beam search over faiss's own graph and vectors, read in
place, that keeps its state, so the per-query effort model's continuation goes on from the probe instead of
searching again.  On debdocs' 221,170 passages (float16, one thread, an Intel Xeon) a fresh search realised
faiss's recall@10 with faiss's mean distance count at every efSearch tried (16, 40, 99, 516), in about faiss's
time (0.86-1.02x its ``index.search`` p50, ``bench/results/pipeline_cost``).

Panorama (arXiv 2510.00566) prunes candidates on partial distances over levels of coordinates; the PCA /
adapter rotation puts the energy in the leading coordinates, which is what makes it prune.

Index space (:func:`index_space`): the kinds without Panorama score every candidate by its full-width inner
product, which an orthogonal R leaves unchanged (``<R q, R d> = <q, d>``), so a build stores their documents as
the encoder gives them and a query skips its D x D rotation (576 KiB of R read at D = 384; 25 µs with R in the
last-level cache, 60-80 µs without, ``bench/results/pipeline_cost``); only the per-query effort model's evidence
reads rotated coordinates, the leading :data:`ENERGY_PREFIX` (:func:`probe`'s ``prefix``).  Panorama's levels
need the rotation's energy compaction: its kinds keep the rotated documents.  Versions built before 2026-12-06
hold every kind rotated (``manifest.ann.space``).

Defaults: ``nlist = round(4 sqrt(N))`` (at least 1, at most N / 39 so k-means has 39 points a centroid),
``M = 32``, ``efConstruction = 80``, Panorama levels 8 (IVF Panorama lists padded to batches of 128).  The served candidates are rescored exactly at full
width (:mod:`engine.stages.rescore`), so the ANN index only decides *which* documents are candidates.

Effort tuning (:func:`tune_effort`): the realised recall@10 against exhaustive search of each effort of a grid
on tuning queries (training queries, or corpus pseudo-queries), bisected between grid points around the goals of
the default targets; the served effort
of a target is the cheapest effort whose tuning recall reaches ``target + margin_share * (1 - target)``
(:func:`effort_for`).  A target no effort of the grid reaches is served by the exact path.

Memory (:func:`bytes_per_document`): what each backend holds per document, by part (vectors, graph, ids,
Panorama's cumulative norms, the level store and its float16 copy), and :func:`select_backend` picks flat
(certified level scan) below ``ann_min_docs`` and the fastest ANN that fits ``memory_budget_bytes`` above,
raising :class:`MemoryBudgetError` with the bytes needed otherwise.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import faiss
import numpy as np

from adawidth import _effort, _hnsw
from adawidth.prefix import top_k

ANN_KINDS = ("ivf", "hnsw", "ivf_panorama", "hnsw_panorama", "hnsw_fp16")
"""ANN backends a version may hold."""
BACKEND_CHOICES = ("none", "auto", *ANN_KINDS)
"""Values of the trainer's ``--ann``: ``none`` (flat only), ``auto`` (:func:`select_backend`) or one kind."""
EFFORT_NAME = {"ivf": "nprobe", "ivf_panorama": "nprobe", "hnsw": "efSearch", "hnsw_panorama": "efSearch",
               "hnsw_fp16": "efSearch"}
FAISS_CLASS = {"ivf": "IndexIVFFlat", "ivf_panorama": "IndexIVFFlatPanorama", "hnsw": "IndexHNSWFlat",
               "hnsw_panorama": "IndexHNSWFlatPanorama", "hnsw_fp16": "IndexHNSWSQ"}
VECTOR_BYTES = {"hnsw_fp16": 2.0}
"""Bytes a coordinate of the ANN's own copy of the vectors (4, float32, for kinds not listed)."""
EFFORT_STEP = 1.25
"""Ratio between consecutive efforts of :func:`effort_grid` (about; rounded to integers).  A tuned effort overshoots
its target by up to one step: at 1.5 (this grid before 2026-12-04) debdocs' 0.99 jumped from efSearch 256
(training recall 0.989) to 384, so the fixed effort realised 0.9946 where the per-query model realised 0.9915 and
the two were not at equal recall (``bench/results/scale/``, 80,000 passages)."""
HNSW_EF_GRID = (10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 480, 640, 768, 960,
                1280, 1536, 2048, 2560, 3072, 4096)
"""efSearch values tuned over (increasing, steps of 1.2-1.33, :data:`EFFORT_STEP`).  Up to 4096: on 10^6 documents
drawn from a Gaussian fitted to SciFact (``bench/results/scale/``) HNSW M = 32 reaches recall@10 0.948 at efSearch
1024 and 0.989 only at 4096."""
DEFAULT_TARGETS = (0.95, 0.99)
INDEX_SPACES = ("rotated", "embedding")
"""What an ANN index holds: the rotated documents ``R d`` (searched with ``R q``), or the documents as the encoder
gives them (searched with the query embedding ``q``; :func:`index_space`)."""
ENERGY_PREFIX = 64
"""The leading rotated coordinates the per-query effort model's evidence reads (``energy16``, ``energy64``)."""
PANORAMA_LEVELS = 8
PANORAMA_BATCH = 128


def index_space(kind: str) -> str:
    """The space a build stores ``kind``'s documents in (:data:`INDEX_SPACES`): ``embedding`` for the kinds that
    score each candidate by its full-width inner product (``ivf``, ``hnsw``, ``hnsw_fp16``: invariant under the
    orthogonal rotation), ``rotated`` for Panorama's (its level pruning needs the rotation's energy compaction).

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in ANN_KINDS:
        raise ValueError(f"ANN kind must be one of {ANN_KINDS}, got {kind!r}")
    return "rotated" if "panorama" in kind else "embedding"


class MemoryBudgetError(ValueError):
    """The backend a build would use does not fit the memory budget; ``needed_bytes`` says how much it needs."""

    def __init__(self, message: str, needed_bytes: int, budget_bytes: int):
        self.needed_bytes, self.budget_bytes = int(needed_bytes), int(budget_bytes)
        super().__init__(message)


@dataclass(frozen=True)
class AnnParams:
    """Build parameters of one ANN index.

    Attributes:
        kind: one of :data:`ANN_KINDS`.
        nlist: IVF inverted lists (IVF kinds; 0 otherwise).
        M: HNSW neighbours per node above level 0 (2M at level 0; HNSW kinds; 0 otherwise).
        ef_construction: HNSW build beam (HNSW kinds).
        n_levels: Panorama levels (Panorama kinds; 0 otherwise).
    """

    kind: str
    nlist: int = 0
    M: int = 0
    ef_construction: int = 0
    n_levels: int = 0

    def as_dict(self) -> dict:
        """The parameters as written in the manifest (kind first)."""
        return {"kind": self.kind, "nlist": self.nlist, "M": self.M, "ef_construction": self.ef_construction,
                "n_levels": self.n_levels}


def default_nlist(n: int) -> int:
    """``round(4 sqrt(n))`` inverted lists, clipped to [1, max(1, n // 39)] (k-means wants >= 39 points a list)."""
    return int(max(1, min(round(4.0 * math.sqrt(max(n, 1))), max(1, n // 39))))


def default_params(kind: str, n: int, *, M: int = 32, ef_construction: int = 80, nlist: int | None = None,
                   n_levels: int = PANORAMA_LEVELS) -> AnnParams:
    """The parameters of ``kind`` for ``n`` documents (module docstring).

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in ANN_KINDS:
        raise ValueError(f"ANN kind must be one of {ANN_KINDS}, got {kind!r}")
    pan = n_levels if kind.endswith("panorama") else 0
    if kind.startswith("ivf"):
        return AnnParams(kind, nlist=int(nlist or default_nlist(n)), n_levels=pan)
    return AnnParams(kind, M=int(M), ef_construction=int(ef_construction), n_levels=pan)


def effort_grid(params: AnnParams) -> tuple[int, ...]:
    """The efforts tuned over, increasing: nprobe 1, 2, 3, 4, 5, 7, 9, 12, ... (x :data:`EFFORT_STEP`, rounded up)
    up to nlist (IVF), :data:`HNSW_EF_GRID` (HNSW)."""
    if params.kind.startswith("hnsw"):
        return HNSW_EF_GRID
    out, p = [], 1
    while p < params.nlist:
        out.append(p)
        p = p + 1 if p < 4 else int(math.ceil(p * EFFORT_STEP))
    out.append(params.nlist)
    return tuple(sorted(set(out)))


# -- memory --------------------------------------------------------------------------------------------------

def hnsw_graph_bytes_per_document(M: int) -> float:
    """Expected bytes of faiss's HNSW graph per document: 2M int32 links at level 0, M per upper level (expected
    1 / (M - 1) upper levels a node, level multiplier 1 / ln M), an int32 level and an int64 offset."""
    upper = 1.0 / max(M - 1, 1)
    return 4.0 * (2 * M + M * upper) + 4 + 8


def bytes_per_document(backend: str, n: int, d: int, params: AnnParams | None = None, *,
                       level_bytes_per_document: float = 0.0, fp16_width: int = 0) -> dict:
    """Bytes per document of one stage-1 backend, by part, and ``total``.

    Args:
        backend: ``flat`` (the certified level scan over the level store, and the mapped documents) or a kind
            of :data:`ANN_KINDS`.
        n, d: documents N and width D.
        params: the ANN's parameters (ANN kinds).
        level_bytes_per_document: the level store's bytes / N (``flat``; its float32 levels, norms and the
            float16 copy), 0 when the version has no levels.
        fp16_width: coordinates of the level store held in float16 as well (the ``float16`` part: 2 bytes each).

    Returns:
        ``{"vectors", "graph", "ids", "panorama", "levels", "float16", "documents", "total"}`` in bytes per
        document (floats): ``documents`` is the version's ``docs.npy`` (4 D, memory-mapped; the exact rescoring
        and exact path read it), ``vectors`` the ANN's own copy (float32; float16 for ``hnsw_fp16``), ``levels``
        the level store without its float16 part, ``float16`` that part.
    """
    out = {"vectors": 0.0, "graph": 0.0, "ids": 0.0, "panorama": 0.0, "levels": 0.0, "float16": 0.0,
           "documents": 4.0 * d}
    if backend == "flat":
        out["float16"] = 2.0 * fp16_width if level_bytes_per_document else 0.0
        out["levels"] = max(level_bytes_per_document - out["float16"], 0.0)
    elif backend in ANN_KINDS:
        if params is None:
            raise ValueError(f"{backend} needs its AnnParams")
        out["vectors"] = VECTOR_BYTES.get(backend, 4.0) * d
        if backend.startswith("ivf"):
            out["ids"] = 8.0
            out["graph"] = 4.0 * d * params.nlist / max(n, 1)  # the centroids, shared
        else:
            out["graph"] = hnsw_graph_bytes_per_document(params.M)
        if backend.endswith("panorama"):
            out["panorama"] = 4.0 * (params.n_levels + 1)
        if backend == "ivf_panorama":  # each list padded to whole batches of PANORAMA_BATCH
            avg = max(n / max(params.nlist, 1), 1.0)
            pad = math.ceil(avg / PANORAMA_BATCH) * PANORAMA_BATCH / avg
            out["vectors"] *= pad
            out["panorama"] *= pad
    else:
        raise ValueError(f"backend must be 'flat' or one of {ANN_KINDS}, got {backend!r}")
    out["total"] = float(sum(v for v in out.values()))
    return {k: round(float(v), 2) for k, v in out.items()}


@dataclass(frozen=True)
class BackendChoice:
    """What :func:`select_backend` chose: ``backend`` (``flat`` or a kind), why, and the bytes it needs."""

    backend: str
    reason: str
    needed_bytes: int
    bytes_per_document: dict = field(default_factory=dict)
    alternatives: tuple[str, ...] = ()
    """Backends that also fit and are built and timed against ``backend`` (:func:`pick_by_latency`); the build
    keeps the faster."""


def select_backend(requested: str, n: int, d: int, *, ann_min_docs: int = 200_000,
                   memory_budget_bytes: int | None = None, level_bytes_per_document: float = 0.0,
                   fp16_width: int = 0, params: dict | None = None) -> BackendChoice:
    """Pick the stage-1 backend of a build.

    ``none``: flat.  A kind: that kind.  ``auto``: flat below ``ann_min_docs`` documents; else ``hnsw_fp16`` when
    it fits the budget (the fastest at equal recall, and smaller than ``hnsw``), else ``ivf``, with flat among the
    ``alternatives`` when it fits too: the build times both at the default recall target on its tuning queries
    and keeps the faster (:func:`pick_by_latency`; on 10^6 Gaussian documents HNSW needs efSearch 4096 for
    recall@10 0.99 and the level scan is ~5 x faster, ``bench/results/scale/``).  Every choice must fit
    ``memory_budget_bytes`` (None: no budget) with the documents ``docs.npy`` and, for flat, the level store.

    Args:
        requested: one of :data:`BACKEND_CHOICES`.
        n, d: documents N and width D.
        ann_min_docs: smallest N at which ``auto`` builds an ANN.
        memory_budget_bytes: bytes the served version may hold, or None.
        level_bytes_per_document, fp16_width: the level store's size (flat; see :func:`bytes_per_document`).
        params: overrides of :func:`default_params` (``M``, ``ef_construction``, ``nlist``).

    Returns:
        The :class:`BackendChoice`.

    Raises:
        MemoryBudgetError: the backend (``auto``: every candidate) does not fit; the message names the bytes.
        ValueError: an unknown ``requested``.
    """
    if requested not in BACKEND_CHOICES:
        raise ValueError(f"--ann must be one of {', '.join(BACKEND_CHOICES)}, got {requested!r}")
    params = params or {}

    def cost(backend):
        p = None if backend == "flat" else default_params(backend, n, **params)
        per = bytes_per_document(backend, n, d, p, level_bytes_per_document=level_bytes_per_document,
                                 fp16_width=fp16_width)
        return int(math.ceil(per["total"] * n)), per

    def fits(need):
        return memory_budget_bytes is None or need <= memory_budget_bytes

    if requested == "auto":
        if n < ann_min_docs:
            candidates, why = ["flat"], f"N = {n:,} < ann_min_docs = {ann_min_docs:,}"
        else:
            candidates, why = ["hnsw_fp16", "ivf"], f"N = {n:,} >= ann_min_docs = {ann_min_docs:,}"
    else:
        candidates, why = ["flat" if requested == "none" else requested], f"--ann {requested}"
    tried = []
    for backend in candidates:
        need, per = cost(backend)
        tried.append((backend, need))
        if fits(need):
            budget = "no memory budget" if memory_budget_bytes is None else f"fits {memory_budget_bytes:,} bytes"
            alternatives = ()
            if requested == "auto" and backend != "flat" and level_bytes_per_document > 0 and fits(cost("flat")[0]):
                alternatives = ("flat",)
            return BackendChoice(backend, f"{why}; {backend} needs {need:,} bytes ({budget})", need, per,
                                 alternatives)
    least = min(tried, key=lambda t: t[1])
    raise MemoryBudgetError(
        f"the stage-1 backend does not fit the memory budget of {memory_budget_bytes:,} bytes: "
        + ", ".join(f"{b} needs {need:,} bytes" for b, need in tried)
        + f" for {n:,} documents of width {d} ({why}); raise memory_budget_bytes (ADAWIDTH_MEMORY_BUDGET_BYTES) "
          f"to at least {least[1]:,} or choose another --ann", least[1], memory_budget_bytes)


def pick_by_latency(measured: dict[str, dict]) -> tuple[str, str]:
    """The backend with the lowest measured p50 among those timed at the same recall target.

    Args:
        measured: backend -> ``{"p50_ms": float (lower is better), "recall_at_10": float, ...}``, each timed
            through the served pipeline on the same tuning queries, one query at a time.

    Returns:
        (backend, reason).

    Raises:
        ValueError: nothing measured, or a p50 that is not a positive finite number.
    """
    if not measured:
        raise ValueError("no backend was measured")
    for b, m in measured.items():
        p = m.get("p50_ms")
        if not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
            raise ValueError(f"{b}: p50_ms must be a positive finite number, got {p!r}")
    best = min(measured, key=lambda b: (measured[b]["p50_ms"], b))
    others = ", ".join(f"{b} {m['p50_ms']:.3g} ms (recall@10 {m['recall_at_10']:.3f})"
                       for b, m in sorted(measured.items()) if b != best)
    m = measured[best]
    return best, (f"{best} measured {m['p50_ms']:.3g} ms p50 at recall@10 {m['recall_at_10']:.3f}"
                  + (f", faster than {others}" if others else ""))


# -- building and searching ----------------------------------------------------------------------------------

def build_index(X_rot: np.ndarray, params: AnnParams, *, seed: int = 0) -> faiss.Index:
    """Build the faiss index of ``params`` over the rotated documents.

    Args:
        X_rot: (N, D) float32 documents in the index's space (:func:`index_space`: rotated, or as the encoder gives
            them), unit norm.
        params: :class:`AnnParams`.
        seed: k-means seed (IVF kinds).

    Returns:
        The trained index holding the N documents (ids 0 .. N-1).

    Raises:
        ValueError: an empty corpus or an unknown kind.
    """
    X = np.ascontiguousarray(X_rot, dtype=np.float32)
    n, d = X.shape
    if n == 0:
        raise ValueError("an ANN index needs at least one document")
    k = params.kind
    if k.startswith("ivf"):
        quantizer = faiss.IndexFlatIP(d)
        if k == "ivf":
            index = faiss.IndexIVFFlat(quantizer, d, params.nlist, faiss.METRIC_INNER_PRODUCT)
        else:
            # lists are padded to whole batches: faiss's default batch of 1024 would pad 250-document lists 4x
            index = faiss.IndexIVFFlatPanorama(quantizer, d, params.nlist, params.n_levels, faiss.METRIC_INNER_PRODUCT,
                                               True, PANORAMA_BATCH)
        index.cp.seed = int(seed)
        index.train(X)
        index.add(X)
        return index  # faiss's Python wrapper keeps the quantizer referenced by the index
    if k == "hnsw":
        index = faiss.IndexHNSWFlat(d, params.M, faiss.METRIC_INNER_PRODUCT)
    elif k == "hnsw_fp16":
        index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, params.M, faiss.METRIC_INNER_PRODUCT)
    elif k == "hnsw_panorama":
        index = faiss.IndexHNSWFlatPanorama(d, params.M, params.n_levels)
    else:
        raise ValueError(f"ANN kind must be one of {ANN_KINDS}, got {k!r}")
    index.hnsw.efConstruction = int(params.ef_construction)
    index.add(X)
    return index


@dataclass(frozen=True)
class AnnHits:
    """One query's ANN candidates: ``rows`` (c,) int64 best first (no -1), ``scores`` (c,) float32 their inner
    products with the query at full width as faiss computed them (every kind of :data:`ANN_KINDS` scores a
    returned document in full, Panorama's too: exact up to float32 rounding, ``hnsw_fp16`` against the
    float16-rounded documents; higher is closer; HNSW Panorama's squared L2 distances converted for unit documents), ``work``
    multiply-adds it cost (documents whose distance was computed × D, and the IVF centroids; HNSW counts from
    faiss's global statistics, so approximate under concurrent searches), and for an IVF search asked for them
    (:func:`search`'s ``centroids``) every centroid ranked: ``centroid_scores`` (nlist,) float32 the query's
    inner products with them, best first (higher is closer), ``centroid_lists`` (nlist,) int64 their list ids;
    None otherwise."""

    rows: np.ndarray
    work: int
    centroid_scores: np.ndarray | None = None
    centroid_lists: np.ndarray | None = None
    scores: np.ndarray | None = None


def _hits(index: faiss.Index, q: np.ndarray, D: np.ndarray, I: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """faiss's one-query answer ((1, k) float32 distances, (1, k) int64 labels) without its -1 padding, as inner
    products: an L2 index (faiss's HNSW Panorama has no inner-product metric) answers ||q - x||^2, which for unit
    documents is ||q||^2 + 1 - 2 q.x."""
    rows, d = I[0], D[0]
    if len(rows) and rows[-1] < 0:  # faiss pads a short answer at its end
        keep = rows >= 0
        rows, d = rows[keep], d[keep]
    if index.metric_type == faiss.METRIC_L2:
        d = (np.float32(np.dot(q[0], q[0])) + np.float32(1.0) - d) * np.float32(0.5)
    return rows, d


_FAST_RANKED_MAX = 512
"""Candidate lists up to this length try :func:`ranked`'s already-ordered check first (longer ones sort)."""


def ranked(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of candidates ((c,) int64 rows, (c,) scores, higher is better): (rows (k',) int64, scores
    (k',) float64), best first, ties by the lower row (as :func:`exact_rerank`); rows appearing twice count once."""
    rows = np.asarray(rows, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    if len(rows) == 0:
        return rows, scores
    if len(rows) <= _FAST_RANKED_MAX:
        # faiss returns its hits best first: strictly decreasing scores over distinct rows are already in this
        # order (no ties to break, nothing to merge), checked on Python floats in ~2 us instead of the ~13 us
        # of lexsort + unique on every probe, continuation and rescore
        s = scores.tolist()
        if all(a > b for a, b in zip(s, s[1:])):
            r = rows.tolist()
            if len(set(r)) == len(r):
                return rows[:k], scores[:k]
    order = np.lexsort((rows, -scores))
    rows, scores = rows[order], scores[order]
    _, first = np.unique(rows, return_index=True)  # each row at its best place
    if len(first) < len(rows):
        first.sort()
        rows, scores = rows[first], scores[first]
    return rows[:k], scores[:k]


def _selector(allowed: np.ndarray | None):
    if allowed is None:
        return None
    bits = np.packbits(np.asarray(allowed, dtype=bool), bitorder="little")
    sel = faiss.IDSelectorBitmap(int(len(allowed)), faiss.swig_ptr(bits))
    sel.bits_ref = bits  # the selector reads the bitmap: keep it alive with the selector
    return sel


def scan_lists(index: faiss.Index, query: np.ndarray, k: int, lists: np.ndarray, scores: np.ndarray,
               allowed: np.ndarray | None = None) -> AnnHits:
    """The top ``k`` of an IVF index's given inverted lists, without a quantizer pass (the continuation of a
    probe: :func:`continue_search`).

    Args:
        index: an IVF index (:func:`build_index`).
        query: (D,) float32 query in the index's space (:func:`index_space`).
        k: candidates wanted.
        lists: (p,) int64 list ids to scan; scores: (p,) float32 their centroid scores (faiss's coarse
            distances; an inner-product IVF-Flat scores documents exactly and ignores them).
        allowed: (N,) bool restriction, or None.

    Returns:
        :class:`AnnHits` whose work is the scanned documents × D (no centroid work; faiss's global statistics,
        so approximate under concurrent searches, as HNSW's).
    """
    q = np.ascontiguousarray(query, dtype=np.float32)[None, :]
    ca = np.ascontiguousarray(np.asarray(lists, np.int64)[None, :])
    cd = np.ascontiguousarray(np.asarray(scores, np.float32)[None, :])
    nprobe = ca.shape[1]
    if nprobe == 0:
        return AnnHits(np.empty(0, np.int64), 0, scores=np.empty(0, np.float32))
    stats = faiss.cvar.indexIVF_stats  # documents scanned, as HNSW's count (a Python loop over list_size cost
    before = int(stats.ndis)           # ~3 us a list: 1 ms a query at nprobe 365)
    p = faiss.SearchParametersIVF()  # per call: the index's own nprobe is shared by concurrent searches
    p.nprobe = nprobe
    sel = _selector(allowed)
    if sel is not None:
        p.sel = sel
    D = np.empty((1, int(k)), np.float32)
    I = np.empty((1, int(k)), np.int64)
    # the C++ search over the given lists (the Python wrapper refuses parameters)
    index.search_preassigned_c(1, faiss.swig_ptr(q), int(k), faiss.swig_ptr(ca), faiss.swig_ptr(cd),
                               faiss.swig_ptr(D), faiss.swig_ptr(I), False, p)
    if "Panorama" in type(index).__name__:  # its ndis leaves out the documents its levels pruned
        scanned = sum(index.invlists.list_size(int(c)) for c in ca[0] if c >= 0)
    else:
        scanned = max(int(stats.ndis) - before, 0)
    rows, scores = _hits(index, q, D, I)
    return AnnHits(rows, scanned * q.shape[1], scores=scores)


def search(index: faiss.Index, kind: str, query: np.ndarray, k: int, effort: int,
           allowed: np.ndarray | None = None, centroids: bool = False) -> AnnHits:
    """The ANN top ``k`` candidates of one query at one effort.

    Args:
        index: built by :func:`build_index` (or read from a version).
        kind: its kind.
        query: (D,) float32 query in the index's space (:func:`index_space`), unit norm.
        k: candidates wanted (HNSW's beam is raised to at least k).
        effort: nprobe (IVF) or efSearch (HNSW).
        allowed: (N,) bool restriction (a faiss ID selector), or None.
        centroids: IVF only: also return every centroid ranked by its score (the quantizer scores every
            centroid anyway; the work is the same).

    Returns:
        :class:`AnnHits`.

    An unfiltered inner-product HNSW (:data:`RESUMABLE_KINDS`) is searched by :class:`ResumableHnsw` (faiss's
    beam search over faiss's graph, without its per-call visited table: the same recall@10 at every efSearch on
    SciFact, ``tests/unit/test_ann.py``); a filtered one, and the other kinds, by faiss.
    """
    q = np.ascontiguousarray(query, dtype=np.float32)[None, :]
    d = q.shape[1]
    if kind.startswith("ivf"):
        nprobe = int(min(max(effort, 1), index.nlist))
        cd, ca = index.quantizer.search(q, index.nlist if centroids else nprobe)
        hits = scan_lists(index, q[0], k, ca[0, :nprobe], cd[0, :nprobe], allowed)
        return AnnHits(hits.rows, index.nlist * d + hits.work, cd[0].copy() if centroids else None,
                       ca[0].astype(np.int64) if centroids else None, hits.scores)
    ef = int(max(effort, k))
    if allowed is None:
        g = graph_of(index)
        if g is not None:  # our search over faiss's graph: faiss's beam search (ResumableHnsw)
            return ResumableHnsw(g, q[0], k).hits(ef)
        p = _hnsw_params(ef)
    else:
        p = faiss.SearchParametersHNSW()
        p.efSearch = ef
        p.sel = _selector(allowed)
    D, I, ndis = _hnsw_search(index, q, k, p)
    rows, scores = _hits(index, q, D, I)
    return AnnHits(rows, ndis * d, scores=scores)


def _hnsw_search(index: faiss.Index, q: np.ndarray, k: int, params) -> tuple[np.ndarray, np.ndarray, int]:
    """faiss's C++ HNSW search of one query ((1, D) float32) with its search parameters: (1, k) float32
    distances, (1, k) int64 labels (-1 pads a short answer) and the distance computations it made (faiss's global
    statistics, so approximate under concurrent searches).  faiss's Python wrapper re-checks and re-allocates on
    every call; this does not."""
    stats = faiss.cvar.hnsw_stats
    before = int(stats.ndis)
    D = np.empty((1, int(k)), np.float32)
    I = np.empty((1, int(k)), np.int64)
    index.search_c(1, faiss.swig_ptr(q), int(k), faiss.swig_ptr(D), faiss.swig_ptr(I), params)
    return D, I, max(int(stats.ndis) - before, 0)


_HNSW_PARAMS: dict[int, faiss.SearchParametersHNSW] = {}


def _hnsw_params(ef: int) -> faiss.SearchParametersHNSW:
    """The unfiltered HNSW search parameters at efSearch ``ef``, one object per effort for the process's life: a
    search only reads them (so concurrent searches may share one), and making one per query cost two SWIG calls.
    The grid holds a few dozen efforts (:func:`effort_grid`), the refined ones a few more."""
    p = _HNSW_PARAMS.get(ef)
    if p is None:
        p = faiss.SearchParametersHNSW()
        p.efSearch = ef
        _HNSW_PARAMS[ef] = p
    return p


RESUMABLE_KINDS = ("hnsw", "hnsw_fp16")
"""Kinds :class:`ResumableHnsw` searches: inner-product HNSW over float32 or float16 vectors (faiss's storage read in
place).  ``hnsw_panorama`` (L2, its own level store) keeps faiss's search."""


def resumable_graph(index: faiss.Index):
    """``adawidth._hnsw.Graph``: views, without copies, of an inner-product ``IndexHNSWFlat``'s or fp16
    ``IndexHNSWSQ``'s graph (neighbours, offsets, levels, neighbours per level, entry point) and vectors, made once
    (the caller keeps it: :class:`engine.stage1.AnnStage1` per version).  None for any other index.  The views read
    faiss's own memory: the index must outlive the graph and must not grow (a version's index is read-only)."""
    if not isinstance(index, faiss.IndexHNSW) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
        return None
    storage = faiss.downcast_index(index.storage)
    if type(storage) is faiss.IndexFlat:
        vectors, fp16 = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d), False
    elif (isinstance(storage, faiss.IndexScalarQuantizer) and storage.sq.qtype == faiss.ScalarQuantizer.QT_fp16
          and storage.code_size == 2 * storage.d):
        vectors, fp16 = faiss.rev_swig_ptr(storage.codes.data(), storage.codes.size()), True
    else:
        return None
    h = index.hnsw

    def view(v):
        return faiss.rev_swig_ptr(v.data(), v.size())

    return _hnsw.Graph(view(h.neighbors), view(h.offsets), view(h.levels), view(h.cum_nneighbor_per_level), vectors,
                       int(index.d), fp16, int(h.entry_point), int(h.max_level))


_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graph_of(index: faiss.Index):
    """:func:`resumable_graph` of ``index``, made once per index object (held while the index lives; made again
    if documents were added since, as faiss may have moved its arrays), or None."""
    g = _GRAPHS.get(index)
    if g is None or (g is not False and g.n != index.ntotal):  # new, or the index grew (faiss reallocated)
        g = _GRAPHS[index] = resumable_graph(index) or False
    return g or None


class ResumableHnsw:
    """One query's HNSW search that keeps its state, so a wider beam goes on from a narrower one instead of
    searching again (``adawidth._hnsw``).  faiss's level-0 beam search (Malkov & Yashunin, TPAMI 2018, Alg. 2;
    faiss ``HNSW::search``) over faiss's own graph and vectors; each :meth:`run` ends, as faiss's search does,
    with every document of the ``ef`` closest visited ones expanded, and a wider run expands on from there.  Its
    answer at one efSearch may differ from a fresh faiss search's in a few rows (the order of expansion differs
    after a resume), so the per-query effort model is calibrated on this search's own answers
    (:func:`trainer.recall_fit.effort_tables`).

    Args:
        graph: :func:`resumable_graph` of the index.
        query: (D,) float32 unit query in the index's space.
        k: candidates wanted (the beam is at least k wide, as faiss's).

    Not thread-safe per object (one query, one thread); objects of one graph may run in parallel (the GIL is
    released while one searches)."""

    __slots__ = ("search", "k", "d")

    def __init__(self, graph, query: np.ndarray, k: int):
        self.k, self.d = int(k), len(query)
        self.search = _hnsw.Search(graph, np.ascontiguousarray(query, dtype=np.float32))

    def run(self, ef: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Search (or go on) at beam width ``max(ef, k)``: ((k,) float32 inner products best first (higher is
        closer; ties by the lower row), (k,) int64 rows (-1 pads a short answer), distance computations so far,
        this query's earlier runs' included)."""
        D = np.empty(self.k, np.float32)
        I = np.empty(self.k, np.int64)
        return D, I, self.search.run(int(max(ef, self.k)), D, I)

    def hits(self, ef: int, steps=()) -> AnnHits:
        """:meth:`run` at ``ef`` after widening through the ``steps`` (increasing efforts) between the widest run
        so far and ``ef`` (the path the effort model's calibration took), as :class:`AnnHits`: rows without the
        padding, scores, work = every run's distance computations x D."""
        for e in steps:
            if self.search.ef < max(e, self.k) < max(ef, self.k):
                self.search.run(int(max(e, self.k)), None, None)
        D, I, ndis = self.run(ef)
        if len(I) and I[-1] < 0:  # a short answer, padded at its end
            keep = I >= 0
            D, I = D[keep], I[keep]
        return AnnHits(I, ndis * self.d, scores=D)


def exact_rerank(docs: np.ndarray, query: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rescore candidates exactly at full width: rows (c,) int64 -> (top rows (k',) int64, scores (k',) float64),
    best first, ties by the lower row; ``docs`` (N, D) float32, ``query`` (D,) float32."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return rows, np.empty(0, np.float64)
    order = np.argsort(rows, kind="stable")  # ties of top_k go to the lower position: make it the lower row
    rows = rows[order]
    scores = np.asarray(docs[rows] @ np.asarray(query, np.float32), dtype=np.float64)
    pos = top_k(scores, min(int(k), len(rows)))
    return rows[pos], scores[pos]


# -- per-query effort (LAET / DARTH style) ----------------------------------------------------------------------

CENTROID_RANKS = (2, 4, 8, 16, 32, 64)
"""The centroid ranks j whose score gap ``c_1 - c_j`` is evidence (IVF probes)."""
CENTROID_MARGINS = (0.0, 0.05, 0.1)
"""Margins δ of the centroid counts ``#{j <= 64: c_j >= s_k - δ}`` (IVF probes)."""
EFFORT_FEATURES = ("probe_s1", "probe_sk", "probe_gap", "probe_gap12", "probe_mean", "probe_std", "probe_found",
                   "probe_distances", "energy16", "energy64", "centroid_c1", "centroid_sk_gap",
                   *(f"centroid_gap{j}" for j in CENTROID_RANKS),
                   *(f"centroids_above_sk_{d:g}" for d in CENTROID_MARGINS))
"""Early evidence of one query for the per-query effort model, in the model's order (:class:`AnnEvidence`)."""
ENERGY_FEATURES = ("energy16", "energy64")
"""The evidence features that read the query's rotated prefix (:data:`ENERGY_PREFIX`).  An index over
the documents as encoded (:func:`index_space`) needs the rotation for nothing else, and on debdocs'
221,170 passages (float16 HNSW M = 32, 2,000 training queries) the models fitted without them chose as cheaply:
median calibrated work 293,376 against 290,304 multiply-adds at 0.95 (probe 24), 321,216 against 322,368 (probe
40), and at 0.99 942,336 against 1,262,976 (probe 24) and 862,272 against 892,608 (probe 40).  Such a build fits
its effort models with them missing (``energy=False``) and its queries skip the rotation
(``trainer.recall_fit.effort_tables``; :meth:`engine.stage1.AnnStage1.needs_prefix`)."""


@dataclass
class AnnEvidence:
    """The probe of one query: its search at the effort model's first effort (:func:`probe_candidates`).

    Attributes:
        vector: (F,) float64 the evidence in :data:`EFFORT_FEATURES` order: the probe's top-k full-width scores
            as faiss computed them (``s1`` best, ``sk`` the k-th, ``gap`` = s1 - sk, ``gap12`` = s1 - s2, their
            mean and standard deviation; inner products of unit vectors, higher is closer), candidates found,
            distance computations (the probe's work / D), the query's energy in its leading 16 and 64 rotated
            coordinates (sum of squares of a unit vector, in [0, 1]), and for an IVF index the distances to the
            nearest centroids (LAET's strongest evidence for IVF): the best centroid score ``c_1``,
            ``s_k - c_1``, the gaps ``c_1 - c_j`` (j in :data:`CENTROID_RANKS`) and how many of the 64 nearest
            centroids score at least ``s_k - δ`` (δ in :data:`CENTROID_MARGINS`: lists that may still hold a
            document beating the probe's k-th); NaN for HNSW (LightGBM's missing value).
        rows: (c,) int64 the probe's candidates, best first: the answer when the probe's effort is the one
            chosen; scores: (c,) float64 their scores.
        work: the probe's multiply-adds.
        effort: the probe's effort.
        centroid_lists: IVF: (nlist,) int64 every list id by its centroid's score, best first (the probe
            scanned the first ``effort``; :func:`continue_search` scans on from there); None for HNSW.
        centroid_scores: IVF: (nlist,) float32 those scores; None for HNSW.
        state: the probe's :class:`ResumableHnsw` when the continuation goes on from it (a probe asked to resume,
            :func:`probe`'s ``resume_grid``), else None; :func:`continue_search` advances it.
        steps: the efforts a resumed continuation passes through on its way to the chosen one (the model's grid:
            the path its calibration took, :func:`trainer.recall_fit.effort_tables`).
    """

    vector: np.ndarray
    rows: np.ndarray
    scores: np.ndarray
    work: int
    effort: int = 0
    centroid_lists: np.ndarray | None = None
    centroid_scores: np.ndarray | None = None
    state: ResumableHnsw | None = None
    steps: tuple[int, ...] = ()

    @property
    def values(self) -> dict:
        """:data:`EFFORT_FEATURES` -> float (the trainer's table, tests, traces)."""
        return dict(zip(EFFORT_FEATURES, self.vector.tolist()))

    def feature_names(self, k: int) -> tuple[str, ...]:
        """The names of :meth:`feature_array` (``k`` is the policy's; the probe already searched at it)."""
        return EFFORT_FEATURES

    def feature_array(self, k: int) -> np.ndarray:
        """(F,) float64 the evidence (:attr:`vector`)."""
        return self.vector


def probe(index: faiss.Index, kind: str, query: np.ndarray, k: int, effort: int,
          allowed: np.ndarray | None = None, prefix: np.ndarray | None = None,
          resume_grid=None) -> AnnEvidence:
    """Search one query ((D,) float32, unit norm, in the index's space: :func:`index_space`) at ``effort`` (the
    model grid's first) and read the evidence the per-query effort model takes (:class:`AnnEvidence`) off faiss's
    own full-width scores of its ``k`` candidates (no second scoring pass).  ``prefix``: the query's leading
    rotated coordinates ((>= :data:`ENERGY_PREFIX`,) float32) for the energy features; None: ``query``'s own (an
    index over rotated documents).  Source: LAET (Li et al., SIGMOD 2020, §4: features of the search's first
    steps, for IVF the distances to the nearest centroids, predict the termination a query needs) and DARTH
    (SIGMOD 2026: recall-targeted early termination).  :func:`probe_and_choose` is the same probe and the
    model's choice in one compiled call, where it applies.  ``resume_grid``: the model's efforts (increasing) when
    the continuation is to go on from the probe's search (:class:`ResumableHnsw`, an unfiltered inner-product
    HNSW; the evidence's ``state``), None to search again (every other case)."""
    pre = np.asarray(query if prefix is None else prefix, np.float32)
    g = graph_of(index) if resume_grid is not None and allowed is None and not kind.startswith("ivf") else None
    if g is None:
        return _evidence(search(index, kind, query, k, effort, allowed, centroids=True), k, effort, len(query), pre)
    state = ResumableHnsw(g, query, k)
    ev = _evidence(state.hits(effort), k, effort, len(query), pre)
    ev.state, ev.steps = state, tuple(int(e) for e in resume_grid)
    return ev


def _evidence(hits: AnnHits, k: int, effort: int, d: int, q: np.ndarray) -> AnnEvidence:
    """:func:`probe`'s evidence of one probe's answer ``hits``; ``q``: the query's leading rotated coordinates.
    Every sum runs left to right in float64 (explicit loops, not numpy's or Python's own summation orders), so
    ``adawidth._effort`` reproduces it to the last bit."""
    rows, scores = ranked(hits.rows, hits.scores, k)
    s = scores.tolist()
    n = len(s)
    nan = math.nan
    v = [nan] * len(EFFORT_FEATURES)
    if n:
        total = square = 0.0
        for x in s:
            total += x
        for x in s:
            square += x * x
        mean = total / n
        v[:6] = [s[0], s[-1], s[0] - s[-1], s[0] - s[1] if n > 1 else nan, mean,
                 math.sqrt(max(square / n - mean * mean, 0.0))]
    energy = energy16 = 0.0
    head = q[:ENERGY_PREFIX].tolist()
    short = min(len(head), 16)
    for i, x in enumerate(head):
        energy += x * x
        if i == short - 1:
            energy16 = energy
    v[6:10] = [float(n), float(hits.work) / max(d, 1), energy16, energy]
    if hits.centroid_scores is not None and len(hits.centroid_scores):
        c = hits.centroid_scores[:CENTROID_RANKS[-1]].astype(np.float64)
        c1, sk = float(c[0]), v[1]
        v[10:12] = [c1, sk - c1]  # NaN when the probe found nothing
        v[12:12 + len(CENTROID_RANKS)] = [c1 - float(c[j - 1]) if len(c) >= j else nan for j in CENTROID_RANKS]
        if n:
            v[12 + len(CENTROID_RANKS):] = [float(np.count_nonzero(c >= sk - m)) for m in CENTROID_MARGINS]
    return AnnEvidence(np.array(v, np.float64), rows, scores, int(hits.work), int(effort), hits.centroid_lists,
                       hits.centroid_scores)


def fused_applies(index: faiss.Index, kind: str, policy, allowed: np.ndarray | None) -> bool:
    """Whether :func:`probe_and_choose` serves a query: an inner-product HNSW (``hnsw``, ``hnsw_fp16``: no
    centroids, no metric conversion), unfiltered, under a model whose features are :data:`EFFORT_FEATURES` in
    order, then its z (every version's effort model)."""
    return (not kind.startswith("ivf") and allowed is None and index.metric_type == faiss.METRIC_INNER_PRODUCT
            and tuple(policy.feature_names) == EFFORT_FEATURES
            and policy.forest.n_features == len(EFFORT_FEATURES) + 1)


def probe_and_choose(index: faiss.Index, kind: str, query: np.ndarray, k: int, effort: int, policy, target: float,
                     prefix: np.ndarray | None = None, resume: bool = False) -> tuple[AnnEvidence, float | None]:
    """:func:`probe` and :meth:`engine.recall.RecallPolicy.choose` of one query in two compiled calls (the HNSW
    search, then ``adawidth._effort.probe_choice``: the ranking check, the evidence, the model's rows and its
    walk), where the Python path makes a dozen calls between them (about 30 µs a query warm and 110 µs with the
    caches cold on debdocs: ``bench/results/pipeline_cost``).  The same evidence to the last bit and the same
    choice (``tests/unit/test_ann.py``); an answer that needs ranking (ties, duplicates) takes the
    Python path from faiss's answer, without a second search.

    Args:
        index, kind: an inner-product HNSW and its kind (:func:`fused_applies`).
        query: (D,) float32 unit query in the index's space; k: candidates wanted (the policy's k).
        effort: the probe's efSearch (the first of the policy's grid).
        policy: the target's :class:`engine.recall.RecallPolicy` (its grid holds efforts).
        target: the declared recall@k, < 1.
        prefix: (>= :data:`ENERGY_PREFIX`,) float32 the query's leading rotated coordinates, or None (``query``'s
            own).
        resume: keep the probe's :class:`ResumableHnsw` state for :func:`continue_search` (the policy's grid the
            steps), as the model of a version built with resumable searches was calibrated; False: the
            continuation searches again.  The probe itself is :class:`ResumableHnsw`'s either way (as
            :func:`search`'s), faiss's search for an index it cannot read.

    Returns:
        (the probe's :class:`AnnEvidence`, the chosen effort as the policy's z, or None when the policy serves
        the target exactly: :meth:`engine.recall.RecallPolicy.choose`'s ``exact``).
    """
    bar = policy.bar(float(target)) if target < 1.0 else None
    if bar is None:
        return probe(index, kind, query, k, effort, None, prefix, policy.z_grid if resume else None), None
    q = np.ascontiguousarray(query, dtype=np.float32)[None, :]
    d = q.shape[1]
    g = graph_of(index)
    if g is None:
        state = None
        D, I, ndis = _hnsw_search(index, q, k, _hnsw_params(int(max(effort, k))))
    else:
        state = ResumableHnsw(g, q[0], k)
        D, I, ndis = state.run(effort)
        D, I = D[None], I[None]
    pre = q[0] if prefix is None else np.ascontiguousarray(prefix, dtype=np.float32)
    f = policy.forest
    v = np.empty(len(EFFORT_FEATURES), np.float64)
    j, n = _effort.probe_choice(f.feature, f.threshold, f.left, f.right, f.flags, f.roots, f.leaves, f.n_features,
                                D[0], I[0], float(ndis), pre, policy.z_grid, float(bar), policy.monotone_z, v)
    if j == -2:  # an answer to rank (engine.ann.ranked): the Python path on faiss's answer
        rows, scores = _hits(index, q, D, I)
        ev = _evidence(AnnHits(rows, ndis * d, scores=scores), k, effort, d, pre)
        z = policy.choose(ev, float(target))[1]
    else:
        grid = policy.z_grid
        ev = AnnEvidence(v, I[0, :n].copy(), D[0, :n].astype(np.float64), ndis * d, int(effort))
        z = float(grid[j if j >= 0 else len(grid) - 1])
    if state is not None and resume:
        ev.state, ev.steps = state, tuple(int(e) for e in policy.z_grid)
    return ev, z


def serve_per_query(index: faiss.Index, query: np.ndarray, k: int, policy, target: float,
                    prefix: np.ndarray | None = None) -> tuple[AnnHits, int, int] | None:
    """One query's per-query effort in one compiled call (``adawidth._hnsw`` ``Search.serve``): the probe at the
    first effort of the policy's grid, its evidence and the model's choice (:func:`probe_and_choose`'s, to the last
    bit), and the search on from the probe through the grid to the chosen effort (:func:`continue_search` of a
    :class:`ResumableHnsw` probe).  What :func:`probe_and_choose` then :func:`continue_search` serve, without the
    Python calls between them (the continuation's, for the queries the probe does not settle); an answer that needs
    ranking (ties, duplicates) goes on from the same search by those two.

    Args:
        index: an inner-product HNSW :func:`resumable_graph` reads (:func:`fused_applies`, unfiltered).
        query: (D,) float32 unit query in the index's space; k: candidates wanted (the policy's k).
        policy: the target's :class:`engine.recall.RecallPolicy` (its grid holds efSearch values, the probe first).
        target: the declared recall@k.
        prefix: (>= :data:`ENERGY_PREFIX`,) float32 the query's leading rotated coordinates, or None (``query``'s
            own).

    Returns:
        (:class:`AnnHits` at the chosen efSearch, rows and scores best first, work = every distance computation x
        D; the efSearch served; the probe's multiply-adds), or None where this call does not apply (a target the
        policy serves exactly, an index :func:`resumable_graph` cannot read): the caller takes the two calls.
    """
    bar = policy.bar(float(target)) if target < 1.0 else None
    g = graph_of(index) if bar is not None else None
    if g is None:
        return None
    q = np.ascontiguousarray(query, dtype=np.float32)
    d, grid, f = len(q), policy.z_grid, policy.forest
    state = ResumableHnsw(g, q, k)
    pre = q if prefix is None else np.ascontiguousarray(prefix, dtype=np.float32)
    v = np.empty(len(EFFORT_FEATURES), np.float64)
    D, I = np.empty(state.k, np.float32), np.empty(state.k, np.int64)
    j, n, probe_ndis, ndis = state.search.serve(f.feature, f.threshold, f.left, f.right, f.flags, f.roots, f.leaves,
                                                f.n_features, pre, grid, float(bar), policy.monotone_z, v, D, I)
    if j == -2:  # the probe's answer needs ranking: the Python path on from the same search
        rows, scores = _hits(index, q[None], D[None], I[None])
        ev = _evidence(AnnHits(rows, probe_ndis * d, scores=scores), k, int(grid[0]), d, pre)
        ev.state, ev.steps = state, tuple(int(e) for e in grid)
        z = policy.choose(ev, float(target))[1]
        effort = max(int(grid[-1]) if z is None else int(z), int(grid[0]))
        return continue_search(index, "hnsw", q, k, ev, effort), effort, ev.work
    effort = max(int(grid[j if j >= 0 else len(grid) - 1]), int(grid[0]))
    if effort <= int(grid[0]):  # the probe's answer (continue_search's, float64 scores)
        return AnnHits(I[:n].copy(), probe_ndis * d, scores=D[:n].astype(np.float64)), effort, probe_ndis * d
    if len(I) and I[-1] < 0:  # a short answer, padded at its end
        keep = I >= 0
        D, I = D[keep], I[keep]
    return AnnHits(I, ndis * d, scores=D), effort, probe_ndis * d


def continue_search(index: faiss.Index, kind: str, query: np.ndarray, k: int, ev: AnnEvidence, effort: int,
                    allowed: np.ndarray | None = None) -> AnnHits:
    """The candidates of one query at ``effort`` after its probe ``ev`` (:func:`probe`), the probe's work included.

    IVF resumes the probe: it scans only the lists after the probe's, in the probe's centroid order (no second
    quantizer pass, no list scanned twice), so a query served at nprobe p costs what a search at p costs.  An HNSW
    probe made with :class:`ResumableHnsw` (``ev.state``) resumes too: its beam widens through ``ev.steps`` up to
    ``effort`` (the path the model's calibration took) and expands on from the probe's state.  Otherwise
    (faiss keeps no search state) HNSW searches again at ``effort`` and pays the probe on top.
    The candidates are the best ``k`` of the probe's and the new search's together, by faiss's full-width scores;
    at an effort no larger than the probe's they are the probe's own.

    Args:
        index, kind: the ANN index and its kind.
        query: (D,) float32 query in the index's space; k: candidates wanted.
        ev: the query's probe.
        effort: nprobe or efSearch.
        allowed: (N,) bool restriction, or None (as the probe's).

    Returns:
        :class:`AnnHits`: rows (<= k,) int64 and scores best first, work = the probe's + the continuation's
        multiply-adds.
    """
    if int(effort) <= ev.effort:
        return AnnHits(ev.rows, ev.work, scores=ev.scores)
    if ev.state is not None:
        return ev.state.hits(effort, ev.steps)
    if kind.startswith("ivf") and ev.centroid_lists is not None:
        hi = int(min(effort, len(ev.centroid_lists)))
        hits = scan_lists(index, query, k, ev.centroid_lists[ev.effort:hi], ev.centroid_scores[ev.effort:hi],
                          allowed)
    else:
        hits = search(index, kind, query, k, effort, allowed)
    return merge_with_probe(ev, hits, k)


def merge_with_probe(ev: AnnEvidence, hits: AnnHits, k: int) -> AnnHits:
    """The best ``k`` of a probe's candidates and a continuation's together, by faiss's full-width scores (a row
    both found counts once), with both searches' work: what :func:`continue_search` serves, and what
    :func:`trainer.recall_fit.effort_tables` reassembles from searches it runs once per effort."""
    if not set(ev.rows.tolist()) - set(hits.rows.tolist()):
        # the usual case (a deeper search found every probe candidate): the continuation's own ranking, without
        # the concatenation and the duplicate-merging sort (each numpy call costs ~10 us when the caches are cold)
        rows, scores = ranked(hits.rows, hits.scores, k)
    else:
        rows, scores = ranked(np.concatenate([ev.rows, hits.rows]), np.concatenate([ev.scores, hits.scores]), k)
    return AnnHits(rows, ev.work + hits.work, scores=scores)


# -- effort tuning -------------------------------------------------------------------------------------------

def exhaustive_top_k(X_rot: np.ndarray, Q_rot: np.ndarray, k: int = 10, chunk: int = 256) -> np.ndarray:
    """(Q, k) int64 exhaustive top-k rows by inner product (ties by the lower row); X (N, D), Q (Q, D) float32."""
    out = np.empty((len(Q_rot), min(k, len(X_rot))), np.int64)
    for s in range(0, len(Q_rot), chunk):
        S = np.asarray(Q_rot[s:s + chunk], np.float32) @ np.asarray(X_rot, np.float32).T
        for i, row in enumerate(S):
            out[s + i] = top_k(row, out.shape[1])
    return out


def recall_at(rows: list, truth: np.ndarray) -> np.ndarray:
    """(Q,) float64 recall of each query's rows against its exhaustive top-k (``truth`` (Q, k))."""
    return np.array([len(set(np.asarray(r).tolist()) & set(t.tolist())) / max(len(t), 1)
                     for r, t in zip(rows, truth)], dtype=np.float64)


def tune_effort(index: faiss.Index, params: AnnParams, X_rot: np.ndarray, Q_rot: np.ndarray, *, k: int = 10,
                depth: int | None = None, truth: np.ndarray | None = None,
                stop_at: float = 0.999, refine_for: tuple[float, ...] = (), refine_steps: int = 3) -> list[dict]:
    """The realised recall@k of every effort of :func:`effort_grid` on tuning queries (the best k of the ``depth``
    ANN candidates by faiss's full-width scores, as served), refined between grid points around given goals.

    Refinement: for each goal of ``refine_for`` (tuning recalls, :func:`goal`), the grid's two efforts around it
    (the last below it, the first reaching it) are bisected at their geometric mean, rounded, up to
    ``refine_steps`` times, and every effort tried joins the curve.  Without it the tuned effort overshoots its
    goal by up to one grid step (:data:`EFFORT_STEP`): on debdocs' 221,170 passages efSearch 96 realised 0.9495
    and 128 0.961 on the training queries, so a target of 0.95 was served at 128 and realised 0.9636 on the test
    queries, outside the 0.005 a declared recall may miss by.

    Args:
        index, params: the ANN index and its parameters.
        X_rot: (N, D) float32 documents in the index's space (:func:`index_space`).
        Q_rot: (Q, D) float32 tuning queries in the same space.
        k: recall@k.
        depth: ANN candidates searched for (default k).
        truth: (Q, k) exhaustive top-k (default computed).
        stop_at: stop once an effort's mean recall reaches this (larger efforts only cost more).
        refine_for: goals to refine the curve around (none by default: the grid only).
        refine_steps: bisections per goal (each costs one pass over the tuning queries).

    Returns:
        ``[{"effort": int, "recall": float, "recall_p10": float, "work": float}, ...]`` increasing in effort:
        mean recall@k, its 10th percentile and mean multiply-adds per query.
    """
    depth = int(depth or k)
    truth = exhaustive_top_k(X_rot, Q_rot, k) if truth is None else truth

    def point(effort: int) -> dict:
        rows, work = [], []
        for q in Q_rot:
            hits = search(index, params.kind, q, depth, effort)
            rows.append(ranked(hits.rows, hits.scores, k)[0])  # as served: faiss's full-width scores
            work.append(hits.work)
        rec = recall_at(rows, truth)
        return {"effort": int(effort), "recall": round(float(rec.mean()), 5),
                "recall_p10": round(float(np.percentile(rec, 10)), 4), "work": float(np.mean(work))}

    curve = []
    for effort in effort_grid(params):
        curve.append(point(effort))
        if curve[-1]["recall"] >= stop_at:
            break
    for g in refine_for:
        for _ in range(int(refine_steps)):
            hi = next((i for i, c in enumerate(curve) if c["recall"] >= g - 1e-12), None)
            if not hi:  # no effort reaches g, or the cheapest does: nothing to bisect
                break
            lo_e, hi_e = curve[hi - 1]["effort"], curve[hi]["effort"]
            mid = int(round(math.sqrt(lo_e * hi_e)))
            if not lo_e < mid < hi_e:
                break
            curve.insert(hi, point(mid))
    return curve


def goal(target: float, margin_share: float) -> float:
    """The tuning recall a target is served at: ``target + margin_share * (1 - target)``, at most 1."""
    return min(float(target) + float(margin_share) * (1.0 - float(target)), 1.0)


def effort_for(curve: list[dict], target: float, margin_share: float = 0.0) -> int | None:
    """The cheapest effort of a tuning curve (:func:`tune_effort`) whose recall reaches :func:`goal`; None when
    none does (or ``target >= 1``: an ANN index certifies nothing)."""
    if target >= 1.0:
        return None
    g = goal(target, margin_share)
    for point in curve:
        if point["recall"] >= g - 1e-12:
            return int(point["effort"])
    return None


MODEL_EFFORT_CAP = 2.0
"""The per-query effort model's grid stops at the first effort of :func:`effort_grid` at least this many times
the tuned effort of the highest :data:`DEFAULT_TARGETS` (:func:`model_efforts`)."""


def model_efforts(params: AnnParams, curve: list[dict], margin_share: float = 0.0,
                  probe: int | None = None, cap: float = MODEL_EFFORT_CAP) -> tuple[int, ...]:
    """The efforts the per-query effort model chooses among: :func:`effort_grid` from ``probe`` (the probe's
    effort, the grid's cheapest by default; :func:`probe_candidates`) up to the first effort at least
    ``cap`` (default :data:`MODEL_EFFORT_CAP`) x the tuned effort (:func:`effort_for` on ``curve`` at
    ``margin_share``) of the highest default target; the whole grid when no tuned effort reaches it.

    Why a cap: uncapped, the model sent 15 % of debdocs' queries to the grid's top at 0.99 (efSearch 4096, 16 x
    the tuned 256), and they set the p95 and the mean.  Capped at 2 x (efSearch 512), the 1,000 test queries
    realised recall@10 0.9936 at 0.78 x the tuned effort's p50 (debdocs' first 50,000 passages, commit e310bfc's
    ``bench/results/scale/summary.md``, ``ours_hnsw_recall_0.99``).
    """
    if not cap > 0:
        raise ValueError(f"the effort cap must be positive, got {cap}")
    grid = effort_grid(params)
    if probe is not None:
        if int(probe) not in grid:
            raise ValueError(f"probe effort {probe} is not on the grid {grid}")
        grid = tuple(e for e in grid if e >= int(probe))
    top = effort_for(curve, max(DEFAULT_TARGETS), margin_share)
    if top is None:
        return grid
    stop = cap * top
    return tuple(e for e in grid if e < stop) + tuple(e for e in grid if e >= stop)[:1]


PROBE_CANDIDATES = 6
"""At most this many probe efforts :func:`probe_candidates` offers the build to choose among."""


def probe_candidates(params: AnnParams, curve: list[dict], margin_share: float = 0.0) -> tuple[int, ...]:
    """The efforts a per-query effort model may probe at, increasing (the build picks one per target by the
    calibration queries' median work, :func:`trainer.recall_fit.fit_effort_models`).

    HNSW: grid efforts from the cheapest up to the tuned effort of the lowest default target (:func:`effort_for`;
    the whole grid's first :data:`PROBE_CANDIDATES` when none is tuned), at most :data:`PROBE_CANDIDATES` of
    them spread evenly over the grid's positions.  Where HNSW cannot resume a search (faiss's search: versions
    built before :class:`ResumableHnsw`), a query the probe does not settle pays the probe again on top of its
    continuation, and a probe near the cheapest target's effort settles more queries at the probe itself, which
    is what a p50 rewards.  On debdocs' 221,170 passages one probe for both targets went from efSearch 10 to 40:
    the median calibrated work at 0.95 fell 32 % and rose 19 % at 0.99, and the measured per-query p50 at 0.95 went
    from 1.15x the fixed effort's to 0.93-0.97x (docs/SCALING.md); hence one probe per target.  A resumed probe
    costs nothing twice, and the build's median work picks among the same candidates.
    IVF resumes its probe (:func:`continue_search`), so the probe costs nothing twice: the grid's cheapest only.
    """
    grid = effort_grid(params)
    if not params.kind.startswith("hnsw"):
        return grid[:1]
    low = effort_for(curve, min(DEFAULT_TARGETS), margin_share)
    upto = [e for e in grid if low is None or e <= low] or list(grid[:1])
    if low is None:
        upto = upto[:PROBE_CANDIDATES]
    if len(upto) <= PROBE_CANDIDATES:
        return tuple(upto)
    pos = np.unique(np.round(np.linspace(0, len(upto) - 1, PROBE_CANDIDATES)).astype(int))
    return tuple(int(upto[i]) for i in pos)
