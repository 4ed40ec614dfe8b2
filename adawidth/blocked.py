"""Coordinate-blocked stage 1: scan the corpus block by block, reusing partial sums.

The rotated corpus is stored as contiguous column blocks of ``block`` coordinates, with each
document's cumulative squared norm at every block boundary.  A query scanned at width m holds its
raw partial dot products with every document; extending to m' > m adds only the blocks between
them, so the extension costs N·(m' − m) multiply-adds (the argument of §3.2.1 of 001, applied to
the whole corpus instead of the shortlist).  The prefix cosine at width m is
``dot_m / (||q[:m]|| · ||d[:m]||)`` (Eq. (1) of 001).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adawidth.prefix import EPS, PartialScores, top_k


@dataclass(frozen=True)
class ScanState:
    """Partial sums of one query against the whole corpus.

    Attributes:
        width: coordinates scanned so far (a multiple of the block size).
        dots: (N,) float32, raw partial dot products over the first ``width`` coordinates.
        query_sqnorm: ``||q[:width]||^2``.
        work: multiply-adds spent so far (N × width).
    """

    width: int
    dots: np.ndarray
    query_sqnorm: float
    work: int


class BlockedCorpus:
    """Rotated documents in a coordinate-blocked layout.

    Args:
        X_rot: rotated documents, (N, D), float32; D must be a multiple of ``block``.
        block: coordinates per block (default 16).

    Raises:
        ValueError: if D is not a multiple of ``block``.
    """

    def __init__(self, X_rot: np.ndarray, block: int = 16):
        X_rot = np.asarray(X_rot, dtype=np.float32)
        N, D = X_rot.shape
        if D % block:
            raise ValueError(f"dimension {D} is not a multiple of the block size {block}")
        self.block, self.N, self.D = block, N, D
        self.matrix = X_rot  # (N, D) row-major copy, for rescoring reads of candidate rows
        self.blocks = [np.ascontiguousarray(X_rot[:, s:s + block]) for s in range(0, D, block)]
        sq = np.stack([np.einsum("ij,ij->i", b, b) for b in self.blocks], axis=0)
        # (n_blocks + 1, N): row j holds every document's squared norm over the first j blocks, and its
        # inverse square root; rows are contiguous so a scan reads one row, never a strided column.
        self.cum_sqnorm = np.concatenate([np.zeros((1, N), np.float32), np.cumsum(sq, axis=0, dtype=np.float32)])
        self.inv_norm = (1.0 / np.sqrt(np.maximum(self.cum_sqnorm, EPS * EPS))).astype(np.float32)

    def start(self) -> ScanState:
        """The empty scan (width 0)."""
        return ScanState(0, np.zeros(self.N, dtype=np.float32), 0.0, 0)

    def extend(self, state: ScanState, query: np.ndarray, width: int) -> ScanState:
        """Scan blocks ``state.width .. width`` and add them to the partial sums.

        Args:
            state: the scan so far.
            query: rotated query, (>= width,), float32.
            width: new width, a multiple of the block size in [state.width, D].

        Returns:
            The new :class:`ScanState` (``state`` is unchanged).

        Raises:
            ValueError: for a width that is not a block boundary or is narrower than the state.
        """
        if width % self.block or not state.width <= width <= self.D:
            raise ValueError(f"width {width} must be a multiple of {self.block} in [{state.width}, {self.D}]")
        dots, qs = state.dots, state.query_sqnorm
        for b in range(state.width // self.block, width // self.block):
            qb = np.asarray(query[b * self.block:(b + 1) * self.block], dtype=np.float32)
            dots = dots + self.blocks[b] @ qb  # a new array: ``state`` stays unchanged
            qs += float(qb @ qb)
        return ScanState(width, dots, qs, state.work + self.N * (width - state.width))

    def cosines(self, state: ScanState) -> np.ndarray:
        """Prefix cosines of every document at ``state.width``; (N,) float32."""
        return state.dots * self.inv_norm[state.width // self.block] / np.float32(max(np.sqrt(state.query_sqnorm), EPS))

    def shortlist(self, state: ScanState, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``size`` documents by prefix cosine at the state's width: (rows (C,), cosines (C,)), best first."""
        # rank on dots / ||d[:w]||: the query's norm is one positive factor, so it cannot change the order
        rank = state.dots * self.inv_norm[state.width // self.block]
        rows = top_k(rank, size)
        return rows, rank[rows] / np.float32(max(np.sqrt(state.query_sqnorm), EPS))

    def partial_scores(self, state: ScanState, rows: np.ndarray) -> PartialScores:
        """The candidates' partial sums, ready for :meth:`adawidth.prefix.PartialScores.extend`."""
        return PartialScores(np.asarray(rows, np.int64), state.dots[rows].astype(np.float64),
                             self.cum_sqnorm[state.width // self.block, rows].astype(np.float64),
                             state.query_sqnorm, state.width)

    def full_matrix(self) -> np.ndarray:
        """The rotated corpus, (N, D) float32 (for rescoring reads of candidate rows)."""
        return self.matrix
