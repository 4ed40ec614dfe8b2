/*
 * adawidth._levelscan: the compiled level-by-level pruning scan behind adawidth.levels.
 *
 * The rotated corpus is stored level-major: level l is one row-major (N, w_l) float32 array (and, for the
 * first L16 levels, a float16 copy).  A query is scanned in two calls:
 *
 *   scan_first  the first level(s) over every candidate row (fused top-n_seed heap on the partial scores), then the
 *               exact full-width scores of the n_seed best partial scores (the seeds, which give the first
 *               threshold: the k-th best exact seed score is a lower bound on the final k-th best score);
 *   scan_rest   block by block: drop a row as soon as partial + bound(tail) < threshold, add the next level
 *               for the survivors, give the rows that reach the last level their exact score (fused top-k
 *               heap, which raises the threshold).
 *
 * The bound at level boundary b is  min(a[b] * tail_norm[b][row], c[b]) + bb[b]; the caller (adawidth/levels.py)
 * chooses a, c and bb: Cauchy-Schwarz a = ||q[b:]||, c = inf (exact); the data-aware bound c = z sqrt(sum_{j>=b}
 * q_j^2 E[d_j^2]) (never looser than Cauchy-Schwarz); its document-aware variant a = min(||q[b:]||,
 * z sqrt(...) / rms(b)).  bb holds the rounding slack (and the float16 error).
 * Source: Panorama, arXiv 2510.00566 (level-major storage, Cauchy-Schwarz pruning); the data-aware bound is
 * this project's (FINDINGS.md, Turn 2).
 *
 * Exact scores are float32 sums over the float32 levels computed by one rule: the levels without a float16
 * copy first (s = 0; s += <q_l, d_l> for l = L16..L-1), then the float32 dots of the float16 levels
 * (s += <q_l, d_l> for l = 0..L16-1).  The first part is the running sum the scan keeps anyway, so a survivor
 * is rescored over the float16 levels only, and a row gets the same score whichever path scores it.  Ties: higher score
 * first, then lower row.  The GIL is released while scanning; a query can be sharded over `threads`
 * pthreads (shared threshold, merged heaps).  SIMD: AVX-512F or AVX2+FMA+F16C chosen at import time on
 * x86-64, portable C elsewhere; with either, every dot product runs eight rows at a time in AVX2 instructions
 * (dot32_x8, rows16x8_avx2), each row with its own fixed reduction tree.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_forest_eval.h"

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(LV_PORTABLE_ONLY)
#include <immintrin.h>
#define LV_X86 1
#else
#define LV_X86 0
#endif

#define MAX_LEVELS 64
#define MAX_THREADS 256
#define BLOCK 2048       /* rows per block of scan_rest (its per-thread buffers stay in L1/L2) */
#define BLOCK_FIRST 4096 /* rows per block of scan_first */
static int64_t MIN_ROWS_PER_THREAD = 32768; /* set_min_rows_per_thread changes it (tests) */

/* ------------------------------------------------------------------------------------------------ SIMD */

#define PREFETCH_ROWS 32 /* how many rows ahead a sparse (gathered) scan prefetches */

/* out[i] = <X[row_i, :w], q[:w]> where row_i = rows[i] (sparse) or start + i (rows == NULL, dense). */
typedef void (*dot_fn)(const void *X, int64_t w, const int32_t *rows, int64_t start, int64_t n,
                       const float *q, float *out);

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else { /* subnormal: m * 2^-24 is exact in float32 */
            float v = (float)m * 5.9604644775390625e-8f;
            return sign ? -v : v;
        }
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Portable versions: eight independent lanes (vectorisable without reassociation), fixed reduction order. */
#define DEFINE_ROW_DOT_GENERIC(NAME, T, SCALAR)                                                               \
    static inline float NAME(const T *x, const float *q, int64_t w) {                                          \
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                               \
        int64_t j = 0;                                                                                          \
        for (; j + 8 <= w; j += 8)                                                                              \
            for (int t = 0; t < 8; t++) acc[t] += SCALAR(x[j + t]) * q[j + t];                                  \
        float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));           \
        for (; j < w; j++) s += SCALAR(x[j]) * q[j];                                                            \
        return s;                                                                                               \
    }
#define AS_FLOAT(v) (v)
DEFINE_ROW_DOT_GENERIC(row_dot32_generic, float, AS_FLOAT)
DEFINE_ROW_DOT_GENERIC(row_dot16_generic, uint16_t, half_to_float)

/* The row loops around a row kernel: dense rows start..start+n-1, or gathered rows (prefetched ahead). */
#define DEFINE_DOT_LOOP(NAME, TARGET, T, ROW_DOT)                                                              \
    TARGET static void NAME(const void *X_, int64_t w, const int32_t *rows, int64_t start, int64_t n,            \
                            const float *q, float *out) {                                                        \
        const T *X = (const T *)X_;                                                                              \
        if (!rows) {                                                                                             \
            for (int64_t i = 0; i < n; i++) out[i] = ROW_DOT(X + (start + i) * w, q, w);                         \
            return;                                                                                              \
        }                                                                                                        \
        for (int64_t i = 0; i < n && i < PREFETCH_ROWS; i++) { /* the first rows too, not only those ahead */  \
            const char *p = (const char *)(X + (int64_t)rows[i] * w);                                            \
            for (int64_t b = 0; b < w * (int64_t)sizeof(T); b += 64) __builtin_prefetch(p + b);                  \
        }                                                                                                        \
        for (int64_t i = 0; i < n; i++) {                                                                        \
            if (i + PREFETCH_ROWS < n) {                                                                         \
                const char *p = (const char *)(X + (int64_t)rows[i + PREFETCH_ROWS] * w);                        \
                for (int64_t b = 0; b < w * (int64_t)sizeof(T); b += 64) __builtin_prefetch(p + b);              \
            }                                                                                                    \
            out[i] = ROW_DOT(X + (int64_t)rows[i] * w, q, w);                                                    \
        }                                                                                                        \
    }

#define NO_TARGET
DEFINE_DOT_LOOP(dot32_generic, NO_TARGET, float, row_dot32_generic)
DEFINE_DOT_LOOP(dot16_generic, NO_TARGET, uint16_t, row_dot16_generic)

#if LV_X86
/* ---- AVX2 + FMA + F16C: 8 lanes, two accumulators ---- */
__attribute__((target("avx2,fma,f16c"))) static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

/* The two-accumulator FMA loop over w elements from j: whole pairs of vectors, then one more vector when it
 * fits; leaves j at the first element not yet accumulated (the caller adds the scalar tail). */
#define SIMD_ACCUMULATE(LANES, FMA, LOADQ, LOAD, x, q, w, j, a0, a1)                                             \
    do {                                                                                                        \
        for (; (j) + 2 * (LANES) <= (w); (j) += 2 * (LANES)) {                                                  \
            a0 = FMA(LOAD(x, j), LOADQ((q) + (j)), a0);                                                         \
            a1 = FMA(LOAD(x, (j) + (LANES)), LOADQ((q) + (j) + (LANES)), a1);                                   \
        }                                                                                                       \
        if ((j) + (LANES) <= (w)) {                                                                             \
            a0 = FMA(LOAD(x, j), LOADQ((q) + (j)), a0);                                                         \
            (j) += (LANES);                                                                                     \
        }                                                                                                       \
    } while (0)

/* One SIMD row kernel a width: LANES lanes, two accumulators, a fixed reduction order.  LOAD(x, j) loads
 * LANES elements of the row as floats (float32 as is, float16 converted); SCALAR(v) converts one element. */
