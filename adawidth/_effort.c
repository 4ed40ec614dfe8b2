/* The per-query effort choice of an ANN first stage in one call: from a probe's faiss answer to the grid position
 * of the effort its recall model chooses (engine.ann.probe_and_choose).
 *
 * The Python path (engine.ann.probe, then engine.recall.RecallPolicy.choose) makes a dozen Python and numpy calls
 * between faiss's answer and the forest: the ranking check, the evidence, the model's rows, the walk.  Warm they
 * cost about 30 us a query, with the caches cold about 110 us (bench/results/pipeline_cost: 13 % of a fixed
 * efSearch's stage call at recall 0.95 on debdocs).  This does the same arithmetic in one compiled call.
 *
 * probe_choice(feature, threshold, left, right, flags, roots, leaves, n_features,
 *              D, I, distances, prefix, z_grid, bar, monotone, evidence) -> (j, n)
 *   the forest's node arrays as adawidth._forest takes them (_forest_eval.h), n_features = E + 1 (the evidence
 *   then the confidence z, adawidth.recall_policy.design);
 *   D: float32 (k,) faiss's inner products, best first; I: int64 (k,) its labels (-1 pads a short answer's end);
 *   distances: the probe's distance computations; prefix: float32 (P,) the query's leading rotated
 *   coordinates (energy16 over the first min(P, 16), energy64 over min(P, 64)); z_grid: float64 (Z,) the model's efforts, increasing; bar: the calibrated threshold on the
 *   model's raw score; monotone: the model does not decrease along z (binary search);
 *   evidence: float64 (E,) written with engine.ann.EFFORT_FEATURES (E >= 10; the centroid features NaN, as an
 *   HNSW probe has none).
 *   Returns j, the first grid position whose predicted recall clears the bar (-1: none does), or -2 when the
 *   answer is not strictly decreasing over distinct rows (ties, duplicates, a -1 before a label, k > 64): the
 *   caller then takes the Python path, which ranks such an answer (engine.ann.ranked); and n, the candidates
 *   found.  The evidence is the Python path's to the last bit: the same float64 operations in the same order
 *   (built with -ffp-contract=off, so no fused multiply-adds).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "_forest_eval.h"

#define N_FIXED 10     /* s1, sk, gap, gap12, mean, std, found, distances, energy16, energy64 */
#define ENERGY_SHORT 16
#define ENERGY_LONG 64 /* engine.ann.ENERGY_PREFIX */
#define MAX_K 64       /* above this the duplicate check would be quadratic: the Python path */

