"""The certified-width kernel (adawidth.levels): congruence with the numpy reference, exactness against
brute force, masks, ranges, threads, float16 levels, the two-phase form, storage round trips, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adawidth import levels as lv
from adawidth.levels import LevelLayout, LevelStore, begin, finish, search
from adawidth.levels_reference import reference_search
from adawidth.rotation import pca_rotation

ISAS = ["generic", "avx2", "avx512"]


def grid_corpus(rng, n: int, D: int, decay: float = 4.0) -> np.ndarray:
    """Documents whose entries are multiples of 2^-6 in [-1, 1] with a decaying spectrum: every product and
    every partial sum is exact in float32, so any summation order gives the same bits (and ties are common)."""
    scale = np.exp(-np.arange(D) / (D / decay))
    return np.clip(np.round(rng.standard_normal((n, D)) * scale * 8) / 64, -1, 1).astype(np.float32)


def real_corpus(rng, n: int, D: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows with an embedding-like spectrum and a shared mean direction, PCA-rotated; queries alike."""
    scale = 1.0 / (1.0 + np.arange(D)) ** 0.7
    mean = rng.standard_normal(D) * 0.6 * scale
    X = rng.standard_normal((n, D)) * scale + mean
    Q = rng.standard_normal((24, D)) * scale + mean
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    R = pca_rotation(X)
    return (X @ R.T).astype(np.float32), (Q @ R.T).astype(np.float32)


