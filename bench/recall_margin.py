"""Does a declared recall land on its target?  Calibration against test queries, per margin rule (issue 19).

For one corpus: the level store of the PCA-rotated documents; the recall policy's table (every query run at every
confidence z of :data:`adawidth.recall_policy.DEFAULT_Z_GRID`, :func:`trainer.recall_fit.recall_table`) on the
training queries (calibration) and on the test queries; the LightGBM model fitted on the calibration queries
(out-of-fold predictions for the bar).  Per target (0.95, 0.99) and margin rule it reports the goal (target +
margin, :func:`adawidth.recall_policy.calibration_goal`) and the test queries' realised mean recall@10 against
exhaustive search of

* **grid z**: the first z of the grid whose mean calibration recall meets the goal (what versions served before);
* **one z**: the z where the calibration curve reaches the goal between grid points
  (:func:`adawidth.recall_policy.interpolated_confidence`, monotone cubic; the test queries are run again at that
  z), and, for comparison, the z where the chord between the two grid points reaches it (tried first);
* **per query**: the model's choice per query at the calibrated bar.

With ``--threads T`` it also serves the test queries on T kernel threads and compares z calibrated on one thread
(what versions did before 2026-12-07) with z calibrated on T threads (:func:`trainer.recall_fit.
thread_calibration`): a sharded scan prunes less, so a z calibrated on one thread over-delivers there.

Margin rules: ``none`` (the goal is the target), ``share`` (a quarter of the miss budget, 0.25 · (1 − t), what
versions used before), ``standard_error`` (one standard error of the calibration mean, what versions use now).
The test queries' own standard error is printed beside each curve: a difference from the target smaller than it
cannot be told.  Recall, not time: the load of the machine does not move these numbers.

Usage::

    OMP_NUM_THREADS=1 python -m bench.recall_margin --corpus scifact
    OMP_NUM_THREADS=1 python -m bench.recall_margin --corpus debdocs --train 2000 --test 1000
    OMP_NUM_THREADS=1 python -m bench.recall_margin --corpus synthetic --n 200000 --train 2000 --test 1000
    OMP_NUM_THREADS=1 python -m bench.recall_margin --corpus synthetic --n 300000 --train 2000 --test 1000 --threads 2

Results: ``bench/results/recall_margin/<corpus>.json`` and ``summary.md`` (all corpora run so far).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from adawidth import levels, recall_policy
from adawidth.rotation import pca_rotation
from bench import scale
from bench.common import machine
from trainer.recall_fit import fit_recall_policy, recall_table, thread_calibration

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "recall_margin"
TARGETS = (0.95, 0.99)
RULES = ("none", "share", "standard_error")
BOUND = "data_aware_doc"


def load(name: str, n: int, n_train: int, n_test: int) -> dict:
    """The corpus and its queries through :mod:`bench.scale`'s loaders (embeddings from the cache)."""
    sf = scale.load_scifact(ROOT / "var", ROOT / "data" / "scifact")
    if name == "scifact":
        return sf
    if name == "debdocs":
        return scale.load_debdocs(ROOT / "var", ROOT.parent / "shared" / "data" / "debdocs", 50_000, n_train, n_test)
    return scale.load_synthetic(sf, n, n_train, n_test)


def goal_of(rule: str, target: float, realised: np.ndarray) -> float:
    """The goal of ``target`` under a margin rule (``none``: the target itself)."""
    if rule == "none":
        return float(target)
    return recall_policy.calibration_goal(target, realised, rule, 0.25)


