"""Pure-numpy reference of :func:`adawidth.levels.search` (the oracle of the tests; never on a hot path).

The same algorithm as the compiled kernel with one thread, step for step: the first levels over every
candidate, the seeds (the best partial scores, exactly scored), then blocks of
:data:`adawidth.levels.SCAN_BLOCK` rows in scan order, each pruned level by level with the bound
``(p + min(a[b] * ||d[b:]||, c[b])) + bb[b] >= tau`` evaluated in float32, the survivors of the last level
scored exactly (:func:`exact_scores`) and kept in a top-k whose k-th score is the threshold.  Only the inner
products are summed in another order (numpy's), so on data whose products and sums are exact in float32
(small dyadic values) the reference and the kernel agree bit for bit: rows, scores, candidates alive per
level and coordinates.  On other data they agree on the exact mode's result; scores differ by float32
rounding.

Source: Panorama, arXiv 2510.00566 (level-wise Cauchy-Schwarz pruning); the data-aware bounds are described
in :mod:`adawidth.levels`.
"""

from __future__ import annotations

import numpy as np

from adawidth.levels import (BOUNDS, DEFAULT_Z, SCAN_BLOCK, LevelResult, LevelStore, _validate_allowed,
                             _validate_int, _validate_query, _validate_ranges, bound_coefficients, default_seeds,
                             query_profile)


def _dots(store: LevelStore, l: int, rows: np.ndarray, q: np.ndarray, use16: bool) -> np.ndarray:
    """(n,) float32: <q[b_l:b_{l+1}], d_row[b_l:b_{l+1}]> from the float16 copy when ``use16`` and it exists."""
    b = store.layout.bounds
    X = store.levels16[l] if use16 and l < store.layout.fp16_levels else store.levels32[l]
    return (X[rows].astype(np.float32) @ q[b[l]:b[l + 1]]).astype(np.float32)