def brute_top(X: np.ndarray, q: np.ndarray, k: int, allowed=None, ranges=None) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive top-k in float64 over the candidates: (rows, scores), higher score then lower row first."""
    cand = np.arange(len(X)) if ranges is None else np.concatenate([np.arange(s, e) for s, e in ranges] or [[]])
    cand = cand.astype(np.int64)
    if allowed is not None:
        cand = cand[allowed[cand]]
    s = X[cand].astype(np.float64) @ q.astype(np.float64)
    order = np.lexsort((cand, -s))[:k]
    return cand[order], s[order]


def assert_exhaustive(res, X, q, k, allowed=None, ranges=None, tol=2e-6):
    """The result is the exhaustive top-k: the same rows except where float32 rounding can swap near-equal
    scores (within ``tol``), scores equal to float64 inner products within 1e-6, best first."""
    rows, ref_s = brute_top(X, q, k, allowed, ranges)
    assert len(res.rows) == len(rows)
    got64 = X[res.rows].astype(np.float64) @ q.astype(np.float64)
    np.testing.assert_allclose(res.scores, got64, atol=1e-6)
    np.testing.assert_allclose(got64, ref_s, atol=tol)  # the same score at every rank
    assert len(set(res.rows.tolist())) == len(res.rows)
    if len(rows):
        if len(ref_s) == k and k < len(X):  # a near tie at the k-th rank may swap set membership
            all_s = brute_top(X, q, k + 1, allowed, ranges)[1]
            clear = len(all_s) <= k or all_s[k - 1] - all_s[k] > tol
        else:
            clear = True
        if clear:
            assert set(res.rows.tolist()) == set(rows.tolist())
    assert np.all(np.diff(res.scores) <= 0)


@pytest.fixture(autouse=True)
def small_thread_shards():
    """Let the kernel split even these small corpora over threads (it keeps 32,768 rows a thread by default)."""
    old = lv._kernel.set_min_rows_per_thread(1024)
    yield
    lv._kernel.set_min_rows_per_thread(old)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(20260515)


@pytest.fixture(scope="module")
def grid(rng):
    X = grid_corpus(rng, 9000, 48)
    Q = grid_corpus(rng, 6, 48)
    return X, Q


@pytest.fixture(scope="module")
def real(rng):
    return real_corpus(rng, 6000, 64)


GRID_LAYOUTS = [LevelLayout.uniform(48, 8), LevelLayout.from_bounds((0, 5, 16, 17, 30, 48), 2),
                LevelLayout.default(48), LevelLayout((48,)),
                # float16 levels whose widths are multiples of 8: the dense scans' eight-rows-at-a-time kernel
                LevelLayout.from_bounds((0, 8, 24, 32, 48), 3)]


def same_result(a, b) -> bool:
    return (np.array_equal(a.rows, b.rows) and np.array_equal(a.scores, b.scores)
            and np.array_equal(a.alive_per_level, b.alive_per_level) and a.coordinates == b.coordinates)


# ------------------------------------------------------------------------------------------------ congruence


@pytest.mark.parametrize("layout", GRID_LAYOUTS, ids=lambda l: f"{l.widths}-fp16x{l.fp16_levels}")
@pytest.mark.parametrize("bound", lv.BOUNDS)
def test_kernel_equals_the_numpy_reference_bit_for_bit(grid, rng, layout, bound):
    X, Q = grid
    store = LevelStore.build(X, layout)
    masks = [None, rng.random(len(X)) < 0.3]
    for q in Q[:3]:
        for allowed in masks:
            for ranges in (None, [[10, 500], [2000, 7000], [8990, 9000]]):
                for k in (1, 10, 120):
                    for first in sorted({1, layout.exact_first_levels, layout.fp16_levels or layout.L}):
                        kw = dict(bound=bound, z=2.0, allowed=allowed, ranges=ranges, first_levels=first)
                        got, ref = search(store, q, k, **kw), reference_search(store, q, k, **kw)
                        assert same_result(got, ref), (k, allowed is None, ranges, first)
                        assert got.certified == ref.certified == (bound == "exact")
                        assert np.all(got.alive_per_level[:first] == got.scanned)


@pytest.mark.parametrize("isa", ISAS)
def test_every_simd_variant_gives_the_same_bits(grid, isa):
    X, Q = grid
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 5, 16, 17, 30, 48), 2))
    try:
        used = lv._kernel.set_isa(isa)
        for q in Q:
            for bound in lv.BOUNDS:
                kw = dict(bound=bound, z=1.5)
                assert same_result(search(store, q, 10, **kw), reference_search(store, q, 10, **kw))
    finally:
        lv._kernel.set_isa("auto")
    assert used in ISAS


def test_stop_level_rescores_the_best_partial_scores(grid):
    X, Q = grid
    store = LevelStore.build(X, LevelLayout.uniform(48, 8, fp16_levels=2))
    for q in Q:
        for stop in range(store.layout.L - 1):
            got = search(store, q, 10, stop_level=stop, rescore=40)
            assert same_result(got, reference_search(store, q, 10, stop_level=stop, rescore=40))
            assert not got.certified and got.stop_level == stop
            np.testing.assert_array_equal(got.scores, (X[got.rows].astype(np.float64) @ q).astype(np.float32))
        with pytest.raises(ValueError, match="stop_level"):
            search(store, q, 10, first_levels=2, stop_level=0)
        assert same_result(search(store, q, 10, first_levels=2, stop_level=1, rescore=40),
                           reference_search(store, q, 10, first_levels=2, stop_level=1, rescore=40))
        # rescoring every survivor of the first prune is the exhaustive answer again
        full = search(store, q, 10, stop_level=0, rescore=len(X))
        assert_exhaustive(full, X, q, 10)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), k=st.integers(1, 40), seed=st.integers(0, 2 ** 16), fp16=st.integers(0, 3),
       density=st.sampled_from([0.0, 0.05, 0.5, 1.0]), bound=st.sampled_from(lv.BOUNDS),
       widths=st.sampled_from([(8, 8, 8), (1, 23), (24,), (3, 5, 7, 9)]))
def test_random_shapes_agree_with_the_reference_and_brute_force(n, k, seed, fp16, density, bound, widths):
    r = np.random.default_rng(seed)
    D = sum(widths)
    X = grid_corpus(r, n, D)
    X[r.random(n) < 0.2] = X[0]  # exact duplicates: ties that only the row order breaks
    q = grid_corpus(r, 1, D)[0]
    allowed = r.random(n) < density if density < 1 else None
    layout = LevelLayout(widths, min(fp16, len(widths)))
    store = LevelStore.build(X, layout)
    got = search(store, q, k, bound=bound, z=1.0, allowed=allowed)
    assert same_result(got, reference_search(store, q, k, bound=bound, z=1.0, allowed=allowed))
    n_allowed = n if allowed is None else int(allowed.sum())
    assert len(got.rows) == min(k, n_allowed)
    if bound == "exact":
        rows, scores = brute_top(X, q, k, allowed)
        np.testing.assert_array_equal(got.rows, rows)  # grid data: float32 is exact, ties go to the lower row
        np.testing.assert_array_equal(got.scores, scores.astype(np.float32))


# ------------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("fp16_levels", [0, 3])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("first_levels", [1, 2, 3])
def test_exact_mode_is_the_exhaustive_top_k(real, fp16_levels, threads, first_levels):
    X, Q = real
    layout = LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), fp16_levels)
    store = LevelStore.build(X, layout)
    for q in Q:
        for k in (1, 10, 50):
            res = search(store, q, k, threads=threads, first_levels=first_levels)
            assert res.certified and res.bound == "exact" and res.z is None
            assert_exhaustive(res, X, q, k)
            assert res.coordinates < len(X) * X.shape[1]  # pruning happened on a PCA-rotated corpus


def test_threads_do_not_change_the_exact_answer(real):
    X, Q = real
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 3))
    for q in Q:
        one, two = search(store, q, 10, threads=1), search(store, q, 10, threads=2)
        np.testing.assert_array_equal(one.rows, two.rows)
        np.testing.assert_array_equal(one.scores, two.scores)


def test_float16_levels_return_the_float32_ranking_and_scores(real):
    X, Q = real
    bounds = (0, 12, 16, 24, 32, 48, 64)
    s32 = LevelStore.build(X, LevelLayout.from_bounds(bounds, 0))
    s16 = LevelStore.build(X, LevelLayout.from_bounds(bounds, 4))
    assert 0 < s16.fp16_residual_max <= 2.0 ** -11 * 1.0001 + 2.0 ** -14 * np.sqrt(32)
    for q in Q:
        a, b = search(s32, q, 10), search(s16, q, 10)
        np.testing.assert_array_equal(a.rows, b.rows)
        # float32 both, summed in another order (the float16 levels' float32 dots come last)
        np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=4 * np.finfo(np.float32).eps)


def test_float16_cannot_hide_a_better_near_duplicate():
    """Two documents whose float16 copies are identical: the float32 rescoring must rank them correctly."""
    rng = np.random.default_rng(3)
    D = 32
    X = rng.standard_normal((3000, D)).astype(np.float32) * np.exp(-np.arange(D) / 6)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    q = X[17].copy()
    twin = X[17].copy()
    twin[0] *= np.float32(1 + 2.0 ** -14)  # a better score by ~q_0^2 2^-14, below float16's resolution
    X = np.vstack([X, twin[None]]).astype(np.float32)
    assert np.float16(X[17, 0]) == np.float16(X[-1, 0]) and np.float32(X[-1] @ q) > np.float32(X[17] @ q)
    store = LevelStore.build(X, LevelLayout.uniform(D, 8, fp16_levels=4))
    res = search(store, q, 2)
    assert res.rows.tolist() == [len(X) - 1, 17]
    assert res.scores[0] > res.scores[1]
    np.testing.assert_allclose(res.scores, [X[-1] @ q, X[17] @ q], atol=1e-6)
    fp32 = search(LevelStore.build(X, LevelLayout.uniform(D, 8)), q, 2)
    np.testing.assert_array_equal(res.rows, fp32.rows)
    np.testing.assert_allclose(res.scores, fp32.scores, rtol=0, atol=4 * np.finfo(np.float32).eps)


def test_flushed_tiny_values_are_covered_by_the_bound():
    """Values below 2^-14 become 0 in the float16 copy.  Here they are all that separates the documents (the
    first coordinate is 1 everywhere), so every float16 partial score ties; the stored residual must keep the
    true top-k alive and the float32 rescoring must rank it."""
    rng = np.random.default_rng(5)
    X = np.clip(rng.standard_normal((5000, 16)) * 1.5e-5, -5e-5, 5e-5).astype(np.float32)  # < 2^-14: flushed
    X[:, 0] = 1.0
    q = rng.standard_normal(16).astype(np.float32)
    q[0] = 1.0
    store = LevelStore.build(X, LevelLayout.uniform(16, 4, fp16_levels=4))
    assert np.all(store.levels16[1] == 0)
    assert store.fp16_residual_max >= float(np.linalg.norm(X[:, 1:], axis=1).max())
    fp32 = LevelStore.build(X, LevelLayout.uniform(16, 4))
    for k in (1, 10):
        res = search(store, q, k)
        np.testing.assert_array_equal(res.rows, search(fp32, q, k).rows)
        assert_exhaustive(res, X, q, k)


def test_ties_go_to_the_lower_row(rng):
    X = np.repeat(grid_corpus(rng, 40, 24), 50, axis=0)  # every document 50 times
    q = grid_corpus(rng, 1, 24)[0]
    store = LevelStore.build(X, LevelLayout.uniform(24, 8, fp16_levels=1))
    for threads in (1, 2):
        res = search(store, q, 75, threads=threads)
        rows, scores = brute_top(X, q, 75)
        np.testing.assert_array_equal(res.rows, rows)
        np.testing.assert_array_equal(res.scores, scores.astype(np.float32))


# ------------------------------------------------------------------------------------------------ filters, ranges


def test_allowed_masks_and_ranges(real, rng):
    X, Q = real
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 2))
    N = len(X)
    for q in Q[:8]:
        for allowed in (rng.random(N) < 0.5, rng.random(N) < 0.002, np.zeros(N, bool), np.ones(N, bool)):
            for ranges in (None, [[0, 100], [4000, 6000]], [[3, 3]], []):
                for threads in (1, 2):
                    res = search(store, q, 10, allowed=allowed, ranges=ranges, threads=threads)
                    assert_exhaustive(res, X, q, 10, allowed, ranges)
                    assert all(allowed[r] for r in res.rows)


def test_k_larger_than_the_corpus_or_the_allowed_set(real):
    X, Q = real
    store = LevelStore.build(X[:50], LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 1))
    q = Q[0]
    res = search(store, q, 500)
    assert len(res.rows) == 50 and res.certified
    assert_exhaustive(res, X[:50], q, 500)
    allowed = np.zeros(50, bool)
    allowed[[3, 7, 11]] = True
    res = search(store, q, 10, allowed=allowed)
    assert sorted(res.rows.tolist()) == [3, 7, 11]
    empty = search(store, q, 10, allowed=np.zeros(50, bool))
    assert len(empty.rows) == 0 and empty.rows.dtype == np.int64 and empty.scores.dtype == np.float32
    assert empty.coordinates == 0 and empty.alive_per_level[0] == 0


def test_an_empty_store_answers_empty():
    store = LevelStore.build(np.zeros((0, 16), np.float32), LevelLayout.uniform(16, 8))
    res = search(store, np.ones(16, np.float32), 5)
    assert len(res.rows) == 0 and store.N == 0


# ------------------------------------------------------------------------------------------------ data-aware


def test_data_aware_bounds_do_less_work_than_the_exact_bound(real):
    X, Q = real
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 3))
    for q in Q:
        exact = search(store, q, 10)
        for bound in ("data_aware", "data_aware_doc"):
            for z in (2.0, 4.0):
                res = search(store, q, 10, bound=bound, z=z)
                assert not res.certified and res.z == z and res.bound == bound
                assert res.coordinates <= exact.coordinates
                # whatever it returns is exactly scored, best first
                np.testing.assert_allclose(res.scores, X[res.rows].astype(np.float64) @ q, atol=1e-6)
                assert np.all(np.diff(res.scores) <= 0)


def test_a_huge_confidence_recovers_the_exact_answer(real):
    X, Q = real
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 0))
    for q in Q[:6]:
        for bound in ("data_aware", "data_aware_doc"):
            res = search(store, q, 10, bound=bound, z=1e4)
            assert_exhaustive(res, X, q, 10)


# ------------------------------------------------------------------------------------------------ two phases


def test_search_is_begin_then_finish_and_a_state_can_be_finished_twice(real):
    X, Q = real
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 3))
    q = Q[2]
    state = begin(store, q, 10)
    p_before = state.p_scan.copy()
    a = finish(state, bound="data_aware", z=3.0)
    b = finish(state, bound="data_aware", z=3.0)
    c = finish(state)
    np.testing.assert_array_equal(state.p_scan, p_before)
    assert same_result(a, b)
    assert same_result(c, search(store, q, 10))
    ev = state.evidence
    L = store.layout.L
    assert ev.query_tail_sqnorm.shape == (L + 1,) and ev.spread.shape == (L + 1,)
    assert ev.query_tail_sqnorm[0] == pytest.approx(float(q.astype(np.float64) @ q), rel=1e-9)
    assert ev.query_tail_sqnorm[-1] == 0 and np.all(np.diff(ev.query_tail_sqnorm) <= 0)
    assert np.all(np.diff(ev.survivors_at_z) >= 0)  # a wider margin keeps more documents
    assert ev.threshold == pytest.approx(float(np.sort(ev.seed_exact)[::-1][9]))
    assert ev.scanned == len(X) and len(ev.partial_top) == lv.default_seeds(10)
    assert np.all(np.diff(ev.partial_top) <= 0)
    p_exact = X[:, :12].astype(np.float64) @ q[:12]
    np.testing.assert_allclose(state.p_scan, p_exact, atol=5e-3)  # level 0 is read in float16 here
    f = ev.features(10)
    assert all(isinstance(v, float) for v in f.values()) and f["threshold"] == ev.threshold
    trace = c.trace()
    assert trace["certified"] is True and trace["coordinates_scored"] == c.coordinates


def test_coordinates_count_every_multiply_add(grid):
    X, Q = grid
    layout = LevelLayout.uniform(48, 8)
    store = LevelStore.build(X, layout)
    res = search(store, Q[0], 10, seeds=32)
    widths = np.array(layout.widths)
    assert res.coordinates == int(res.alive_per_level @ widths) + 32 * 48
    assert res.coordinate_share == pytest.approx(res.coordinates / (len(X) * 48))


# ------------------------------------------------------------------------------------------------ storage


def test_arrays_round_trip_through_memory_mapped_files(real, tmp_path):
    X, Q = real
    store = LevelStore.build(X, LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 3))
    for name, arr in store.arrays().items():
        np.save(tmp_path / f"{name}.npy", arr)
    mapped = {p.stem: np.load(p, mmap_mode="r") for p in tmp_path.glob("*.npy")}
    loaded = LevelStore.from_arrays(mapped)
    assert loaded.layout == store.layout and loaded.N == store.N and loaded.D == store.D
    assert isinstance(loaded.levels32[0], np.memmap) and isinstance(loaded.tail_norms, np.memmap)
    assert loaded.levels16[0] is mapped["level16_00"]  # used in place, not copied
    for q in Q[:5]:
        assert same_result(search(store, q, 10), search(loaded, q, 10))


def test_from_arrays_refuses_incomplete_or_wrong_arrays(real):
    X, _ = real
    arrays = LevelStore.build(X[:100], LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 1)).arrays()
    for key in ("bounds", "level32_02", "level16_00", "tail_norms"):
        broken = dict(arrays)
        del broken[key]
        with pytest.raises(ValueError, match="missing"):
            LevelStore.from_arrays(broken)
    with pytest.raises(ValueError, match="float32"):
        LevelStore.from_arrays({**arrays, "level32_01": arrays["level32_01"].astype(np.float64)})
    with pytest.raises(ValueError, match="shape"):
        LevelStore.from_arrays({**arrays, "tail_norms": arrays["tail_norms"][:, :50].copy()})
    with pytest.raises(ValueError, match="C-contiguous"):
        LevelStore.from_arrays({**arrays, "level32_00": np.asfortranarray(arrays["level32_00"])})


# ------------------------------------------------------------------------------------------------ bad input


def test_layout_validation():
    assert LevelLayout.default(384).bounds == (0, 32, 64, 96, 128, 192, 256, 384)
    assert LevelLayout.default(384).fp16_width == 96
    assert LevelLayout.default(384).exact_first_levels == 2
    assert LevelLayout.uniform(384, 16).exact_first_levels == 4
    assert LevelLayout.uniform(384, 16, fp16_levels=2).exact_first_levels == 2
    assert LevelLayout((384,)).exact_first_levels == 1
    assert LevelLayout.uniform(50, 16).widths == (16, 16, 16, 2)
    for bad in (dict(widths=()), dict(widths=(0, 4)), dict(widths=(4,), fp16_levels=2), dict(widths=(1,) * 65)):
        with pytest.raises(ValueError):
            LevelLayout(**bad)
    with pytest.raises(ValueError):
        LevelLayout.from_bounds((0, 8, 8, 16))
    with pytest.raises(ValueError):
        LevelLayout.from_bounds((1, 8))


def test_bad_inputs_raise_clear_value_errors(real):
    X, Q = real
    store = LevelStore.build(X[:200], LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 1))
    q = Q[0]
    cases = [
        (dict(query=q[:10]), "shape"),
        (dict(query=q[None]), "shape"),
        (dict(query=np.array(["a"] * 64)), "numeric"),
        (dict(query=np.where(np.arange(64) == 3, np.nan, q)), "non-finite"),
        (dict(k=0), "k must be"),
        (dict(k=2.5), "k must be an integer"),
        (dict(k=True), "k must be an integer"),
        (dict(threads=0), "threads"),
        (dict(allowed=np.ones(199, bool)), "allowed"),
        (dict(allowed=np.ones(200, np.int8)), "allowed"),
        (dict(ranges=[[5, 2]]), "ranges"),
        (dict(ranges=[[0, 300]]), "ranges"),
        (dict(ranges=[[10, 20], [15, 30]]), "ranges"),
        (dict(ranges=[[50, 60], [0, 10]]), "ranges"),
        (dict(ranges=[[0.5, 3]]), "ranges"),
        (dict(ranges=[1, 2, 3]), "ranges"),
        (dict(bound="cauchy"), "bound"),
        (dict(bound="data_aware", z=-1.0), "z must be"),
        (dict(bound="data_aware", z=float("nan")), "z must be"),
        (dict(bound="data_aware", z="4"), "z must be"),
        (dict(stop_level=6), "stop_level"),
        (dict(stop_level=-1), "stop_level"),
        (dict(stop_level=2, rescore=3), "rescore"),
        (dict(first_levels=0), "first_levels"),
        (dict(first_levels=2), "first_levels"),  # beyond the float16 levels
        (dict(first_levels=1, stop_level=0, rescore=9), "rescore"),
        (dict(seeds=-1), "seeds"),
    ]
    for kw, message in cases:
        args = dict(query=q, k=10)
        args.update(kw)
        query, k = args.pop("query"), args.pop("k")
        with pytest.raises(ValueError, match=message):
            search(store, query, k, **args)
    # the finiteness check is a float64 sum, which cannot overflow: a huge finite query is still served (its inner
    # products are finite in float32), an infinite one is refused
    big = np.where(np.arange(64) == 3, 1e20, 0.0).astype(np.float32)
    assert search(store, big, 5).rows.tolist() == np.argsort(-(store.levels32[0][:, 3]), kind="stable")[:5].tolist()
    with pytest.raises(ValueError, match="non-finite"):
        search(store, np.where(np.arange(64) == 3, np.inf, q).astype(np.float32), 10)


def test_build_refuses_bad_corpora():
    with pytest.raises(ValueError, match="2-D float"):
        LevelStore.build(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="2-D float"):
        LevelStore.build(np.zeros((4, 8), np.int32), LevelLayout.uniform(8, 4))
    with pytest.raises(ValueError, match="non-finite"):
        LevelStore.build(np.full((4, 8), np.inf, np.float32), LevelLayout.uniform(8, 4))
    with pytest.raises(ValueError, match="coordinates"):
        LevelStore.build(np.zeros((4, 8), np.float32), LevelLayout.uniform(16, 4))
    with pytest.raises(ValueError, match="float16"):
        LevelStore.build(np.full((4, 8), 1e6, np.float32), LevelLayout.uniform(8, 4, fp16_levels=1))


def test_the_kernel_checks_its_buffers(real):
    X, Q = real
    store = LevelStore.build(X[:100], LevelLayout.from_bounds((0, 12, 16, 24, 32, 48, 64), 0))
    args = lv._store_args(store, Q[0], None, np.array([[0, 100]], np.int64))
    out = [np.empty(100, np.float32), np.empty(4, np.int64), np.empty(4, np.float32), np.empty(4, np.float32)]
    with pytest.raises(ValueError, match="at least"):
        lv._kernel.scan_first(*args, 1, 4, 1, np.empty(10, np.float32), *out[1:])
    with pytest.raises(ValueError, match="bytes"):
        lv._kernel.scan_first(*args, 1, 4, 1, np.empty(100, np.float64), *out[1:])
    with pytest.raises(ValueError, match="n_first"):
        lv._kernel.scan_first(*args, 7, 4, 1, *out)
    bad_ranges = lv._store_args(store, Q[0], None, np.array([[0, 500]], np.int64))
    with pytest.raises(ValueError, match="ranges"):
        lv._kernel.scan_first(*bad_ranges, 1, 4, 1, *out)
    assert lv._kernel.BLOCK == lv.SCAN_BLOCK


@pytest.mark.parametrize("allowed_rows", [[], [7]])
def test_the_recall_policy_answers_a_search_that_allows_almost_nothing(allowed_rows):
    """A restriction that leaves no (or one) document (a phrase matching only a deleted document) gives the
    recall policy no seeds: its evidence is NaN there, and the search answers the allowed rows (it used to raise
    IndexError, a 500)."""
    from engine.index import IndexVersion
    from engine.pipeline import Pipeline
    from engine.plan import SearchSpec
    from engine.recall import RecallPolicy
    from trainer.recall_fit import fit_recall_policy, recall_table

    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 64)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = rng.standard_normal((50, 64)).astype(np.float32)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    store = LevelStore.build(X)
    table = recall_table(store, Q[:40], k=10, bound="data_aware_doc")
    booster, oof = fit_recall_policy(table)
    policy = RecallPolicy(booster, table.feature_names, table.z_grid, "data_aware_doc", oof, table.recall, k=10)
    v = IndexVersion.in_memory(X, np.eye(64, dtype=np.float32), [f"d{i}" for i in range(3000)], levels=store,
                               recall_policy=policy)
    allowed = np.zeros(3000, bool)
    allowed[allowed_rows] = True
    r = Pipeline().search(v, [SearchSpec("q", k=10, recall_target=0.99)], embeddings=Q[45:46], allowed=allowed)[0]
    assert r.rows.tolist() == allowed_rows and r.trace["policy"] == "recall"
    ev = begin(store, Q[45], 10, allowed=allowed).evidence
    f = ev.features(10)
    assert len(f) == len(table.feature_names) and (np.isnan(f["partial_last"]) == (not allowed_rows))


# ------------------------------------------------------------------------------------------------ the fused search


@pytest.fixture(scope="module")
def real_policy(real):
    """A recall policy fitted on 16 of the ``real`` corpus' queries (the other 8 are held out)."""
    from engine.recall import RecallPolicy
    from trainer.recall_fit import fit_recall_policy, recall_table

    X, Q = real
    store = LevelStore.build(X)
    table = recall_table(store, Q[:16], k=10, bound="data_aware_doc")
    booster, oof = fit_recall_policy(table)
    return store, RecallPolicy(booster, table.feature_names, table.z_grid, "data_aware_doc", oof, table.recall, k=10)


