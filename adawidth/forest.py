"""A LightGBM regression forest flattened into arrays and predicted by a compiled loop (:mod:`adawidth._forest`).

Serving calls a model for one query at a time (ten rows: the recall policy's confidences), where LightGBM's
Python ``predict`` costs about 0.2 ms of argument checking per call; the flattened forest answers the same
numbers in microseconds.  It reads the model's own dump (``Booster.dump_model()``), so the trainer still fits,
saves and versions a plain LightGBM text model; :meth:`Forest.from_dump` is checked against ``Booster.predict``
in ``tests/unit/test_forest.py``.

Supported: regression objectives (the raw score is the prediction), numerical ``<=`` splits, LightGBM's
missing-value rules (``None``: NaN is 0; ``Zero``: 0 and NaN take the default side; ``NaN``: NaN takes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from adawidth import _forest

_MISSING = {"None": 0, "Zero": 1, "NaN": 2}


@dataclass(frozen=True)
class Forest:
    """A flattened forest: one entry per internal node of every tree (trees concatenated).

    Attributes:
        feature: (n,) int32 feature index of each split.
        threshold: (n,) float64, go left when ``x[feature] <= threshold``.
        left, right: (n,) int32 children: a node index when >= 0, else ``~leaf``.
        flags: (n,) int32, bit 0 default-left, bits 1-2 the missing type (0 None, 1 Zero, 2 NaN).
        roots: (T,) int32 root of each tree (``~leaf`` for a single-leaf tree).
        leaves: (n_leaves,) float64 leaf values.
        n_features: F, the width of a row.
        feature_names: the model's feature names, in order.
        monotone: (F,) the model's monotone constraints (LightGBM ``monotone_constraints``: +1 increasing, -1
            decreasing, 0 none), or () when it was fitted without any.
    """

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    flags: np.ndarray
    roots: np.ndarray
    leaves: np.ndarray
    n_features: int
    feature_names: tuple[str, ...]
    monotone: tuple[int, ...] = ()

    @classmethod
    def from_dump(cls, dump: Mapping) -> "Forest":
        """Flatten ``Booster.dump_model()``.

        Raises:
            ValueError: for a model this evaluator does not handle (classes, categorical splits, linear trees,
                a non-regression objective).
        """
        if dump.get("num_class", 1) != 1 or dump.get("num_tree_per_iteration", 1) != 1:
            raise ValueError("only single-output models are supported")
        objective = str(dump.get("objective", ""))
        if not objective.startswith("regression"):
            raise ValueError(f"only regression objectives are supported, got {objective!r}")
        feature, threshold, left, right, flags, leaves, roots = [], [], [], [], [], [], []

        def walk(node) -> int:
            if "leaf_value" in node or "split_feature" not in node:
                leaves.append(float(node["leaf_value"]))
                return ~(len(leaves) - 1)
            if node.get("decision_type", "<=") != "<=":
                raise ValueError(f"unsupported split {node.get('decision_type')!r} (categorical?)")
            i = len(feature)
            feature.append(int(node["split_feature"]))
            threshold.append(float(node["threshold"]))
            flags.append(int(bool(node.get("default_left", True))) | (_MISSING[node.get("missing_type", "None")] << 1))
            left.append(0)
            right.append(0)
            left[i] = walk(node["left_child"])
            right[i] = walk(node["right_child"])
            return i

        for tree in dump["tree_info"]:
            if "leaf_coeff" in tree.get("tree_structure", {}):
                raise ValueError("linear trees are not supported")
            roots.append(walk(tree["tree_structure"]))
        i32 = lambda a: np.asarray(a, dtype=np.int32)  # noqa: E731
        return cls(i32(feature), np.asarray(threshold, np.float64), i32(left), i32(right), i32(flags), i32(roots),
                   np.asarray(leaves, np.float64), int(dump["max_feature_idx"]) + 1,
                   tuple(dump.get("feature_names", ())), tuple(int(c) for c in dump.get("monotone_constraints") or ()))

    def reads(self, column: int) -> bool:
        """True when some split of the forest reads ``column`` (a model fitted on a column LightGBM found constant,
        e.g. all missing, never reads it: its value at prediction time is irrelevant)."""
        return bool(np.any(self.feature == int(column)))

    def increasing_in(self, column: int) -> bool:
        """True when the model was fitted non-decreasing in ``column`` (a +1 monotone constraint): rows that differ
        only there, in increasing order, score in non-decreasing order."""
        return 0 <= column < len(self.monotone) and self.monotone[column] == 1

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Raw scores of rows; X (R, F) or (F,) float -> (R,) float64.

        Raises:
            ValueError: when a row is not F wide.
        """
        X = np.ascontiguousarray(np.atleast_2d(X), dtype=np.float64)
        if X.shape[1] != self.n_features:
            raise ValueError(f"rows must have {self.n_features} features, got {X.shape[1]}")
        out = np.empty(X.shape[0], np.float64)
        _forest.predict(self.feature, self.threshold, self.left, self.right, self.flags, self.roots, self.leaves,
                        X, out, self.n_features)
        return out

    def first_at_least(self, X: np.ndarray, bar: float, monotone: bool = False) -> int:
        """The first row of X, in order, whose raw score is at least ``bar``, or -1 when none is; the rows after
        it are not scored (``next(i for i, p in enumerate(self.predict(X)) if p >= bar)`` at a fraction of the cost
        when an early row clears the bar).

        Args:
            X: (R, F) float rows, e.g. one query's evidence at increasing confidences.
            bar: the threshold on the raw score (higher is stricter).
            monotone: the caller's statement that the rows' scores never decrease from row to row (rows that
                differ only in a column the model :meth:`increasing_in`, in increasing order): a binary search
                then scores about log2(R) + 1 rows instead of up to R, and finds the same row.

        Raises:
            ValueError: when a row is not F wide.
        """
        X = np.ascontiguousarray(np.atleast_2d(X), dtype=np.float64)
        if X.shape[1] != self.n_features:
            raise ValueError(f"rows must have {self.n_features} features, got {X.shape[1]}")
        return _forest.first_at_least(self.feature, self.threshold, self.left, self.right, self.flags, self.roots,
                                      self.leaves, X, self.n_features, float(bar), bool(monotone))