#define DEFINE_ROW_DOT(NAME, TARGET, T, VEC, LANES, ZERO, FMA, LOADQ, LOAD, HSUM, SCALAR)                        \
    TARGET static inline float NAME(const T *x, const float *q, int64_t w) {                                    \
        VEC a0 = ZERO(), a1 = ZERO();                                                                           \
        int64_t j = 0;                                                                                          \
        SIMD_ACCUMULATE(LANES, FMA, LOADQ, LOAD, x, q, w, j, a0, a1);                                           \
        float s = HSUM(a0, a1);                                                                                 \
        for (; j < w; j++) s += SCALAR(x[j]) * q[j];                                                            \
        return s;                                                                                               \
    }

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define LOAD_F32_AVX2(x, j) _mm256_loadu_ps((x) + (j))
#define LOAD_F16_AVX2(x, j) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((x) + (j))))
#define HSUM_AVX2(a0, a1) hsum256(_mm256_add_ps(a0, a1))
/* The four kernels of one instruction set: the float32 and float16 row dots and their loops over rows. */
#define DEFINE_ISA(ISA, TARGET, VEC, LANES, ZERO, FMA, LOADQ, LOAD32, LOAD16, HSUM)                               \
    DEFINE_ROW_DOT(row_dot32_##ISA, TARGET, float, VEC, LANES, ZERO, FMA, LOADQ, LOAD32, HSUM, AS_FLOAT)         \
    DEFINE_ROW_DOT(row_dot16_##ISA, TARGET, uint16_t, VEC, LANES, ZERO, FMA, LOADQ, LOAD16, HSUM, half_to_float) \
    DEFINE_DOT_LOOP(dot32_##ISA, TARGET, float, row_dot32_##ISA)                                                 \
    DEFINE_DOT_LOOP(dot16_##ISA, TARGET, uint16_t, row_dot16_##ISA)

DEFINE_ISA(avx2, AVX2, __m256, 8, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_loadu_ps, LOAD_F32_AVX2, LOAD_F16_AVX2,
           HSUM_AVX2)

/* ---- AVX-512F: 16 lanes, two accumulators ---- */
#define AVX512 __attribute__((target("avx512f")))
#define LOAD_F32_AVX512(x, j) _mm512_loadu_ps((x) + (j))
#define LOAD_F16_AVX512(x, j) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((x) + (j))))
#define HSUM_AVX512(a0, a1) _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
DEFINE_ISA(avx512, AVX512, __m512, 16, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_loadu_ps, LOAD_F32_AVX512,
           LOAD_F16_AVX512, HSUM_AVX512)
#endif

/* ---- pruning filters ----
 * filter: the first prune, over a block's partial scores ps[0..nb) and tail norms t[0..nb): keeps i when
 *         (ps[i] + min(a * t[i], c)) + b >= tau, writing rows (row0 + i) and p (ps[i]) compacted; returns the
 *         count.
 * prune:  the later prunes, in place over n candidates: keeps i when (p[i] + min(a * tl[rows[i]], c)) + b >= tau,
 *         compacting rows, p and rest.
 * Every variant evaluates the bound with the same float operations (a product, then two sums, no fused
 * multiply-add), so all variants keep the same rows.  NaN partial scores (rows outside `allowed`) never pass.
 * The SIMD variants store whole vectors: rows, p and rest need SLACK spare entries past the end. */
#define SLACK 16
typedef int64_t (*filter_fn)(const float *ps, const float *t, int64_t nb, float a, float c, float b, float tau,
                             int32_t row0, int32_t *rows, float *p);
typedef int64_t (*prune_fn)(const float *tl, int64_t n, float a, float c, float b, float tau, int32_t *rows, float *p,
                            float *rest);

static inline float min_f(float x, float y) { return y < x ? y : x; }

/* The scalar bound, from element i on (the whole of the generic variants, the tail of the SIMD ones). */
static inline int64_t filter_from(int64_t i, const float *ps, const float *t, int64_t nb, float a, float c, float b,
                                  float tau, int32_t row0, int32_t *rows, float *p, int64_t n) {
    for (; i < nb; i++) {
        const float v = ps[i];
        const float ub = (v + min_f(a * t[i], c)) + b;
        rows[n] = row0 + (int32_t)i;
        p[n] = v;
        n += ub >= tau;
    }
    return n;
}

static inline int64_t prune_from(int64_t i, const float *tl, int64_t n, float a, float c, float b, float tau,
                                 int32_t *rows, float *p, float *rest, int64_t m) {
    for (; i < n; i++) {
        const float ub = (p[i] + min_f(a * tl[rows[i]], c)) + b;
        rows[m] = rows[i];
        p[m] = p[i];
        rest[m] = rest[i];
        m += ub >= tau;
    }
    return m;
}

static int64_t filter_generic(const float *ps, const float *t, int64_t nb, float a, float c, float b, float tau,
                              int32_t row0, int32_t *rows, float *p) {
    return filter_from(0, ps, t, nb, a, c, b, tau, row0, rows, p, 0);
}

static int64_t prune_generic(const float *tl, int64_t n, float a, float c, float b, float tau, int32_t *rows,
                             float *p, float *rest) {
    return prune_from(0, tl, n, a, c, b, tau, rows, p, rest, 0);
}

#if LV_X86
static int32_t COMPACT_LUT[256][8]; /* for mask m: the indices of its set bits, in order */
static const int32_t IOTA16[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static void init_compact_lut(void) {
    for (int m = 0; m < 256; m++) {
        int k = 0;
        for (int j = 0; j < 8; j++)
            if (m & (1 << j)) COMPACT_LUT[m][k++] = j;
        while (k < 8) COMPACT_LUT[m][k++] = 0;
    }
}

/* The SIMD bound of the filter and the prune, one instantiation an instruction set.  Per ISA: VF/VI (float and
 * int vectors of W lanes), MASK_T and MASK_OF (the lanes whose bound reaches tau), COMPACT_PREP (what the
 * compaction of a mask needs: AVX2 a permutation from COMPACT_LUT, AVX-512 nothing) and the compacting stores
 * STORE_I / STORE_F (the kept lanes, in order, at dst); the scalar tail is filter_from / prune_from. */
#define DEFINE_FILTER_PRUNE(ISA, TARGET, VF, VI, W, SET1, SET1I, ADD, ADDI, MIN, MUL, LOADF, LOADI, GATHER,        \
                            MASK_T, MASK_OF, COMPACT_PREP, STORE_I, STORE_F)                                     \
    TARGET static int64_t filter_##ISA(const float *ps, const float *t, int64_t nb, float a, float c, float b,     \
                                       float tau, int32_t row0, int32_t *rows, float *p) {                       \
        const VF va = SET1(a), vc = SET1(c), vb = SET1(b), vt = SET1(tau);                                        \
        VI vrow = ADDI(SET1I(row0), LOADI((const void *)IOTA16));                                                 \
        const VI vw = SET1I(W);                                                                                   \
        int64_t n = 0, i = 0;                                                                                     \
        for (; i + (W) <= nb; i += (W)) {                                                                         \
            const VF v = LOADF(ps + i);                                                                           \
            const VF ub = ADD(ADD(v, MIN(MUL(va, LOADF(t + i)), vc)), vb);                                        \
            const MASK_T k = MASK_OF(ub, vt);                                                                     \
            COMPACT_PREP(k);                                                                                      \
            STORE_I(rows + n, k, vrow);                                                                           \
            STORE_F(p + n, k, v);                                                                                 \
            n += __builtin_popcount((unsigned)k);                                                                 \
            vrow = ADDI(vrow, vw);                                                                                \
        }                                                                                                         \
        return filter_from(i, ps, t, nb, a, c, b, tau, row0, rows, p, n);                                         \
    }                                                                                                             \
    TARGET static int64_t prune_##ISA(const float *tl, int64_t n, float a, float c, float b, float tau,            \
                                      int32_t *rows, float *p, float *rest) {                                     \
        const VF va = SET1(a), vc = SET1(c), vb = SET1(b), vt = SET1(tau);                                        \
        int64_t m = 0, i = 0;                                                                                     \
        for (; i + (W) <= n; i += (W)) {                                                                          \
            const VI idx = LOADI((const void *)(rows + i));                                                       \
            const VF v = LOADF(p + i), r = LOADF(rest + i);                                                       \
            const VF ub = ADD(ADD(v, MIN(MUL(va, GATHER(tl, idx)), vc)), vb);                                     \
            const MASK_T k = MASK_OF(ub, vt);                                                                     \
            COMPACT_PREP(k);                                                                                      \
            STORE_I(rows + m, k, idx);                                                                            \
            STORE_F(p + m, k, v);                                                                                 \
            STORE_F(rest + m, k, r);                                                                              \
            m += __builtin_popcount((unsigned)k);                                                                 \
        }                                                                                                         \
        return prune_from(i, tl, n, a, c, b, tau, rows, p, rest, m);                                              \
    }

#define NO_PREP(k) (void)0
#define AVX2_GATHER(tl, idx) _mm256_i32gather_ps(tl, idx, 4)
#define AVX2_MASK_OF(ub, vt) _mm256_movemask_ps(_mm256_cmp_ps(ub, vt, _CMP_GE_OQ))
#define AVX2_PREP(k) const __m256i perm = _mm256_loadu_si256((const __m256i *)COMPACT_LUT[k])
#define AVX2_STORE_I(dst, k, x) _mm256_storeu_si256((__m256i *)(dst), _mm256_permutevar8x32_epi32(x, perm))
#define AVX2_STORE_F(dst, k, x) _mm256_storeu_ps(dst, _mm256_permutevar8x32_ps(x, perm))
DEFINE_FILTER_PRUNE(avx2, AVX2, __m256, __m256i, 8, _mm256_set1_ps, _mm256_set1_epi32, _mm256_add_ps, _mm256_add_epi32,
                    _mm256_min_ps, _mm256_mul_ps, _mm256_loadu_ps, _mm256_loadu_si256, AVX2_GATHER, int,
                    AVX2_MASK_OF, AVX2_PREP, AVX2_STORE_I, AVX2_STORE_F)

/* AVX-512 compacts with compress stores (no permutation to prepare) */
#define AVX512_GATHER(tl, idx) _mm512_i32gather_ps(idx, tl, 4)
#define AVX512_MASK_OF(ub, vt) _mm512_cmp_ps_mask(ub, vt, _CMP_GE_OQ)
#define AVX512_STORE_I(dst, k, x) _mm512_storeu_si512((void *)(dst), _mm512_maskz_compress_epi32(k, x))
#define AVX512_STORE_F(dst, k, x) _mm512_storeu_ps(dst, _mm512_maskz_compress_ps(k, x))
DEFINE_FILTER_PRUNE(avx512, AVX512, __m512, __m512i, 16, _mm512_set1_ps, _mm512_set1_epi32, _mm512_add_ps,
                    _mm512_add_epi32, _mm512_min_ps, _mm512_mul_ps, _mm512_loadu_ps, _mm512_loadu_si512,
                    AVX512_GATHER, __mmask16, AVX512_MASK_OF, NO_PREP, AVX512_STORE_I, AVX512_STORE_F)
#endif

/* ---- the first pass over several float16 levels: one accumulator per row across the levels ----
 * out[i] = sum over l < nl of <q[b_l:b_{l+1}], X_l[row_i]> with one rounding tree per row (used only where the
 * partial score prunes and seeds, never as an exact score: the float16 levels are always rescored). */
typedef struct {
    int nl;
    const uint16_t *X[MAX_LEVELS];
    int64_t w[MAX_LEVELS];
    const float *q[MAX_LEVELS];
} Multi16;

typedef void (*multi_fn)(const Multi16 *m, const int32_t *rows, int64_t start, int64_t n, float *out);

static void multi16_generic(const Multi16 *m, const int32_t *rows, int64_t start, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows ? rows[i] : start + i;
        float s = 0.0f;
        for (int l = 0; l < m->nl; l++) s += row_dot16_generic(m->X[l] + r * m->w[l], m->q[l], m->w[l]);
        out[i] = s;
    }
}

#if LV_X86
/* The float16 leading levels as one accumulator across levels (one reduction a row, as the exact bound's
 * float16 error term assumes). */
#define DEFINE_MULTI16(NAME, TARGET, VEC, LANES, ZERO, FMA, LOADQ, LOAD, HSUM)                                   \
    TARGET static void NAME(const Multi16 *m, const int32_t *rows, int64_t start, int64_t n, float *out) {      \
        for (int64_t i = 0; i < n; i++) {                                                                       \
            int64_t r = rows ? rows[i] : start + i;                                                             \
            VEC a0 = ZERO(), a1 = ZERO();                                                                       \
            float tail = 0.0f;                                                                                  \
            for (int l = 0; l < m->nl; l++) {                                                                   \
                const uint16_t *x = m->X[l] + r * m->w[l];                                                      \
                const float *q = m->q[l];                                                                       \
                const int64_t w = m->w[l];                                                                      \
                int64_t j = 0;                                                                                  \
                SIMD_ACCUMULATE(LANES, FMA, LOADQ, LOAD, x, q, w, j, a0, a1);                                   \
                for (; j < w; j++) tail += half_to_float(x[j]) * q[j];                                          \
            }                                                                                                   \
            out[i] = HSUM(a0, a1) + tail;                                                                       \
        }                                                                                                       \
    }

DEFINE_MULTI16(multi16_avx2, AVX2, __m256, 8, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_loadu_ps, LOAD_F16_AVX2,
               HSUM_AVX2)
DEFINE_MULTI16(multi16_avx512, AVX512, __m512, 16, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_loadu_ps,
               LOAD_F16_AVX512, HSUM_AVX512)

/* ---- dense float16 scans, eight rows at a time (AVX2) ----
 * The dense first pass over the float16 leading levels is most of a declared-recall query's time at large N
 * (it reads every document; the data-aware bounds drop almost all of them right after it).  One row at a time,
 * each row pays a horizontal reduction (seven instructions for 32 multiply-adds); here eight rows keep one
 * accumulator each and share one transposing reduction.  Only partial scores over float16 levels are computed
 * this way: they prune and rank seeds and are never a returned score (the float16 levels are always rescored
 * from float32), so their summation order may differ from the row kernel's.  Every bound's float32 rounding
 * slack (gamma_D ||q|| ||d||) holds for any summation order. */
AVX2 static inline __m256 reduce8_avx2(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
                                       __m256 v7) {
    const __m256 t0 = _mm256_hadd_ps(v0, v1), t1 = _mm256_hadd_ps(v2, v3);
    const __m256 t2 = _mm256_hadd_ps(v4, v5), t3 = _mm256_hadd_ps(v6, v7);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* rows 0-3 | rows 4-7, two halves */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* out[i] for rows[i] (sparse; the rows PREFETCH_ROWS ahead prefetched) or start + i (rows == NULL, dense) over the
 * levels of m (every width a multiple of 8), eight rows at a time; returns how many rows it wrote (n rounded down
 * to a multiple of 8). */
AVX2 static int64_t rows16x8_avx2(const Multi16 *m, const int32_t *rows, int64_t start, int64_t n, float *out) {
    int64_t i = 0;
    if (rows)
        for (int64_t t = 0; t < n && t < PREFETCH_ROWS; t++)
            for (int l = 0; l < m->nl; l++) __builtin_prefetch(m->X[l] + (int64_t)rows[t] * m->w[l]);
    for (; i + 8 <= n; i += 8) {
        int64_t r[8];
        for (int t = 0; t < 8; t++) r[t] = rows ? rows[i + t] : start + i + t;
        if (rows)
            for (int t = 0; t < 8 && i + PREFETCH_ROWS + t < n; t++)
                for (int l = 0; l < m->nl; l++)
                    __builtin_prefetch(m->X[l] + (int64_t)rows[i + PREFETCH_ROWS + t] * m->w[l]);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int l = 0; l < m->nl; l++) {
            const int64_t w = m->w[l];
            const uint16_t *X = m->X[l];
            const float *q = m->q[l];
            for (int64_t j = 0; j < w; j += 8) {
                const __m256 qj = _mm256_loadu_ps(q + j);
#define ROW8(a, t) a = _mm256_fmadd_ps(LOAD_F16_AVX2(X + r[t] * w, j), qj, a)
                ROW8(a0, 0); ROW8(a1, 1); ROW8(a2, 2); ROW8(a3, 3);
                ROW8(a4, 4); ROW8(a5, 5); ROW8(a6, 6); ROW8(a7, 7);
#undef ROW8
            }
        }
        _mm256_storeu_ps(out + i, reduce8_avx2(a0, a1, a2, a3, a4, a5, a6, a7));
    }
    return i;
}

static int widths_of_8(const Multi16 *m) {
    for (int l = 0; l < m->nl; l++)
        if (m->w[l] % 8) return 0;
    return 1;
}

/* float32 dots eight rows at a time, dense or gathered: one 8-lane accumulator per row (lane i sums the elements
 * j = i mod 8 in order), reduced by reduce8_avx2's fixed tree ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)),
 * then the w mod 8 remaining elements added in order.  A row's sum is the same bits whichever rows share its group
 * (a last group of fewer than eight repeats its last row), so every path that scores a row exactly (the running sum
 * of pass 2, the seeds, the survivors' completion) gets one score for it: the exact-score rule of the header. */
AVX2 static void dot32_x8(const void *X_, int64_t w, const int32_t *rows, int64_t start, int64_t n, const float *q,
                          float *out) {
    const float *X = (const float *)X_;
    const int64_t w8 = w & ~(int64_t)7;
    if (rows)
        for (int64_t t = 0; t < n && t < PREFETCH_ROWS; t++)
            for (int64_t b = 0; b < w * 4; b += 64) __builtin_prefetch((const char *)(X + (int64_t)rows[t] * w) + b);
    for (int64_t i = 0; i < n; i += 8) {
        const int64_t m = n - i < 8 ? n - i : 8;
        const float *x[8];
        for (int t = 0; t < 8; t++) {
            const int64_t ii = i + (t < m ? t : m - 1);
            x[t] = X + (rows ? (int64_t)rows[ii] : start + ii) * w;
        }
        if (rows)
            for (int64_t t = i + PREFETCH_ROWS; t < n && t < i + PREFETCH_ROWS + 8; t++)
                for (int64_t b = 0; b < w * 4; b += 64) __builtin_prefetch((const char *)(X + (int64_t)rows[t] * w) + b);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t j = 0; j < w8; j += 8) {
            const __m256 qj = _mm256_loadu_ps(q + j);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x[0] + j), qj, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x[1] + j), qj, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x[2] + j), qj, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x[3] + j), qj, a3);
            a4 = _mm256_fmadd_ps(_mm256_loadu_ps(x[4] + j), qj, a4);
            a5 = _mm256_fmadd_ps(_mm256_loadu_ps(x[5] + j), qj, a5);
            a6 = _mm256_fmadd_ps(_mm256_loadu_ps(x[6] + j), qj, a6);
            a7 = _mm256_fmadd_ps(_mm256_loadu_ps(x[7] + j), qj, a7);
        }
        float sums[8];
        _mm256_storeu_ps(sums, reduce8_avx2(a0, a1, a2, a3, a4, a5, a6, a7));
        for (int64_t t = 0; t < m; t++) {
            float v = sums[t];
            for (int64_t j = w8; j < w; j++) v += x[t][j] * q[j];
            out[i + t] = v;
        }
    }
}

