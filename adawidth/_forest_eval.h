/* The tree walk of a flattened LightGBM regression forest, shared by adawidth._forest (Python's Forest.predict)
 * and adawidth._levelscan (the recall policy inside the fused level-scan search), so both score a row the same.
 *
 * Node arrays (one entry per internal node of every tree, trees concatenated):
 *   feature[n] int32, threshold[n] float64, left[n] / right[n] int32 (a child >= 0 is a node index, < 0 is leaf
 *   ~child), flags[n] int32 (bit 0 default_left, bits 1-2 missing type: 0 None, 1 Zero, 2 NaN);
 *   roots[t] int32 (the root node of tree t, or ~leaf for a single-leaf tree); leaves[l] float64.
 * A row's raw score is the sum of every tree's leaf, as LightGBM's "<=" numerical splits decide
 * (lightgbm/src/io/tree.h NumericalDecision).
 */
#ifndef ADAWIDTH_FOREST_EVAL_H
#define ADAWIDTH_FOREST_EVAL_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>

typedef struct {
    const int32_t *feature, *left, *right, *flags, *roots;
    const double *threshold, *leaves;
    int64_t n_nodes, n_trees, n_leaves;
} ForestTrees;

/* The raw score of one row x[0..n_features) into *score; -1 for a malformed forest (a node or leaf index out of
 * range, or a split on a feature the row lacks), 0 otherwise. */
static inline int forest_row_score(const ForestTrees *f, const double *xr, int64_t n_features, double *score) {
    double s = 0.0;
    for (int64_t t = 0; t < f->n_trees; t++) {
        int32_t node = f->roots[t];
        while (node >= 0) {
            if (node >= f->n_nodes || f->feature[node] < 0 || f->feature[node] >= n_features) return -1;
            double v = xr[f->feature[node]];
            int fl = f->flags[node], missing = (fl >> 1) & 3, go_left;
            if (isnan(v) && missing != 2) v = 0.0;
            if ((missing == 1 && v > -1e-35 && v < 1e-35) || (missing == 2 && isnan(v)))
                go_left = fl & 1;
            else
                go_left = v <= f->threshold[node];
            node = go_left ? f->left[node] : f->right[node];
        }
        int32_t leaf = ~node;
        if (leaf >= f->n_leaves) return -1;
        s += f->leaves[leaf];
    }
    *score = s;
    return 0;
}

/* The first of `rows` rows (row r at x + r * n_features), in order, whose raw score is >= bar: *found = its index,
 * or -1 when none is.  -1 for a malformed forest, 0 otherwise.
 * monotone 0: rows are scored in order, none after the first that clears the bar.  monotone 1: the caller states
 * that the scores never decrease from row to row (a model fitted monotone increasing in the one column in which
 * the rows differ, the recall policy's z: LightGBM's monotone_constraints); a binary search then scores about
 * log2(rows) + 1 rows and finds the same row (floating-point addition is monotone, so the sum of the trees'
 * non-decreasing leaves does not decrease either). */
static inline int forest_first_at_least(const ForestTrees *f, const double *x, int64_t rows, int64_t n_features,
                                        double bar, int monotone, int64_t *found) {
    *found = -1;
    if (monotone) {
        int64_t lo = 0, hi = rows; /* the answer lies in [lo, hi]; hi == rows: none */
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            double s;
            if (forest_row_score(f, x + mid * n_features, n_features, &s) < 0) return -1;
            if (s >= bar)
                hi = mid;
            else
                lo = mid + 1;
        }
        *found = lo < rows ? lo : -1;
        return 0;
    }
    for (int64_t r = 0; r < rows; r++) {
        double s;
        if (forest_row_score(f, x + r * n_features, n_features, &s) < 0) return -1;
        if (s >= bar) {
            *found = r;
            return 0;
        }
    }
    return 0;
}

#endif
