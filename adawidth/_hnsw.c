/* A resumable HNSW search over a faiss index's own graph and vectors (engine.ann.ResumableHnsw).
 *
 * faiss keeps no search state: a query searched at efSearch e and then at e' > e pays the first search again.  The
 * per-query effort model (engine.ann.probe_and_choose) probes every query at a small efSearch, reads the probe's
 * evidence and picks the efSearch the query needs; with faiss the queries the probe does not settle search again
 * from the top.  This search keeps its state, so the probe's work is the first part of the continuation's.
 *
 * The search is faiss's (faiss/impl/HNSW.cpp, HNSW::search with a bounded queue; Malkov & Yashunin, TPAMI 2018,
 * Alg. 2 and 5): a greedy descent of the upper levels from the entry point, then a best-first beam search of level
 * 0 whose beam holds the ef closest documents seen, until every document of the beam has been expanded.  Its state
 * is the visited documents: the beam (the ef closest, a max-heap), the reserve (every other visited document, a
 * min-heap: what a beam of ef evicted or never admitted), and which documents were expanded.  Resuming at ef' > ef
 * moves the reserve's best into the beam until it holds ef', then expands on until the beam is expanded again.
 * Each phase ends in faiss's own state of convergence (every document of the ef' closest visited ones expanded);
 * the order of expansion differs from a fresh search at ef', so the answers may differ in a few rows: the effort
 * model is calibrated on this search's own answers (trainer.recall_fit.effort_tables).
 *
 * Graph(neighbors, offsets, levels, cum_nneighbor_per_level, vectors, dim, fp16, entry_point, max_level)
 *   views (no copies) of faiss's HNSW arrays (int32, uint64, int32, int32) and of its storage's vectors: float32
 *   (N, dim) of an IndexFlat, or the uint16 float16 codes (N, dim) of an IndexScalarQuantizer QT_fp16.  Scores are
 *   inner products (higher is closer); the search runs on d = -<q, x> as faiss's inner-product HNSW does.
 * Search(graph, query)   query float32 (dim,); a visited table is taken from the graph's pool for its life.
 *   .run(ef, D, I) -> distance computations so far (the probe's included); D float32 (k,), I int64 (k,) written
 *   with the k best documents found, best first, ties by the lower row (-1 and -FLT_MAX pad a short answer); D and
 *   I both None: no answer (a step on the way to a wider beam).  ef below the largest run
 *   so far changes nothing but the answer's copy.  The GIL is released while it searches; one Search must not
 *   be run by two threads at once.
 *   .serve(feature, threshold, left, right, flags, roots, leaves, n_features, prefix, z_grid, bar, monotone,
 *          evidence, D, I) -> (j, n, probe_distances, distances)
 *   one query's per-query effort in one call, on a Search that has not run (engine.ann.serve_per_query): the
 *   probe at efSearch max(z_grid[0], k) into D, I; its evidence into evidence and the first grid position j whose
 *   predicted recall clears bar (-1 none: the grid's last), as adawidth._effort.probe_choice computes them from
 *   the same answer (_effort_eval.h; its arguments too); then, when the chosen effort is above the probe's, the
 *   search on through the grid's efforts in between to it, its answer into D, I (ResumableHnsw.hits).  j = -2:
 *   the probe's answer needs ranking (ties, duplicates): D, I hold it, nothing more ran, and the caller chooses
 *   on the Python path.  n: the probe's candidates; the distance computations after the probe and in all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_effort_eval.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HAVE_X86 1
#endif

typedef struct {
    float d;
    int32_t id;
} Entry;

/* -- inner products ------------------------------------------------------------------------------------------- */

typedef void (*dots_fn)(const void *X, int64_t dim, const int32_t *ids, int n, const float *q, float *out);

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 113;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void dots_f32_generic(const void *X, int64_t dim, const int32_t *ids, int n, const float *q, float *out) {
    for (int i = 0; i < n; i++) {
        const float *x = (const float *)X + (int64_t)ids[i] * dim;
        float s = 0.f;
        for (int64_t j = 0; j < dim; j++) s += q[j] * x[j];
        out[i] = s;
    }
}

