"""The served recall policy of a version: the level-pruning confidence for a declared recall@k.

Holds the LightGBM model the trainer fitted (:mod:`trainer.recall_fit`) and its out-of-fold calibration data.
Per target it serves, by measurement on the calibration queries (:meth:`RecallPolicy.serving`), either the
**per-query** confidence (the model reads each query's evidence; :meth:`RecallPolicy.choose`) or **one
calibrated** confidence for every query (the z where the grid's mean calibration recall curve reaches the target
plus the margin, :func:`adawidth.recall_policy.interpolated_confidence`): the model only where its out-of-fold
choices save at least
:data:`MODEL_MIN_SAVING` of the work of that one z, since evaluating it costs time of its own.  The maths is
:mod:`adawidth.recall_policy`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

import numpy as np

from adawidth import levels, recall_policy
from adawidth.forest import Forest


_UNSEEN = object()  # RecallPolicy._columns: evidence names not seen yet

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
        calibration_coordinates: (Qc, Z) multiply-adds of each calibration run, or None (versions built before
            it was kept: they serve the per-query model at every target).
        k: the k the policy was calibrated at (recall@k).
        margin_share: the share of a target's miss budget (1 - target) added to it before calibrating, under
            ``margin_rule`` ``"share"`` (:func:`adawidth.recall_policy.safety_margin`).
        margin_rule: how a target's margin is set (:func:`adawidth.recall_policy.calibration_goal`):
            ``"standard_error"`` (default; versions calibrated on training queries) or ``"share"`` (pseudo-queries,
            and versions written before the rule was recorded).
        seeds: documents exactly scored after the first level, as the calibration's evidence was computed
            (None: :func:`adawidth.levels.default_seeds` of k).
        serve: ``"measured"`` (default: per target, the per-query model or the one calibrated z, whichever
            :meth:`serving` measures cheaper), ``"model"`` (always the per-query model) or ``"fixed"`` (always the
            one calibrated z): the last two for comparisons (``bench/scale.py``).
        calibration_threads: the kernel threads the calibration runs above used (1 in every version's stored
            policy; a policy from :meth:`at_threads` says which it holds).
        calibration_by_threads: kernel threads t > 1 -> ((Qc, Z) realised recall@k, (Qc, Z) multiply-adds or
            None) of the same calibration queries scanned on t threads (:func:`trainer.recall_fit.
            thread_calibration`); empty for versions built before it was kept, or too small to shard.
    """

    booster: object
    feature_names: list[str]
    z_grid: np.ndarray
    bound: str
    calibration_pred: np.ndarray
    calibration_recall: np.ndarray
    calibration_coordinates: np.ndarray | None = None
    k: int = 10
    margin_share: float = 0.25
    margin_rule: str = "standard_error"
    seeds: int | None = None
    serve: str = "measured"
    calibration_threads: int = 1
    calibration_by_threads: dict = field(default_factory=dict)
    # derived state and caches, never copied by dataclasses.replace (a copy with another ``serve`` decides afresh)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _bars: dict = field(default_factory=dict, init=False, repr=False)
    forest: Forest | None = field(default=None, init=False, repr=False)
    _columns: dict = field(default_factory=dict, init=False, repr=False)
    _template: np.ndarray | None = field(default=None, init=False, repr=False)
    _serving: dict = field(default_factory=dict, init=False, repr=False)
    _goals: dict = field(default_factory=dict, init=False, repr=False)
    _monotone_z: bool = field(default=False, init=False, repr=False)
    _at_threads: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if self.serve not in ("measured", "model", "fixed"):
            raise ValueError(f"serve must be 'measured', 'model' or 'fixed', got {self.serve!r}")
        if self.margin_rule not in recall_policy.MARGIN_RULES:
            raise ValueError(f"margin_rule must be one of {recall_policy.MARGIN_RULES}, got {self.margin_rule!r}")
        if self.seeds is None:
            self.seeds = levels.default_seeds(self.k)
        shape = np.shape(self.calibration_pred)
        for t, (recall, coordinates) in self.calibration_by_threads.items():
            if int(t) < 2 or np.shape(recall) != shape or (coordinates is not None and np.shape(coordinates) != shape):
                raise ValueError(f"calibration_by_threads[{t!r}] must hold (Qc, Z) = {shape} arrays at t >= 2")
        # the same model as a compiled forest: serving predicts ten rows a query, where LightGBM's Python
        # call overhead would dominate (adawidth.forest; tests/unit/test_forest.py checks the equality)
        self.forest = Forest.from_dump(self.booster.dump_model())
        self._template = recall_policy.design(np.zeros(len(self.feature_names)), self.z_grid)
        # the model's z is its last column (recall_policy.design): monotone there, choose() bisects the grid
        self._monotone_z = self.forest.increasing_in(len(self.feature_names))

    def at_threads(self, threads: int) -> "RecallPolicy":
        """This policy calibrated for a level scan on ``threads`` kernel threads (cached; the same model, with the
        realised recall and work of the calibration queries scanned on that many threads, so the bar, the goal and
        the one calibrated z meet the target there).

        Args:
            threads: the threads the kernel actually runs one query on (:func:`adawidth.levels.kernel_threads`).

        Returns:
            ``self`` for one thread or when nothing is calibrated at more; else a policy over the calibration of
            the largest calibrated thread count at most ``threads`` (its :attr:`calibration_threads` says which).
            Serving on more threads than any calibrated keeps realising at least the target: more threads prune
            less.
        """
        if threads <= 1 or not self.calibration_by_threads:  # the usual case on the query path: nothing to pick
            return self
        t = max((t for t in self.calibration_by_threads if t <= threads), default=1)
        if t <= 1:
            return self
        out = self._at_threads.get(t)
        if out is None:
            with self.lock:
                out = self._at_threads.get(t)
                if out is None:
                    recall, coordinates = self.calibration_by_threads[t]
                    out = replace(self, calibration_recall=recall, calibration_coordinates=coordinates,
                                  calibration_threads=t, calibration_by_threads={})
                    self._at_threads[t] = out
        return out

    def reads(self, name: str) -> bool:
        """True when the model's forest splits on evidence feature ``name`` (False for a name it does not have)."""
        return name in self.feature_names and self.forest.reads(self.feature_names.index(name))

    @property
    def monotone_z(self) -> bool:
        """True when the model does not decrease along its last column z (choices bisect the grid)."""
        return self._monotone_z

    def goal(self, target: float) -> float:
        """The mean calibration recall ``target`` is calibrated to (cached): target + margin under
        ``margin_rule`` (:func:`adawidth.recall_policy.calibration_goal`), at most 1."""
        out = self._goals.get(target)
        if out is None:
            out = recall_policy.calibration_goal(target, self.calibration_recall, self.margin_rule, self.margin_share)
            self._goals[target] = out
        return out

    def bar(self, target: float) -> float:
        """τ for ``target`` (cached): the lowest bar whose calibration choices meet :meth:`goal`; +inf for
        "the safest confidence", None when not even that meets it."""
        if target not in self._bars:
            goal = self.goal(target)
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
        cached = self._columns.get(names, _UNSEEN)
        if cached is _UNSEEN:  # where each model feature sits in the evidence (len(names): missing, NaN); None when
            pos = {n: i for i, n in enumerate(names)}  # the evidence is the model's features in its order
            cols = [pos.get(n, len(names)) for n in self.feature_names]
            cached = None if cols == list(range(len(names))) else np.array(cols, dtype=np.int64)
            self._columns[names] = cached
        rows = self._template.copy()
        if cached is None:  # the usual case: no gather (each numpy call costs ~10 us when the caches are cold)
            rows[:, :len(values)] = values
        else:
            rows[:, :len(cached)] = np.append(values, np.nan)[cached]
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
        j = self.forest.first_at_least(self._rows(evidence), bar, monotone=self._monotone_z)
        return self.bound, float(self.z_grid[j if j >= 0 else len(self.z_grid) - 1])

    def seeds_for(self, k: int) -> int:
        """Seeds for a request of k results under the rule the calibration used: :func:`adawidth.levels.
        legacy_seeds` for a version calibrated with it (``seeds`` equal to its value at the calibration k), else
        :func:`adawidth.levels.default_seeds` (a rule of k: fewer than k seeds would leave the scan without a
        first threshold)."""
        legacy = self.seeds == levels.legacy_seeds(self.k) != levels.default_seeds(self.k)
        return levels.legacy_seeds(k) if legacy else levels.default_seeds(k)

    def confidence_model(self, target: float, L: int) -> levels.ConfidenceModel | None:
        """:meth:`choose` compiled for :func:`adawidth.levels.fused_search` on a store of L levels: None where
        :meth:`choose` answers ``"exact"``."""
        bar = None if target >= 1.0 else self.bar(target)
        if bar is None:
            return None
        return levels.ConfidenceModel.for_model(self.forest, [*self.feature_names, "z"], L, self.z_grid, bar)

    def fixed_z(self, target: float) -> float | None:
        """The one calibrated confidence for ``target``: where the grid's mean calibration recall curve reaches
        :meth:`goal`, interpolated between grid points (:func:`adawidth.recall_policy.interpolated_confidence`;
        None when no grid point reaches it).  A level-scan confidence: any float serves."""
        mean = np.asarray(self.calibration_recall, np.float64).mean(axis=0)
        return recall_policy.interpolated_confidence(self.z_grid, mean, self.goal(target))

    def model_saving(self, target: float) -> float | None:
        """The share of the one calibrated z's mean work (multiply-adds) that the per-query choices save on the
        calibration queries (out-of-fold predictions; negative when they cost more), or None when it cannot be
        told (no calibration work kept, or no fixed z or bar for the target)."""
        bar, z = self.bar(target), self.fixed_z(target)
        if self.calibration_coordinates is None or bar is None or z is None:
            return None
        work = np.asarray(self.calibration_coordinates, np.float64)
        pick = recall_policy.choose(self.calibration_pred, bar)
        fixed = float(np.interp(z, self.z_grid, work.mean(axis=0)))  # z may lie between grid points
        return float(1.0 - work[np.arange(len(work)), pick].mean() / max(fixed, 1.0))

    def serving(self, target: float, L: int) -> tuple[str, levels.ConfidenceModel | None, float | None]:
        """How :func:`adawidth.levels.fused_search` serves ``target`` on a store of L levels (cached per target):
        ``(bound, model, z)``.

        ``("exact", None, None)`` where :meth:`choose` answers exact (target 1, or not even the safest z meets the
        target on the calibration queries); ``(bound, ConfidenceModel, None)`` for the per-query model when it
        saves at least :data:`MODEL_MIN_SAVING` of the work (:meth:`model_saving`), or when that cannot be told;
        else ``(bound, None, z)`` with the one calibrated z (:meth:`fixed_z`).  ``serve`` other than
        ``"measured"`` forces one of the two.
        """
        key = (float(target), int(L))
        out = self._serving.get(key)
        if out is None:
            bar = None if target >= 1.0 else self.bar(target)
            if bar is None:
                out = ("exact", None, None)
            else:
                saving = self.model_saving(target)
                fixed = self.serve == "fixed" or (self.serve == "measured" and saving is not None
                                                  and saving < MODEL_MIN_SAVING)
                if fixed and self.fixed_z(target) is not None:
                    out = (self.bound, None, self.fixed_z(target))
                else:
                    out = (self.bound, self.confidence_model(target, L), None)
            self._serving[key] = out
        return out


MODEL_MIN_SAVING = 0.05
"""The per-query model serves a target only when its calibration choices save at least this share of the work of
the one calibrated confidence: evaluating it (about 20-30 us a query, two hundred trees over about ten rows) must
pay for itself.  On SciFact and debdocs it did not (docs/SCALING.md), so one calibrated z serves there."""
