"""Certified width: level-by-level pruning of a rotated corpus, exact or at a stated confidence.

After an energy-compacting rotation (PCA of the document second moment, :func:`adawidth.rotation.pca_rotation`)
the leading coordinates carry most of every inner product.  The rotated corpus is stored **level-major**: a
level is a contiguous range of coordinates ``[b_l, b_{l+1})`` and each level is one contiguous row-major
``(N, w_l)`` array.  A query scans the first level(s) of every candidate, seeds a threshold ``tau`` with the
exact scores of the best partial scores, then goes block by block: a document is dropped as soon as

    p_i(b) + bound_i(b) < tau,        p_i(b) = <q[:b], d_i[:b]>,

and the documents that reach the last level get their exact full-width inner product, which feeds a fused
top-k heap and raises ``tau``.  The result is the top-k by exact float32 inner product over all D coordinates
(documents and queries are unit norm, so at D = 384 that is the frozen encoder's cosine ranking); ties go to
the lower row.

Bounds (``bound=``):

* ``"exact"``: Cauchy-Schwarz on the stored tail norms, ``bound_i(b) = ||q[b:]|| * ||d_i[b:]||``.  The result
  is exactly the exhaustive top-k (``certified=True``).  Source: Panorama, arXiv 2510.00566 (level-wise
  Cauchy-Schwarz pruning over level-major storage; faiss ``IndexFlatIPPanorama``).  Unlike Panorama, the
  threshold is seeded before the pruning scan with the exact scores of the best first-level partial scores.
* ``"data_aware"``: the unscanned tail dot product's spread estimated from the per-coordinate second moments
  of the rotated corpus, ``bound(b) = z * sqrt(sum_{j>=b} q_j^2 E[d_j^2])`` (one value per query and level;
  FINDINGS.md, "Turn 2: adapting width per candidate").  A stated recall, not a certificate.
* ``"data_aware_doc"``: the same spread scaled by the document's own tail norm relative to the corpus RMS tail
  norm, ``bound_i(b) = z * sqrt(sum_{j>=b} q_j^2 E[d_j^2]) * ||d_i[b:]|| / sqrt(sum_{j>=b} E[d_j^2])``.

Both data-aware bounds are capped by the Cauchy-Schwarz bound (``min(., ||q[b:]|| ||d_i[b:]||)``): a bound
looser than the certified one buys nothing.

float16 leading levels (``LevelLayout.fp16_levels``): the first levels, which every document reads, may be
scanned from a float16 copy (half the bytes).  Values below the smallest normal float16, 2^-14, are flushed
to zero at build time; every other value is rounded to nearest, a relative error of at most 2^-11.  Hence for
every document ``|<q, d_hat - d>| <= ||q[:b16]|| * r_i`` with ``r_i = ||d_hat_i[:b16] - d_i[:b16]||``
<= 2^-11 ||d_i[:b16]|| + ||flushed part of d_i||.  The store keeps ``max_i r_i`` (computed in float64,
rounded up); every bound adds ``||q[:b16]|| * max_i r_i``, and the documents that reach the last level are
rescored from the float32 levels, so the returned scores and ranking are exactly the float32 ones.

Exact scores are float32 sums computed by one rule: the levels without a float16 copy in level order from 0
(the running sum the scan keeps), then the float32 dots of the float16 levels in level order.  A survivor is
thus rescored over the float16 levels only, and every path (seeds, survivors, rescoring) gives a row the same
bits.  With and without float16 levels the sums run in another order, so scores may differ in the last bit.

Every bound also carries a float32 rounding slack ``2 (D + 16) 2^-24 ||q|| max_i ||d_i||`` (the computed
partial sums and the computed exact scores each differ from real arithmetic by at most
``gamma_D sum_j |q_j d_ij| <= gamma_D ||q|| ||d_i||``), and the stored tail norms and query norms are rounded
up, so "exact" holds for the scores the kernel itself computes.

The scan runs in the compiled :mod:`adawidth._levelscan` (C, GIL released, fused top-k heaps, AVX-512 /
AVX2 chosen at import time); ``threads > 1`` shards one query's rows over the kernel's own threads with a
shared threshold.  :mod:`adawidth.levels_reference` is a pure-numpy implementation of the same algorithm,
the oracle of the tests.

Two-phase form, for a per-query policy: :func:`begin` scans the first level(s) and returns a :class:`LevelState` with
cheap evidence (:class:`LevelEvidence`); :func:`finish` completes it with a chosen bound, confidence ``z``
and stopping level.  A state is not modified by :func:`finish`, so it can be finished several times.
:func:`search` is ``finish(begin(...))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

try:
    from adawidth import _levelscan as _kernel
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError("adawidth._levelscan is not built: run `pip install -e .` (needs a C compiler and the "
                      "Python headers) or `python setup.py build_ext --inplace`") from exc

BOUNDS = ("exact", "data_aware", "data_aware_doc")
FP16_MIN_NORMAL = 2.0 ** -14  # values of smaller magnitude are flushed to zero in the float16 copy
FP16_MAX = 65504.0
SCAN_BLOCK = 2048  # rows per block of the pruning scan (adawidth/_levelscan.c BLOCK)
DEFAULT_Z = 4.0
MAX_LEVELS = _kernel.MAX_LEVELS
MAX_THREADS = _kernel.MAX_THREADS


# ------------------------------------------------------------------------------------------------ layout


@dataclass(frozen=True)
class LevelLayout:
    """Level boundaries of a D-dimensional rotated corpus.

    Attributes:
        widths: coordinates per level, ``(w_0, ..., w_{L-1})``, each >= 1, summing to D; 1 <= L <= 64.
        fp16_levels: how many leading levels also get a float16 copy that the scan reads (0 = none).
    """

    widths: tuple[int, ...]
    fp16_levels: int = 0

    def __post_init__(self):
        widths = tuple(int(w) for w in self.widths)
        if not widths or len(widths) > MAX_LEVELS or any(w < 1 for w in widths):
            raise ValueError(f"widths must be 1..{MAX_LEVELS} positive integers, got {self.widths!r}")
        if not 0 <= int(self.fp16_levels) <= len(widths):
            raise ValueError(f"fp16_levels must be in [0, {len(widths)}], got {self.fp16_levels}")
        object.__setattr__(self, "widths", widths)
        object.__setattr__(self, "fp16_levels", int(self.fp16_levels))

    @property
    def L(self) -> int:
        """Number of levels."""
        return len(self.widths)

    @cached_property  # read on every query (frozen: computed once)
    def D(self) -> int:
        """Total coordinates."""
        return int(sum(self.widths))

    @cached_property  # read on every query (frozen: computed once)
    def bounds(self) -> tuple[int, ...]:
        """Level boundaries ``(0, b_1, ..., b_L = D)``; level l covers coordinates ``[b_l, b_{l+1})``."""
        return tuple(int(b) for b in np.concatenate([[0], np.cumsum(self.widths)]))

    @property
    def fp16_width(self) -> int:
        """Coordinates held in float16, ``b_{fp16_levels}``."""
        return self.bounds[self.fp16_levels]

    @cached_property  # read on every exact query (frozen: computed once)
    def exact_first_levels(self) -> int:
        """Levels the exact mode scans for every document before it prunes: those within the first D/6
        coordinates (at least one; within the float16 levels when there are any).  The exact bound prunes little
        before ~D/6 coordinates, so reading them in one streaming pass beats reading them for most documents
        level by level; the data-aware bounds prune after the first level already (:func:`search`)."""
        b = self.bounds
        n = max(1, sum(1 for x in b[1:] if x <= max(b[1], round(self.D / 6))))
        return min(n, self.fp16_levels) if self.fp16_levels else n

    @classmethod
    def uniform(cls, D: int, width: int, fp16_levels: int = 0) -> "LevelLayout":
        """Levels of ``width`` coordinates (the last one shorter when ``width`` does not divide D)."""
        if D < 1 or width < 1:
            raise ValueError(f"need D >= 1 and width >= 1, got D={D}, width={width}")
        widths = [width] * (D // width) + ([D % width] if D % width else [])
        return cls(tuple(widths), min(fp16_levels, len(widths)))

    @classmethod
    def from_bounds(cls, bounds: Sequence[int], fp16_levels: int = 0) -> "LevelLayout":
        """From boundaries ``(0, b_1, ..., D)`` (strictly increasing)."""
        b = [int(x) for x in bounds]
        if len(b) < 2 or b[0] != 0 or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError(f"bounds must start at 0 and increase strictly, got {list(bounds)!r}")
        return cls(tuple(y - x for x, y in zip(b, b[1:])), fp16_levels)

    @classmethod
    def default(cls, D: int = 384) -> "LevelLayout":
        """The measured default: boundaries 32, 64, 96, 128, 192, 256, D, the first three levels (96
        coordinates) also in float16.

        Chosen on a synthetic 1M x 384 corpus with SciFact's spectrum, PCA rotation, one thread
        (``bench/results/levels/levels_layouts.md``).  Every document reads the first levels, so they are
        float16: without it the exact mode took 0.29 x faiss IndexFlatIP instead of 0.18.  The exact mode reads the
        first 64 coordinates of every document in one streaming pass (:attr:`exact_first_levels` = 2) and prunes
        from there; the data-aware bounds drop almost every document after the first 32 coordinates, which then
        is their whole cost (0.08-0.09 x flat at recall@10 0.994-0.999).  A first level of 64 made the exact mode
        about 15 % faster (0.15-0.16 x flat) but the data-aware bounds about 10-30 % slower (0.09-0.10 x flat,
        as they then read 64 coordinates of everyone); 32 is the compromise that keeps the declared-recall mode
        below half the cost of the static funnel.

        Float16 stops at 96 coordinates for memory: the float16 copy and the tail norms then take
        2 * 96 + 4 * 8 = 224 bytes a document beyond the float32 vectors, less than the 268 of a faiss HNSW
        graph with M = 32, so the flat level store never needs more memory than the HNSW index it competes
        with.  Copying a fourth level (128 coordinates, 288 bytes) made the exact mode 4 % faster at 1M and
        did not change the data-aware bounds (which rarely read past 32 coordinates).

        For another D the same shape is scaled: boundaries at D/12, D/6, D/4, D/3, D/2, 2D/3, float16 up to D/4.
        """
        if D == 384:
            return cls.from_bounds((0, 32, 64, 96, 128, 192, 256, 384), fp16_levels=3)
        b = sorted({int(round(f * D)) for f in (1 / 12, 1 / 6, 1 / 4, 1 / 3, 1 / 2, 2 / 3)} - {0, D})
        if not b:
            return cls((D,))
        return cls.from_bounds([0, *b, D], fp16_levels=sum(1 for x in b if x <= round(D / 4)))


# ------------------------------------------------------------------------------------------------ store


def _round_up_f32(x64: np.ndarray) -> np.ndarray:
    """float64 -> float32, rounded toward +inf (so a stored norm never understates the true one)."""
    x32 = np.asarray(x64, dtype=np.float32)
    low = x32.astype(np.float64) < x64
    if np.any(low):
        x32 = x32.copy()
        x32[low] = np.nextafter(x32[low], np.float32(np.inf))
    return x32


def _round_up_scalar(x: float) -> float:
    return float(_round_up_f32(np.array([x], dtype=np.float64))[0])


class LevelStore:
    """A rotated corpus stored level-major for the pruning scan.

    Build with :meth:`build`; save with :meth:`arrays` and load with :meth:`from_arrays` (accepts memory-mapped
    arrays and never copies them).  Nothing here reads files.

    Attributes:
        layout: the :class:`LevelLayout`.
        levels32: L arrays, level l of shape (N, w_l), float32, C-contiguous.
        levels16: ``layout.fp16_levels`` arrays, (N, w_l), float16, C-contiguous: the rounded copies
            (|x| < 2^-14 flushed to zero).
        tail_norms: (L + 1, N) float32, ``tail_norms[l, i] = ||d_i[b_l:]||`` rounded up (row 0: the full norm,
            row L: zeros).
        second_moment: (D,) float64, ``E[d_j^2]`` over the corpus (the data-aware bound's spread).
        max_norm: ``max_i ||d_i||`` (for the rounding slack).
        fp16_residual_max: ``max_i ||d_hat_i[:b16] - d_i[:b16]||`` rounded up (0 without float16 levels):
            the float16 error term of every bound.
    """

    def __init__(self, layout: LevelLayout, levels32: Sequence[np.ndarray], levels16: Sequence[np.ndarray],
                 tail_norms: np.ndarray, second_moment: np.ndarray, max_norm: float, fp16_residual_max: float = 0.0):
        if not isinstance(layout, LevelLayout):
            raise ValueError(f"layout must be a LevelLayout, got {type(layout).__name__}")
        L = layout.L
        if len(levels32) != L or len(levels16) != layout.fp16_levels:
            raise ValueError(f"need {L} float32 and {layout.fp16_levels} float16 levels, "
                             f"got {len(levels32)} and {len(levels16)}")
        first = levels32[0]
        if not isinstance(first, np.ndarray) or first.ndim != 2:
            raise ValueError("level32[0] must be a 2-D numpy array")
        N = int(first.shape[0])
        for l, (w, a) in enumerate(zip(layout.widths, levels32)):
            _check_array(a, f"level32[{l}]", np.float32, (N, w))
        for l, (w, a) in enumerate(zip(layout.widths, levels16)):
            _check_array(a, f"level16[{l}]", np.float16, (N, w))
        _check_array(tail_norms, "tail_norms", np.float32, (L + 1, N))
        _check_array(second_moment, "second_moment", np.float64, (layout.D,))
        for name, v in (("max_norm", max_norm), ("fp16_residual_max", fp16_residual_max)):
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        self.layout = layout
        self.levels32 = tuple(levels32)
        self.levels16 = tuple(levels16)
        self.tail_norms = tail_norms
        self.second_moment = second_moment
        self.max_norm = float(max_norm)
        self.fp16_residual_max = float(fp16_residual_max) if layout.fp16_levels else 0.0
        self._bounds = np.asarray(layout.bounds, dtype=np.int64)
        # corpus RMS tail norm at every boundary, sqrt(sum_{j >= b} E[d_j^2]), for data_aware_doc
        suffix = np.concatenate([np.cumsum(second_moment[::-1])[::-1], [0.0]])
        self.rms_tail = np.sqrt(np.maximum(suffix[self._bounds], 0.0))
        self._inv_rms_tail = np.where(self.rms_tail > 0, 1.0 / np.where(self.rms_tail > 0, self.rms_tail, 1.0), 0.0)
        # (D, L + 1) suffix indicator: column l sums coordinates j >= b_l (one product per query profile)
        self._suffix = (np.arange(layout.D)[:, None] >= self._bounds[None, :]).astype(np.float64)
        self._all_rows = np.array([[0, N]], dtype=np.int64)  # the default ranges: every row (read-only)
        self._all_rows.flags.writeable = False

    @property
    def N(self) -> int:
        """Documents."""
        return int(self.levels32[0].shape[0])

    @property
    def D(self) -> int:
        """Coordinates."""
        return self.layout.D

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays (float32 levels, float16 levels, norms)."""
        return int(sum(a.nbytes for a in (*self.levels32, *self.levels16, self.tail_norms, self.second_moment)))

    @classmethod
    def build(cls, X_rot: np.ndarray, layout: LevelLayout | None = None, *, chunk: int = 65536) -> "LevelStore":
        """Store rotated documents level-major.

        Args:
            X_rot: (N, D) rotated documents (any float dtype; rows ``R x``), finite.  The float32 levels hold
                ``X_rot.astype(float32)``; exact scores are inner products with those.
            layout: the levels (default :meth:`LevelLayout.default` for D).
            chunk: rows processed at a time (bounds the float64 temporaries to chunk x D).

        Returns:
            The :class:`LevelStore` (new arrays; ``X_rot`` is not kept).

        Raises:
            ValueError: for a non-2-D or non-finite input, a layout of another D, or values too large for the
                float16 copy (|x| > 65504).
        """
        X_rot = np.asarray(X_rot)
        if X_rot.ndim != 2 or not np.issubdtype(X_rot.dtype, np.floating):
            raise ValueError(f"X_rot must be a 2-D float array, got shape {X_rot.shape} dtype {X_rot.dtype}")
        N, D = X_rot.shape
        layout = layout or LevelLayout.default(D)
        if not isinstance(layout, LevelLayout) or layout.D != D:
            raise ValueError(f"layout must be a LevelLayout over {D} coordinates, got {layout!r}")
        if N >= 2 ** 31:
            raise ValueError(f"at most 2^31 - 1 documents, got {N}")
        bounds = layout.bounds
        L, L16, b16 = layout.L, layout.fp16_levels, layout.fp16_width
        levels32 = [np.empty((N, w), dtype=np.float32) for w in layout.widths]
        levels16 = [np.empty((N, w), dtype=np.float16) for w in layout.widths[:L16]]
        tails = np.zeros((L + 1, N), dtype=np.float32)
        m2 = np.zeros(D, dtype=np.float64)
        resid_max = 0.0
        for s in range(0, N, max(1, chunk)):
            e = min(N, s + chunk)
            x32 = np.asarray(X_rot[s:e], dtype=np.float32)
            if not np.all(np.isfinite(x32)):
                raise ValueError(f"X_rot has non-finite values in rows {s}..{e - 1}")
            x64 = x32.astype(np.float64)
            sq = x64 * x64
            m2 += sq.sum(axis=0)
            suffix = np.cumsum(sq[:, ::-1], axis=1)[:, ::-1]  # suffix[:, j] = sum_{j' >= j}
            for l in range(L):
                levels32[l][s:e] = x32[:, bounds[l]:bounds[l + 1]]
                tails[l, s:e] = _round_up_f32(np.sqrt(suffix[:, bounds[l]]))
            if L16:
                lead = x32[:, :b16]
                if np.abs(lead).max(initial=0.0) > FP16_MAX:
                    raise ValueError(f"values above {FP16_MAX} do not fit the float16 levels")
                h = np.where(np.abs(lead) < FP16_MIN_NORMAL, np.float32(0), lead).astype(np.float16)
                for l in range(L16):
                    levels16[l][s:e] = h[:, bounds[l]:bounds[l + 1]]
                err = h.astype(np.float64) - x64[:, :b16]
                resid_max = max(resid_max, float(np.sqrt(np.einsum("ij,ij->i", err, err).max(initial=0.0))))
        m2 /= max(N, 1)
        max_norm = float(tails[0].max()) if N else 0.0
        return cls(layout, levels32, levels16, tails, m2, max_norm, _round_up_scalar(resid_max))

    def arrays(self) -> dict[str, np.ndarray]:
        """Named arrays to save as version files; :meth:`from_arrays` reads them back.

        Keys: ``bounds`` (L + 1,) int64; ``fp16_levels`` (1,) int64; ``norms`` (2,) float64 (max_norm,
        fp16_residual_max); ``level32_00`` ... (N, w_l) float32; ``level16_00`` ... (N, w_l) float16;
        ``tail_norms`` (L + 1, N) float32; ``second_moment`` (D,) float64.  The big arrays are the store's own
        (not copies).
        """
        out = {"bounds": self._bounds.copy(), "fp16_levels": np.array([self.layout.fp16_levels], dtype=np.int64),
               "norms": np.array([self.max_norm, self.fp16_residual_max], dtype=np.float64),
               "tail_norms": self.tail_norms, "second_moment": self.second_moment}
        for l, a in enumerate(self.levels32):
            out[f"level32_{l:02d}"] = a
        for l, a in enumerate(self.levels16):
            out[f"level16_{l:02d}"] = a
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "LevelStore":
        """The inverse of :meth:`arrays`; memory-mapped arrays are used in place (never copied).

        Raises:
            ValueError: for a missing key, or an array of the wrong shape, dtype or layout (not C-contiguous).
        """
        missing = [k for k in ("bounds", "fp16_levels", "norms", "tail_norms", "second_moment") if k not in arrays]
        if missing:
            raise ValueError(f"missing level-store arrays: {missing}")
        layout = LevelLayout.from_bounds(np.asarray(arrays["bounds"]).tolist(),
                                         int(np.asarray(arrays["fp16_levels"]).reshape(-1)[0]))
        norms = np.asarray(arrays["norms"], dtype=np.float64).reshape(-1)
        if norms.shape != (2,):
            raise ValueError(f"norms must hold 2 values, got {norms.shape}")
        try:
            levels32 = [arrays[f"level32_{l:02d}"] for l in range(layout.L)]
            levels16 = [arrays[f"level16_{l:02d}"] for l in range(layout.fp16_levels)]
        except KeyError as exc:
            raise ValueError(f"missing level-store array {exc.args[0]!r}") from None
        return cls(layout, levels32, levels16, arrays["tail_norms"], arrays["second_moment"], float(norms[0]),
                   float(norms[1]))


def _check_array(a, name: str, dtype, shape: tuple[int, ...]) -> None:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")


# ------------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class LevelEvidence:
    """Cheap per-query evidence after the first level(s) (for a policy that picks z and the stopping level).

    Attributes:
        partial_top: (S,) float32, the best first-level partial scores, best first (S = seeds found).
        seed_exact: (S,) float32, the exact scores of the same documents.
        threshold: float, the k-th best exact seed score (the first threshold tau), -inf with fewer than k seeds.
        query_tail_sqnorm: (L + 1,) float64, ``||q[b_l:]||^2`` at every boundary (the query's tail energy).
        spread: (L + 1,) float64, ``sqrt(sum_{j >= b_l} q_j^2 E[d_j^2])`` (the data-aware bound at z = 1).
        z_grid: (Z,) float64, the confidences of ``survivors_at_z``.
        survivors_at_z: (Z,) int64, documents whose partial score ``p >= tau - z * spread[f]`` (f = the first
            levels scanned): how many the data-aware filter would keep at each z (empty when evidence was not
            requested).
        scanned: int, documents scanned (allowed rows in the ranges).
    """

    partial_top: np.ndarray
    seed_exact: np.ndarray
    threshold: float
    query_tail_sqnorm: np.ndarray
    spread: np.ndarray
    z_grid: np.ndarray
    survivors_at_z: np.ndarray
    scanned: int

    def feature_names(self, k: int = 10) -> tuple[str, ...]:
        """The names of :meth:`feature_array`'s values, in order (the same for every query of a store and grid)."""
        return evidence_feature_names(len(self.query_tail_sqnorm) - 1, self.z_grid[:len(self.survivors_at_z)])

    def feature_array(self, k: int = 10) -> np.ndarray:
        """(F,) float64 feature values in the order of :meth:`feature_names` (missing values are NaN); the serving
        path's form of :meth:`features` (no dict, no strings).  Computed by the compiled kernel, the same code that
        the fused search (:func:`fused_search`) runs, so a model trained on these values sees the served ones."""
        out = np.empty(len(_SCALAR_FEATURES) + len(self.query_tail_sqnorm) + len(self.spread)
                       + len(self.survivors_at_z), dtype=np.float64)
        _kernel.evidence_features(np.ascontiguousarray(self.partial_top, np.float32),
                                  np.ascontiguousarray(self.seed_exact, np.float32), float(self.threshold),
                                  np.ascontiguousarray(self.query_tail_sqnorm, np.float64),
                                  np.ascontiguousarray(self.spread, np.float64),
                                  np.ascontiguousarray(self.survivors_at_z, np.int64), int(self.scanned), int(k), out)
        return out

    def features(self, k: int = 10) -> dict[str, float]:
        """A flat dict of named float features (stable names; missing values are NaN)."""
        return dict(zip(self.feature_names(k), self.feature_array(k).tolist()))


_SCALAR_FEATURES = ("threshold", "partial_1", "partial_k", "partial_last", "partial_gap_1_k", "partial_gap_k_last",
                    "exact_1", "exact_minus_partial_mean", "scanned_log10")
_FEATURE_NAMES: dict[tuple, tuple[str, ...]] = {}  # feature names by (L, z grid)
EVIDENCE_Z_GRID: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
"""The confidences at which :func:`begin` and :func:`fused_search` count the data-aware filter's survivors."""
_EVIDENCE_Z = np.array(EVIDENCE_Z_GRID, dtype=np.float64)  # the default grid as the kernel reads it
_EVIDENCE_Z.flags.writeable = False


def evidence_feature_names(L: int, z_grid=EVIDENCE_Z_GRID) -> tuple[str, ...]:
    """The names of the evidence features of a store of L levels with survivor counts at ``z_grid``, in the order
    of :meth:`LevelEvidence.feature_array` and of :func:`fused_search`'s ``features``."""
    key = (int(L), tuple(float(z) for z in z_grid))
    names = _FEATURE_NAMES.get(key)
    if names is None:
        names = (*_SCALAR_FEATURES, *(f"query_tail_sqnorm_{l}" for l in range(L + 1)),
                 *(f"spread_{l}" for l in range(L + 1)), *(f"survivors_share_z{z:g}" for z in key[1]))
        _FEATURE_NAMES[key] = names
    return names


@dataclass(frozen=True, eq=False)
class ConfidenceModel:
    """A per-query choice of the data-aware confidence z inside :func:`fused_search` (a recall policy, compiled).

    The query's evidence features (:func:`evidence_feature_names`) fill one model row per z of ``z_grid``; the
    first z whose row's raw forest score is at least ``bar`` is used (the last z when none is):
    :func:`adawidth.recall_policy.choose` for one query, evaluated inside the kernel.

    Attributes:
        forest: :class:`adawidth.forest.Forest` (LightGBM regression, raw score = predicted recall@k).
        colmap: (F,) int32, the model's column j is evidence feature ``colmap[j]`` (>= 0), missing (-1) or z (-2).
        z_grid: (Z,) float64 confidences, increasing (more work, higher recall).
        bar: the bar on the predicted recall (+inf: always the last z).
    """

    forest: object
    colmap: np.ndarray
    z_grid: np.ndarray
    bar: float

    @classmethod
    def for_model(cls, forest, model_features, L: int, z_grid, bar: float,
                  evidence_z_grid=EVIDENCE_Z_GRID) -> "ConfidenceModel":
        """Map a model over named features (evidence names, and ``"z"``) onto the evidence of a store of L levels.

        Raises:
            ValueError: for a model whose width is not ``len(model_features)``, or that lacks the ``z`` column.
        """
        names = list(model_features)
        if "z" not in names or forest.n_features != len(names):
            raise ValueError(f"the model must read {forest.n_features} named features including 'z', got {names!r}")
        index = {n: i for i, n in enumerate(evidence_feature_names(L, evidence_z_grid))}
        colmap = np.array([-2 if n == "z" else index.get(n, -1) for n in names], dtype=np.int32)
        return cls(forest, colmap, np.ascontiguousarray(z_grid, dtype=np.float64), float(bar))

    @cached_property
    def nodes(self) -> tuple:
        """The forest's seven node arrays, in the kernel's order, and whether the model is monotone increasing in
        its z column (then the kernel finds the first z clearing the bar by binary search); computed once."""
        f = self.forest
        z_col = np.flatnonzero(self.colmap == -2)
        monotone = bool(len(z_col)) and f.increasing_in(int(z_col[0]))
        return (f.feature, f.threshold, f.left, f.right, f.flags, f.roots, f.leaves, monotone)


@dataclass(frozen=True, eq=False)
class LevelState:
    """A query after :func:`begin`: first level(s) scanned, threshold seeded.  Read-only; finish it any number of times.

    Attributes:
        store: the :class:`LevelStore`.
        query: (D,) float32, the rotated query.
        k: results asked for.
        allowed: (N,) bool or None.
        ranges: (R, 2) int64, the scanned row ranges ``[start, end)``.
        threads: kernel threads used by :func:`begin` (and by default by :func:`finish`).
        first_levels: levels scanned for every candidate.
        p_scan: (P,) float32, the partial score over the first levels of every scanned position (NaN outside
            ``allowed``).
        seed_rows, seed_partial, seed_exact: (S,) int64 / float32 / float32, the seeds, best partial first.
        scanned: documents scanned.
        coordinates: multiply-adds spent so far (the first levels plus the seeds' exact scores).
        evidence: :class:`LevelEvidence`.
    """

    store: LevelStore
    query: np.ndarray
    k: int
    allowed: np.ndarray | None
    ranges: np.ndarray
    threads: int
    first_levels: int
    p_scan: np.ndarray
    seed_rows: np.ndarray
    seed_partial: np.ndarray
    seed_exact: np.ndarray
    scanned: int
    coordinates: int
    evidence: LevelEvidence


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~6 us a query in object.__setattr__
class LevelResult:
    """The top-k of one query.

    Attributes:
        rows: (k',) int64, document rows best first; k' = min(k, allowed documents in the ranges).
        scores: (k',) float32, their exact float32 inner products over all D coordinates (higher is better).
        coordinates: int, multiply-adds spent: the first levels, the seeds, every later level, the float32
            rescoring of the float16 levels.
        alive_per_level: (L,) int64, candidates entering each level (the first levels: all scanned documents).
        certified: True only when the result is provably the exhaustive top-k (exact bound, full depth).
        bound: the bound used ("exact", "data_aware" or "data_aware_doc").
        z: the confidence used, None for the exact bound.
        stop_level: the last level scanned with pruning (L - 1 = all).
        threshold_seed: the first threshold tau (k-th best exact seed score; -inf with fewer than k seeds).
        scanned: documents scanned (allowed documents in the ranges).
        n_seeds: documents scored exactly to seed the threshold.
        D: coordinates per document (for :attr:`coordinate_share`).
        features: (E,) float64 evidence features (:func:`fused_search` with ``features=True``), else None.
        first_coordinates: multiply-adds of the first levels and the seeds (:func:`fused_search`), else None.
    """

    rows: np.ndarray
    scores: np.ndarray
    coordinates: int
    alive_per_level: np.ndarray
    certified: bool
    bound: str
    z: float | None
    stop_level: int
    threshold_seed: float
    scanned: int
    n_seeds: int
    D: int = field(default=0)
    features: np.ndarray | None = None
    first_coordinates: int | None = None

    @property
    def coordinate_share(self) -> float:
        """``coordinates / (scanned * D)``: the work as a share of exhaustive search (lower is cheaper)."""
        return self.coordinates / max(self.scanned * self.D, 1)

    def trace(self) -> dict:
        """JSON-ready summary for a response trace."""
        return {"coordinates_scored": int(self.coordinates), "alive_per_level": [int(x) for x in self.alive_per_level],
                "certified": bool(self.certified), "bound": self.bound, "z": self.z, "stop_level": int(self.stop_level),
                "coordinate_share": round(self.coordinate_share, 6), "scanned": int(self.scanned)}


# ------------------------------------------------------------------------------------------------ search


def kernel_threads(threads: int, rows: int) -> int:
    """The threads the compiled scan of ``rows`` candidate rows actually runs on when given ``threads``: between
    1 and ``threads``, at most one per 32,768 rows (``_kernel.set_min_rows_per_thread`` changes that, for tests).
    The recall a confidence z realises depends on it: the shared threshold is the best of the threads' own k-th
    scores (each over its block and the seeds), never above the one thread's k-th score over all it has scanned, so
    more threads prune less and realise more recall at the same z (``bench/recall_margin.py --threads``).  A
    recall policy is therefore calibrated per thread count (:meth:`engine.recall.RecallPolicy.at_threads`)."""
    return int(_kernel.threads_for(int(threads), int(rows)))


def default_seeds(k: int) -> int:
    """Documents scored exactly after the first level(s) to seed the threshold: ``max(2 k, 16)``.

    Each seed costs a scattered read of all D coordinates (about 0.6 us on the 2-core machine); twice k seeds
    already hold the final k-th best score's neighbourhood, so more raised the threshold too little to pay
    (SciFact, declared recall: 20 seeds 57 us a query against 69 us with 40, 2 % more multiply-adds; debdocs 50k:
    354 against 384 us).  Versions built before this (``max(4 k, 32)``, :func:`legacy_seeds`) keep theirs, since
    their recall policy's evidence was computed with them."""
    return max(2 * k, 16)


def legacy_seeds(k: int) -> int:
    """The seeds of versions built before :func:`default_seeds` halved them: ``max(4 k, 32)``."""
    return max(4 * k, 32)


def _validate_query(store: LevelStore, query) -> np.ndarray:
    q = np.asarray(query)
    if q.ndim != 1 or q.shape[0] != store.D:
        raise ValueError(f"query must have shape ({store.D},), got {q.shape}")
    if q.dtype.kind not in "fiu":
        raise ValueError(f"query must be numeric (float or integer), got dtype {q.dtype}")
    q = np.ascontiguousarray(q, dtype=np.float32)
    # a float64 sum of float32 values cannot overflow, so it is finite exactly when every value is
    if not math.isfinite(q.sum(dtype=np.float64)):
        raise ValueError("query has non-finite values")
    return q


def _validate_allowed(store: LevelStore, allowed) -> np.ndarray | None:
    if allowed is None:
        return None
    a = np.asarray(allowed)
    if a.dtype != np.bool_ or a.shape != (store.N,):
        raise ValueError(f"allowed must be a bool array of shape ({store.N},), got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a)


def _validate_ranges(store: LevelStore, ranges) -> np.ndarray:
    if ranges is None:
        return store._all_rows
    r = np.asarray(ranges)
    if r.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if r.ndim != 2 or r.shape[1] != 2 or not np.issubdtype(r.dtype, np.integer):
        raise ValueError(f"ranges must be an (R, 2) integer array of [start, end) rows, got {r.dtype} {r.shape}")
    r = np.ascontiguousarray(r, dtype=np.int64)
    if np.any(r[:, 0] > r[:, 1]) or np.any(r[:, 0] < 0) or np.any(r[:, 1] > store.N) or np.any(r[1:, 0] < r[:-1, 1]):
        raise ValueError(f"ranges must be sorted, disjoint [start, end) within [0, {store.N}]")
    return r


def _validate_int(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be in [{low}, {high if high is not None else 'inf'}], got {value}")
    return int(value)


def _store_args(store: LevelStore, q: np.ndarray, allowed, ranges):
    return store.levels32, store.levels16, store._bounds, store.tail_norms, q, allowed, ranges, store.N


def query_profile(store: LevelStore, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(||q[b_l:]||^2, sqrt(sum_{j >= b_l} q_j^2 E[d_j^2]))`` at every boundary, each (L + 1,) float64 (float64
    sums from the last coordinate down, in the kernel: the fused search computes the same bits)."""
    tail_sq, spread = np.empty(store.layout.L + 1), np.empty(store.layout.L + 1)
    _kernel.query_profile(np.ascontiguousarray(q, np.float32), store.second_moment, store._bounds, tail_sq, spread)
    return tail_sq, spread


def begin(store: LevelStore, query, k: int, *, allowed=None, ranges=None, threads: int = 1,
          first_levels: int = 1, seeds: int | None = None, evidence: bool = True,
          z_grid: Sequence[float] = EVIDENCE_Z_GRID) -> LevelState:
    """Scan the first level(s) of every candidate and seed the threshold (the first phase of :func:`search`).

    Args:
        store: the :class:`LevelStore`.
        query: (D,) float, the query in the store's rotated basis, finite.
        k: results wanted, >= 1.
        allowed: optional (N,) bool; only these documents may be returned (applied before the top-k).
        ranges: optional (R, 2) int, sorted disjoint ``[start, end)`` row ranges to scan (default: all rows).
        threads: kernel threads for this one query (1..256; the kernel uses at most one per 32,768 scanned rows,
            so small corpora and short row ranges run on the calling thread).  Give it the machine's cores at
            N >= 100k when queries arrive one at a time.
        first_levels: levels scanned for every candidate before any pruning (1 .. L; at most
            ``layout.fp16_levels`` when there are float16 levels).  :func:`finish` prunes from there on.
        seeds: documents given an exact score after the first levels (default :func:`default_seeds`).
        evidence: also count the survivors of the data-aware filter at each z of ``z_grid`` (one pass over the
            partial scores).
        z_grid: confidences for :attr:`LevelEvidence.survivors_at_z`.

    Returns:
        :class:`LevelState`.

    Raises:
        ValueError: for a query, mask or ranges of the wrong shape or dtype, a non-finite query, k < 1, or
            ``first_levels`` out of range.
    """
    q = _validate_query(store, query)
    k = _validate_int(k, "k", 1)
    threads = _validate_int(threads, "threads", 1, MAX_THREADS)
    layout = store.layout
    n_first = _validate_int(first_levels, "first_levels", 1, layout.fp16_levels or layout.L)
    n_seed = default_seeds(k) if seeds is None else _validate_int(seeds, "seeds", 0)
    allowed = _validate_allowed(store, allowed)
    ranges = _validate_ranges(store, ranges)
    P = store.N if ranges is store._all_rows else int((ranges[:, 1] - ranges[:, 0]).sum())
    n_seed = min(n_seed, P)
    p_scan = np.empty(P, dtype=np.float32)
    seed_rows = np.empty(n_seed, dtype=np.int64)
    seed_partial = np.empty(n_seed, dtype=np.float32)
    seed_exact = np.empty(n_seed, dtype=np.float32)
    n_found, scanned, coords = _kernel.scan_first(*_store_args(store, q, allowed, ranges), n_first, n_seed,
                                                  threads, p_scan, seed_rows, seed_partial, seed_exact)
    seed_rows, seed_partial, seed_exact = seed_rows[:n_found], seed_partial[:n_found], seed_exact[:n_found]
    tail_sq, spread = query_profile(store, q)
    tau = float(np.sort(seed_exact)[::-1][k - 1]) if n_found >= k else float("-inf")
    zg = np.asarray(z_grid, dtype=np.float64)
    counts = np.zeros(len(zg), dtype=np.int64)
    if evidence and len(zg) and P:
        thresholds = (tau - zg * spread[n_first]).astype(np.float32)
        if not np.isfinite(tau):
            thresholds[:] = -np.inf
        _kernel.count_at_least(p_scan, thresholds, counts)
    ev = LevelEvidence(seed_partial, seed_exact, tau, tail_sq, spread, zg, counts if evidence else counts[:0],
                       int(scanned))
    return LevelState(store, q, k, allowed, ranges, threads, n_first, p_scan, seed_rows, seed_partial, seed_exact,
                      int(scanned), int(coords), ev)


def bound_coefficients(store: LevelStore, tail_sq: np.ndarray, spread: np.ndarray, bound: str,
                       z: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's bound at every boundary b: ``min(a[b] * ||d_i[b:]||, c[b]) + bb[b]``.

    exact: ``a = ||q[b:]||``, ``c = inf``; data_aware: ``a = ||q[b:]||``, ``c = z * spread`` (never looser than
    Cauchy-Schwarz); data_aware_doc: ``a = min(||q[b:]||, z * spread / rms_tail)``, ``c = inf``.  ``bb`` holds
    the float32 rounding slack and, with float16 levels, ``||q[:b16]|| * max_i r_i``.

    Args:
        store: the store.
        tail_sq, spread: (L + 1,) float64 from :func:`query_profile`.
        bound: one of :data:`BOUNDS`; z: its confidence (data-aware bounds).

    Returns:
        (a, c, bb): each (L + 1,) float32, rounded up.
    """
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    n = len(tail_sq)
    a, c, bb = np.empty(n, np.float32), np.empty(n, np.float32), np.empty(n, np.float32)
    _kernel.bound_coefficients(np.ascontiguousarray(tail_sq, np.float64), np.ascontiguousarray(spread, np.float64),
                               store._inv_rms_tail, store.layout.fp16_levels, store.D, store.max_norm,
                               store.fp16_residual_max, BOUNDS.index(bound), float("nan") if z is None else float(z),
                               a, c, bb)
    return a, c, bb


def finish(state: LevelState, *, bound: str = "exact", z: float | None = None, stop_level: int | None = None,
           rescore: int | None = None, threads: int | None = None) -> LevelResult:
    """Complete a query begun with :func:`begin`: prune level by level, rescore the survivors exactly.

    Args:
        state: from :func:`begin` (not modified).
        bound: "exact" (Cauchy-Schwarz, certified), "data_aware" or "data_aware_doc" (see the module docstring).
        z: the confidence of the data-aware bounds (default 4.0; ignored by "exact"), finite and >= 0.
        stop_level: the last level scanned with pruning (default L - 1: all; at least ``first_levels - 1``).
            With an earlier level the ``rescore`` best partial scores among that level's survivors get exact
            scores and the result is not certified.
        rescore: candidates rescored at ``stop_level`` < L - 1 (default 10 k), >= k.
        threads: kernel threads (default: the state's).

    Returns:
        :class:`LevelResult`.

    Raises:
        ValueError: for an unknown bound, a negative or non-finite z, a stop level outside
            [first_levels - 1, L - 1], rescore < k.
    """
    store, k = state.store, state.k
    L = store.layout.L
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    if bound == "exact":
        z_used = None
    else:
        z_used = DEFAULT_Z if z is None else z
        if isinstance(z_used, bool) or not isinstance(z_used, (int, float, np.floating, np.integer)) \
                or not np.isfinite(z_used) or z_used < 0:
            raise ValueError(f"z must be a finite number >= 0, got {z!r}")
        z_used = float(z_used)
    stop = L - 1 if stop_level is None else _validate_int(stop_level, "stop_level", state.first_levels - 1, L - 1)
    n_rescore = 10 * k if rescore is None else _validate_int(rescore, "rescore", k)
    threads = state.threads if threads is None else _validate_int(threads, "threads", 1, MAX_THREADS)
    a, c, bb = bound_coefficients(store, state.evidence.query_tail_sqnorm, state.evidence.spread, bound, z_used)
    k_eff = max(1, min(k, state.scanned))  # no more results than candidates (bounds the heaps' memory)
    rows = np.empty(k_eff, dtype=np.int64)
    scores = np.empty(k_eff, dtype=np.float32)
    alive = np.zeros(L, dtype=np.int64)
    alive[:state.first_levels] = state.scanned
    n_out, coords = _kernel.scan_rest(*_store_args(store, state.query, state.allowed, state.ranges),
                                      state.first_levels, state.p_scan,
                                      a, c, bb, state.seed_rows, state.seed_exact, k_eff, stop,
                                      max(k_eff, min(n_rescore, state.scanned)), threads, rows, scores, alive)
    return LevelResult(rows=rows[:n_out], scores=scores[:n_out], coordinates=int(state.coordinates + coords),
                       alive_per_level=alive, certified=bound == "exact" and stop == L - 1, bound=bound, z=z_used,
                       stop_level=stop, threshold_seed=state.evidence.threshold, scanned=state.scanned,
                       n_seeds=len(state.seed_rows), D=store.D)


def search(store: LevelStore, query, k: int, *, bound: str = "exact", z: float | None = None, allowed=None,
           ranges=None, threads: int = 1, stop_level: int | None = None, rescore: int | None = None,
           seeds: int | None = None, first_levels: int | None = None) -> LevelResult:
    """Top-k by exact full-width inner product, pruned level by level: ``finish(begin(...))``.

    Args:
        store: the :class:`LevelStore`.
        query: (D,) float, in the store's rotated basis.
        k: results wanted, >= 1; k' = min(k, allowed documents in the ranges) come back.
        bound, z, stop_level, rescore: see :func:`finish`.
        allowed, ranges, threads, seeds: see :func:`begin`.
        first_levels: levels scanned for every candidate (default: ``layout.exact_first_levels`` for the exact
            bound, 1 for the data-aware bounds).

    Returns:
        :class:`LevelResult`; with ``bound="exact"`` (and the default stop level) ``rows`` is exactly the
        exhaustive top-k of ``X_rot @ query`` in float32, ties to the lower row, and ``certified`` is True.

    Raises:
        ValueError: see :func:`begin` and :func:`finish`.
    """
    if first_levels is None:
        first_levels = store.layout.exact_first_levels if bound == "exact" else 1
    state = begin(store, query, k, allowed=allowed, ranges=ranges, threads=threads, first_levels=first_levels,
                  seeds=seeds, evidence=False)
    return finish(state, bound=bound, z=z, stop_level=stop_level, rescore=rescore)


def fused_search(store: LevelStore, query, k: int, *, bound: str = "exact", z: float | None = None,
                 model: ConfidenceModel | None = None, allowed=None, ranges=None, threads: int = 1,
                 first_levels: int | None = None, seeds: int | None = None, evidence_z_grid=EVIDENCE_Z_GRID,
                 features: bool = False) -> LevelResult:
    """One query in one compiled call: ``finish(begin(...))`` with the confidence chosen in between.

    The serving form of :func:`begin` + a per-query confidence + :func:`finish`: the first level(s), the seeds, the
    query profile, the evidence, the confidence (``model``, else ``z``), the bound and the pruning scan run in the
    kernel without returning to Python, so a query pays one call's overhead.  Every quantity is computed by the
    same compiled code as the two-call path (:func:`query_profile`, :meth:`LevelEvidence.feature_array`,
    :func:`bound_coefficients`), so the result equals ``finish(begin(...), bound=bound, z=chosen)`` bit for bit
    (``tests/unit/test_levels.py``).

    Args:
        store: the :class:`LevelStore`.
        query: (D,) float, in the store's rotated basis, finite.
        k: results wanted, >= 1.
        bound: "exact" (certified), "data_aware" or "data_aware_doc".
        z: the confidence of a data-aware bound when ``model`` is None (default 4.0).
        model: a :class:`ConfidenceModel` choosing z per query from the evidence (data-aware bounds only).
        allowed, ranges, threads, seeds: see :func:`begin`.
        first_levels: levels scanned for every candidate (default: ``layout.exact_first_levels`` for the exact
            bound, 1 for the data-aware bounds).
        evidence_z_grid: the confidences of the survivor counts among the evidence.
        features: also return the evidence features (``LevelResult.features``).

    Returns:
        :class:`LevelResult` with ``z`` the confidence used (None for the exact bound).

    Raises:
        ValueError: as :func:`begin` and :func:`finish`; a model with the exact bound; a malformed model.
    """
    q = _validate_query(store, query)
    k = _validate_int(k, "k", 1)
    threads = _validate_int(threads, "threads", 1, MAX_THREADS)
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    layout = store.layout
    if first_levels is None:
        first_levels = layout.exact_first_levels if bound == "exact" else 1
    n_first = _validate_int(first_levels, "first_levels", 1, layout.fp16_levels or layout.L)
    n_seed = default_seeds(k) if seeds is None else _validate_int(seeds, "seeds", 0)
    if bound == "exact":
        if model is not None:
            raise ValueError("the exact bound takes no confidence model")
        z_used = float("nan")
    else:
        z_used = DEFAULT_Z if z is None else z
        if isinstance(z_used, bool) or not isinstance(z_used, (int, float, np.floating, np.integer)) \
                or not np.isfinite(z_used) or z_used < 0:
            raise ValueError(f"z must be a finite number >= 0, got {z!r}")
    allowed = _validate_allowed(store, allowed)
    ranges = _validate_ranges(store, ranges)
    ev_z = _EVIDENCE_Z if evidence_z_grid is EVIDENCE_Z_GRID else np.ascontiguousarray(evidence_z_grid, np.float64)
    L = layout.L
    rows = np.empty(k, dtype=np.int64)
    scores = np.empty(k, dtype=np.float32)
    alive = np.zeros(L, dtype=np.int64)
    info = np.empty(6, dtype=np.float64)
    feats = np.empty(len(_SCALAR_FEATURES) + 2 * (L + 1) + len(ev_z)) if features else None
    if model is None:
        nodes, colmap, zg, bar = None, None, None, 0.0
    else:
        nodes, colmap, zg, bar = model.nodes, model.colmap, model.z_grid, model.bar
    n_out = _kernel.search(*_store_args(store, q, allowed, ranges), store.second_moment, store._inv_rms_tail,
                           store.max_norm, store.fp16_residual_max, k, n_first, n_seed, threads, BOUNDS.index(bound),
                           float(z_used), ev_z, nodes, colmap, zg, float(bar), rows, scores, alive, info, feats)
    return LevelResult(rows=rows[:n_out], scores=scores[:n_out], coordinates=int(info[2]), alive_per_level=alive,
                       certified=bound == "exact", bound=bound, z=None if bound == "exact" else float(info[0]),
                       stop_level=L - 1, threshold_seed=float(info[1]), scanned=int(info[3]), n_seeds=int(info[4]),
                       D=store.D, features=feats, first_coordinates=int(info[5]))