static void dots_f16_generic(const void *X, int64_t dim, const int32_t *ids, int n, const float *q, float *out) {
    for (int i = 0; i < n; i++) {
        const uint16_t *x = (const uint16_t *)X + (int64_t)ids[i] * dim;
        float s = 0.f;
        for (int64_t j = 0; j < dim; j++) s += q[j] * half_to_float(x[j]);
        out[i] = s;
    }
}

#ifdef HAVE_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#define LOAD32(x, j) _mm256_loadu_ps((x) + (j))
#define LOAD16(x, j) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((x) + (j))))
/* four rows at a time (independent accumulators), then one; tails of dim % 8 in scalar */
#define DEFINE_DOTS(NAME, T, LOAD, SCALAR)                                                                         \
    AVX2 static void NAME(const void *X, int64_t dim, const int32_t *ids, int n, const float *q, float *out) {     \
        int64_t body = dim & ~(int64_t)7;                                                                          \
        int i = 0;                                                                                                 \
        for (; i + 4 <= n; i += 4) {                                                                               \
            const T *x0 = (const T *)X + (int64_t)ids[i] * dim, *x1 = (const T *)X + (int64_t)ids[i + 1] * dim;     \
            const T *x2 = (const T *)X + (int64_t)ids[i + 2] * dim, *x3 = (const T *)X + (int64_t)ids[i + 3] * dim; \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                            \
            for (int64_t j = 0; j < body; j += 8) {                                                                \
                __m256 qj = _mm256_loadu_ps(q + j);                                                                \
                a0 = _mm256_fmadd_ps(LOAD(x0, j), qj, a0);                                                         \
                a1 = _mm256_fmadd_ps(LOAD(x1, j), qj, a1);                                                         \
                a2 = _mm256_fmadd_ps(LOAD(x2, j), qj, a2);                                                         \
                a3 = _mm256_fmadd_ps(LOAD(x3, j), qj, a3);                                                         \
            }                                                                                                      \
            float s0 = hsum8(a0), s1 = hsum8(a1), s2 = hsum8(a2), s3 = hsum8(a3);                                  \
            for (int64_t j = body; j < dim; j++) {                                                                 \
                s0 += q[j] * SCALAR(x0[j]);                                                                        \
                s1 += q[j] * SCALAR(x1[j]);                                                                        \
                s2 += q[j] * SCALAR(x2[j]);                                                                        \
                s3 += q[j] * SCALAR(x3[j]);                                                                        \
            }                                                                                                      \
            out[i] = s0;                                                                                           \
            out[i + 1] = s1;                                                                                       \
            out[i + 2] = s2;                                                                                       \
            out[i + 3] = s3;                                                                                       \
        }                                                                                                          \
        for (; i < n; i++) {                                                                                       \
            const T *x = (const T *)X + (int64_t)ids[i] * dim;                                                     \
            __m256 a = _mm256_setzero_ps();                                                                        \
            for (int64_t j = 0; j < body; j += 8) a = _mm256_fmadd_ps(LOAD(x, j), _mm256_loadu_ps(q + j), a);     \
            float s = hsum8(a);                                                                                    \
            for (int64_t j = body; j < dim; j++) s += q[j] * SCALAR(x[j]);                                         \
            out[i] = s;                                                                                            \
        }                                                                                                          \
    }
#define AS_FLOAT(v) (v)
DEFINE_DOTS(dots_f32_avx2, float, LOAD32, AS_FLOAT)
DEFINE_DOTS(dots_f16_avx2, uint16_t, LOAD16, half_to_float)
#endif

static dots_fn DOTS_F32 = dots_f32_generic, DOTS_F16 = dots_f16_generic;

/* -- heaps of (d, id): max-heap (beam: worst on top) and min-heap (candidates, reserve: best on top) ----------- */

static inline int before(Entry a, Entry b, int max) { return max ? a.d > b.d : a.d < b.d; }