def finish_scores(store: LevelStore, rows: np.ndarray, q: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """``rest`` plus the float32 dots of the float16 levels, added in level order."""
    s = rest.astype(np.float32).copy()
    for l in range(store.layout.fp16_levels):
        s += _dots(store, l, rows, q, use16=False)
    return s


def exact_scores(store: LevelStore, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(n,) float32 exact scores by the kernel's rule: the levels without a float16 copy summed in level order
    from 0, then the float32 dots of the float16 levels added in level order."""
    rest = np.zeros(len(rows), dtype=np.float32)
    for l in range(store.layout.fp16_levels, store.layout.L):
        rest += _dots(store, l, rows, q, use16=False)
    return finish_scores(store, rows, q, rest)


def _top(scores: np.ndarray, rows: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n best (higher score, then lower row), best first."""
    order = np.lexsort((rows, -scores.astype(np.float64)))[:n]
    return scores[order], rows[order]


class _TopK:
    """The kernel's fused heap: keeps the k best (score desc, row asc); ``worst`` is the threshold when full."""

    def __init__(self, k: int, scores: np.ndarray, rows: np.ndarray):
        self.k = k
        s, r = _top(scores, rows, k)
        self.items = list(zip(s.tolist(), r.tolist()))

    @property
    def full(self) -> bool:
        return len(self.items) >= self.k

    @property
    def worst(self) -> float:
        return self.items[-1][0] if self.full else float("-inf")

    def push(self, score: float, row: int) -> bool:
        if self.full:
            ws, wr = self.items[-1]
            if not (score > ws or (score == ws and row < wr)):
                return False
            self.items.pop()
        self.items.append((score, row))
        self.items.sort(key=lambda e: (-e[0], e[1]))
        return True


def reference_search(store: LevelStore, query, k: int, *, bound: str = "exact", z: float | None = None,
                     allowed=None, ranges=None, stop_level: int | None = None, rescore: int | None = None,
                     seeds: int | None = None, first_levels: int | None = None) -> LevelResult:
    """What :func:`adawidth.levels.search` returns with ``threads=1``, computed in numpy.

    Args and returns: as :func:`adawidth.levels.search`.

    Raises:
        ValueError: for the same bad inputs.
    """
    q = _validate_query(store, query)
    k = _validate_int(k, "k", 1)
    allowed = _validate_allowed(store, allowed)
    ranges = _validate_ranges(store, ranges)
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    z_used = None if bound == "exact" else float(DEFAULT_Z if z is None else z)
    L, D = store.layout.L, store.D
    if first_levels is None:
        first_levels = store.layout.exact_first_levels if bound == "exact" else 1
    nf = _validate_int(first_levels, "first_levels", 1, store.layout.fp16_levels or L)
    stop = L - 1 if stop_level is None else _validate_int(stop_level, "stop_level", nf - 1, L - 1)
    partial_mode = stop < L - 1
    n_rescore = 10 * k if rescore is None else _validate_int(rescore, "rescore", k)
    n_seed = default_seeds(k) if seeds is None else _validate_int(seeds, "seeds", 0)
    tails, widths = store.tail_norms, store.layout.widths

    pos_rows = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in ranges]) if len(ranges) else \
        np.zeros(0, dtype=np.int64)
    ok = np.ones(len(pos_rows), dtype=bool) if allowed is None else allowed[pos_rows]
    # the first levels and the seeds
    p_scan = np.full(len(pos_rows), np.nan, dtype=np.float32)
    first = _dots(store, 0, pos_rows[ok], q, use16=True)
    for l in range(1, nf):
        first += _dots(store, l, pos_rows[ok], q, use16=True)
    p_scan[ok] = first
    scanned = int(ok.sum())
    n_seed = min(n_seed, len(pos_rows))
    k_eff = max(1, min(k, scanned))  # as the kernel: no more results than candidates
    n_rescore = max(k_eff, min(n_rescore, scanned))
    coords = scanned * store.layout.bounds[nf]
    _, seed_rows = _top(p_scan[ok], pos_rows[ok], n_seed)
    seed_exact = exact_scores(store, seed_rows, q)
    coords += len(seed_rows) * D
    tau0 = float(np.sort(seed_exact)[::-1][k - 1]) if len(seed_rows) >= k else float("-inf")
    tail_sq, spread = query_profile(store, q)
    a, c, bb = bound_coefficients(store, tail_sq, spread, bound, z_used)
    top = _TopK(k_eff, seed_exact, seed_rows)
    is_seed = np.isin(pos_rows, seed_rows)
    alive = np.zeros(L, dtype=np.int64)
    alive[:nf] = scanned
    partial_s: list[np.ndarray] = []
    partial_r: list[np.ndarray] = []

    # the blocks, in scan order: each range split into SCAN_BLOCK rows
    starts = np.concatenate([[0], np.cumsum(ranges[:, 1] - ranges[:, 0])]) if len(ranges) else np.zeros(1, int)
    for r in range(len(ranges)):
        for off in range(0, int(ranges[r, 1] - ranges[r, 0]), SCAN_BLOCK):
            sl = slice(int(starts[r]) + off, min(int(starts[r + 1]), int(starts[r]) + off + SCAN_BLOCK))
            tau = np.float32(top.worst)
            rows, p = pos_rows[sl], p_scan[sl]
            keep = ((p + np.minimum(a[nf] * tails[nf][rows], c[nf])) + bb[nf] >= tau) & ~is_seed[sl]
            rows, p = rows[keep], p[keep]
            rest = p.copy() if store.layout.fp16_levels == 0 else np.zeros(len(p), dtype=np.float32)
            stopped = partial_mode and stop == nf - 1
            for l in range(nf, L):
                if stopped or len(rows) == 0:
                    break
                alive[l] += len(rows)
                coords += len(rows) * widths[l]
                d = _dots(store, l, rows, q, use16=True)
                p = p + d
                if l >= store.layout.fp16_levels:
                    rest = rest + d
                if l == L - 1:
                    break
                keep = (p + np.minimum(a[l + 1] * tails[l + 1][rows], c[l + 1])) + bb[l + 1] >= tau
                rows, p, rest = rows[keep], p[keep], rest[keep]
                stopped = partial_mode and l == stop
            if stopped:
                partial_s.append(p)
                partial_r.append(rows)
                continue
            if len(rows) == 0:
                continue
            if store.layout.fp16_levels:
                s = finish_scores(store, rows, q, rest)
                coords += len(rows) * store.layout.fp16_width
            else:
                s = p
            for score, row in zip(s.tolist(), rows.tolist()):
                if not score >= tau:
                    continue
                if top.push(score, row) and top.full and top.worst > tau:
                    tau = np.float32(top.worst)

    cand_s = [seed_exact, np.array([e[0] for e in top.items], dtype=np.float32)]
    cand_r = [seed_rows, np.array([e[1] for e in top.items], dtype=np.int64)]
    if partial_mode and partial_r:
        _, pr = _top(np.concatenate(partial_s), np.concatenate(partial_r), n_rescore)
        cand_s.append(exact_scores(store, pr, q))
        cand_r.append(pr)
        coords += len(pr) * D
    cs, cr = np.concatenate(cand_s), np.concatenate(cand_r)
    _, first = np.unique(cr, return_index=True)
    scores, rows = _top(cs[first], cr[first], k_eff)
    return LevelResult(rows=rows.astype(np.int64), scores=scores.astype(np.float32), coordinates=int(coords),
                       alive_per_level=alive, certified=bound == "exact" and not partial_mode, bound=bound, z=z_used,
                       stop_level=stop, threshold_seed=tau0, scanned=scanned, n_seeds=len(seed_rows), D=D)
