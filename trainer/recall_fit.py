"""Fitting the recall policy (``adawidth.recall_policy``): LightGBM over level-scan evidence, label-free.

For every calibration query (training queries when the collection has them, else pseudo-queries drawn from the
corpus) the level scan is begun once and finished at every confidence z of the grid; the target of a row
(evidence, z) is that run's recall@k against the exhaustive top-k (certified by the exact bound), so no
relevance label is needed.  Predictions for calibration are **out-of-fold** (K-fold over the queries), as for
the router (§3.2.3 of 001_63bafbdb24f0770e.txt): a bar set on in-sample predictions would under-shoot on new
queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightgbm as lgb
import numpy as np

from adawidth import levels, recall_policy
from engine import ann
from trainer.router_fit import LGB_PARAMS, NUM_ROUNDS


@dataclass
class RecallTable:
    """Every calibration query under every confidence.

    Attributes:
        features: (Q, F) float64 evidence, columns ``feature_names``.
        feature_names: F names (:meth:`adawidth.levels.LevelEvidence.features`).
        recall: (Q, Z) realised recall@k against the exhaustive top-k, in [0, 1] (higher is better).
        coordinates: (Q, Z) multiply-adds of each run.
        exact_coordinates: (Q,) multiply-adds of the exact (certified) run.
        z_grid: (Z,) confidences.
    """

    features: np.ndarray
    feature_names: list[str]
    recall: np.ndarray
    coordinates: np.ndarray
    exact_coordinates: np.ndarray
    z_grid: np.ndarray


def recall_table(store: levels.LevelStore, Q_rot: np.ndarray, *, k: int = 10, bound: str = "data_aware",
                 z_grid=recall_policy.DEFAULT_Z_GRID, threads: int = 1) -> RecallTable:
    """Run every query at every confidence (and once exactly) through the level scan.

    Args:
        store: the version's level store.
        Q_rot: (Q, D) float32 rotated calibration queries.
        k: results (recall@k).
        bound: the probabilistic bound of :mod:`adawidth.levels`.
        z_grid: confidences, increasing.
    """
    z = np.asarray(z_grid, dtype=np.float64)
    Q = Q_rot.shape[0]
    rec = np.zeros((Q, len(z)))
    work = np.zeros((Q, len(z)), dtype=np.int64)
    exact_work = np.zeros(Q, dtype=np.int64)
    feats, names = [], None
    for i in range(Q):
        state = levels.begin(store, Q_rot[i], k, threads=threads)
        f = state.evidence.features(k)
        names = names or list(f)
        feats.append([f[n] for n in names])
        ex = levels.finish(state, bound="exact")
        exact_work[i] = ex.coordinates
        truth = set(ex.rows.tolist())
        for j, zj in enumerate(z):
            r = levels.finish(state, bound=bound, z=float(zj))
            rec[i, j] = len(truth.intersection(r.rows.tolist())) / max(len(truth), 1)
            work[i, j] = r.coordinates
    return RecallTable(np.asarray(feats, dtype=np.float64), names or [], rec, work, exact_work, z)


def concat_tables(tables: list[RecallTable]) -> RecallTable:
    """One table of the queries of several (the folds of cross-fitted rotations); same features and grid."""
    first = tables[0]
    if any(t.feature_names != first.feature_names or not np.array_equal(t.z_grid, first.z_grid) for t in tables):
        raise ValueError("tables to concatenate must share features and the confidence grid")
    return RecallTable(np.concatenate([t.features for t in tables]), first.feature_names,
                       np.concatenate([t.recall for t in tables]), np.concatenate([t.coordinates for t in tables]),
                       np.concatenate([t.exact_coordinates for t in tables]), first.z_grid)


def _fit(X: np.ndarray, y: np.ndarray, names: list[str], seed: int) -> lgb.Booster:
    # non-decreasing in the last column (the confidence z, or the ANN effort): a larger z prunes less, so recall
    # does not fall, and a model that says so lets serving find a query's first z clearing the bar by binary
    # search (adawidth/_forest_eval.h: about 5 of the grid's 17 rows scored instead of up to 17)
    params = dict(LGB_PARAMS, seed=seed, monotone_constraints=[0] * (len(names) - 1) + [1])
    return lgb.train(params, lgb.Dataset(X, y, feature_name=names, free_raw_data=False), NUM_ROUNDS)


def fit_recall_policy(table: RecallTable, *, folds: int = 4, seed: int = 0) -> tuple[lgb.Booster, np.ndarray]:
    """Fit the model on all calibration queries and return it with out-of-fold predictions.

    Returns:
        (booster over ``feature_names + ["z"]``, (Q, Z) out-of-fold predicted recall).

    Raises:
        ValueError: with fewer than ``2 * folds`` calibration queries.
    """
    Q, Z = table.recall.shape
    if Q < 2 * folds:
        raise ValueError(f"the recall policy needs at least {2 * folds} calibration queries, got {Q}")
    names = list(table.feature_names) + ["z"]
    X = recall_policy.design(table.features, table.z_grid)
    y = table.recall.reshape(-1)
    fold_of = np.random.default_rng(seed + 7).permutation(Q) % folds
    oof = np.zeros((Q, Z))
    for f in range(folds):
        fit_q, out_q = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
        rows = (fit_q[:, None] * Z + np.arange(Z)[None, :]).reshape(-1)
        model = _fit(X[rows], y[rows], names, seed)
        oof[out_q] = model.predict(recall_policy.design(table.features[out_q], table.z_grid)).reshape(len(out_q), Z)
    return _fit(X, y, names, seed), oof


def calibration_report(table: RecallTable, oof: np.ndarray, targets=(0.9, 0.95, 0.99, 0.999),
                       margin_share: float = 0.25, margin_rule: str = "standard_error") -> dict:
    """Per target: the goal (target + margin, :func:`adawidth.recall_policy.calibration_goal`), the bar, the
    realised mean recall and work of the per-query choices on the calibration queries, and the one calibrated z
    for every query (the static baseline, :func:`adawidth.recall_policy.interpolated_confidence`) with its mean
    calibration recall and work (both read off the grid's curve at that z)."""
    full = table.exact_coordinates.astype(np.float64)
    out = {}
    rows = np.arange(len(full))
    mean_recall, mean_work = table.recall.mean(axis=0), table.coordinates.astype(np.float64).mean(axis=0)
    for t in targets:
        goal = recall_policy.calibration_goal(t, table.recall, margin_rule, margin_share)
        bar = recall_policy.calibrate_bar(oof, table.recall, goal)
        if np.isfinite(bar) or recall_policy.safest_meets(table.recall, goal):
            pick = recall_policy.choose(oof, bar)
            rec, work = table.recall[rows, pick].mean(), table.coordinates[rows, pick].mean()
        else:
            rec, work = 1.0, full.mean()
        fixed = recall_policy.interpolated_confidence(table.z_grid, mean_recall, goal)
        out[str(t)] = {"goal": round(float(goal), 6),
                       "bar": bar if np.isfinite(bar) else ("safest" if rec < 1.0 or work < full.mean() else "exact"),
                       "recall": float(rec), "mean_coordinates": float(work), "fixed_z": fixed,
                       "fixed_recall": None if fixed is None else float(np.interp(fixed, table.z_grid, mean_recall)),
                       "fixed_mean_coordinates": None if fixed is None else float(np.interp(fixed, table.z_grid,
                                                                                            mean_work))}
    out["margin_rule"] = margin_rule
    out["exact_mean_coordinates"] = float(full.mean())
    return out


def effort_table(index, params, X_rot: np.ndarray, Q_rot: np.ndarray, *, k: int = 10,
                 truth: np.ndarray | None = None, efforts=None) -> RecallTable:
    """The per-query effort model's table (issue 19): every calibration query probed once at the cheapest effort
    (:func:`engine.ann.probe`: its evidence) and searched at every effort of the grid, its best k ranked by
    faiss's full-width scores (as served).

    Args:
        index, params: the ANN index and its :class:`engine.ann.AnnParams`.
        X_rot: (N, D) float32 rotated documents; Q_rot: (Q, D) float32 rotated calibration queries.
        k: recall@k.
        truth: (Q, k) exhaustive top-k rows (default computed).
        efforts: the grid (default :func:`engine.ann.effort_grid`), increasing.

    Returns:
        A :class:`RecallTable` whose ``z_grid`` is the effort grid: ``recall`` (Q, E) realised recall@k against
        exhaustive search, ``coordinates`` (Q, E) multiply-adds served (the probe, plus its continuation
        :func:`engine.ann.continue_search` unless the effort is the probe's), ``exact_coordinates`` (Q,) N·D.
    """
    efforts = np.asarray(efforts if efforts is not None else ann.effort_grid(params), dtype=np.float64)
    truth = ann.exhaustive_top_k(X_rot, Q_rot, k) if truth is None else truth
    Q, E = len(Q_rot), len(efforts)
    rec, work = np.zeros((Q, E)), np.zeros((Q, E), dtype=np.int64)
    feats = []
    for i, q in enumerate(Q_rot):
        ev = ann.probe(index, params.kind, q, k, int(efforts[0]))
        feats.append(ev.vector)
        t = set(truth[i].tolist())
        for j, e in enumerate(efforts):
            if j == 0:
                rows, w = ev.rows, ev.work
            else:  # as served (engine.stage1.AnnStage1.per_query): on from the probe
                hits = ann.continue_search(index, params.kind, q, k, ev, int(e))
                rows, w = hits.rows, hits.work
            rec[i, j] = len(t.intersection(rows.tolist())) / max(len(t), 1)
            work[i, j] = w
    exact = np.full(Q, X_rot.shape[0] * X_rot.shape[1], dtype=np.int64)
    return RecallTable(np.asarray(feats, dtype=np.float64), list(ann.EFFORT_FEATURES), rec, work, exact, efforts)
