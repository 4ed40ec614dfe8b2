/* Prediction of a flattened tree ensemble (a LightGBM regression model) for a few rows, without the
 * per-call overhead of LightGBM's Python API (about 0.2 ms for ten rows; this takes microseconds).
 *
 * The node arrays and the tree walk are in _forest_eval.h (shared with adawidth._levelscan's fused search).
 * predict(..., x: float64 (R, F) C-contiguous, out: float64 (R,), n_features) sums the leaf of every tree.
 * first_at_least(..., x, n_features, bar[, monotone]) returns the first row whose sum is >= bar (-1: none),
 * scoring rows in order and stopping there, or (monotone 1: the scores never decrease from row to row) by binary
 * search.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "_forest_eval.h"

static int get(PyObject *o, Py_buffer *b, int writable) {
    return PyObject_GetBuffer(o, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
}

/* Shared argument handling of predict and first_at_least: the 7 node arrays, x and (predict only) out. */
static int open_forest(PyObject **objs, int n_objs, Py_buffer *all, int *got, ForestTrees *f, Py_ssize_t n_features,
                       Py_ssize_t *rows) {
    for (*got = 0; *got < n_objs; (*got)++)
        if (get(objs[*got], &all[*got], *got == 8) < 0) return -1;
    Py_buffer *bf = &all[0], *bt = &all[1], *bl = &all[2], *br = &all[3], *bfl = &all[4], *broots = &all[5],
              *bleaves = &all[6], *bx = &all[7];
    if (bf->itemsize != 4 || bl->itemsize != 4 || br->itemsize != 4 || bfl->itemsize != 4 || broots->itemsize != 4 ||
        bt->itemsize != 8 || bleaves->itemsize != 8 || bx->itemsize != 8 || (n_objs > 8 && all[8].itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "node arrays must be int32 (feature, left, right, flags, roots) and "
                                          "float64 (threshold, leaves, x, out)");
        return -1;
    }
    f->feature = bf->buf, f->left = bl->buf, f->right = br->buf, f->flags = bfl->buf, f->roots = broots->buf;
    f->threshold = bt->buf, f->leaves = bleaves->buf;
    f->n_nodes = bf->len / 4, f->n_trees = broots->len / 4, f->n_leaves = bleaves->len / 8;
    if (n_features <= 0 || bx->len / 8 % n_features != 0) {
        PyErr_SetString(PyExc_ValueError, "x must hold rows * n_features float64 values");
        return -1;
    }
    *rows = bx->len / 8 / n_features;
    if (n_objs > 8 && all[8].len / 8 != *rows) {
        PyErr_SetString(PyExc_ValueError, "out must hold one float64 per row of x");
        return -1;
    }
    return 0;
}

static PyObject *predict(PyObject *self, PyObject *args) {
    PyObject *objs[9];
    Py_ssize_t n_features, rows = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOn", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &objs[7], &objs[8], &n_features))
        return NULL;
    Py_buffer all[9];
    int got = 0;
    ForestTrees f;
    if (open_forest(objs, 9, all, &got, &f, n_features, &rows) < 0) goto fail;
    const double *x = all[7].buf;
    double *out = all[8].buf;
    for (Py_ssize_t r = 0; r < rows; r++)
        if (forest_row_score(&f, x + r * n_features, n_features, &out[r]) < 0) {
            PyErr_SetString(PyExc_ValueError, "malformed forest");
            goto fail;
        }
    for (int i = 0; i < got; i++) PyBuffer_Release(&all[i]);
    Py_RETURN_NONE;
fail:
    for (int i = 0; i < got; i++) PyBuffer_Release(&all[i]);
    return NULL;
}

/* The first row, in order, whose raw score is at least `bar` (-1: none), scoring no row after it (or by binary
 * search when the caller says the scores are monotone): the recall policy's choice of the cheapest confidence
 * (rows in increasing confidence) at a fraction of predict's cost. */
static PyObject *first_at_least(PyObject *self, PyObject *args) {
    PyObject *objs[8];
    Py_ssize_t n_features, rows = 0;
    double bar;
    int monotone = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnd|p", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &objs[7], &n_features, &bar, &monotone))
        return NULL;
    Py_buffer all[8];
    int got = 0;
    ForestTrees f;
    Py_ssize_t found = -1;
    if (open_forest(objs, 8, all, &got, &f, n_features, &rows) < 0) goto fail;
    const double *x = all[7].buf;
    int64_t at = -1;
    if (forest_first_at_least(&f, x, rows, n_features, bar, monotone, &at) < 0) {
        PyErr_SetString(PyExc_ValueError, "malformed forest");
        goto fail;
    }
    found = (Py_ssize_t)at;
    for (int i = 0; i < got; i++) PyBuffer_Release(&all[i]);
    return PyLong_FromSsize_t(found);
fail:
    for (int i = 0; i < got; i++) PyBuffer_Release(&all[i]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"predict", predict, METH_VARARGS, "predict(feature, threshold, left, right, flags, roots, leaves, x, out, n_features)"},
    {"first_at_least", first_at_least, METH_VARARGS,
     "first_at_least(feature, threshold, left, right, flags, roots, leaves, x, n_features, bar, monotone=False) -> "
     "int (-1: none)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_forest", "Flattened tree-ensemble prediction.", -1, methods};

PyMODINIT_FUNC PyInit__forest(void) { return PyModule_Create(&module); }