static PyObject *probe_choice(PyObject *self, PyObject *args) {
    PyObject *objs[13];
    Py_ssize_t n_features;
    double distances, bar;
    int monotone = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOOdOOdpO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6], &n_features, &objs[7], &objs[8], &distances, &objs[9], &objs[10], &bar,
                          &monotone, &objs[11]))
        return NULL;
    Py_buffer b[12];
    int got = 0;
    double *rows = NULL, stack_rows[1024];
    PyObject *out = NULL;
    for (; got < 12; got++)
        if (PyObject_GetBuffer(objs[got], &b[got], (got == 11 ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    if (b[0].itemsize != 4 || b[2].itemsize != 4 || b[3].itemsize != 4 || b[4].itemsize != 4 || b[5].itemsize != 4 ||
        b[1].itemsize != 8 || b[6].itemsize != 8 || b[7].itemsize != 4 || b[8].itemsize != 8 || b[9].itemsize != 4 ||
        b[10].itemsize != 8 || b[11].itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "node arrays int32 (feature, left, right, flags, roots) and float64 "
                                          "(threshold, leaves); D float32, I int64, prefix float32, z_grid and "
                                          "evidence float64");
        goto done;
    }
    ForestTrees f = {.feature = b[0].buf, .threshold = b[1].buf, .left = b[2].buf, .right = b[3].buf,
                     .flags = b[4].buf, .roots = b[5].buf, .leaves = b[6].buf, .n_nodes = b[0].len / 4,
                     .n_trees = b[5].len / 4, .n_leaves = b[6].len / 8};
    const float *D = b[7].buf, *prefix = b[9].buf;
    const int64_t *I = b[8].buf;
    const double *z = b[10].buf;
    double *ev = b[11].buf;
    const Py_ssize_t k = b[7].len / 4, n_ev = b[11].len / 8, n_z = b[10].len / 8;
    if (b[8].len / 8 != k || n_ev < N_FIXED || n_features != n_ev + 1 || n_z < 1) {
        PyErr_SetString(PyExc_ValueError, "D and I must be (k,), evidence (E >= 10,) with n_features = E + 1, "
                                          "z_grid non-empty");
        goto done;
    }
    Py_ssize_t n = 0;
    while (n < k && I[n] >= 0) n++;
    int ordered = k <= MAX_K;
    for (Py_ssize_t i = n; i < k && ordered; i++) ordered = I[i] < 0; /* -1 pads the end only */
    for (Py_ssize_t i = 1; i < n && ordered; i++) {
        ordered = (double)D[i - 1] > (double)D[i];
        for (Py_ssize_t j = 0; j < i && ordered; j++) ordered = I[j] != I[i];
    }
    if (!ordered) {
        out = Py_BuildValue("nn", (Py_ssize_t)-2, n);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_ev; i++) ev[i] = NAN;
    if (n) { /* engine.ann.probe: sums left to right over the float64 scores, as Python's sum() */
        double sum = 0.0, sq = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) sum += (double)D[i];
        for (Py_ssize_t i = 0; i < n; i++) sq += (double)D[i] * (double)D[i];
        const double mean = sum / (double)n, var = sq / (double)n - mean * mean;
        ev[0] = D[0], ev[1] = D[n - 1], ev[2] = (double)D[0] - (double)D[n - 1];
        ev[3] = n > 1 ? (double)D[0] - (double)D[1] : NAN;
        ev[4] = mean, ev[5] = sqrt(var > 0.0 ? var : 0.0);
    }
    ev[6] = (double)n, ev[7] = distances;
    const Py_ssize_t n_pre = b[9].len / 4 < ENERGY_LONG ? b[9].len / 4 : ENERGY_LONG,
                     n_short = n_pre < ENERGY_SHORT ? n_pre : ENERGY_SHORT;
    double e = 0.0;
    ev[8] = 0.0;
    for (Py_ssize_t i = 0; i < n_pre; i++) {
        e += (double)prefix[i] * (double)prefix[i];
        if (i == n_short - 1) ev[8] = e;
    }
    ev[9] = e;
    const Py_ssize_t width = n_features, cells = n_z * width;
    rows = cells <= 1024 ? stack_rows : malloc(sizeof(double) * (size_t)cells);
    if (!rows) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < n_z; r++) { /* adawidth.recall_policy.design: the evidence beside every z */
        for (Py_ssize_t c = 0; c < n_ev; c++) rows[r * width + c] = ev[c];
        rows[r * width + n_ev] = z[r];
    }
    int64_t at = -1;
    if (forest_first_at_least(&f, rows, n_z, width, bar, monotone, &at) < 0) {
        PyErr_SetString(PyExc_ValueError, "malformed forest");
        goto done;
    }
    out = Py_BuildValue("nn", (Py_ssize_t)at, n);
done:
    if (rows && rows != stack_rows) free(rows);
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return out;
}

static PyMethodDef methods[] = {
    {"probe_choice", probe_choice, METH_VARARGS,
     "probe_choice(feature, threshold, left, right, flags, roots, leaves, n_features, D, I, distances, prefix, "
     "z_grid, bar, monotone, evidence) -> (j, n): j the grid position chosen (-1 none clears the bar, -2 the "
     "answer needs ranking: take the Python path), n the candidates found"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_effort",
                                    "The per-query ANN effort choice from a probe's answer in one call.", -1, methods};

PyMODINIT_FUNC PyInit__effort(void) { return PyModule_Create(&module); }