/* The float16 dots eight rows at a time where every width is a multiple of 8 (dense and gathered rows alike; the
 * remaining rows, and other widths, by the row kernel of `rest`, the instruction set's own). */
#define DEFINE_X8(SUFFIX, DOT16_REST, MULTI16_REST)                                                               \
    AVX2 static void dot16_x8_##SUFFIX(const void *X, int64_t w, const int32_t *rows, int64_t start, int64_t n,    \
                                       const float *q, float *out) {                                            \
        int64_t done = 0;                                                                                      \
        if (w % 8 == 0) {                                                                                      \
            Multi16 m;                                                                                         \
            m.nl = 1;                                                                                          \
            m.X[0] = (const uint16_t *)X;                                                                      \
            m.w[0] = w;                                                                                        \
            m.q[0] = q;                                                                                        \
            done = rows16x8_avx2(&m, rows, start, n, out);                                                     \
        }                                                                                                      \
        if (done < n) DOT16_REST(X, w, rows ? rows + done : NULL, start + (rows ? 0 : done), n - done, q, out + done); \
    }                                                                                                          \
    AVX2 static void multi16_x8_##SUFFIX(const Multi16 *m, const int32_t *rows, int64_t start, int64_t n,         \
                                         float *out) {                                                          \
        const int64_t done = widths_of_8(m) ? rows16x8_avx2(m, rows, start, n, out) : 0;                       \
        if (done < n) MULTI16_REST(m, rows ? rows + done : NULL, start + (rows ? 0 : done), n - done, out + done); \
    }
DEFINE_X8(avx2, dot16_avx2, multi16_avx2)
DEFINE_X8(avx512, dot16_avx512, multi16_avx512)
#endif

/* ---- count_at_least: out[j] = #{i : v[i] >= t_j} for a few thresholds, in one pass over v ----
 * Blocks of COUNT_BLOCK values (in L1) are compared with every threshold, int32 counts per block: the compiler
 * vectorises the inner loop (compare, mask, subtract) in each ISA's variant.  NaN values are never counted. */
#define COUNT_BLOCK 2048
typedef void (*count_fn)(const float *v, Py_ssize_t n, const float *t, Py_ssize_t m, int64_t *out);

#define DEFINE_COUNT(NAME, TARGET)                                                                               \
    TARGET static void NAME(const float *v, Py_ssize_t n, const float *t, Py_ssize_t m, int64_t *out) {         \
        for (Py_ssize_t j = 0; j < m; j++) out[j] = 0;                                                          \
        for (Py_ssize_t s = 0; s < n; s += COUNT_BLOCK) {                                                       \
            const Py_ssize_t e = s + COUNT_BLOCK < n ? s + COUNT_BLOCK : n;                                     \
            for (Py_ssize_t j = 0; j < m; j++) {                                                                \
                const float tj = t[j];                                                                          \
                int32_t c = 0;                                                                                  \
                for (Py_ssize_t i = s; i < e; i++) c += v[i] >= tj;                                             \
                out[j] += c;                                                                                    \
            }                                                                                                   \
        }                                                                                                       \
    }

DEFINE_COUNT(count_generic, )
#if LV_X86
DEFINE_COUNT(count_avx2, AVX2)
DEFINE_COUNT(count_avx512, AVX512)
#endif

static dot_fn DOT32 = dot32_generic, DOT16 = dot16_generic;
static multi_fn MULTI16 = multi16_generic;
static count_fn COUNT = count_generic;
static filter_fn FILTER = filter_generic;
static prune_fn PRUNE = prune_generic;
static const char *ISA = "generic";

/* Point the kernels at one instruction set's variants. */
#define USE_ISA(X)                                                                                                 \
    do {                                                                                                           \
        DOT32 = dot32_##X, DOT16 = dot16_##X, MULTI16 = multi16_##X, FILTER = filter_##X, PRUNE = prune_##X;     \
        COUNT = count_##X;                                                                                         \
        ISA = #X;                                                                                                  \
    } while (0)

/* The SIMD variant: want NULL = the best available; "generic", "avx2" or "avx512" = at most that one. */
static void select_isa(const char *want) {
    USE_ISA(generic);
#if LV_X86
    __builtin_cpu_init();
    init_compact_lut();
    int has512 = __builtin_cpu_supports("avx512f");
    int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (want && strcmp(want, "generic") == 0) return;
    if (has512 && has2 && (!want || strcmp(want, "avx512") == 0)) {
        USE_ISA(avx512);
        /* dots eight rows at a time (AVX2 instructions): faster than one 16-lane row at a time with its horizontal
           reduction (AMD Zen 4, debdocs 50k declared recall: float16 284 vs 370 us a query, then float32 297 vs
           368) */
        DOT16 = dot16_x8_avx512, MULTI16 = multi16_x8_avx512, DOT32 = dot32_x8;
    } else if (has2) {
        USE_ISA(avx2);
        DOT16 = dot16_x8_avx2, MULTI16 = multi16_x8_avx2, DOT32 = dot32_x8; /* eight rows at a time */
    }
#else
    (void)want;
#endif
}

/* ------------------------------------------------------------------------------------------------ heaps */

typedef struct {
    float s;
    int32_t r;
} Ent;

/* a ranks below b: lower score, or the same score and a higher row */
static inline int worse(Ent a, Ent b) { return a.s < b.s || (a.s == b.s && a.r > b.r); }

typedef struct {
    Ent *e;
    int64_t n, cap;
} Heap; /* binary heap, root = the worst entry kept */

static void heap_sift_down(Heap *h, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && worse(h->e[l], h->e[m])) m = l;
        if (r < h->n && worse(h->e[r], h->e[m])) m = r;
        if (m == i) return;
        Ent t = h->e[i];
        h->e[i] = h->e[m];
        h->e[m] = t;
        i = m;
    }
}

/* keep x if it ranks among the cap best seen; returns 1 when kept */
static inline int heap_push(Heap *h, Ent x) {
    if (h->cap <= 0) return 0;
    if (h->n < h->cap) {
        int64_t i = h->n++;
        h->e[i] = x;
        while (i > 0) {
            int64_t p = (i - 1) / 2;
            if (!worse(h->e[i], h->e[p])) break;
            Ent t = h->e[i];
            h->e[i] = h->e[p];
            h->e[p] = t;
            i = p;
        }
        return 1;
    }
    if (!worse(h->e[0], x)) return 0;
    h->e[0] = x;
    heap_sift_down(h, 0);
    return 1;
}