static void heap_push(Entry *h, int *n, Entry e, int max) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!before(e, h[p], max)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static Entry heap_pop(Entry *h, int *n, int max) {
    Entry top = h[0], last = h[--(*n)];
    int i = 0, m = *n;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && before(h[c + 1], h[c], max)) c++;
        if (!before(h[c], last, max)) break;
        h[i] = h[c];
        i = c;
    }
    if (m > 0) h[i] = last;
    return top;
}

typedef struct {
    Entry *a;
    int n, cap;
} Heap;

static int heap_reserve(Heap *h, int more) {
    if (h->n + more <= h->cap) return 0;
    int cap = h->cap ? h->cap : 64;
    while (cap < h->n + more) cap *= 2;
    Entry *a = realloc(h->a, (size_t)cap * sizeof(Entry));
    if (!a) return -1;
    h->a = a;
    h->cap = cap;
    return 0;
}

/* -- the graph ------------------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t *stamp; /* per document: >= gen visited this search, gen + 1 expanded */
    uint32_t gen;
} Visited;

typedef struct {
    PyObject_HEAD Py_buffer buf[5];
    int nbuf;
    const int32_t *neighbors, *levels, *cum;
    const uint64_t *offsets;
    const void *X;
    int64_t n, dim;
    int fp16, max_level;
    int32_t entry;
    Visited *pool;
    int npool, cappool;
} Graph;