def recall_at_z(store, Q_rot: np.ndarray, z: float, k: int = 10, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """((Q,) recall@k, (Q,) multiply-adds) of each query at confidence z on ``threads`` kernel threads, recall
    against the exact (certified) top-k."""
    out, work = np.empty(len(Q_rot)), np.empty(len(Q_rot))
    for i, q in enumerate(Q_rot):
        state = levels.begin(store, q, k, threads=threads)
        truth = set(levels.finish(state, bound="exact").rows.tolist())
        res = levels.finish(state, bound=BOUND, z=z)
        out[i], work[i] = len(truth & set(res.rows.tolist())) / k, res.coordinates
    return out, work


def chord(z: np.ndarray, mean: np.ndarray, goal: float) -> float | None:
    """The z where the straight line between the last grid point below ``goal`` and the first meeting it
    reaches it (None when no point does)."""
    meets = np.flatnonzero(mean >= goal - 1e-12)
    if not len(meets):
        return None
    j = int(meets[0])
    if j == 0 or mean[j] <= mean[j - 1]:
        return float(z[j])
    return float(z[j - 1] + (goal - mean[j - 1]) / (mean[j] - mean[j - 1]) * (z[j] - z[j - 1]))


def se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def at_threads(store, Q_cal: np.ndarray, Q_test: np.ndarray, cal, oof: np.ndarray, pred_test: np.ndarray,
               threads: int) -> dict:
    """Serving on ``threads`` kernel threads: per target (margin rule ``standard_error``, what versions use), the
    test queries' realised recall and work when z is calibrated on one thread (what versions served before
    2026-12-07) and when it is calibrated on ``threads`` (:func:`trainer.recall_fit.thread_calibration`), for
    the one calibrated z and for the per-query model (the same model and predictions; only the bar moves)."""
    used = levels.kernel_threads(threads, store.N)
    cal_t = thread_calibration([(store, Q_cal)], [used])[used] if used > 1 else (cal.recall, cal.coordinates)
    test_t = recall_table(store, Q_test, k=10, bound=BOUND, threads=used)
    rows = np.arange(len(Q_test))
    out = {"threads": threads, "kernel_threads": used,
           "calibration_mean": cal_t[0].mean(axis=0).round(5).tolist(),
           "test_mean": test_t.recall.mean(axis=0).round(5).tolist(), "targets": {}}
    for t in TARGETS:
        per = {}
        for label, realised in (("calibrated_1_thread", cal.recall), (f"calibrated_{used}_threads", cal_t[0])):
            goal = goal_of("standard_error", t, realised)
            zi = recall_policy.interpolated_confidence(cal.z_grid, realised.mean(axis=0), goal)
            one, one_work = (recall_at_z(store, Q_test, zi, threads=used) if zi is not None
                             else (test_t.recall[:, -1], test_t.coordinates[:, -1]))
            bar = recall_policy.calibrate_bar(oof, realised, goal)
            pick = recall_policy.choose(pred_test, bar)
            pq = test_t.recall[rows, pick]
            per[label] = {"goal": round(goal, 5), "one_z": None if zi is None else round(zi, 4),
                          "one_z_recall": round(float(one.mean()), 5), "one_z_se": round(se(one), 5),
                          "one_z_coordinates": round(float(np.mean(one_work))),
                          "per_query_recall": round(float(pq.mean()), 5), "per_query_se": round(se(pq), 5),
                          "per_query_coordinates": round(float(test_t.coordinates[rows, pick].mean()))}
        out["targets"][f"{t:g}"] = per
    return out


def run(name: str, n: int, n_train: int, n_test: int, threads: int = 1) -> dict:
    d = load(name, n, n_train, n_test)
    X = np.ascontiguousarray(d["X"], np.float32)
    R = pca_rotation(X).astype(np.float32)
    X_rot = np.ascontiguousarray(X @ R.T, np.float32)
    Q_cal = np.ascontiguousarray(d["Q_train"] @ R.T, np.float32)
    Q_test = np.ascontiguousarray(d["Q_test"] @ R.T, np.float32)
    store = levels.LevelStore.build(X_rot)
    cal = recall_table(store, Q_cal, k=10, bound=BOUND)
    test = recall_table(store, Q_test, k=10, bound=BOUND)
    booster, oof = fit_recall_policy(cal)
    z = cal.z_grid
    pred_test = booster.predict(recall_policy.design(test.features, z)).reshape(len(Q_test), len(z))
    rows = np.arange(len(Q_test))
    out = {"corpus": name, "note": d["note"], "n_docs": int(len(X)), "calibration_queries": int(len(Q_cal)),
           "test_queries": int(len(Q_test)), "z_grid": z.tolist(),
           "calibration_mean": cal.recall.mean(axis=0).round(5).tolist(),
           "test_mean": test.recall.mean(axis=0).round(5).tolist(),
           "calibration_se": [round(se(c), 5) for c in cal.recall.T], "test_se": [round(se(c), 5) for c in test.recall.T],
           "mean_coordinates": cal.coordinates.mean(axis=0).round(0).tolist(), "targets": {}}
    mean_cal = cal.recall.mean(axis=0)
    for t in TARGETS:
        per = {}
        for rule in tqdm(RULES, desc=f"{name} {t}", leave=False):
            goal = goal_of(rule, t, cal.recall)
            j = int(np.argmax(mean_cal >= goal - 1e-12)) if (mean_cal >= goal - 1e-12).any() else len(z) - 1
            zi = recall_policy.interpolated_confidence(z, mean_cal, goal)
            one = recall_at_z(store, Q_test, zi)[0] if zi is not None else test.recall[:, -1]
            zc = chord(z, mean_cal, goal)
            by_chord = recall_at_z(store, Q_test, zc)[0] if zc is not None else test.recall[:, -1]
            bar = recall_policy.calibrate_bar(oof, cal.recall, goal)
            pick = recall_policy.choose(pred_test, bar)
            pq = test.recall[rows, pick]
            per[rule] = {"goal": round(goal, 5),
                         "grid_z": float(z[j]), "grid_recall": round(float(test.recall[:, j].mean()), 5),
                         "grid_coordinates": round(float(test.coordinates[:, j].mean())),
                         "one_z": None if zi is None else round(zi, 4), "one_z_recall": round(float(one.mean()), 5),
                         "one_z_se": round(se(one), 5),
                         "chord_z": None if zc is None else round(zc, 4),
                         "chord_recall": round(float(by_chord.mean()), 5),
                         "per_query_bar": bar if np.isfinite(bar) else None,
                         "per_query_recall": round(float(pq.mean()), 5), "per_query_se": round(se(pq), 5),
                         "per_query_coordinates": round(float(test.coordinates[rows, pick].mean()))}
        out["targets"][f"{t:g}"] = per
    if threads > 1:
        out["served_threads"] = at_threads(store, Q_cal, Q_test, cal, oof, pred_test, threads)
    return out


def markdown(results: dict, command: dict, machine_line: str) -> str:
    lines = ["# Declared recall on test queries, per margin rule", "",
             "Realised mean recall@10 of the test queries against exhaustive search (± its standard error over the "
             "test queries). *grid z*: the first grid point meeting the goal; *chord z*: the straight line between "
             "the two grid points around the goal; *one z*: the calibration curve read between grid points "
             "(monotone cubic, what versions serve); *per query*: the LightGBM model at the calibrated bar. Within 0.005 of the "
             "target is the issue's goal.", "", f"Machine: {machine_line}", ""]
    for name, r in results.items():
        lines += [f"## {name} (N = {r['n_docs']:,}; {r['calibration_queries']} calibration, {r['test_queries']} test "
                  "queries)", "", f"Command: `{command.get(name, '')}`", "",
                  "| target | margin rule | goal | grid z | recall | chord z | recall | one z | recall | "
                  "per query recall |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for t, per in r["targets"].items():
            for rule, v in per.items():
                one = "—" if v["one_z"] is None else f"{v['one_z']:.3f}"
                ch = "—" if v["chord_z"] is None else f"{v['chord_z']:.3f}"
                lines.append(f"| {t} | {rule} | {v['goal']:.4f} | {v['grid_z']:g} | {v['grid_recall']:.4f} | {ch} | "
                             f"{v['chord_recall']:.4f} | {one} | "
                             f"{v['one_z_recall']:.4f} ± {v['one_z_se']:.4f} | "
                             f"{v['per_query_recall']:.4f} ± {v['per_query_se']:.4f} |")
        lines += ["", "Mean recall by z (calibration / test):", "",
                  "| z | " + " | ".join(f"{v:g}" for v in r["z_grid"]) + " |",
                  "|---|" + "---|" * len(r["z_grid"]),
                  "| calibration | " + " | ".join(f"{v:.4f}" for v in r["calibration_mean"]) + " |",
                  "| test | " + " | ".join(f"{v:.4f}" for v in r["test_mean"]) + " |", ""]
        st = r.get("served_threads")
        if st:
            lines += [f"Served on {st['kernel_threads']} kernel threads (margin rule standard_error): z calibrated on "
                      "one thread against z calibrated on the serving thread count (the same model; its bar and "
                      "the one z are calibrated on the calibration queries scanned on that many threads). "
                      "Work: mean multiply-adds per query, thousands.", "",
                      "| target | calibrated on | goal | one z | recall | work | per query recall | work |",
                      "|---|---|---|---|---|---|---|---|"]
            for t, per in st["targets"].items():
                for label, v in per.items():
                    one = "—" if v["one_z"] is None else f"{v['one_z']:.3f}"
                    lines.append(f"| {t} | {label.replace('calibrated_', '').replace('_', ' ')} | {v['goal']:.4f} | "
                                 f"{one} | {v['one_z_recall']:.4f} ± {v['one_z_se']:.4f} | "
                                 f"{v['one_z_coordinates'] / 1000:,.0f} | "
                                 f"{v['per_query_recall']:.4f} ± {v['per_query_se']:.4f} | "
                                 f"{v['per_query_coordinates'] / 1000:,.0f} |")
            lines += ["", f"Mean recall by z on {st['kernel_threads']} threads (calibration / test):", "",
                      "| z | " + " | ".join(f"{v:g}" for v in r["z_grid"]) + " |",
                      "|---|" + "---|" * len(r["z_grid"]),
                      "| calibration | " + " | ".join(f"{v:.4f}" for v in st["calibration_mean"]) + " |",
                      "| test | " + " | ".join(f"{v:.4f}" for v in st["test_mean"]) + " |", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=["scifact", "debdocs", "synthetic"], default="scifact")
    ap.add_argument("--n", type=int, default=200_000, help="synthetic documents")
    ap.add_argument("--train", type=int, default=2000, help="calibration queries (debdocs, synthetic)")
    ap.add_argument("--test", type=int, default=1000, help="test queries (debdocs, synthetic)")
    ap.add_argument("--threads", type=int, default=1,
                    help="also serve the test queries on this many kernel threads, z calibrated on one thread "
                         "and on this many (the kernel uses at most one per 32,768 documents)")
    args = ap.parse_args(argv)
    r = run(args.corpus, args.n, args.train, args.test, args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    cmd = "OMP_NUM_THREADS=1 python -m bench.recall_margin " + " ".join(
        argv if argv is not None else __import__("sys").argv[1:])
    r["command"] = cmd.strip()
    # one file per corpus; a synthetic size other than the default and a thread count get their own
    stem = args.corpus + (f"_{args.n}" if args.corpus == "synthetic" and args.n != 200_000 else "") + \
        (f"_threads{args.threads}" if args.threads > 1 else "")
    (OUT / f"{stem}.json").write_text(json.dumps(r, indent=1))
    results = {p.stem: json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))}
    text = markdown(results, {k: v.get("command", "") for k, v in results.items()}, machine())
    (OUT / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