static int ent_better_first(const void *a_, const void *b_) {
    Ent a = *(const Ent *)a_, b = *(const Ent *)b_;
    if (worse(b, a)) return -1;
    if (worse(a, b)) return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ context */

typedef struct {
    int L, L16;
    int64_t N, D;
    int64_t bounds[MAX_LEVELS + 1];
    const float *lv32[MAX_LEVELS];
    const uint16_t *lv16[MAX_LEVELS];
    const float *tails;    /* (L + 1, N) */
    const float *q;        /* (D,) */
    const uint8_t *allowed; /* (N,) or NULL */
    const int64_t *ranges; /* (R, 2) [start, end) sorted, disjoint */
    int64_t n_ranges;
    int64_t *range_off; /* (R + 1,) first position of each range */
    int64_t P;          /* positions = rows to scan */
} Ctx;

static inline int64_t level_w(const Ctx *c, int l) { return c->bounds[l + 1] - c->bounds[l]; }

/* dots of level l for rows (sparse) or start..start+n (dense); fp16 copy when l < L16 and use16 */
static inline void level_dots(const Ctx *c, int l, int use16, const int32_t *rows, int64_t start, int64_t n,
                              float *out) {
    const float *ql = c->q + c->bounds[l];
    if (use16 && l < c->L16)
        DOT16(c->lv16[l], level_w(c, l), rows, start, n, ql, out);
    else
        DOT32(c->lv32[l], level_w(c, l), rows, start, n, ql, out);
}

/* Completes exact scores: out = rest + the float32 dots of the float16 levels, added in level order. */
static void finish_scores(const Ctx *c, const int32_t *rows, int64_t n, const float *rest, float *out, float *tmp) {
    for (int64_t i = 0; i < n; i++) out[i] = rest[i];
    for (int l = 0; l < c->L16; l++) {
        level_dots(c, l, 0, rows, 0, n, tmp);
        for (int64_t i = 0; i < n; i++) out[i] += tmp[i];
    }
}

/* The exact scores of n rows from scratch (the rule in the header); rest and tmp are n-float scratch. */
static void exact_scores(const Ctx *c, const int32_t *rows, int64_t n, float *out, float *rest, float *tmp) {
    for (int64_t i = 0; i < n; i++) rest[i] = 0.0f;
    for (int l = c->L16; l < c->L; l++) {
        level_dots(c, l, 0, rows, 0, n, tmp);
        for (int64_t i = 0; i < n; i++) rest[i] += tmp[i];
    }
    finish_scores(c, rows, n, rest, out, tmp);
}

/* Exact scores of the rows of entries e[0..n): a new array of n floats (the caller frees it), or NULL when out of
 * memory. */
static float *exact_of_entries(const Ctx *c, const Ent *e, int64_t n) {
    float *ex = malloc(sizeof(float) * (size_t)(n + 1));
    int32_t *rows = malloc((sizeof(int32_t) + 2 * sizeof(float)) * (size_t)(n + 1)); /* rows, then 2 scratch */
    if (ex && rows) {
        float *tmp = (float *)(rows + n + 1), *rest = tmp + n + 1;
        for (int64_t i = 0; i < n; i++) rows[i] = e[i].r;
        exact_scores(c, rows, n, ex, rest, tmp);
    } else {
        free(ex);
        ex = NULL;
    }
    free(rows);
    return ex;
}

/* Positions [p0, p1) of the concatenated ranges, piece by piece (each piece inside one range). */
typedef struct {
    const Ctx *c;
    int64_t r, p, p1;
} Pieces;

static void pieces_init(Pieces *it, const Ctx *c, int64_t p0, int64_t p1) {
    int64_t lo = 0, hi = c->n_ranges;
    while (hi - lo > 1) { /* the last range whose first position is <= p0 */
        int64_t mid = (lo + hi) / 2;
        if (c->range_off[mid] <= p0) lo = mid; else hi = mid;
    }
    it->c = c;
    it->r = lo;
    it->p = p0;
    it->p1 = p1;
}

static int pieces_next(Pieces *it, int64_t *pos, int64_t *row, int64_t *len) {
    const Ctx *c = it->c;
    while (it->r < c->n_ranges && it->p < it->p1) {
        int64_t end = c->range_off[it->r + 1] < it->p1 ? c->range_off[it->r + 1] : it->p1;
        if (end > it->p) {
            *pos = it->p;
            *row = c->ranges[2 * it->r] + (it->p - c->range_off[it->r]);
            *len = end - it->p;
            it->p = end;
            return 1;
        }
        it->r++;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ pass 1 */

typedef struct {
    const Ctx *c;
    int64_t p0, p1;
    float *p_scan;
    int n_first; /* levels scanned for every row */
    Heap heap;   /* top n_seed by partial score */
    int64_t scanned, coords;
    int failed;
} First;

/* The partial scores of the first n_first levels for n rows: dense rows start..start+n-1 (rows == NULL) or the
   given rows; tmp is n-float scratch.  Over float32 levels they are summed in level order from 0 (they are the
   start of the exact score); over float16 levels they only prune and rank seeds, so one accumulator spans the
   levels (one reduction per row). */
static void first_partials(const Ctx *c, int n_first, const int32_t *rows, int64_t start, int64_t n, float *out,
                           float *tmp) {
    if (n_first > 1 && c->L16 >= n_first) { /* float16 levels: one pass, one reduction per row */
        Multi16 m;
        m.nl = n_first;
        for (int l = 0; l < n_first; l++) {
            m.X[l] = c->lv16[l];
            m.w[l] = level_w(c, l);
            m.q[l] = c->q + c->bounds[l];
        }
        MULTI16(&m, rows, start, n, out);
        return;
    }
    level_dots(c, 0, 1, rows, start, n, out);
    for (int l = 1; l < n_first; l++) {
        level_dots(c, l, 1, rows, start, n, tmp);
        for (int64_t i = 0; i < n; i++) out[i] += tmp[i];
    }
}

/* The largest of v[0..n) (-inf when n = 0; NaN entries are skipped).  Eight independent running maxima, so the
   compiler vectorises it without reordering any one of them (a single running maximum is a serial chain of
   compare-and-select, about as slow per row as the float16 dot itself). */
static inline float chunk_max(const float *v, int64_t n) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++) m[t] = v[i + t] > m[t] ? v[i + t] : m[t];
    for (; i < n; i++) m[0] = v[i] > m[0] ? v[i] : m[0];
    float r = m[0];
    for (int t = 1; t < 8; t++) r = m[t] > r ? m[t] : r;
    return r;
}

static void *first_worker(void *arg) {
    First *f = (First *)arg;
    const Ctx *c = f->c;
    int32_t *rows = malloc(sizeof(int32_t) * BLOCK_FIRST);
    float *out = malloc(sizeof(float) * BLOCK_FIRST), *tmp = malloc(sizeof(float) * BLOCK_FIRST);
    if (!rows || !out || !tmp) {
        f->failed = 1;
        goto done;
    }
    Pieces it;
    pieces_init(&it, c, f->p0, f->p1);
    int64_t piece_pos, piece_row, piece_len;
    while (pieces_next(&it, &piece_pos, &piece_row, &piece_len)) {
        for (int64_t off = 0; off < piece_len; off += BLOCK_FIRST) {
            int64_t n = piece_len - off < BLOCK_FIRST ? piece_len - off : BLOCK_FIRST;
            int64_t pos = piece_pos + off, row = piece_row + off;
            float *dst = f->p_scan + pos;
            int64_t m = n;
            if (c->allowed) {
                m = 0;
                for (int64_t i = 0; i < n; i++)
                    if (c->allowed[row + i]) rows[m++] = (int32_t)(row + i);
            }
            if (m == n) {
                first_partials(c, f->n_first, NULL, row, n, dst, tmp);
                /* fused top-n_seed: once the heap is full, a chunk whose maximum does not beat its worst entry is
                   skipped (rows ascend, so a tie with the worst entry never displaces it) */
                for (int64_t i0 = 0; i0 < n; i0 += 64) {
                    const int64_t i1 = i0 + 64 < n ? i0 + 64 : n;
                    if (f->heap.n >= f->heap.cap) {
                        if (f->heap.cap == 0) break;
                        if (!(chunk_max(dst + i0, i1 - i0) > f->heap.e[0].s)) continue;
                    }
                    for (int64_t i = i0; i < i1; i++) {
                        Ent e = {dst[i], (int32_t)(row + i)};
                        if (f->heap.n < f->heap.cap || worse(f->heap.e[0], e)) heap_push(&f->heap, e);
                    }
                }
            } else {
                for (int64_t i = 0; i < n; i++) dst[i] = NAN; /* not a candidate */
                first_partials(c, f->n_first, rows, 0, m, out, tmp);
                for (int64_t i = 0; i < m; i++) {
                    dst[rows[i] - row] = out[i];
                    Ent e = {out[i], rows[i]};
                    if (f->heap.n < f->heap.cap || worse(f->heap.e[0], e)) heap_push(&f->heap, e);
                }
            }
            f->scanned += m;
        }
    }
    f->coords = f->scanned * c->bounds[f->n_first];
done:
    free(rows);
    free(out);
    free(tmp);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ pass 2 */

typedef struct {
    const Ctx *c;
    int64_t p0, p1;
    const float *p_scan;
    const float *a, *cc, *bb; /* (L + 1,) bound coefficients per boundary */
    const int32_t *seed_rows_sorted; /* rows excluded from the scan (already exactly scored) */
    int64_t n_seeds;
    int stop_level, n_first;
    _Atomic uint32_t *shared_tau; /* float bits, monotone max */
    Heap heap;                    /* top k exact (initialised with the seeds' top k) */
    Heap partial;                 /* stop_level < L - 1: top `rescore` by partial score */
    int64_t alive[MAX_LEVELS];
    int64_t coords;
    int failed;
} Rest;

static inline float load_tau(_Atomic uint32_t *t) {
    uint32_t b = atomic_load_explicit(t, memory_order_relaxed);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static inline void raise_tau(_Atomic uint32_t *t, float v) {
    uint32_t old = atomic_load_explicit(t, memory_order_relaxed);
    for (;;) {
        float f;
        memcpy(&f, &old, 4);
        if (!(v > f)) return;
        uint32_t nb;
        memcpy(&nb, &v, 4);
        if (atomic_compare_exchange_weak_explicit(t, &old, nb, memory_order_relaxed, memory_order_relaxed)) return;
    }
}

static void *rest_worker(void *arg) {
    Rest *r = (Rest *)arg;
    const Ctx *c = r->c;
    const int L = c->L;
    const int partial_mode = r->stop_level < L - 1;
    int32_t *rows = malloc(sizeof(int32_t) * (BLOCK + SLACK));
    float *p = malloc(sizeof(float) * (BLOCK + SLACK)), *rest = malloc(sizeof(float) * (BLOCK + SLACK));
    float *d = malloc(sizeof(float) * BLOCK), *exact = malloc(sizeof(float) * BLOCK);
    if (!rows || !p || !rest || !d || !exact) {
        r->failed = 1;
        goto done;
    }
    int64_t seed_i = 0; /* the next seed row at or after the scan position */
    float tau_local = r->heap.n >= r->heap.cap && r->heap.cap > 0 ? r->heap.e[0].s : -INFINITY;
    Pieces it;
    pieces_init(&it, c, r->p0, r->p1);
    int64_t piece_pos, piece_row, piece_len;
    while (pieces_next(&it, &piece_pos, &piece_row, &piece_len)) {
        for (int64_t off = 0; off < piece_len; off += BLOCK) {
            const int64_t nb = piece_len - off < BLOCK ? piece_len - off : BLOCK;
            const int64_t pos = piece_pos + off, row0 = piece_row + off;
            float tau = load_tau(r->shared_tau);
            if (tau_local > tau) tau = tau_local;
            /* filter with the bound at boundary n_first (branch-free; NaN, outside `allowed`, never passes) */
            const int nf = r->n_first;
            const float a1 = r->a[nf], c1 = r->cc[nf], b1 = r->bb[nf];
            const float *t1 = c->tails + (int64_t)nf * c->N + row0;
            const float *ps = r->p_scan + pos;
            int64_t n = FILTER(ps, t1, nb, a1, c1, b1, tau, (int32_t)row0, rows, p);
            /* drop the seeds (already scored exactly); rows and seeds are both ascending */
            while (seed_i < r->n_seeds && r->seed_rows_sorted[seed_i] < row0) seed_i++;
            if (seed_i < r->n_seeds && r->seed_rows_sorted[seed_i] < row0 + nb) {
                int64_t m = 0, s = seed_i;
                for (int64_t i = 0; i < n; i++) {
                    while (s < r->n_seeds && r->seed_rows_sorted[s] < rows[i]) s++;
                    int is_seed = s < r->n_seeds && r->seed_rows_sorted[s] == rows[i];
                    rows[m] = rows[i];
                    p[m] = p[i];
                    m += !is_seed;
                }
                n = m;
            }
            /* rest: the running sum over the levels without a float16 copy (the first part of the exact score) */
            if (c->L16 == 0)
                for (int64_t i = 0; i < n; i++) rest[i] = p[i];
            else
                for (int64_t i = 0; i < n; i++) rest[i] = 0.0f;
            if (partial_mode && r->stop_level == nf - 1) goto to_partial;
            for (int l = nf; l < L && n > 0; l++) {
                const int64_t w = level_w(c, l);
                r->alive[l] += n;
                r->coords += n * w;
                if (l < L - 1) { /* the survivors' next tail norms: scattered, one cache miss each otherwise */
                    const float *tn = c->tails + (int64_t)(l + 1) * c->N;
                    for (int64_t i = 0; i < n; i++) __builtin_prefetch(tn + rows[i]);
                }
                level_dots(c, l, 1, rows, 0, n, d);
                if (l >= c->L16) {
                    for (int64_t i = 0; i < n; i++) {
                        p[i] += d[i];
                        rest[i] += d[i];
                    }
                } else {
                    for (int64_t i = 0; i < n; i++) p[i] += d[i];
                }
                if (l == L - 1) break;
                const float al = r->a[l + 1], cl = r->cc[l + 1], bl = r->bb[l + 1];
                const float *tl = c->tails + (int64_t)(l + 1) * c->N;
                n = PRUNE(tl, n, al, cl, bl, tau, rows, p, rest);
                if (partial_mode && l == r->stop_level) goto to_partial;
            }
            if (n == 0) continue;
            /* completion: exact scores (p itself without float16 levels; rest + float32 float16-levels with them) */
            const float *sc = p;
            if (c->L16 > 0) {
                finish_scores(c, rows, n, rest, exact, d);
                r->coords += n * c->bounds[c->L16];
                sc = exact;
            }
            for (int64_t i = 0; i < n; i++) {
                const float s = sc[i];
                if (!(s >= tau)) continue;
                Ent e = {s, rows[i]};
                if (heap_push(&r->heap, e) && r->heap.n >= r->heap.cap) {
                    const float wv = r->heap.e[0].s;
                    if (wv > tau_local) {
                        tau_local = wv;
                        raise_tau(r->shared_tau, wv);
                        if (wv > tau) tau = wv;
                    }
                }
            }
            continue;
        to_partial:
            for (int64_t i = 0; i < n; i++) {
                Ent e = {p[i], rows[i]};
                if (r->partial.n < r->partial.cap || worse(r->partial.e[0], e)) heap_push(&r->partial, e);
            }
        }
    }
done:
    free(rows);
    free(p);
    free(rest);
    free(d);
    free(exact);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ Python glue */

typedef struct {
    Py_buffer views[MAX_LEVELS * 2 + 16];
    int n;
} Views;

static void release_views(Views *v) {
    for (int i = 0; i < v->n; i++) PyBuffer_Release(&v->views[i]);
    v->n = 0;
}

/* A C-contiguous buffer of `itemsize`-byte items, at least `min_items` of them.  None gives *ptr = NULL
   (an error when `required`).  Returns 0, or -1 with a ValueError set. */
static int get_buf(Views *v, PyObject *obj, Py_ssize_t itemsize, Py_ssize_t min_items, int writable, int required,
                   const char *what, void **ptr, Py_ssize_t *count) {
    *ptr = NULL;
    if (count) *count = 0;
    if (obj == Py_None) {
        if (!required) return 0;
        PyErr_Format(PyExc_ValueError, "%s is required", what);
        return -1;
    }
    Py_buffer *b = &v->views[v->n];
    if (PyObject_GetBuffer(obj, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s buffer", what, writable ? " writable" : "");
        return -1;
    }
    v->n++;
    if (b->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: items of %zd bytes expected, got %zd", what, itemsize, b->itemsize);
        return -1;
    }
    if (b->len / itemsize < min_items) {
        PyErr_Format(PyExc_ValueError, "%s: at least %zd items expected, got %zd", what, min_items, b->len / itemsize);
        return -1;
    }
    *ptr = b->buf;
    if (count) *count = b->len / itemsize;
    return 0;
}

#define GET(obj, isz, minn, wr, req, what, ptr, cnt)                                                         \
    do {                                                                                                     \
        void *_p;                                                                                            \
        if (get_buf(&v, (obj), (isz), (minn), (wr), (req), (what), &_p, (cnt)) < 0) goto out;                \
        (ptr) = _p;                                                                                          \
    } while (0)

/* The store and query arguments shared by scan_first and scan_rest. */
typedef struct {
    PyObject *levels32, *levels16, *bounds, *tails, *q, *allowed, *ranges;
    Py_ssize_t N;
} StoreArgs;

static int fill_ctx(Ctx *c, Views *vv, const StoreArgs *s) {
    Views *pv = vv;
#define v (*pv)
    memset(c, 0, sizeof *c);
    if (!PyTuple_Check(s->levels32) || !PyTuple_Check(s->levels16)) {
        PyErr_SetString(PyExc_ValueError, "levels32 and levels16 must be tuples");
        goto out;
    }
    Py_ssize_t L = PyTuple_GET_SIZE(s->levels32), L16 = PyTuple_GET_SIZE(s->levels16);
    if (L < 1 || L > MAX_LEVELS || L16 > L) {
        PyErr_Format(PyExc_ValueError, "need 1 <= L <= %d and L16 <= L, got L=%zd L16=%zd", MAX_LEVELS, L, L16);
        goto out;
    }
    if (s->N < 0 || s->N > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "N must be in [0, 2^31)");
        goto out;
    }
    c->L = (int)L;
    c->L16 = (int)L16;
    c->N = s->N;
    const int64_t *bounds;
    GET(s->bounds, 8, L + 1, 0, 1, "bounds", bounds, NULL);
    for (int l = 0; l <= L; l++) c->bounds[l] = bounds[l];
    if (c->bounds[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "bounds must start at 0");
        goto out;
    }
    for (int l = 0; l < L; l++)
        if (c->bounds[l + 1] <= c->bounds[l]) {
            PyErr_SetString(PyExc_ValueError, "bounds must increase");
            goto out;
        }
    c->D = c->bounds[L];
    for (int l = 0; l < L; l++) GET(PyTuple_GET_ITEM(s->levels32, l), 4, c->N * level_w(c, l), 0, 1, "a float32 level", c->lv32[l], NULL);
    for (int l = 0; l < L16; l++) GET(PyTuple_GET_ITEM(s->levels16, l), 2, c->N * level_w(c, l), 0, 1, "a float16 level", c->lv16[l], NULL);
    GET(s->tails, 4, (L + 1) * c->N, 0, 1, "tail_norms", c->tails, NULL);
    GET(s->q, 4, c->D, 0, 1, "query", c->q, NULL);
    GET(s->allowed, 1, c->N, 0, 0, "allowed", c->allowed, NULL);
    Py_ssize_t n_items;
    GET(s->ranges, 8, 0, 0, 1, "ranges", c->ranges, &n_items);
    if (n_items % 2) {
        PyErr_SetString(PyExc_ValueError, "ranges must be (R, 2)");
        goto out;
    }
    c->n_ranges = n_items / 2;
    c->range_off = malloc(sizeof(int64_t) * (size_t)(c->n_ranges + 1));
    if (!c->range_off) {
        PyErr_NoMemory();
        goto out;
    }
    c->range_off[0] = 0;
    int64_t prev_end = 0;
    for (int64_t r = 0; r < c->n_ranges; r++) {
        int64_t a = c->ranges[2 * r], b = c->ranges[2 * r + 1];
        if (a < prev_end || b < a || b > c->N) {
            PyErr_SetString(PyExc_ValueError, "ranges must be sorted, disjoint [start, end) within [0, N]");
            goto out;
        }
        prev_end = b;
        c->range_off[r + 1] = c->range_off[r] + (b - a);
    }
    c->P = c->range_off[c->n_ranges];
    return 0;
out:
    return -1;
#undef v
}

static void free_ctx(Ctx *c) {
    free(c->range_off);
    c->range_off = NULL;
}

/* Threads actually used: at most one per MIN_ROWS_PER_THREAD rows (below that, starting a thread costs more than
   it saves). */
static int clamp_threads(int threads, int64_t P) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    int64_t max_useful = P / MIN_ROWS_PER_THREAD > 0 ? P / MIN_ROWS_PER_THREAD : 1;
    if (threads > max_useful) threads = (int)max_useful;
    return threads;
}

/* Runs fn over `threads` argument blocks (block 0 in the calling thread; a block whose thread could not start
   runs here afterwards, so no rows are ever skipped). */
static void run_workers(void *(*fn)(void *), void *args, size_t size, int threads) {
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < threads; t++) started[t] = pthread_create(&tid[t], NULL, fn, (char *)args + t * size) == 0;
    fn(args);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            fn((char *)args + t * size);
    }
}

/* ------------------------------------------------------------------------------------------------ the passes */

/* Pass 1 over the rows of c (call without the GIL): p_scan (P,) gets every position's partial score over the first
   n_first levels; the n_found <= n_seed best partial scores (best first) go to seed_rows / seed_part with their
   exact scores in seed_exact.  Returns 0, or -1 when out of memory. */
static int first_pass(const Ctx *c, int n_first, int64_t n_seed, int threads, float *p_scan, int64_t *seed_rows,
                      float *seed_part, float *seed_exact, int64_t *n_found_out, int64_t *scanned_out,
                      int64_t *coords_out) {
    threads = clamp_threads(threads, c->P);
    First *fs = calloc((size_t)threads, sizeof(First));
    Ent *all = malloc(sizeof(Ent) * (size_t)(threads * n_seed + 1));
    int failed = !fs || !all;
    int64_t n_found = 0, scanned = 0, coords = 0;
    if (!failed) {
        for (int t = 0; t < threads; t++) {
            fs[t].c = c;
            fs[t].p0 = c->P * t / threads;
            fs[t].p1 = c->P * (t + 1) / threads;
            fs[t].p_scan = p_scan;
            fs[t].n_first = n_first;
            fs[t].heap.cap = n_seed;
            fs[t].heap.e = all + t * n_seed;
        }
        run_workers(first_worker, fs, sizeof(First), threads);
        /* merge the per-thread heaps (compacting forward in place): the best n_seed partial scores overall */
        int64_t m = 0;
        for (int t = 0; t < threads; t++) {
            failed |= fs[t].failed;
            scanned += fs[t].scanned;
            coords += fs[t].coords;
            for (int64_t i = 0; i < fs[t].heap.n; i++) all[m++] = fs[t].heap.e[i];
        }
        qsort(all, (size_t)m, sizeof(Ent), ent_better_first);
        n_found = m < n_seed ? m : n_seed;
        if (!failed && n_found > 0) {
            float *ex = exact_of_entries(c, all, n_found);
            if (ex) {
                for (int64_t i = 0; i < n_found; i++) {
                    seed_rows[i] = all[i].r;
                    seed_part[i] = all[i].s;
                    seed_exact[i] = ex[i];
                }
                coords += n_found * c->D;
            } else {
                failed = 1;
            }
            free(ex);
        }
    }
    free(fs);
    free(all);
    *n_found_out = n_found;
    *scanned_out = scanned;
    *coords_out = coords;
    return failed ? -1 : 0;
}

/* Pass 2 (call without the GIL): prune from level n_first on with the bound (a, cc, bb) at every boundary, the S
   seeds (seed_rows, seed_exact) starting the top-k; up to k rows best first into rows_out / scores_out (*n_out of
   them), candidates entering levels n_first..L-1 added to alive_out.  Returns 0, or -1 when out of memory. */
static int rest_pass(const Ctx *c, int n_first, const float *p_scan, const float *a, const float *cc, const float *bb,
                     const int64_t *seed_rows, const float *seed_exact, int64_t S, int64_t k, int stop_level,
                     int64_t rescore, int threads, int64_t *rows_out, float *scores_out, int64_t *alive_out,
                     int64_t *n_out_out, int64_t *coords_out) {
    threads = clamp_threads(threads, c->P);
    const int full = stop_level == c->L - 1;
    const int64_t part_cap = full ? 0 : rescore;
    Rest *rs = calloc((size_t)threads, sizeof(Rest));
    Ent *heap_mem = malloc(sizeof(Ent) * (size_t)(threads * k + 1));
    Ent *part_mem = malloc(sizeof(Ent) * (size_t)(threads * part_cap + 1));
    Ent *seed_heap = malloc(sizeof(Ent) * (size_t)(k + 1));
    int32_t *seed_sorted = malloc(sizeof(int32_t) * (size_t)(S + 1));
    Ent *cand = malloc(sizeof(Ent) * (size_t)(threads * k + part_cap + S + 1));
    int failed = !rs || !heap_mem || !part_mem || !seed_heap || !seed_sorted || !cand;
    int64_t n_out = 0, coords = 0;
    if (failed) goto done;
    /* the seeds' top k (exact) start every thread's heap and the shared threshold */
    Heap seeds = {seed_heap, 0, k};
    for (int64_t i = 0; i < S; i++) {
        Ent e = {seed_exact[i], (int32_t)seed_rows[i]};
        heap_push(&seeds, e);
        seed_sorted[i] = (int32_t)seed_rows[i];
    }
    for (int64_t i = 1; i < S; i++) { /* insertion sort: a few dozen seeds */
        int32_t x = seed_sorted[i];
        int64_t j = i - 1;
        while (j >= 0 && seed_sorted[j] > x) {
            seed_sorted[j + 1] = seed_sorted[j];
            j--;
        }
        seed_sorted[j + 1] = x;
    }
    float tau0 = seeds.n >= k ? seeds.e[0].s : -INFINITY;
    uint32_t tau_bits;
    memcpy(&tau_bits, &tau0, 4);
    _Atomic uint32_t shared_tau;
    atomic_init(&shared_tau, tau_bits);
    for (int t = 0; t < threads; t++) {
        Rest *r = &rs[t];
        r->c = c;
        r->p0 = c->P * t / threads;
        r->p1 = c->P * (t + 1) / threads;
        r->p_scan = p_scan;
        r->a = a;
        r->cc = cc;
        r->bb = bb;
        r->seed_rows_sorted = seed_sorted;
        r->n_seeds = S;
        r->stop_level = stop_level;
        r->n_first = n_first;
        r->shared_tau = &shared_tau;
        r->heap.e = heap_mem + t * k;
        r->heap.cap = k;
        r->heap.n = seeds.n;
        memcpy(r->heap.e, seeds.e, sizeof(Ent) * (size_t)seeds.n);
        r->partial.e = part_mem + t * part_cap;
        r->partial.cap = part_cap;
    }
    run_workers(rest_worker, rs, sizeof(Rest), threads);
    int64_t m = 0;
    for (int t = 0; t < threads; t++) {
        failed |= rs[t].failed;
        coords += rs[t].coords;
        for (int l = 0; l < c->L; l++) alive_out[l] += rs[t].alive[l];
    }
    /* candidates: every seed (scored exactly, excluded from the scan) and each thread's heap */
    for (int64_t i = 0; i < S; i++) {
        Ent e = {seed_exact[i], (int32_t)seed_rows[i]};
        cand[m++] = e;
    }
    for (int t = 0; t < threads; t++)
        for (int64_t i = 0; i < rs[t].heap.n; i++) cand[m++] = rs[t].heap.e[i];
    if (!full && !failed) {
        /* the `rescore` best partial scores at the stop level get their exact scores */
        int64_t np = 0;
        for (int t = 0; t < threads; t++)
            for (int64_t i = 0; i < rs[t].partial.n; i++) part_mem[np++] = rs[t].partial.e[i];
        qsort(part_mem, (size_t)np, sizeof(Ent), ent_better_first);
        if (np > rescore) np = rescore;
        float *ex = exact_of_entries(c, part_mem, np);
        if (ex) {
            for (int64_t i = 0; i < np; i++) {
                Ent e = {ex[i], part_mem[i].r};
                cand[m++] = e;
            }
            coords += np * c->D;
        } else {
            failed = 1;
        }
        free(ex);
    }
    if (!failed) {
        /* a seed sits in every thread's heap too: copies of one row carry one score, so they are adjacent */
        qsort(cand, (size_t)m, sizeof(Ent), ent_better_first);
        for (int64_t i = 0; i < m && n_out < k; i++) {
            if (n_out > 0 && cand[i].r == rows_out[n_out - 1]) continue;
            rows_out[n_out] = cand[i].r;
            scores_out[n_out] = cand[i].s;
            n_out++;
        }
    }
done:
    free(rs);
    free(cand);
    free(heap_mem);
    free(part_mem);
    free(seed_heap);
    free(seed_sorted);
    *n_out_out = n_out;
    *coords_out = coords;
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------------ query maths
 * One implementation of the per-query quantities adawidth.levels reads (its query_profile, LevelEvidence.
 * feature_array and bound_coefficients call these through the module functions below), so the fused search and
 * the two-call path (begin / finish, the trainer's recall table) compute them bit for bit alike. */

/* tail_sq[l] = ||q[b_l:]||^2 and spread[l] = sqrt(sum_{j >= b_l} q_j^2 m2_j) at every boundary l = 0..L, in
   float64, summed from the last coordinate down. */
static void query_profile_c(const float *q, const double *m2, const int64_t *bounds, int L, double *tail_sq,
                            double *spread) {
    double s1 = 0.0, s2 = 0.0;
    int l = L;
    int64_t D = bounds[L];
    tail_sq[L] = 0.0;
    spread[L] = 0.0;
    for (int64_t j = D - 1; j >= 0; j--) {
        const double qj = (double)q[j], sq = qj * qj;
        s1 += sq;
        s2 += sq * m2[j];
        while (l > 0 && bounds[l - 1] == j) {
            l--;
            tail_sq[l] = s1;
            spread[l] = sqrt(s2 > 0.0 ? s2 : 0.0);
        }
    }
}

#define N_SCALAR_FEATURES 9
/* The evidence features in adawidth.levels' order (_SCALAR_FEATURES, then tail_sq (L + 1), spread (L + 1), the
   survivor shares (Z)): out has N_SCALAR_FEATURES + 2 (L + 1) + Z entries; missing values are NaN. */
static void evidence_features_c(const float *pt, const float *se, int64_t n, double tau, const double *tail_sq,
                                const double *spread, int L, const int64_t *counts, int64_t Z, int64_t scanned,
                                int64_t k, double *out) {
    const double nan = NAN;
    const double p1 = n ? (double)pt[0] : nan, pk = (k >= 1 && k - 1 < n) ? (double)pt[k - 1] : nan;
    const double pl = n ? (double)pt[n - 1] : nan;
    double emax = nan, dsum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || (double)se[i] > emax) emax = (double)se[i];
        dsum += (double)se[i] - (double)pt[i];
    }
    const double sc = (double)(scanned > 1 ? scanned : 1);
    out[0] = isfinite(tau) ? tau : nan;
    out[1] = p1;
    out[2] = pk;
    out[3] = pl;
    out[4] = p1 - pk;
    out[5] = pk - pl;
    out[6] = emax;
    out[7] = n ? dsum / (double)n : nan;
    out[8] = log10(sc);
    double *o = out + N_SCALAR_FEATURES;
    for (int l = 0; l <= L; l++) o[l] = tail_sq[l];
    o += L + 1;
    for (int l = 0; l <= L; l++) o[l] = spread[l];
    o += L + 1;
    for (int64_t j = 0; j < Z; j++) o[j] = (double)counts[j] / sc;
}

#define BOUND_EXACT 0
#define BOUND_DATA_AWARE 1
#define BOUND_DATA_AWARE_DOC 2
#define U32 5.9604644775390625e-08 /* 2^-24, the unit roundoff of float32 */

/* The kernel's bound at every boundary: min(a[l] * ||d[b_l:]||, c[l]) + bb[l] (see adawidth.levels.
   bound_coefficients), each rounded up to float32 by a relative 2^-20. */
static void bound_coefficients_c(const double *tail_sq, const double *spread, const double *inv_rms_tail, int L,
                                 int L16, int64_t D, double max_norm, double fp16_residual_max, int bound, double z,
                                 float *a, float *c, float *bb) {
    const double qn = sqrt(tail_sq[0]);
    double slack = 2.0 * (double)(D + 16) * U32 * qn * max_norm * (1.0 + 0x1p-10);
    if (L16) {
        const double d = tail_sq[0] - tail_sq[L16];
        slack += sqrt(d > 0.0 ? d : 0.0) * fp16_residual_max;
    }
    const double up = 1.0 + 0x1p-20;
    for (int l = 0; l <= L; l++) {
        double al = sqrt(tail_sq[l]), cl = INFINITY;
        if (bound == BOUND_DATA_AWARE) {
            cl = z * spread[l];
        } else if (bound == BOUND_DATA_AWARE_DOC) {
            const double v = z * spread[l] * inv_rms_tail[l];
            if (v < al) al = v;
        }
        a[l] = (float)(al * up);
        c[l] = (float)(cl * up);
        bb[l] = (float)(slack * up);
    }
}

/* The k-th best of v[0..n) (n >= k >= 1), v unchanged. */
static float kth_best(const float *v, int64_t n, int64_t k, float *scratch) {
    for (int64_t i = 0; i < n; i++) { /* insertion sort, descending: a few dozen seeds */
        float x = v[i];
        int64_t j = i - 1;
        while (j >= 0 && scratch[j] < x) {
            scratch[j + 1] = scratch[j];
            j--;
        }
        scratch[j + 1] = x;
    }
    return scratch[k - 1];
}

/* ------------------------------------------------------------------------------------------------ Python glue */

/*
 * scan_first(levels32, levels16, bounds, tails, q, allowed, ranges, N, n_first, n_seed, threads,
 *            p_scan_out, seed_rows_out, seed_partial_out, seed_exact_out) -> (n_seeds, scanned, coordinates)
 *
 * p_scan_out: (P,) float32, the partial score over the first n_first levels of every scanned position (NaN
 * outside `allowed`);
 * seed_*_out: (n_seed,) int64 / float32 / float32: rows of the best partial scores (best first), those partial
 * scores, and their exact scores.  Only the first n_seeds entries are written.
 */
static PyObject *py_scan_first(PyObject *self, PyObject *args) {
    StoreArgs sa;
    PyObject *pout_o, *srow_o, *spart_o, *sexact_o;
    Py_ssize_t n_seed;
    int threads, n_first;
    if (!PyArg_ParseTuple(args, "OOOOOOOniniOOOO", &sa.levels32, &sa.levels16, &sa.bounds, &sa.tails, &sa.q,
                          &sa.allowed, &sa.ranges, &sa.N, &n_first, &n_seed, &threads, &pout_o, &srow_o, &spart_o,
                          &sexact_o))
        return NULL;
    Views v = {.n = 0};
    Ctx c = {0};
    PyObject *result = NULL;
    float *p_scan, *seed_part, *seed_exact;
    int64_t *seed_rows;
    if (fill_ctx(&c, &v, &sa) < 0) goto out;
    if (n_seed < 0) {
        PyErr_SetString(PyExc_ValueError, "n_seed must be >= 0");
        goto out;
    }
    if (n_first < 1 || n_first > c.L || (c.L16 > 0 && n_first > c.L16)) {
        PyErr_SetString(PyExc_ValueError, "need 1 <= n_first <= L, and n_first <= L16 when there are float16 levels");
        goto out;
    }
    GET(pout_o, 4, c.P, 1, 1, "p_scan_out", p_scan, NULL);
    GET(srow_o, 8, n_seed, 1, 1, "seed_rows_out", seed_rows, NULL);
    GET(spart_o, 4, n_seed, 1, 1, "seed_partial_out", seed_part, NULL);
    GET(sexact_o, 4, n_seed, 1, 1, "seed_exact_out", seed_exact, NULL);
    int rc;
    int64_t n_found, scanned, coords;
    Py_BEGIN_ALLOW_THREADS;
    rc = first_pass(&c, n_first, n_seed, threads, p_scan, seed_rows, seed_part, seed_exact, &n_found, &scanned,
                    &coords);
    Py_END_ALLOW_THREADS;
    if (rc < 0) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("(LLL)", (long long)n_found, (long long)scanned, (long long)coords);
out:
    free_ctx(&c);
    release_views(&v);
    return result;
}

/* The checks of the pass-2 arguments shared by scan_rest and search. */
static int check_rest_args(const Ctx *c, int n_first, int64_t k, int64_t rescore, int stop_level) {
    if (n_first < 1 || n_first > c->L || (c->L16 > 0 && n_first > c->L16)) {
        PyErr_SetString(PyExc_ValueError, "need 1 <= n_first <= L, and n_first <= L16 when there are float16 levels");
        return -1;
    }
    if (k < 1 || rescore < 0 || stop_level < n_first - 1 || stop_level >= c->L) {
        PyErr_SetString(PyExc_ValueError, "need k >= 1, rescore >= 0 and n_first - 1 <= stop_level < L");
        return -1;
    }
    return 0;
}

/*
 * scan_rest(levels32, levels16, bounds, tails, q, allowed, ranges, N, n_first, p_scan, a, c, bb,
 *           seed_rows, seed_exact, k, stop_level, rescore, threads, rows_out, scores_out, alive_out)
 *   -> (n_out, coordinates)
 *
 * a, c, bb: (L + 1,) float32 bound coefficients at each level boundary; seed_rows (S,) int64 and seed_exact (S,)
 * float32 from scan_first; rows_out (k,) int64 and scores_out (k,) float32 receive the result best first;
 * alive_out (L,) int64 is added to (candidates entering levels n_first..L-1; the caller fills the first ones).
 */
static PyObject *py_scan_rest(PyObject *self, PyObject *args) {
    StoreArgs sa;
    PyObject *pscan_o, *a_o, *c_o, *bb_o, *srow_o, *sexact_o, *rows_o, *scores_o, *alive_o;
    Py_ssize_t k, rescore;
    int stop_level, threads, n_first;
    if (!PyArg_ParseTuple(args, "OOOOOOOniOOOOOOniniOOO", &sa.levels32, &sa.levels16, &sa.bounds, &sa.tails,
                          &sa.q, &sa.allowed, &sa.ranges, &sa.N, &n_first, &pscan_o, &a_o, &c_o, &bb_o, &srow_o,
                          &sexact_o, &k, &stop_level, &rescore, &threads, &rows_o, &scores_o, &alive_o))
        return NULL;
    Views v = {.n = 0};
    Ctx c = {0};
    PyObject *result = NULL;
    const float *p_scan, *a, *cc, *bb, *seed_exact;
    const int64_t *seed_rows;
    int64_t *rows_out, *alive_out;
    float *scores_out;
    Py_ssize_t S, S2;
    if (fill_ctx(&c, &v, &sa) < 0) goto out;
    if (check_rest_args(&c, n_first, k, rescore, stop_level) < 0) goto out;
    GET(pscan_o, 4, c.P, 0, 1, "p_scan", p_scan, NULL);
    GET(a_o, 4, c.L + 1, 0, 1, "a", a, NULL);
    GET(c_o, 4, c.L + 1, 0, 1, "c", cc, NULL);
    GET(bb_o, 4, c.L + 1, 0, 1, "bb", bb, NULL);
    GET(srow_o, 8, 0, 0, 1, "seed_rows", seed_rows, &S);
    GET(sexact_o, 4, 0, 0, 1, "seed_exact", seed_exact, &S2);
    if (S2 != S) {
        PyErr_SetString(PyExc_ValueError, "seed_rows and seed_exact differ in length");
        goto out;
    }
    GET(rows_o, 8, k, 1, 1, "rows_out", rows_out, NULL);
    GET(scores_o, 4, k, 1, 1, "scores_out", scores_out, NULL);
    GET(alive_o, 8, c.L, 1, 1, "alive_out", alive_out, NULL);
    for (Py_ssize_t i = 0; i < S; i++)
        if (seed_rows[i] < 0 || seed_rows[i] >= c.N) {
            PyErr_SetString(PyExc_ValueError, "a seed row is outside [0, N)");
            goto out;
        }
    int rc;
    int64_t n_out, coords;
    Py_BEGIN_ALLOW_THREADS;
    rc = rest_pass(&c, n_first, p_scan, a, cc, bb, seed_rows, seed_exact, S, k, stop_level, rescore, threads,
                   rows_out, scores_out, alive_out, &n_out, &coords);
    Py_END_ALLOW_THREADS;
    if (rc < 0) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("(LL)", (long long)n_out, (long long)coords);
out:
    free_ctx(&c);
    release_views(&v);
    return result;
}

/* The forest arguments of search: None, or a tuple (feature, threshold, left, right, flags, roots, leaves[,
 * monotone]); monotone true: the model rows' scores never decrease along the z grid (forest_first_at_least). */
static int get_forest(Views *pv, PyObject *o, ForestTrees *f, int *monotone) {
#define v (*pv)
    if (!PyTuple_Check(o) || (PyTuple_GET_SIZE(o) != 7 && PyTuple_GET_SIZE(o) != 8)) {
        PyErr_SetString(PyExc_ValueError, "forest must be None or a tuple of 7 node arrays (and a monotone flag)");
        goto out;
    }
    *monotone = 0;
    if (PyTuple_GET_SIZE(o) == 8) {
        const int m = PyObject_IsTrue(PyTuple_GET_ITEM(o, 7));
        if (m < 0) goto out;
        *monotone = m;
    }
    Py_ssize_t n_nodes, n_roots, n_leaves, n;
    GET(PyTuple_GET_ITEM(o, 0), 4, 0, 0, 1, "forest feature", f->feature, &n_nodes);
    GET(PyTuple_GET_ITEM(o, 1), 8, n_nodes, 0, 1, "forest threshold", f->threshold, &n);
    GET(PyTuple_GET_ITEM(o, 2), 4, n_nodes, 0, 1, "forest left", f->left, &n);
    GET(PyTuple_GET_ITEM(o, 3), 4, n_nodes, 0, 1, "forest right", f->right, &n);
    GET(PyTuple_GET_ITEM(o, 4), 4, n_nodes, 0, 1, "forest flags", f->flags, &n);
    GET(PyTuple_GET_ITEM(o, 5), 4, 0, 0, 1, "forest roots", f->roots, &n_roots);
    GET(PyTuple_GET_ITEM(o, 6), 8, 0, 0, 1, "forest leaves", f->leaves, &n_leaves);
    f->n_nodes = n_nodes;
    f->n_trees = n_roots;
    f->n_leaves = n_leaves;
    return 0;
out:
    return -1;
#undef v
}

/*
 * search(levels32, levels16, bounds, tails, q, allowed, ranges, N,
 *        second_moment, inv_rms_tail, max_norm, fp16_residual_max,
 *        k, n_first, n_seed, threads, bound, z, ev_z, forest, colmap, z_grid, bar,
 *        rows_out, scores_out, alive_out, info_out, features_out) -> n_out
 *
 * One query in one call: pass 1 (the first n_first levels, the seeds), the query profile, the evidence (the
 * survivor counts at ev_z (Ze,) float64 and the features of adawidth.levels.LevelEvidence), the confidence, the
 * bound, pass 2.  second_moment (D,) and inv_rms_tail (L + 1,) float64 are the store's; bound 0 exact, 1
 * data_aware, 2 data_aware_doc.  The confidence: with forest None, z (ignored by the exact bound); else the first
 * z of z_grid (Zp,) float64 whose model row (colmap (F,) int32: evidence index, -1 missing, -2 the z) scores >= bar
 * (the last one when none does).  rows_out (k,) int64 and scores_out (k,) float32 take the result, alive_out (L,)
 * int64 the candidates entering each level, info_out (6,) float64 [z used (NaN: exact), the seed threshold,
 * coordinates, scanned, seeds, coordinates of pass 1], features_out (E,) float64 (or None) the evidence features.
 */
static PyObject *py_search(PyObject *self, PyObject *args) {
    StoreArgs sa;
    PyObject *m2_o, *irt_o, *evz_o, *forest_o, *colmap_o, *zg_o, *rows_o, *scores_o, *alive_o, *info_o, *feat_o;
    double max_norm, fp16_res, z_fixed, bar;
    Py_ssize_t k, n_seed;
    int n_first, threads, bound;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOOddninii" "dOOOOdOOOOO", &sa.levels32, &sa.levels16, &sa.bounds,
                          &sa.tails, &sa.q, &sa.allowed, &sa.ranges, &sa.N, &m2_o, &irt_o, &max_norm, &fp16_res, &k,
                          &n_first, &n_seed, &threads, &bound, &z_fixed, &evz_o, &forest_o, &colmap_o, &zg_o, &bar,
                          &rows_o, &scores_o, &alive_o, &info_o, &feat_o))
        return NULL;
    Views v = {.n = 0};
    Ctx c = {0};
    ForestTrees forest = {0};
    int monotone = 0;
    PyObject *result = NULL;
    const double *m2, *irt, *evz = NULL, *zg = NULL;
    const int32_t *colmap = NULL;
    int64_t *rows_out, *alive_out;
    float *scores_out;
    double *info, *feat_out = NULL;
    Py_ssize_t Ze = 0, Zp = 0, F = 0, n_feat_out = 0;
    const int use_forest = forest_o != Py_None;
    if (fill_ctx(&c, &v, &sa) < 0) goto out;
    const int L = c.L;
    if (check_rest_args(&c, n_first, k, 0, L - 1) < 0) goto out;
    if (n_seed < 0 || bound < BOUND_EXACT || bound > BOUND_DATA_AWARE_DOC) {
        PyErr_SetString(PyExc_ValueError, "need n_seed >= 0 and bound 0 (exact), 1 (data_aware) or 2 (data_aware_doc)");
        goto out;
    }
    if (bound != BOUND_EXACT && !use_forest && !(isfinite(z_fixed) && z_fixed >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "z must be finite and >= 0");
        goto out;
    }
    GET(m2_o, 8, c.D, 0, 1, "second_moment", m2, NULL);
    GET(irt_o, 8, L + 1, 0, 1, "inv_rms_tail", irt, NULL);
    GET(evz_o, 8, 0, 0, 1, "ev_z", evz, &Ze);
    GET(rows_o, 8, k, 1, 1, "rows_out", rows_out, NULL);
    GET(scores_o, 4, k, 1, 1, "scores_out", scores_out, NULL);
    GET(alive_o, 8, L, 1, 1, "alive_out", alive_out, NULL);
    GET(info_o, 8, 6, 1, 1, "info_out", info, NULL);
    const Py_ssize_t E = N_SCALAR_FEATURES + 2 * (L + 1) + Ze;
    GET(feat_o, 8, E, 1, 0, "features_out", feat_out, &n_feat_out);
    if (use_forest) {
        if (bound == BOUND_EXACT) {
            PyErr_SetString(PyExc_ValueError, "the exact bound takes no forest");
            goto out;
        }
        if (get_forest(&v, forest_o, &forest, &monotone) < 0) goto out;
        GET(colmap_o, 4, 1, 0, 1, "colmap", colmap, &F);
        GET(zg_o, 8, 1, 0, 1, "z_grid", zg, &Zp);
        for (Py_ssize_t j = 0; j < F; j++)
            if (colmap[j] < -2 || colmap[j] >= E) {
                PyErr_SetString(PyExc_ValueError, "colmap entries must be -2 (z), -1 (missing) or an evidence index");
                goto out;
            }
        for (Py_ssize_t j = 0; j < Zp; j++)
            if (!isfinite(zg[j]) || zg[j] < 0.0) {
                PyErr_SetString(PyExc_ValueError, "z_grid must hold finite values >= 0");
                goto out;
            }
    }
    const int evidence = use_forest || feat_out != NULL;
    const int64_t P = c.P, S_cap = n_seed < P ? n_seed : P;
    float *p_scan = malloc(sizeof(float) * (size_t)(P + 1));
    int64_t *seed_rows = malloc(sizeof(int64_t) * (size_t)(S_cap + 1));
    float *seed_part = malloc(sizeof(float) * (size_t)(3 * S_cap + 3)), *seed_exact = seed_part + S_cap + 1,
          *scratch = seed_exact + S_cap + 1;
    double *prof = malloc(sizeof(double) * (size_t)(2 * (L + 1) + E + F * (Zp + 1) + 1));
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)(Ze + 1));
    float *coef = malloc(sizeof(float) * (size_t)(3 * (L + 1) + Ze)), *th = coef + 3 * (L + 1);
    int rc = -1, malformed = 0;
    int64_t n_out = 0;
    if (p_scan && seed_rows && seed_part && prof && counts && coef) {
        double *tail_sq = prof, *spread = prof + L + 1, *feat = spread + L + 1, *rowsbuf = feat + E;
        int64_t n_found = 0, scanned = 0, coords1 = 0, coords2 = 0;
        double z = bound == BOUND_EXACT ? NAN : z_fixed, tau = -INFINITY;
        Py_BEGIN_ALLOW_THREADS;
        rc = first_pass(&c, n_first, S_cap, threads, p_scan, seed_rows, seed_part, seed_exact, &n_found, &scanned,
                        &coords1);
        if (rc == 0) {
            if (n_found >= k) tau = (double)kth_best(seed_exact, n_found, k, scratch);
            query_profile_c(c.q, m2, c.bounds, L, tail_sq, spread);
            if (evidence) {
                for (Py_ssize_t j = 0; j < Ze; j++) counts[j] = 0;
                if (Ze && P) { /* one pass over the partial scores for every threshold */
                    for (Py_ssize_t j = 0; j < Ze; j++)
                        th[j] = isfinite(tau) ? (float)(tau - evz[j] * spread[n_first]) : -INFINITY;
                    COUNT(p_scan, P, th, Ze, counts);
                }
                evidence_features_c(seed_part, seed_exact, n_found, tau, tail_sq, spread, L, counts, Ze, scanned, k,
                                    feat);
            }
            if (use_forest) {
                /* the model rows of every z of the grid, then the first whose prediction clears the bar */
                for (Py_ssize_t r = 0; r < Zp; r++)
                    for (Py_ssize_t j = 0; j < F; j++)
                        rowsbuf[r * F + j] = colmap[j] >= 0 ? feat[colmap[j]] : (colmap[j] == -2 ? zg[r] : NAN);
                int64_t found = -1;
                if (forest_first_at_least(&forest, rowsbuf, Zp, F, bar, monotone, &found) < 0)
                    malformed = 1;
                else
                    z = zg[found >= 0 ? found : Zp - 1];
            }
            if (!malformed) {
                float *a = coef, *cc = coef + L + 1, *bb = coef + 2 * (L + 1);
                bound_coefficients_c(tail_sq, spread, irt, L, c.L16, c.D, max_norm, fp16_res, bound, z, a, cc, bb);
                const int64_t k_eff = scanned < k ? (scanned > 1 ? scanned : 1) : k;
                for (int l = 0; l < L; l++) alive_out[l] = l < n_first ? scanned : 0;
                rc = rest_pass(&c, n_first, p_scan, a, cc, bb, seed_rows, seed_exact, n_found, k_eff, L - 1, k_eff,
                               threads, rows_out, scores_out, alive_out, &n_out, &coords2);
            }
        }
        Py_END_ALLOW_THREADS;
        info[0] = z;
        info[1] = tau;
        info[2] = (double)(coords1 + coords2);
        info[3] = (double)scanned;
        info[4] = (double)n_found;
        info[5] = (double)coords1;
        if (feat_out && evidence)
            for (Py_ssize_t j = 0; j < E; j++) feat_out[j] = feat[j];
    }
    free(p_scan);
    free(seed_rows);
    free(seed_part);
    free(prof);
    free(counts);
    free(coef);
    if (malformed) {
        PyErr_SetString(PyExc_ValueError, "malformed forest");
        goto out;
    }
    if (rc < 0) {
        PyErr_NoMemory();
        goto out;
    }
    result = PyLong_FromLongLong((long long)n_out);
