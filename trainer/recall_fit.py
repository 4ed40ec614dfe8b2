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
        threads: kernel threads of each scan (:func:`adawidth.levels.kernel_threads` says how many it uses).
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


def thread_counts(rows: int, threads: int) -> list[int]:
    """The kernel thread counts above one a level scan of ``rows`` rows can run on with at most ``threads``
    threads (:func:`adawidth.levels.kernel_threads`, distinct and increasing; empty below 65,536 rows)."""
    return sorted({levels.kernel_threads(t, rows) for t in range(2, max(int(threads), 1) + 1)} - {1})


def thread_calibration(runs: list[tuple[levels.LevelStore, np.ndarray]], threads: list[int], *, k: int = 10,
                       bound: str = "data_aware_doc", z_grid=recall_policy.DEFAULT_Z_GRID
                       ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The calibration queries' realised recall and work at every z, scanned on each of ``threads`` kernel threads.

    The shared threshold of a sharded scan is the best of the threads' own k-th scores, so it prunes less than one
    thread and a z realises more recall (``bench/recall_margin.py --threads``: +0.007 to +0.013 mean recall@10
    at z 2.5-3 on 300k synthetic documents).  :meth:`engine.recall.RecallPolicy.at_threads` serves these.

    Args:
        runs: (store, (Q_i, D) float32 rotated calibration queries) in the order of the one-thread table's rows
            (the cross-fitted rotations' parts, or one).
        threads: kernel thread counts (:func:`thread_counts`).
        k, bound, z_grid: as :func:`recall_table`.

    Returns:
        t -> ((Q, Z) realised recall@k in [0, 1], (Q, Z) int64 multiply-adds), Q = sum of Q_i.
    """
    out = {}
    for t in threads:
        tables = [recall_table(store, Q, k=k, bound=bound, z_grid=z_grid, threads=t) for store, Q in runs]
        out[int(t)] = (np.concatenate([tb.recall for tb in tables]), np.concatenate([tb.coordinates for tb in tables]))
    return out


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
    Q = table.recall.shape[0]
    if Q < 2 * folds:
        raise ValueError(f"the recall policy needs at least {2 * folds} calibration queries, got {Q}")
    names = list(table.feature_names) + ["z"]
    oof = _oof(table, folds, seed)
    return _fit(recall_policy.design(table.features, table.z_grid), table.recall.reshape(-1), names, seed), oof


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
                 truth: np.ndarray | None = None, efforts=None, prefixes: np.ndarray | None = None) -> RecallTable:
    """The per-query effort model's table (issue 19): every calibration query probed once at the grid's first
    effort (:func:`engine.ann.probe`: its evidence) and searched at every effort of the grid, its best k ranked
    by faiss's full-width scores (as served).

    Args:
        index, params: the ANN index and its :class:`engine.ann.AnnParams`.
        X_rot: (N, D) float32 documents and Q_rot: (Q, D) float32 calibration queries, both in the index's space
            (:func:`engine.ann.index_space`: rotated, or as the encoder gives them).
        k: recall@k.
        truth: (Q, k) exhaustive top-k rows (default computed).
        efforts: the grid (default :func:`engine.ann.effort_grid`), increasing; the first is the probe's.
        prefixes: (Q, >= :data:`engine.ann.ENERGY_PREFIX`) float32 the queries' leading rotated coordinates for
            the evidence (:func:`engine.ann.probe`), or None when ``Q_rot`` is rotated.

    Returns:
        A :class:`RecallTable` whose ``z_grid`` is the effort grid: ``recall`` (Q, E) realised recall@k against
        exhaustive search, ``coordinates`` (Q, E) multiply-adds served (the probe, plus its continuation
        :func:`engine.ann.continue_search` unless the effort is the probe's), ``exact_coordinates`` (Q,) N·D.
    """
    efforts = tuple(int(e) for e in (efforts if efforts is not None else ann.effort_grid(params)))
    return effort_tables(index, params, X_rot, Q_rot, k=k, truth=truth, efforts=efforts,
                         probes=efforts[:1], prefixes=prefixes)[efforts[0]]


def effort_tables(index, params, X_rot: np.ndarray, Q_rot: np.ndarray, *, k: int = 10,
                  truth: np.ndarray | None = None, efforts=None, probes=None,
                  prefixes: np.ndarray | None = None, resumable: bool = True,
                  energy: bool = True) -> dict[int, RecallTable]:
    """:func:`effort_table` for several probe efforts at once: per probe p, the table over the efforts of the
    grid from p on (p first), each as served (:func:`engine.ann.continue_search`).

    An inner-product HNSW (:data:`engine.ann.RESUMABLE_KINDS`) with ``resumable`` resumes its probe
    (:class:`engine.ann.ResumableHnsw`): per probe, one search per query widened through the grid, each effort's
    answer the one :func:`engine.ann.continue_search` serves (it passes through the same efforts).  Otherwise
    HNSW's continuation is a fresh search merged with the probe's candidates (:func:`engine.ann.merge_with_probe`),
    so each query is searched once per effort of the grid and probed once per probe, and every probe's table is
    reassembled from those searches.  IVF resumes its probe's lists, which depends on the probe: it runs
    :func:`engine.ann.continue_search` per probe.

    Args:
        efforts: the grid, increasing (default :func:`engine.ann.effort_grid`).
        probes: probe efforts, each on the grid (default its first).
        resumable: HNSW resumes its probe (as versions built since 2026-12-07 serve); False: faiss's fresh
            searches (the earlier versions' calibration).
        energy: False leaves the energy features (:data:`engine.ann.ENERGY_FEATURES`) missing (NaN) in the table,
            so a model fitted on it never reads them and serving needs no rotated prefix.
        (the rest as :func:`effort_table`)

    Returns:
        probe effort -> :class:`RecallTable`.

    Raises:
        ValueError: a probe not on the grid.
    """
    efforts = tuple(int(e) for e in (efforts if efforts is not None else ann.effort_grid(params)))
    probes = tuple(int(p) for p in (probes if probes is not None else efforts[:1]))
    bad = [p for p in probes if p not in efforts]
    if bad:
        raise ValueError(f"probe efforts {bad} are not on the effort grid {efforts}")
    truth = ann.exhaustive_top_k(X_rot, Q_rot, k) if truth is None else truth
    Q = len(Q_rot)
    start = {p: efforts.index(p) for p in probes}
    rec = {p: np.zeros((Q, len(efforts) - start[p])) for p in probes}
    work = {p: np.zeros((Q, len(efforts) - start[p]), dtype=np.int64) for p in probes}
    feats = {p: [] for p in probes}
    resumable = resumable and params.kind in ann.RESUMABLE_KINDS
    resumes = resumable or not params.kind.startswith("hnsw")
    first = min(start.values()) + 1
    for i, q in enumerate(Q_rot):
        t = set(truth[i].tolist())
        fresh = {} if resumes else {e: ann.search(index, params.kind, q, k, e) for e in efforts[first:]}
        for p in probes:
            ev = ann.probe(index, params.kind, q, k, p, prefix=None if prefixes is None else prefixes[i],
                           resume_grid=efforts if resumable else None)
            feats[p].append(ev.vector)
            for j, e in enumerate(efforts[start[p]:]):
                if j == 0:
                    hits = ann.AnnHits(ev.rows, ev.work, scores=ev.scores)
                elif resumes:  # as served (engine.stage1.AnnStage1.per_query): on from the probe
                    hits = ann.continue_search(index, params.kind, q, k, ev, e)
                else:
                    hits = ann.merge_with_probe(ev, fresh[e], k)
                rec[p][i, j] = len(t.intersection(hits.rows.tolist())) / max(len(t), 1)
                work[p][i, j] = hits.work
    exact = np.full(Q, X_rot.shape[0] * X_rot.shape[1], dtype=np.int64)
    features = {p: np.asarray(feats[p], dtype=np.float64).reshape(Q, len(ann.EFFORT_FEATURES)) for p in probes}
    if not energy:
        for f in features.values():
            f[:, [ann.EFFORT_FEATURES.index(n) for n in ann.ENERGY_FEATURES]] = np.nan
    return {p: RecallTable(features[p], list(ann.EFFORT_FEATURES), rec[p], work[p], exact,
                           np.asarray(efforts[start[p]:], dtype=np.float64)) for p in probes}



@dataclass
class EffortFit:
    """One per-query effort model a build serves (:func:`fit_effort_models`).

    Attributes:
        table: the calibration table of its probe (its ``z_grid`` starts at the probe's effort).
        booster: LightGBM over ``table.feature_names + ["z"]``; oof: (Q, E) its out-of-fold predictions.
        probe: its probe's effort (nprobe or efSearch).
        targets: the recall targets it serves, increasing (those whose calibrated median work was lowest at its
            probe).
        probes: per probe effort tried (str), ``{"p50_work": {target: median multiply-adds}}`` of the calibration
            queries' choices at each target's calibrated bar (lower is cheaper): the figures the choice was made
            on (the same dict in every model of one fit).
    """

    table: RecallTable
    booster: lgb.Booster
    oof: np.ndarray
    probe: int
    targets: tuple[float, ...]
    probes: dict


def _oof(table: RecallTable, folds: int, seed: int) -> np.ndarray:
    """(Q, Z) out-of-fold predictions of ``table`` (K-fold over its queries)."""
    Q, Z = table.recall.shape
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
    return oof


def calibrated_p50_work(table: RecallTable, oof: np.ndarray, target: float, margin_rule: str = "standard_error",
                        margin_share: float = 0.25) -> float:
    """The calibration queries' median multiply-adds (lower is cheaper) when each takes the cheapest effort whose
    out-of-fold prediction clears the bar calibrated for ``target`` (:func:`adawidth.recall_policy.calibrate_bar`
    at :func:`adawidth.recall_policy.calibration_goal`); the grid's last effort where no bar meets it."""
    goal = recall_policy.calibration_goal(target, table.recall, margin_rule, margin_share)
    bar = recall_policy.calibrate_bar(oof, table.recall, goal)
    pick = recall_policy.choose(oof, bar) if np.isfinite(bar) else np.full(len(oof), oof.shape[1] - 1)
    return float(np.median(np.asarray(table.coordinates, np.float64)[np.arange(len(oof)), pick]))


def fit_effort_models(index, params, X_rot: np.ndarray, Q_rot: np.ndarray, curve: list[dict], *, k: int = 10,
                      truth: np.ndarray | None = None, margin_share: float = 0.0,
                      targets: tuple[float, ...] = ann.DEFAULT_TARGETS, margin_rule: str = "standard_error",
                      rule_share: float = 0.25, folds: int = 4, seed: int = 0,
                      cap: float = ann.MODEL_EFFORT_CAP, prefixes: np.ndarray | None = None,
                      resumable: bool = True, probes: tuple[int, ...] | None = None,
                      energy: bool = True) -> list[EffortFit]:
    """The per-query effort models, each with the probe effort its targets chose on the calibration queries
    (issue 19).

    For every probe of :func:`engine.ann.probe_candidates` (``curve``: the tuned effort curve,
    :func:`engine.ann.tune_effort`; ``margin_share``: the share the fixed efforts are served at), the table over
    :func:`engine.ann.model_efforts` from that probe up to ``cap`` x the highest target's tuned effort
    (:func:`effort_tables`), its out-of-fold predictions, and
    per target the median work of the calibrated choices (:func:`calibrated_p50_work` under ``margin_rule`` /
    ``rule_share``).  Each target takes the probe where that median is lowest; targets taking the same probe
    share one model, refitted on all queries.  A median because the issue's target is a p50; work (distance
    computations x D) because it is what one thread's latency follows and it does not move with a shared
    machine's load.  Per target because the best probe moves with it: where HNSW cannot resume a search
    (``resumable`` False, faiss's search), a probe near a low target's effort settles most of its queries, while a
    high target's queries mostly search again and pay the probe twice (debdocs' 221,170 passages, one model:
    efSearch 40 had the lowest geometric mean, but its median work at 0.99 was 19 % above probe 10's,
    docs/SCALING.md).  ``X_rot``, ``Q_rot`` and ``prefixes`` as :func:`effort_table`; ``resumable`` as
    :func:`effort_tables`, and so is ``energy``; ``probes``: the probe efforts to choose among (None: :func:`engine.ann.probe_candidates`;
    one effort fixes the probe, as ``bench.probe_sweep`` does).

    Returns:
        The models, by their lowest target (each target of ``targets`` in exactly one).

    Raises:
        ValueError: with fewer than ``2 * folds`` calibration queries, no target, a ``cap`` not above 0, or an
            empty or non-positive ``probes``.
    """
    if probes is not None and (not probes or min(probes) < 1):
        raise ValueError(f"probes must be positive efforts, got {probes!r}")
    if len(Q_rot) < 2 * folds:
        raise ValueError(f"the effort model needs at least {2 * folds} calibration queries, got {len(Q_rot)}")
    if not targets:
        raise ValueError("the effort model needs at least one recall target")
    probes = (tuple(sorted({int(p) for p in probes})) if probes is not None
              else ann.probe_candidates(params, curve, margin_share))
    grid = tuple(sorted(set(ann.model_efforts(params, curve, margin_share, cap=cap)) | set(probes)))
    tables = effort_tables(index, params, X_rot, Q_rot, k=k, truth=truth, efforts=grid, probes=probes,
                           prefixes=prefixes, resumable=resumable, energy=energy)
    report, oofs = {}, {}
    for p, table in tables.items():
        oofs[p] = _oof(table, folds, seed)
        report[str(p)] = {"p50_work": {f"{t:g}": round(calibrated_p50_work(table, oofs[p], t, margin_rule,
                                                                           rule_share), 1) for t in targets}}
    chosen: dict[int, list[float]] = {}
    for t in sorted(float(t) for t in targets):  # the cheapest probe on a tie
        p = min(tables, key=lambda e: (report[str(e)]["p50_work"][f"{t:g}"], e))
        chosen.setdefault(p, []).append(t)
    fits = []
    for p, ts in chosen.items():
        table = tables[p]
        booster = _fit(recall_policy.design(table.features, table.z_grid), table.recall.reshape(-1),
                       list(table.feature_names) + ["z"], seed)
        fits.append(EffortFit(table, booster, oofs[p], int(p), tuple(ts), report))
    return sorted(fits, key=lambda f: f.targets[0])
