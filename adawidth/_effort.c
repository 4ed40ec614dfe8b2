/* The per-query effort choice of an ANN first stage in one call: from a probe's faiss answer to the grid position
 * of the effort its recall model chooses (engine.ann.probe_and_choose).
 *
 * The Python path (engine.ann.probe, then engine.recall.RecallPolicy.choose) makes a dozen Python and numpy calls
 * between faiss's answer and the forest: the ranking check, the evidence, the model's rows, the walk.  Warm they
 * cost about 30 us a query, with the caches cold about 110 us (bench/results/pipeline_cost: 13 % of a fixed
 * efSearch's stage call at recall 0.95 on debdocs).  This does the same arithmetic in one compiled call
 * (_effort_eval.h, which adawidth._hnsw's Search.serve shares).
 *
 * probe_choice(feature, threshold, left, right, flags, roots, leaves, n_features,
 *              D, I, distances, prefix, z_grid, bar, monotone, evidence) -> (j, n)
 *   the forest's node arrays as adawidth._forest takes them (_forest_eval.h), n_features = E + 1 (the evidence
 *   then the confidence z, adawidth.recall_policy.design);
 *   D: float32 (k,) faiss's inner products, best first; I: int64 (k,) its labels (-1 pads a short answer's end);
 *   distances: the probe's distance computations; prefix: float32 (P,) the query's leading rotated
 *   coordinates (energy16 over the first min(P, 16), energy64 over min(P, 64)); z_grid: float64 (Z,) the
 *   model's efforts, increasing; bar: the calibrated threshold on the model's raw score; monotone: the model
 *   does not decrease along z (binary search);
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

#include "_effort_eval.h"

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
    PyObject *out = NULL;
    for (; got < 12; got++)
        if (PyObject_GetBuffer(objs[got], &b[got], (got == 11 ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    ForestTrees f;
    if (effort_forest_of(b, &f) < 0) goto done;
    if (b[7].itemsize != 4 || b[8].itemsize != 8 || b[9].itemsize != 4 || b[10].itemsize != 8 || b[11].itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "D float32, I int64, prefix float32, z_grid and evidence float64");
        goto done;
    }
    const float *D = b[7].buf, *prefix = b[9].buf;
    const int64_t *I = b[8].buf;
    const double *z = b[10].buf;
    double *ev = b[11].buf;
    const Py_ssize_t k = b[7].len / 4, n_ev = b[11].len / 8, n_z = b[10].len / 8;
    if (b[8].len / 8 != k || n_ev < EFFORT_N_FIXED || n_features != n_ev + 1 || n_z < 1) {
        PyErr_SetString(PyExc_ValueError, "D and I must be (k,), evidence (E >= 10,) with n_features = E + 1, "
                                          "z_grid non-empty");
        goto done;
    }
    int64_t at = -1, n = 0;
    const int rc =
        effort_choose(&f, D, I, k, distances, prefix, b[9].len / 4, z, n_z, bar, monotone, ev, n_ev, &at, &n);
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "malformed forest");
        goto done;
    }
    out = Py_BuildValue("nn", (Py_ssize_t)at, (Py_ssize_t)n);
done:
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