out:
    free_ctx(&c);
    release_views(&v);
    return result;
}

/* query_profile(q (D,) float32, second_moment (D,) float64, bounds (L + 1,) int64, tail_sq_out (L + 1,) float64,
   spread_out (L + 1,) float64): see query_profile_c. */
static PyObject *py_query_profile(PyObject *self, PyObject *args) {
    PyObject *q_o, *m2_o, *b_o, *t_o, *s_o;
    if (!PyArg_ParseTuple(args, "OOOOO", &q_o, &m2_o, &b_o, &t_o, &s_o)) return NULL;
    Views v = {.n = 0};
    PyObject *result = NULL;
    const float *q;
    const double *m2;
    const int64_t *bounds;
    double *tail, *spread;
    Py_ssize_t D, nb;
    GET(b_o, 8, 2, 0, 1, "bounds", bounds, &nb);
    const int L = (int)(nb - 1);
    if (L > MAX_LEVELS || bounds[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "bounds must start at 0 and hold at most MAX_LEVELS + 1 values");
        goto out;
    }
    for (int l = 0; l < L; l++)
        if (bounds[l + 1] <= bounds[l]) {
            PyErr_SetString(PyExc_ValueError, "bounds must increase");
            goto out;
        }
    GET(q_o, 4, bounds[L], 0, 1, "q", q, &D);
    GET(m2_o, 8, bounds[L], 0, 1, "second_moment", m2, NULL);
    GET(t_o, 8, L + 1, 1, 1, "tail_sq_out", tail, NULL);
    GET(s_o, 8, L + 1, 1, 1, "spread_out", spread, NULL);
    query_profile_c(q, m2, bounds, L, tail, spread);
    result = Py_None;
    Py_INCREF(result);
out:
    release_views(&v);
    return result;
}

