"""The served recall policy of a version: per query, the level-pruning confidence for a declared recall@k.

Holds the LightGBM model the trainer fitted (:mod:`trainer.recall_fit`) and its out-of-fold calibration data,
and answers :meth:`RecallPolicy.choose` for the route stage.  The maths is :mod:`adawidth.recall_policy`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from adawidth import levels, recall_policy
from adawidth.forest import Forest


@dataclass
class RecallPolicy:
    """One version's recall policy.

    Attributes:
        booster: LightGBM booster over ``feature_names`` + ``["z"]`` predicting recall@k in [0, 1].
        feature_names: evidence features in the model's order (:meth:`adawidth.levels.LevelEvidence.features`).
        z_grid: (Z,) float64 confidences, increasing.
        bound: the level scan's probabilistic bound (``data_aware`` or ``data_aware_doc``).
        calibration_pred: (Qc, Z) out-of-fold predictions of the calibration queries.
        calibration_recall: (Qc, Z) their realised recall@k at each confidence.
        k: the k the policy was calibrated at (recall@k).
        margin_share: the share of a target's miss budget (1 - target) added to it before calibrating its bar
            (:func:`adawidth.recall_policy.safety_margin`).
    """

    booster: object
    feature_names: list[str]
    z_grid: np.ndarray
    bound: str
    calibration_pred: np.ndarray
    calibration_recall: np.ndarray
    k: int = 10
    margin_share: float = 0.25
    lock: threading.Lock = field(default_factory=threading.Lock)
    _bars: dict = field(default_factory=dict)
    forest: Forest | None = None
    _columns: dict = field(default_factory=dict)
    _template: np.ndarray | None = None
    _models: dict = field(default_factory=dict)

    def __post_init__(self):
        # the same model as a compiled forest: serving predicts ten rows a query, where LightGBM's Python
        # call overhead would dominate (adawidth.forest; tests/unit/test_forest.py checks the equality)
        self.forest = Forest.from_dump(self.booster.dump_model())
        self._template = recall_policy.design(np.zeros(len(self.feature_names)), self.z_grid)

    def bar(self, target: float) -> float:
        """τ for ``target`` (cached): the lowest bar whose calibration choices meet target + margin; +inf for
        "the safest confidence", None when not even that meets it."""
        if target not in self._bars:
            goal = min(target + recall_policy.safety_margin(target, self.margin_share), 1.0)
            bar = recall_policy.calibrate_bar(self.calibration_pred, self.calibration_recall, goal)
            if not np.isfinite(bar) and not recall_policy.safest_meets(self.calibration_recall, goal):
                bar = None  # not even the safest confidence meets it: the exact bound serves
            self._bars[target] = bar
        return self._bars[target]

    def predict(self, evidence) -> np.ndarray:
        """(Z,) predicted recall@k of one query at every confidence of the grid (the rows of
        :func:`adawidth.recall_policy.design`, built from a cached template)."""
        return self.forest.predict(self._rows(evidence))

    def _rows(self, evidence) -> np.ndarray:
        """(Z, F + 1) float64 model rows of one query: its evidence beside every z of the grid."""
        if hasattr(evidence, "feature_array"):  # adawidth.levels.LevelEvidence
            names, values = evidence.feature_names(self.k), evidence.feature_array(self.k)
        else:  # any evidence with a features(k) dict (engine.ann.AnnEvidence)
            f = evidence.features(self.k)
            names, values = tuple(f), np.fromiter(f.values(), np.float64, len(f))
        cached = self._columns.get(names)
        if cached is None:  # where each model feature sits in the evidence (len(names): missing, NaN)
            pos = {n: i for i, n in enumerate(names)}
            cached = np.array([pos.get(n, len(names)) for n in self.feature_names], dtype=np.int64)
            self._columns[names] = cached
        values = np.append(values, np.nan)
        rows = self._template.copy()
        rows[:, :len(cached)] = values[cached]
        return rows

    def choose(self, evidence, target: float) -> tuple[str, float | None]:
        """(bound, z) for one query: ``("exact", None)`` at target 1, else the cheapest z predicted to clear the
        calibrated bar (the grid's safest z when none does; ``exact`` when even that cannot meet the target on
        the calibration queries)."""
        if target >= 1.0:
            return "exact", None
        bar = self.bar(target)
        if bar is None:
            return "exact", None
        # recall_policy.choose for one query, scoring the grid's rows only up to the first that clears the bar
        j = self.forest.first_at_least(self._rows(evidence), bar)
        return self.bound, float(self.z_grid[j if j >= 0 else len(self.z_grid) - 1])

    def confidence_model(self, target: float, L: int) -> levels.ConfidenceModel | None:
        """:meth:`choose` compiled for :func:`adawidth.levels.fused_search` on a store of L levels (cached per
        target): None where :meth:`choose` answers ``"exact"`` (target 1, or a target not even the safest z meets
        on the calibration queries)."""
        key = (float(target), int(L))
        if key not in self._models:
            bar = None if target >= 1.0 else self.bar(target)
            self._models[key] = None if bar is None else levels.ConfidenceModel.for_model(
                self.forest, [*self.feature_names, "z"], L, self.z_grid, bar)
        return self._models[key]
