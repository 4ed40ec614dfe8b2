"""The served recall policy of a version: per query, the level-pruning confidence for a declared recall@k.

Holds the LightGBM model the trainer fitted (:mod:`trainer.recall_fit`) and its out-of-fold calibration data,
and answers :meth:`RecallPolicy.choose` for the route stage.  The maths is :mod:`adawidth.recall_policy`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from adawidth import recall_policy


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
        margin: added to a target before calibrating its bar (a one-sided safety margin, in recall).
    """

    booster: object
    feature_names: list[str]
    z_grid: np.ndarray
    bound: str
    calibration_pred: np.ndarray
    calibration_recall: np.ndarray
    k: int = 10
    margin: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _bars: dict = field(default_factory=dict)

    def bar(self, target: float) -> float:
        """τ for ``target`` (cached): the lowest bar whose calibration choices meet target + margin."""
        if target not in self._bars:
            self._bars[target] = recall_policy.calibrate_bar(self.calibration_pred, self.calibration_recall,
                                                             min(target + self.margin, 1.0))
        return self._bars[target]

    def predict(self, evidence) -> np.ndarray:
        """(Z,) predicted recall@k of one query at every confidence of the grid."""
        f = evidence.features(self.k)
        row = np.array([f.get(n, np.nan) for n in self.feature_names], dtype=np.float64)
        with self.lock:
            return np.asarray(self.booster.predict(recall_policy.design(row, self.z_grid)), dtype=np.float64)

    def choose(self, evidence, target: float) -> tuple[str, float | None]:
        """(bound, z) for one query: ``("exact", None)`` at target 1, else the cheapest z predicted to clear the
        calibrated bar (the grid's safest z when none does; ``exact`` when even that cannot meet the target on
        the calibration queries)."""
        if target >= 1.0:
            return "exact", None
        bar = self.bar(target)
        if not np.isfinite(bar):
            return "exact", None
        j = int(recall_policy.choose(self.predict(evidence)[None, :], bar)[0])
        return self.bound, float(self.z_grid[j])