/* evidence_features(seed_partial (S,) float32, seed_exact (S,) float32, tau, tail_sq (L + 1,) float64,
   spread (L + 1,) float64, counts (Z,) int64, scanned, k, out (9 + 2 (L + 1) + Z,) float64). */
static PyObject *py_evidence_features(PyObject *self, PyObject *args) {
    PyObject *pt_o, *se_o, *t_o, *s_o, *c_o, *o_o;
    double tau;
    Py_ssize_t scanned, k;
    if (!PyArg_ParseTuple(args, "OOdOOOnnO", &pt_o, &se_o, &tau, &t_o, &s_o, &c_o, &scanned, &k, &o_o)) return NULL;
    Views v = {.n = 0};
    PyObject *result = NULL;
    const float *pt, *se;
    const double *tail, *spread;
    const int64_t *counts;
    double *out;
    Py_ssize_t S, S2, L1, L2, Z;
    GET(pt_o, 4, 0, 0, 1, "seed_partial", pt, &S);
    GET(se_o, 4, 0, 0, 1, "seed_exact", se, &S2);
    GET(t_o, 8, 1, 0, 1, "tail_sq", tail, &L1);
    GET(s_o, 8, 1, 0, 1, "spread", spread, &L2);
    GET(c_o, 8, 0, 0, 1, "counts", counts, &Z);
    if (S2 != S || L1 != L2) {
        PyErr_SetString(PyExc_ValueError, "seed_partial / seed_exact and tail_sq / spread must match in length");
        goto out;
    }
    GET(o_o, 8, N_SCALAR_FEATURES + 2 * L1 + Z, 1, 1, "out", out, NULL);
    evidence_features_c(pt, se, S, tau, tail, spread, (int)(L1 - 1), counts, Z, scanned, k, out);
    result = Py_None;
    Py_INCREF(result);
out:
    release_views(&v);
    return result;
}

