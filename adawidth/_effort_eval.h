/* The per-query ANN effort choice from a probe's answer: the ranking check, the evidence (engine.ann.probe, to the
 * last bit: the same float64 operations in the same order; build with -ffp-contract=off) and the first grid effort
 * whose predicted recall clears the bar (engine.recall.RecallPolicy.choose).  Shared by adawidth._effort (after
 * faiss's search) and adawidth._hnsw (Search.serve: the probe, this, and the continuation in one call).
 */
#ifndef ADAWIDTH_EFFORT_EVAL_H
#define ADAWIDTH_EFFORT_EVAL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "_forest_eval.h"

#define EFFORT_N_FIXED 10     /* s1, sk, gap, gap12, mean, std, found, distances, energy16, energy64 */
#define EFFORT_ENERGY_SHORT 16
#define EFFORT_ENERGY_LONG 64 /* engine.ann.ENERGY_PREFIX */
#define EFFORT_MAX_K 64       /* above this the duplicate check would be quadratic: the Python path */
#define EFFORT_STACK_CELLS 1024 /* model rows (grid x (E + 1)) up to this many without a heap allocation */

/* From a probe's answer D (k,) float32 inner products best first and I (k,) int64 labels (-1 pads a short
 * answer's end), its distance computations and the query's leading rotated coordinates prefix (n_prefix,):
 * ev[0..n_ev) the evidence in engine.ann.EFFORT_FEATURES order (n_ev >= EFFORT_N_FIXED; the centroid features NaN,
 * as an HNSW probe has none); *found the candidates found; *at the first position of z (n_z,) increasing whose
 * predicted recall (the forest over the evidence and z, n_features = n_ev + 1) is >= bar, -1 when none is, or -2
 * when the answer is not strictly decreasing over distinct rows (ties, duplicates, a -1 before a label,
 * k > EFFORT_MAX_K: the caller ranks it, engine.ann.ranked, and chooses on the Python path).
 * Returns 0, -1 for a malformed forest, -2 when out of memory. */
static inline int effort_choose(const ForestTrees *f, const float *D, const int64_t *I, int64_t k, double distances,
                                const float *prefix, int64_t n_prefix, const double *z, int64_t n_z, double bar,
                                int monotone, double *ev, int64_t n_ev, int64_t *at, int64_t *found) {
    int64_t n = 0;
    while (n < k && I[n] >= 0) n++;
    *found = n;
    int ordered = k <= EFFORT_MAX_K;
    for (int64_t i = n; i < k && ordered; i++) ordered = I[i] < 0; /* -1 pads the end only */
    for (int64_t i = 1; i < n && ordered; i++) {
        ordered = (double)D[i - 1] > (double)D[i];
        for (int64_t j = 0; j < i && ordered; j++) ordered = I[j] != I[i];
    }
    if (!ordered) {
        *at = -2;
        return 0;
    }
    for (int64_t i = 0; i < n_ev; i++) ev[i] = NAN;
    if (n) { /* engine.ann.probe: sums left to right over the float64 scores, as Python's sum() */
        double sum = 0.0, sq = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)D[i];
        for (int64_t i = 0; i < n; i++) sq += (double)D[i] * (double)D[i];
        const double mean = sum / (double)n, var = sq / (double)n - mean * mean;
        ev[0] = D[0], ev[1] = D[n - 1], ev[2] = (double)D[0] - (double)D[n - 1];
        ev[3] = n > 1 ? (double)D[0] - (double)D[1] : NAN;
        ev[4] = mean, ev[5] = sqrt(var > 0.0 ? var : 0.0);
    }
    ev[6] = (double)n, ev[7] = distances;
    const int64_t n_pre = n_prefix < EFFORT_ENERGY_LONG ? n_prefix : EFFORT_ENERGY_LONG,
                  n_short = n_pre < EFFORT_ENERGY_SHORT ? n_pre : EFFORT_ENERGY_SHORT;
    double e = 0.0;
    ev[8] = 0.0;
    for (int64_t i = 0; i < n_pre; i++) {
        e += (double)prefix[i] * (double)prefix[i];
        if (i == n_short - 1) ev[8] = e;
    }
    ev[9] = e;
    const int64_t width = n_ev + 1, cells = n_z * width;
    double stack_rows[EFFORT_STACK_CELLS];
    double *rows = cells <= EFFORT_STACK_CELLS ? stack_rows : malloc(sizeof(double) * (size_t)cells);
    if (!rows) return -2;
    for (int64_t r = 0; r < n_z; r++) { /* adawidth.recall_policy.design: the evidence beside every z */
        for (int64_t c = 0; c < n_ev; c++) rows[r * width + c] = ev[c];
        rows[r * width + n_ev] = z[r];
    }
    const int rc = forest_first_at_least(f, rows, n_z, width, bar, monotone, at);
    if (rows != stack_rows) free(rows);
    return rc;
}

#ifdef Py_PYTHON_H
/* The forest of seven buffers in adawidth._forest's order (feature, threshold, left, right, flags, roots, leaves):
 * 0, or -1 with a ValueError when they are not int32 (feature, left, right, flags, roots) and float64 (threshold,
 * leaves). */
static inline int effort_forest_of(const Py_buffer *b, ForestTrees *f) {
    static const Py_ssize_t size[7] = {4, 8, 4, 4, 4, 4, 8};
    for (int i = 0; i < 7; i++)
        if (b[i].itemsize != size[i]) {
            PyErr_SetString(PyExc_ValueError, "node arrays must be int32 (feature, left, right, flags, roots) and "
                                              "float64 (threshold, leaves)");
            return -1;
        }
    *f = (ForestTrees){.feature = b[0].buf, .threshold = b[1].buf, .left = b[2].buf, .right = b[3].buf,
                       .flags = b[4].buf, .roots = b[5].buf, .leaves = b[6].buf, .n_nodes = b[0].len / 4,
                       .n_trees = b[5].len / 4, .n_leaves = b[6].len / 8};
    return 0;
}
#endif

#endif