@pytest.mark.parametrize("target", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("threads", [1, 3])
def test_fused_search_is_begin_choose_finish_bit_for_bit(real, real_policy, target, threads):
    """One compiled call gives what the two-call path gives with the policy's choice in between: the same z, rows,
    scores, work, survivors per level and evidence features, to the last bit (the kernel computes the query
    profile, the features and the bound for both).  With several threads the first pass, the evidence and the
    choice are still the same bits; the pruning scan shares its rising threshold between threads, so a data-aware
    bound may keep other near-threshold rows from run to run (as two finish calls may)."""
    X, Q = real
    store, policy = real_policy
    model = policy.confidence_model(target, store.layout.L)
    assert model is not None
    chosen = set()
    for q in Q:
        state = begin(store, q, 10, threads=threads)
        bound, z = policy.choose(state.evidence, target)
        two = finish(state, bound=bound, z=z)
        one = lv.fused_search(store, q, 10, bound=bound, model=model, threads=threads, features=True)
        assert one.z == two.z == z and one.bound == bound and one.threshold_seed == two.threshold_seed
        np.testing.assert_array_equal(one.features, state.evidence.feature_array(10))
        if threads == 1:
            assert same_result(one, two)
        assert one.first_coordinates == state.coordinates and one.certified is False
        chosen.add(z)
    assert chosen <= set(policy.z_grid.tolist())


@pytest.mark.parametrize("layout", GRID_LAYOUTS, ids=lambda l: f"{l.widths}-fp16x{l.fp16_levels}")
def test_fused_search_at_a_fixed_confidence_and_exact_equals_the_reference(grid, layout):
    X, Q = grid
    store = LevelStore.build(X, layout)
    for q in Q[:3]:
        for bound, z in (("exact", None), ("data_aware", 2.0), ("data_aware_doc", 1.5)):
            one = lv.fused_search(store, q, 10, bound=bound, z=z)
            assert same_result(one, search(store, q, 10, bound=bound, z=z))
            assert same_result(one, reference_search(store, q, 10, bound=bound, z=z))
            assert one.certified == (bound == "exact") and one.z == z


def test_fused_search_masks_ranges_and_small_allowed_sets(real, real_policy):
    X, Q = real
    store, policy = real_policy
    model = policy.confidence_model(0.99, store.layout.L)
    rng = np.random.default_rng(3)
    allowed = rng.random(len(X)) < 0.3
    ranges = np.array([[100, 2000], [3000, 5990]])
    for kwargs in ({"allowed": allowed}, {"ranges": ranges}, {"allowed": allowed, "ranges": ranges}):
        res = lv.fused_search(store, Q[20], 10, **kwargs)
        assert_exhaustive(res, X, Q[20], 10, kwargs.get("allowed"), kwargs.get("ranges"))
        res = lv.fused_search(store, Q[20], 10, bound="data_aware_doc", model=model, **kwargs)
        two = begin(store, Q[20], 10, **kwargs)
        assert same_result(res, finish(two, **dict(zip(("bound", "z"), policy.choose(two.evidence, 0.99)))))
    for rows in ([], [7]):  # no seeds: NaN evidence, and the allowed rows come back
        only = np.zeros(len(X), bool)
        only[rows] = True
        res = lv.fused_search(store, Q[20], 10, bound="data_aware_doc", model=model, allowed=only, features=True)
        assert res.rows.tolist() == rows and np.isnan(res.features[0])


def test_fused_search_rejects_bad_arguments(real, real_policy):
    X, Q = real
    store, policy = real_policy
    model = policy.confidence_model(0.99, store.layout.L)
    with pytest.raises(ValueError, match="exact bound takes no confidence model"):
        lv.fused_search(store, Q[0], 10, model=model)
    with pytest.raises(ValueError, match="z must be"):
        lv.fused_search(store, Q[0], 10, bound="data_aware", z=float("nan"))
    with pytest.raises(ValueError, match="bound must be"):
        lv.fused_search(store, Q[0], 10, bound="cosine")
    with pytest.raises(ValueError, match="query"):
        lv.fused_search(store, Q[0][:10], 10)
    broken = lv.ConfidenceModel(model.forest, np.full_like(model.colmap, 10_000), model.z_grid, model.bar)
    with pytest.raises(ValueError, match="colmap"):
        lv.fused_search(store, Q[0], 10, bound="data_aware_doc", model=broken)
    f = model.forest
    bad_forest = type(f)(f.feature, f.threshold, f.left, f.right, f.flags, f.roots + 10**6, f.leaves, f.n_features,
                         f.feature_names)
    with pytest.raises(ValueError, match="malformed forest"):
        lv.fused_search(store, Q[0], 10, bound="data_aware_doc",
                        model=lv.ConfidenceModel(bad_forest, model.colmap, model.z_grid, model.bar))
    with pytest.raises(ValueError, match="'z'"):
        lv.ConfidenceModel.for_model(f, list(policy.feature_names) + ["not_z"], store.layout.L, policy.z_grid, 0.9)
    assert policy.confidence_model(1.0, store.layout.L) is None  # target 1: the exact bound serves


@pytest.mark.parametrize("k", [10, 50])
def test_a_served_recall_request_prunes_at_any_k(real, real_policy, k):
    """Through the pipeline, a declared-recall request of any k seeds its threshold with enough documents (a
    policy calibrated at k = 10 once seeded a k = 50 request with 20: no first threshold, more work than the
    exact mode) and meets its target against the exhaustive top-k."""
    from engine.index import IndexVersion
    from engine.pipeline import Pipeline
    from engine.plan import SearchSpec

    X, Q = real
    store, policy = real_policy
    v = IndexVersion.in_memory(X, np.eye(X.shape[1], dtype=np.float32), [f"d{i}" for i in range(len(X))],
                               levels=store, recall_policy=policy)
    v.level_scan_min_docs = 0
    pipe = Pipeline()
    recall, work = [], []
    for q in Q[16:]:
        auto = pipe.search(v, [SearchSpec("q", k=k, recall_target=0.99)], embeddings=q[None, :])[0]
        full = pipe.search(v, [SearchSpec("q", k=k, width="full")], embeddings=q[None, :])[0]
        recall.append(len(set(auto.rows.tolist()) & set(full.rows.tolist())) / k)
        work.append(auto.trace["coordinates_scored"] / full.trace["coordinates_scored"])
    assert np.mean(recall) >= 0.95 and np.mean(work) < 0.8, (np.mean(recall), np.mean(work))
    assert policy.seeds_for(k) == lv.default_seeds(k) >= 2 * k


def test_width_full_takes_the_flat_scan_for_deep_requests_on_small_corpora(real, real_policy):
    """From LEVEL_SCAN_MIN_DOCS documents width full is the level scan at k = 10; a deeper request needs a
    larger corpus before the level scan pays (engine.stages.stage1.flat_is_faster).  Both are exact."""
    from engine.index import IndexVersion
    from engine.pipeline import Pipeline
    from engine.plan import SearchSpec

    X, Q = real
    store, policy = real_policy
    v = IndexVersion.in_memory(X, np.eye(X.shape[1], dtype=np.float32), [f"d{i}" for i in range(len(X))],
                               levels=store, recall_policy=policy)
    v.level_scan_min_docs = 5_000  # 6,000 documents: the level scan at k = 10, the flat scan at k = 100
    for k, backend in ((10, "levels"), (100, "flat")):
        r = Pipeline().search(v, [SearchSpec("q", k=k, width="full")], embeddings=Q[3][None, :])[0]
        assert r.trace["stage1_backend"] == backend and r.trace["certified"]
        assert_exhaustive(r, X, Q[3], k)