/* bound_coefficients(tail_sq (L + 1,) float64, spread (L + 1,) float64, inv_rms_tail (L + 1,) float64, L16, D,
   max_norm, fp16_residual_max, bound (0/1/2), z, a_out, c_out, bb_out (L + 1,) float32). */
static PyObject *py_bound_coefficients(PyObject *self, PyObject *args) {
    PyObject *t_o, *s_o, *r_o, *a_o, *c_o, *b_o;
    int L16, bound;
    Py_ssize_t D;
    double max_norm, fp16_res, z;
    if (!PyArg_ParseTuple(args, "OOOinddidOOO", &t_o, &s_o, &r_o, &L16, &D, &max_norm, &fp16_res, &bound, &z, &a_o,
                          &c_o, &b_o))
        return NULL;
    Views v = {.n = 0};
    PyObject *result = NULL;
    const double *tail, *spread, *irt;
    float *a, *cc, *bb;
    Py_ssize_t L1;
    GET(t_o, 8, 1, 0, 1, "tail_sq", tail, &L1);
    GET(s_o, 8, L1, 0, 1, "spread", spread, NULL);
    GET(r_o, 8, L1, 0, 1, "inv_rms_tail", irt, NULL);
    GET(a_o, 4, L1, 1, 1, "a_out", a, NULL);
    GET(c_o, 4, L1, 1, 1, "c_out", cc, NULL);
    GET(b_o, 4, L1, 1, 1, "bb_out", bb, NULL);
    if (L16 < 0 || L16 >= L1 || bound < BOUND_EXACT || bound > BOUND_DATA_AWARE_DOC) {
        PyErr_SetString(PyExc_ValueError, "need 0 <= L16 <= L and bound in {0, 1, 2}");
        goto out;
    }
    bound_coefficients_c(tail, spread, irt, (int)(L1 - 1), L16, D, max_norm, fp16_res, bound, z, a, cc, bb);
    result = Py_None;
    Py_INCREF(result);
out:
    release_views(&v);
    return result;
}