static void graph_dealloc(Graph *g) {
    for (int i = 0; i < g->nbuf; i++) PyBuffer_Release(&g->buf[i]);
    for (int i = 0; i < g->npool; i++) free(g->pool[i].stamp);
    free(g->pool);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static int graph_init(Graph *g, PyObject *args, PyObject *kw) {
    PyObject *o[5];
    long long dim, entry;
    int fp16, max_level;
    if (!PyArg_ParseTuple(args, "OOOOOLpLi", &o[0], &o[1], &o[2], &o[3], &o[4], &dim, &fp16, &entry, &max_level))
        return -1;
    if (g->nbuf) {
        PyErr_SetString(PyExc_RuntimeError, "Graph is initialised once");
        return -1;
    }
    static const Py_ssize_t size[5] = {4, 8, 4, 4, 0};
    for (; g->nbuf < 5; g->nbuf++)
        if (PyObject_GetBuffer(o[g->nbuf], &g->buf[g->nbuf], PyBUF_C_CONTIGUOUS) < 0) return -1;
    for (int i = 0; i < 4; i++)
        if (g->buf[i].itemsize != size[i]) {
            PyErr_SetString(PyExc_ValueError, "neighbors int32, offsets uint64, levels int32, cum int32");
            return -1;
        }
    g->n = g->buf[2].len / 4;
    g->dim = dim;
    g->fp16 = fp16;
    if (dim <= 0 || g->buf[4].len != g->n * dim * (fp16 ? 2 : 4) || g->buf[1].len != (g->n + 1) * 8 ||
        entry < 0 || entry >= g->n || max_level < 0 || g->buf[3].len / 4 < max_level + 2) {
        PyErr_SetString(PyExc_ValueError, "vectors must be (N, dim) float32 (float16 codes when fp16), offsets "
                                          "(N + 1,), the entry point a document, cum at least max_level + 2 long");
        return -1;
    }
    g->neighbors = g->buf[0].buf;
    g->offsets = g->buf[1].buf;
    g->levels = g->buf[2].buf;
    g->cum = g->buf[3].buf;
    g->X = g->buf[4].buf;
    g->entry = (int32_t)entry;
    g->max_level = max_level;
    return 0;
}

static PyObject *graph_n(Graph *g, void *closure) { return PyLong_FromLongLong(g->n); }
static PyGetSetDef graph_getset[] = {{"n", (getter)graph_n, NULL, "documents in the graph", NULL}, {NULL}};

static PyTypeObject GraphType = {PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adawidth._hnsw.Graph",
                                 .tp_basicsize = sizeof(Graph),
                                 .tp_flags = Py_TPFLAGS_DEFAULT,
                                 .tp_new = PyType_GenericNew,
                                 .tp_init = (initproc)graph_init,
                                 .tp_dealloc = (destructor)graph_dealloc,
                                 .tp_getset = graph_getset,
                                 .tp_doc = "Views of a faiss HNSW index's graph and vectors (see the module)."};

/* -- one query's search --------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD Graph *g;
    float *q;
    Visited vt;
    Heap beam, reserve, cand;
    int ef, started;
    int64_t ndis;
} Search;

static void search_dealloc(Search *s) {
    if (s->g) {
        if (s->vt.stamp) { /* back to the pool (held under the GIL) */
            Graph *g = s->g;
            if (g->npool == g->cappool) {
                int cap = g->cappool ? 2 * g->cappool : 4;
                Visited *p = realloc(g->pool, (size_t)cap * sizeof(Visited));
                if (p) {
                    g->pool = p;
                    g->cappool = cap;
                }
            }
            if (g->npool < g->cappool)
                g->pool[g->npool++] = s->vt;
            else
                free(s->vt.stamp);
        }
        Py_DECREF(s->g);
    }
    free(s->q);
    free(s->beam.a);
    free(s->reserve.a);
    free(s->cand.a);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int search_init(Search *s, PyObject *args, PyObject *kw) {
    PyObject *go, *qo;
    if (!PyArg_ParseTuple(args, "O!O", &GraphType, &go, &qo)) return -1;
    if (s->g) {
        PyErr_SetString(PyExc_RuntimeError, "Search is initialised once");
        return -1;
    }
    Graph *g = (Graph *)go;
    if (!g->nbuf) {
        PyErr_SetString(PyExc_ValueError, "the graph is not initialised");
        return -1;
    }
    Py_buffer qb;
    if (PyObject_GetBuffer(qo, &qb, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (qb.itemsize != 4 || qb.len != g->dim * 4) {
        PyBuffer_Release(&qb);
        PyErr_Format(PyExc_ValueError, "query must be float32 (%lld,)", (long long)g->dim);
        return -1;
    }
    s->q = malloc((size_t)g->dim * 4);
    if (!s->q) {
        PyBuffer_Release(&qb);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(s->q, qb.buf, (size_t)g->dim * 4);
    PyBuffer_Release(&qb);
    if (g->npool) {
        s->vt = g->pool[--g->npool];
    } else {
        s->vt.stamp = calloc((size_t)g->n, 4);
        s->vt.gen = 0;
        if (!s->vt.stamp) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (s->vt.gen >= UINT32_MAX - 4) { /* stamps wrap: start over */
        memset(s->vt.stamp, 0, (size_t)g->n * 4);
        s->vt.gen = 0;
    }
    s->vt.gen += 2; /* this search: gen visited, gen + 1 expanded */
    Py_INCREF(g);
    s->g = g;
    return 0;
}

/* the greedy descent of the upper levels (faiss's greedy_update_nearest): the closest document found at level 1 */
static Entry descend(Search *s, dots_fn dots) {
    const Graph *g = s->g;
    Entry best = {0.f, g->entry};
    float dot;
    dots(g->X, g->dim, &best.id, 1, s->q, &dot);
    best.d = -dot; /* not counted: faiss's statistics leave the entry point's distance out too */
    for (int level = g->max_level; level >= 1; level--) {
        for (;;) {
            int32_t prev = best.id, ids[4];
            float out[4];
            uint64_t begin = g->offsets[prev] + (uint64_t)g->cum[level], end = g->offsets[prev] + g->cum[level + 1];
            int m = 0;
            for (uint64_t j = begin; j < end; j++) {
                int32_t v = g->neighbors[j];
                if (v < 0) break;
                ids[m++] = v;
                if (m == 4 || j + 1 == end || g->neighbors[j + 1] < 0) {
                    dots(g->X, g->dim, ids, m, s->q, out);
                    s->ndis += m;
                    for (int t = 0; t < m; t++)
                        if (-out[t] < best.d) {
                            best.d = -out[t];
                            best.id = ids[t];
                        }
                    m = 0;
                }
            }
            if (best.id == prev) break;
        }
    }
    return best;
}

/* level 0 until every document of the ef closest visited ones is expanded; -1 when out of memory */
static int expand(Search *s, dots_fn dots, int ef) {
    const Graph *g = s->g;
    uint32_t *stamp = s->vt.stamp, gen = s->vt.gen;
    int32_t ids[512];
    float out[512];
    const int64_t row_bytes = g->dim * (g->fp16 ? 2 : 4);
    while (s->cand.n > 0) {
        Entry c = s->cand.a[0];
        if (s->beam.n >= ef && c.d > s->beam.a[0].d) break; /* left in cand: a resume rebuilds it anyway */
        heap_pop(s->cand.a, &s->cand.n, 0);
        if (stamp[c.id] == gen + 1) continue;
        stamp[c.id] = gen + 1;
        uint64_t begin = g->offsets[c.id] + (uint64_t)g->cum[0], end = g->offsets[c.id] + (uint64_t)g->cum[1];
        int m = 0;
        for (uint64_t j = begin; j < end && m < 512; j++) {
            int32_t v = g->neighbors[j];
            if (v < 0) break;
            if (stamp[v] >= gen) continue;
            stamp[v] = gen;
            ids[m++] = v;
            __builtin_prefetch((const char *)g->X + (int64_t)v * row_bytes);
        }
        if (!m) continue;
        dots(g->X, g->dim, ids, m, s->q, out);
        s->ndis += m;
        if (heap_reserve(&s->cand, m) || heap_reserve(&s->reserve, m) || heap_reserve(&s->beam, m)) return -1;
        for (int t = 0; t < m; t++) {
            Entry e = {-out[t], ids[t]};
            if (s->beam.n < ef) {
                heap_push(s->beam.a, &s->beam.n, e, 1);
                heap_push(s->cand.a, &s->cand.n, e, 0);
            } else if (e.d < s->beam.a[0].d) {
                Entry out_of_beam = heap_pop(s->beam.a, &s->beam.n, 1);
                heap_push(s->reserve.a, &s->reserve.n, out_of_beam, 0);
                heap_push(s->beam.a, &s->beam.n, e, 1);
                heap_push(s->cand.a, &s->cand.n, e, 0);
            } else {
                heap_push(s->reserve.a, &s->reserve.n, e, 0);
            }
        }
    }
    return 0;
}

static int cmp_entry(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->d != y->d) return x->d < y->d ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The search at beam width ef (or on from the widest so far), and when D is not NULL its k best into D, I (best
 * first, ties by the lower row; -FLT_MAX and -1 pad a short answer).  Runs without the GIL.  -1: out of memory. */
static int run_at(Search *s, int ef, float *D, int64_t *I, Py_ssize_t k) {
    dots_fn dots = s->g->fp16 ? DOTS_F16 : DOTS_F32;
    if (!s->started) {
        Entry ep = descend(s, dots);
        if (heap_reserve(&s->beam, 1) || heap_reserve(&s->cand, 1)) return -1;
        s->vt.stamp[ep.id] = s->vt.gen;
        heap_push(s->beam.a, &s->beam.n, ep, 1);
        heap_push(s->cand.a, &s->cand.n, ep, 0);
        s->started = 1;
    } else if (ef > s->ef) { /* widen the beam from the reserve, then rebuild the candidates: its unexpanded */
        if (heap_reserve(&s->beam, ef - s->beam.n)) return -1;
        while (s->beam.n < ef && s->reserve.n > 0)
            heap_push(s->beam.a, &s->beam.n, heap_pop(s->reserve.a, &s->reserve.n, 0), 1);
        s->cand.n = 0;
        if (heap_reserve(&s->cand, s->beam.n)) return -1;
        for (int i = 0; i < s->beam.n; i++)
            if (s->vt.stamp[s->beam.a[i].id] != s->vt.gen + 1) heap_push(s->cand.a, &s->cand.n, s->beam.a[i], 0);
    }
    if (ef > s->ef) {
        s->ef = ef;
        if (expand(s, dots, ef) < 0) return -1;
    }
    if (!D) return 0;
    Entry *top = malloc((size_t)(s->beam.n ? s->beam.n : 1) * sizeof(Entry));
    if (!top) return -1;
    memcpy(top, s->beam.a, (size_t)s->beam.n * sizeof(Entry));
    qsort(top, (size_t)s->beam.n, sizeof(Entry), cmp_entry);
    for (Py_ssize_t i = 0; i < k; i++) {
        D[i] = i < s->beam.n ? -top[i].d : -FLT_MAX;
        I[i] = i < s->beam.n ? top[i].id : -1;
    }
    free(top);
    return 0;
}

static int check_initialised(Search *s) {
    if (!s->g) PyErr_SetString(PyExc_ValueError, "the search is not initialised");
    return s->g ? 0 : -1;
}

static PyObject *search_run(Search *s, PyObject *args) {
    int ef;
    PyObject *Do, *Io;
    if (!PyArg_ParseTuple(args, "iOO", &ef, &Do, &Io)) return NULL;
    if (check_initialised(s) < 0) return NULL;
    if (ef < 1) {
        PyErr_SetString(PyExc_ValueError, "ef must be at least 1");
        return NULL;
    }
    Py_buffer Db = {0}, Ib = {0};
    int answer = Do != Py_None || Io != Py_None;
    if (answer) {
        if (PyObject_GetBuffer(Do, &Db, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
        if (PyObject_GetBuffer(Io, &Ib, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&Db);
            return NULL;
        }
    }
    PyObject *result = NULL;
    Py_ssize_t k = Db.len / 4;
    if (answer && (Db.itemsize != 4 || Ib.itemsize != 8 || Ib.len != k * 8 || k < 1)) {
        PyErr_SetString(PyExc_ValueError, "D float32 (k,) and I int64 (k,), k >= 1 (or both None: no answer)");
        goto done;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS;
    failed = run_at(s, ef, answer ? Db.buf : NULL, answer ? Ib.buf : NULL, k) < 0;
    Py_END_ALLOW_THREADS;
    if (failed)
        PyErr_NoMemory();
    else
        result = PyLong_FromLongLong(s->ndis);
done:
    if (answer) {
        PyBuffer_Release(&Db);
        PyBuffer_Release(&Ib);
    }
    return result;
}

/* serve(feature, threshold, left, right, flags, roots, leaves, n_features, prefix, z_grid, bar, monotone,
 *       evidence, D, I) -> (j, n, probe_distances, distances): see the module. */
static PyObject *search_serve(Search *s, PyObject *args) {
    PyObject *o[12];
    Py_ssize_t n_features;
    double bar;
    int monotone = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOOdpOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &n_features,
                          &o[7], &o[8], &bar, &monotone, &o[9], &o[10], &o[11]))
        return NULL;
    if (check_initialised(s) < 0) return NULL;
    if (s->started) {
        PyErr_SetString(PyExc_ValueError, "serve starts a search: this one has run already");
        return NULL;
    }
    Py_buffer b[12];
    int got = 0;
    PyObject *out = NULL;
    for (; got < 12; got++)
        if (PyObject_GetBuffer(o[got], &b[got], (got >= 9 ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0) goto done;
    ForestTrees f;
    if (effort_forest_of(b, &f) < 0) goto done;
    if (b[7].itemsize != 4 || b[8].itemsize != 8 || b[9].itemsize != 8 || b[10].itemsize != 4 || b[11].itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "prefix float32, z_grid and evidence float64, D float32, I int64");
        goto done;
    }
    const float *prefix = b[7].buf;
    const double *z = b[8].buf;
    double *ev = b[9].buf;
    float *D = b[10].buf;
    int64_t *I = b[11].buf;
    const Py_ssize_t n_z = b[8].len / 8, n_ev = b[9].len / 8, k = b[10].len / 4;
    if (b[11].len != k * 8 || k < 1 || n_ev < EFFORT_N_FIXED || n_features != n_ev + 1 || n_z < 1 || z[0] < 1 ||
        z[n_z - 1] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "D and I must be (k,), k >= 1, evidence (E >= 10,) with n_features = "
                                          "E + 1, z_grid non-empty efforts from 1");
        goto done;
    }
    int64_t at = -1, found = 0, probe_ndis = 0;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS;
    const int kk = (int)k, probe = (int)z[0] > kk ? (int)z[0] : kk;
    rc = run_at(s, probe, D, I, k) < 0 ? -2 : 0;
    probe_ndis = s->ndis;
    if (!rc)
        rc = effort_choose(&f, D, I, k, (double)probe_ndis, prefix, b[7].len / 4, z, n_z, bar, monotone, ev, n_ev,
                           &at, &found);
    if (!rc && at != -2) { /* engine.stage1.AnnStage1.per_query, engine.ann.ResumableHnsw.hits */
        const int chosen = (int)z[at >= 0 ? at : n_z - 1], effort = chosen > kk ? chosen : kk;
        if (effort > probe) {
            for (Py_ssize_t i = 0; i < n_z && !rc; i++) {
                const int e = (int)z[i] > kk ? (int)z[i] : kk;
                if (s->ef < e && e < effort) rc = run_at(s, e, NULL, NULL, k) < 0 ? -2 : 0;
            }
            if (!rc) rc = run_at(s, effort, D, I, k) < 0 ? -2 : 0;
        }
    }
    Py_END_ALLOW_THREADS;
    if (rc == -2)
        PyErr_NoMemory();
    else if (rc < 0)
        PyErr_SetString(PyExc_ValueError, "malformed forest");
    else
        out = Py_BuildValue("LLLL", (long long)at, (long long)found, (long long)probe_ndis, (long long)s->ndis);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return out;
}

static PyObject *search_ndis(Search *s, void *closure) { return PyLong_FromLongLong(s->ndis); }
static PyObject *search_ef(Search *s, void *closure) { return PyLong_FromLong(s->ef); }

static PyMethodDef search_methods[] = {
    {"run", (PyCFunction)search_run, METH_VARARGS,
     "run(ef, D, I) -> distance computations so far: search (or resume) at beam width ef, the k best into D, I "
     "(None, None: no answer)."},
    {"serve", (PyCFunction)search_serve, METH_VARARGS,
     "serve(feature, threshold, left, right, flags, roots, leaves, n_features, prefix, z_grid, bar, monotone, "
     "evidence, D, I) -> (j, n, probe_distances, distances): the probe at z_grid[0], its evidence and the model's "
     "choice (_effort_eval.h), the continuation to the chosen effort through the grid; see the module."},
    {NULL}};
static PyGetSetDef search_getset[] = {{"ndis", (getter)search_ndis, NULL, "distance computations so far", NULL},
                                      {"ef", (getter)search_ef, NULL, "the widest beam run so far", NULL},
                                      {NULL}};

static PyTypeObject SearchType = {PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adawidth._hnsw.Search",
                                  .tp_basicsize = sizeof(Search),
                                  .tp_flags = Py_TPFLAGS_DEFAULT,
                                  .tp_new = PyType_GenericNew,
                                  .tp_init = (initproc)search_init,
                                  .tp_dealloc = (destructor)search_dealloc,
                                  .tp_methods = search_methods,
                                  .tp_getset = search_getset,
                                  .tp_doc = "One query's resumable HNSW search (see the module)."};

static PyObject *isa(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(DOTS_F32 == dots_f32_generic ? "generic" : "avx2");
}

static PyMethodDef module_methods[] = {{"isa", isa, METH_NOARGS, "the instruction set the inner products use"},
                                       {NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "adawidth._hnsw",
                                    "A resumable HNSW search over a faiss index's graph (engine.ann).", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__hnsw(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        DOTS_F32 = dots_f32_avx2;
        DOTS_F16 = dots_f16_avx2;
    }
#endif
    if (PyType_Ready(&GraphType) < 0 || PyType_Ready(&SearchType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&GraphType);
    Py_INCREF(&SearchType);
    if (PyModule_AddObject(m, "Graph", (PyObject *)&GraphType) < 0 ||
        PyModule_AddObject(m, "Search", (PyObject *)&SearchType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