/* count_at_least(values (n,) float32, thresholds (m,) float32, out (m,) int64): out[j] = #{i : values[i] >= t_j}
   (NaN values are never counted). */
static PyObject *py_count_at_least(PyObject *self, PyObject *args) {
    PyObject *vo, *to, *oo;
    if (!PyArg_ParseTuple(args, "OOO", &vo, &to, &oo)) return NULL;
    Views v = {.n = 0};
    PyObject *result = NULL;
    const float *vals, *th;
    int64_t *cnt;
    Py_ssize_t n, m;
    GET(vo, 4, 0, 0, 1, "values", vals, &n);
    GET(to, 4, 0, 0, 1, "thresholds", th, &m);
    GET(oo, 8, m, 1, 1, "out", cnt, NULL);
    Py_BEGIN_ALLOW_THREADS;
    COUNT(vals, n, th, m, cnt);
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
out:
    release_views(&v);
    return result;
}

static PyObject *py_isa(PyObject *self, PyObject *args) { return PyUnicode_FromString(ISA); }

static PyObject *py_set_isa(PyObject *self, PyObject *args) {
    const char *want;
    if (!PyArg_ParseTuple(args, "s", &want)) return NULL;
    if (strcmp(want, "auto") != 0 && strcmp(want, "generic") != 0 && strcmp(want, "avx2") != 0 &&
        strcmp(want, "avx512") != 0) {
        PyErr_SetString(PyExc_ValueError, "isa must be auto, generic, avx2 or avx512");
        return NULL;
    }
    select_isa(strcmp(want, "auto") == 0 ? NULL : want);
    return PyUnicode_FromString(ISA);
}

static PyObject *py_set_min_rows_per_thread(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "rows per thread must be >= 1");
        return NULL;
    }
    Py_ssize_t old = (Py_ssize_t)MIN_ROWS_PER_THREAD;
    MIN_ROWS_PER_THREAD = n;
    return PyLong_FromSsize_t(old);
}

static PyObject *py_threads_for(PyObject *self, PyObject *args) {
    int threads;
    long long rows;
    if (!PyArg_ParseTuple(args, "iL", &threads, &rows)) return NULL;
    return PyLong_FromLong(clamp_threads(threads, rows < 0 ? 0 : (int64_t)rows));
}

static PyMethodDef methods[] = {
    {"scan_first", py_scan_first, METH_VARARGS, "Level 0 over every candidate, fused top-n_seed, the seeds' exact scores."},
    {"scan_rest", py_scan_rest, METH_VARARGS, "Levels 1..L-1 with pruning and a fused top-k."},
    {"search", py_search, METH_VARARGS, "One query in one call: pass 1, evidence, the policy's confidence, pass 2."},
    {"count_at_least", py_count_at_least, METH_VARARGS, "Counts of values >= each threshold."},
    {"query_profile", py_query_profile, METH_VARARGS, "The query's tail energy and data-aware spread at each boundary."},
    {"evidence_features", py_evidence_features, METH_VARARGS, "The recall policy's evidence features."},
    {"bound_coefficients", py_bound_coefficients, METH_VARARGS, "The pruning bound's coefficients at each boundary."},
    {"isa", py_isa, METH_NOARGS, "The SIMD variant in use: avx512, avx2 or generic."},
    {"set_isa", py_set_isa, METH_VARARGS, "Select a SIMD variant (auto, generic, avx2, avx512); the best available below it is used."},
    {"threads_for", py_threads_for, METH_VARARGS,
     "The threads a scan of `rows` rows given `threads` actually uses (one per min_rows_per_thread rows at most)."},
    {"set_min_rows_per_thread", py_set_min_rows_per_thread, METH_VARARGS,
     "Set the rows per kernel thread below which fewer threads are used (default 32768); returns the old value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_levelscan",
    .m_doc = "Compiled level-by-level pruning scan (see adawidth.levels).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__levelscan(void) {
    select_isa(NULL);
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0 || PyModule_AddIntConstant(m, "BLOCK_FIRST", BLOCK_FIRST) < 0 ||
        PyModule_AddIntConstant(m, "MAX_LEVELS", MAX_LEVELS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
