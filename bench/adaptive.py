"""Per-query stage-1 width, shortlist depth and rescoring width, learned, against the best static funnel.

Every query first scans the corpus on one coordinate block (16 coordinates; ``adawidth.blocked``)
and reads 22 evidence values from it (``adawidth.stage1_policy``).  A LightGBM regressor, fitted on
training queries only, predicts for every configuration (m1, C, r) of the static sweep's grid either
its top-10 agreement with exhaustive full-width search (label-free target) or its NDCG@10 (labelled
target).  Two policies use it:

* ``threshold`` (agreement target): the cheapest configuration whose predicted agreement clears τ;
* ``tradeoff`` (NDCG target): the configuration maximising predicted NDCG@10 − λ · work / full work.

Each query pays N·m1 + C·(r − m1) multiply-adds plus the evidence (100 × 16); the first block's scan
is part of every m1 >= 16, so it is not paid twice.  Sweeping τ or λ traces a curve that is compared
with the static Pareto frontier on the same test queries: the work saved at equal NDCG@10 (within
0.5 %) and the NDCG@10 added at equal work, with 95 % bootstrap intervals over queries.  The oracle
picks with the true NDCG@10 (the upper bound of any policy on this grid).

Protocols: with a train split (SciFact) the policy is fitted on the train queries, ranked through
cross-fitted adapters when the rotation is learned, and scored on the test queries (all, and the
unseen subset); with ``--folds K`` (the classic collections) it is K-fold cross-validation over the
judged queries, with a label-free rotation (identity or PCA).

Usage::

    .venv/bin/python -m bench.adaptive --dataset data/scifact --rotation pca
    .venv/bin/python -m bench.adaptive --dataset ../shared/data/cranfield --rotation pca --folds 5

Writes ``bench/results/adaptive/<collection>_<rotation>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np

from adawidth import stage1_policy as sp
from adawidth.metrics import ranking_metric
from adawidth.prefix import exact_prefix_search
from bench.common import ROOT
from bench.funnels import add_run_arguments, bootstrap_ci, learned_rotation, load_embedded, pareto_indices
from engine.io import atomic
from trainer.stage1_policy_fit import LGB_PARAMS, NUM_ROUNDS

TAUS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
LAMBDAS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def ndcg_matrix(rankings: np.ndarray, judgments: list[dict], doc_ids: list[str]) -> np.ndarray:
    """(Q, K) NDCG@10 of (Q, K, k) rankings of index rows, one column per configuration."""
    return np.stack([ranking_metric(rankings[:, j], judgments, "ndcg", 10, doc_ids)
                     for j in range(rankings.shape[1])], axis=1).reshape(rankings.shape[:2])


def fit(feats: np.ndarray, target: np.ndarray, grid, N: int, full_work: float, seed: int):
    """The served policy's LightGBM model (trainer.stage1_policy_fit) on any per-configuration target."""
    names = list(sp.EVIDENCE_NAMES + sp.CONFIG_NAMES)
    return lgb.train(dict(LGB_PARAMS, seed=seed),
                     lgb.Dataset(sp.design(feats, grid, N, full_work), target.ravel(), feature_name=names),
                     num_boost_round=NUM_ROUNDS)


class Split:
    """Evidence, rankings and targets of one set of queries under one rotation."""

    def __init__(self, X_rot, Q_rot, Q_raw, X_raw, judgments, doc_ids, grid):
        self.feats = sp.evidence_matrix(X_rot, Q_rot)
        self.rankings = sp.funnel_rankings(X_rot, Q_rot, grid)
        reference = exact_prefix_search(Q_raw, X_raw, X_raw.shape[1], 10)  # rotation-invariant full width
        self.agreement = sp.top10_agreement(self.rankings, reference)
        self.ndcg = ndcg_matrix(self.rankings, judgments, doc_ids) if judgments is not None else None
        self.full_ndcg = ranking_metric(reference, judgments, "ndcg", 10, doc_ids) if judgments is not None else None


def concat(splits: list[Split], order: np.ndarray) -> Split:
    out = Split.__new__(Split)
    for attr in ("feats", "rankings", "agreement", "ndcg", "full_ndcg"):
        parts = [getattr(s, attr) for s in splits]
        out.__dict__[attr] = np.concatenate(parts)[np.argsort(order)] if parts[0] is not None else None
    return out


def select_on_train(train: "Split", grid, work: np.ndarray, N: int, full_work: float, seed: int, folds: int = 5) -> dict:
    """Choose τ and the rival static funnel on the training queries only (no test query is looked at).

    The static choice is the cheapest configuration whose mean training NDCG@10 is within 0.5 % of the best
    configuration's; τ is the one (of :data:`TAUS`) whose out-of-fold choices cost least while reaching the same
    training NDCG@10 bar (the largest-NDCG τ when none does).
    """
    q = train.ndcg.mean(0)
    bar = 0.995 * q.max()
    static_index = int(min((i for i in range(len(grid)) if q[i] >= bar), key=lambda i: work[i]))
    fold_of = np.random.default_rng(seed).permutation(len(train.feats)) % folds
    oof = np.empty_like(train.agreement)
    for f in range(folds):
        tr, te = fold_of != f, fold_of == f
        oof[te] = fit(train.feats[tr], train.agreement[tr], grid, N, full_work, seed).predict(
            sp.design(train.feats[te], grid, N, full_work)).reshape(-1, len(grid))
    rows = np.arange(len(oof))
    per_tau = {t: (float(train.ndcg[rows, sp.choose_threshold(oof, work, t)].mean()),
                   float(work[sp.choose_threshold(oof, work, t)].mean())) for t in TAUS}
    ok = [t for t in TAUS if per_tau[t][0] >= bar]
    tau = min(ok, key=lambda t: per_tau[t][1]) if ok else max(TAUS, key=lambda t: per_tau[t][0])
    return {"tau": tau, "static_index": static_index, "train_bar_ndcg@10": float(bar),
            "train_by_tau": {str(t): {"ndcg@10": v[0], "work_ratio_to_full": v[1] / full_work} for t, v in per_tau.items()}}


def compare(per_q: np.ndarray, w: np.ndarray, nte: np.ndarray, work: np.ndarray, front: list[int],
            unseen: np.ndarray | None, full_work: float, grid) -> dict:
    """One policy point against the static frontier on the same queries."""
    static_q = nte.mean(0)
    pt = {"work": float(w.mean()), "work_ratio_to_full": float(w.mean() / full_work), "ndcg@10": float(per_q.mean()),
          "ndcg@10_unseen": float(per_q[unseen].mean()) if unseen is not None and unseen.any() else None}
    ok = [i for i in front if static_q[i] >= 0.995 * pt["ndcg@10"]]
    if ok:
        s = min(ok, key=lambda i: work[i])
        diff = per_q - nte[:, s]
        pt["static_equal_quality"] = {"config": vars(grid[s]), "work_ratio_to_full": float(work[s] / full_work),
                                      "ndcg@10": float(static_q[s]), "work_saved": float(1 - pt["work"] / work[s]),
                                      "ndcg_diff": float(diff.mean()), "ci95": bootstrap_ci(diff)}
    cheaper = [i for i in range(len(grid)) if work[i] <= pt["work"]]
    if cheaper:
        s = max(cheaper, key=lambda i: static_q[i])
        diff = per_q - nte[:, s]
        pt["static_equal_work"] = {"config": vars(grid[s]), "work_ratio_to_full": float(work[s] / full_work),
                                   "ndcg@10": float(static_q[s]), "ndcg_added": float(diff.mean()),
                                   "ci95": bootstrap_ci(diff)}
    return pt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--collection")
    p.add_argument("--rotation", default="pca", choices=["identity", "pca", "adapter", "adapter_on_pca"])
    p.add_argument("--folds", type=int, default=0, help="K-fold CV over the judged queries (0: train → test)")
    add_run_arguments(p, ROOT / "bench" / "results" / "adaptive")
    args = p.parse_args(argv)
    held_out = None
    if args.folds and args.rotation.startswith("adapter"):
        p.error("--folds needs a label-free rotation (identity or pca)")

    t0 = time.time()
    emb = load_embedded(args.dataset, args.home, args.collection, use_train=not args.folds)
    if not args.folds and not emb.train_ids:
        p.error(f"{args.dataset} has no train split: use --folds 5")
    X, N, D = emb.X, emb.X.shape[0], emb.X.shape[1]
    full_work = float(N * D)
    grid = sp.default_grid()
    work = np.array([c.work(N) for c in grid], dtype=np.float64)
    Qt = emb.Qt

    if args.folds:
        R = learned_rotation(args.rotation, X, None, None)
        Xr = (X @ R.T).astype(np.float32)
        test = Split(Xr, (Qt @ R.T).astype(np.float32), Qt, X, emb.judg_t, emb.doc_ids, grid)
        fold_of = np.random.default_rng(args.seed).permutation(len(Qt)) % args.folds
        pred_agree = np.empty((len(Qt), len(grid)))
        pred_ndcg = np.empty((len(Qt), len(grid)))
        for f in range(args.folds):
            tr, te = fold_of != f, fold_of == f
            ma = fit(test.feats[tr], test.agreement[tr], grid, N, full_work, args.seed)
            mn = fit(test.feats[tr], test.ndcg[tr], grid, N, full_work, args.seed)
            dm = sp.design(test.feats[te], grid, N, full_work)
            pred_agree[te] = ma.predict(dm).reshape(-1, len(grid))
            pred_ndcg[te] = mn.predict(dm).reshape(-1, len(grid))
        n_train, folds_note = f"{args.folds}-fold CV", f"{args.folds}-fold cross-validation over judged queries"
    else:
        pos = emb.positives(emb.judg_tr)
        folds = args.crossfit_folds if args.rotation.startswith("adapter") else 1
        fold_of = np.random.default_rng(args.seed + 1).permutation(len(emb.train_ids)) % folds
        parts, order = [], []
        for f in range(folds):
            held = np.flatnonzero(fold_of == f)
            fit_idx = np.flatnonzero(fold_of != f) if folds > 1 else np.arange(len(emb.train_ids))
            R = learned_rotation(args.rotation, X, emb.Qtr[fit_idx], [pos[i] for i in fit_idx], args.epochs, args.seed)
            parts.append(Split((X @ R.T).astype(np.float32), (emb.Qtr[held] @ R.T).astype(np.float32), emb.Qtr[held], X,
                               [emb.judg_tr[i] for i in held], emb.doc_ids, grid))
            order.append(held)
        train = concat(parts, np.concatenate(order))
        print(f"training data ready ({time.time() - t0:.0f} s)", file=sys.stderr)
        R = learned_rotation(args.rotation, X, emb.Qtr, pos, args.epochs, args.seed)
        test = Split((X @ R.T).astype(np.float32), (Qt @ R.T).astype(np.float32), Qt, X, emb.judg_t, emb.doc_ids, grid)
        dm = sp.design(test.feats, grid, N, full_work)
        pred_agree = fit(train.feats, train.agreement, grid, N, full_work, args.seed).predict(dm).reshape(-1, len(grid))
        pred_ndcg = fit(train.feats, train.ndcg, grid, N, full_work, args.seed).predict(dm).reshape(-1, len(grid))
        n_train = f"{len(emb.train_ids)} train queries" + (f", cross-fitted {folds}-fold" if folds > 1 else "")
        folds_note = "policy fitted on the train split, scored on the test split"
        held_out = select_on_train(train, grid, work, N, full_work, args.seed)
    print(f"policy fitted ({time.time() - t0:.0f} s)", file=sys.stderr)

    nte, unseen = test.ndcg, emb.unseen
    rows = np.arange(len(Qt))
    static_q = nte.mean(0)
    front = pareto_indices(work, static_q)
    ev = sp.evidence_work()
    threshold_pts, tradeoff_pts, oracle = [], [], []
    for tau in TAUS:
        pick = sp.choose_threshold(pred_agree, work, tau)
        pt = compare(nte[rows, pick], work[pick] + ev, nte, work, front, unseen, full_work, grid)
        pt["tau"] = tau
        pt["picks"] = np.bincount(pick, minlength=len(grid)).tolist()
        pt["mean_agreement"] = float(test.agreement[rows, pick].mean())
        threshold_pts.append(pt)
    for lam in LAMBDAS:
        pick = sp.choose_tradeoff(pred_ndcg, work, full_work, lam)
        pt = compare(nte[rows, pick], work[pick] + ev, nte, work, front, unseen, full_work, grid)
        pt["lambda"] = lam
        pt["picks"] = np.bincount(pick, minlength=len(grid)).tolist()
        tradeoff_pts.append(pt)
        opick = np.argmax(nte - lam * work[None, :] / full_work, axis=1)
        oracle.append({"lambda": lam, "work_ratio_to_full": float(work[opick].mean() / full_work),
                       "ndcg@10": float(nte[rows, opick].mean()),
                       "ndcg@10_unseen": float(nte[rows, opick][unseen].mean()) if unseen is not None else None})

    if held_out is not None:  # τ and the static configuration both chosen on the train split, scored on test
        tau, s_cfg = held_out["tau"], held_out["static_index"]
        pick = sp.choose_threshold(pred_agree, work, tau)
        per_q = nte[rows, pick]
        diff = per_q - nte[:, s_cfg]
        held_out.update({
            "test_policy": {"work_ratio_to_full": float((work[pick] + ev).mean() / full_work), "ndcg@10": float(per_q.mean()),
                            "ndcg@10_unseen": float(per_q[unseen].mean()) if unseen is not None else None},
            "test_static": {"config": vars(grid[s_cfg]), "work_ratio_to_full": float(work[s_cfg] / full_work),
                            "ndcg@10": float(nte[:, s_cfg].mean()),
                            "ndcg@10_unseen": float(nte[unseen, s_cfg].mean()) if unseen is not None else None},
            "ndcg_diff": float(diff.mean()), "ci95": bootstrap_ci(diff)})
        held_out["work_saved"] = 1 - held_out["test_policy"]["work_ratio_to_full"] / held_out["test_static"]["work_ratio_to_full"]

    def static_row(i):
        return {"config": vars(grid[i]), "work_ratio_to_full": float(work[i] / full_work), "ndcg@10": float(static_q[i]),
                "ndcg@10_unseen": float(nte[unseen, i].mean()) if unseen is not None else None,
                "agreement": float(test.agreement[:, i].mean())}

    cmd = f"python -m bench.adaptive --dataset {args.dataset} --rotation {args.rotation}" + \
          (f" --folds {args.folds}" if args.folds else "")
    result = {
        "command": cmd, "collection": emb.name, "rotation": args.rotation, "documents": N,
        "test_queries": len(Qt), "unseen_queries": int(unseen.sum()) if unseen is not None else None,
        "protocol": folds_note, "policy_training": n_train,
        "cost_model": "multiply-adds per query = N*m1 (flat stage-1 scan) + C*(r - m1) (rescoring reuses stage-1 "
                      f"sums) + {ev} (evidence) for the adaptive policy",
        "full_width": {"ndcg@10": float(test.full_ndcg.mean()), "work": full_work},
        "grid": [vars(c) for c in grid], "static": [static_row(i) for i in range(len(grid))], "static_frontier": [static_row(i) for i in front],
        "threshold_policy": threshold_pts, "tradeoff_policy": tradeoff_pts, "oracle": oracle,
        "selected_on_train": held_out,
        "seconds": round(time.time() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{emb.name}_{args.rotation}"
    atomic.write_text(args.out / f"{stem}.json", json.dumps(result, indent=1))
    md = render(result)
    atomic.write_text(args.out / f"{stem}.md", md)
    plot(result, args.out / f"{stem}.png")
    print(md)
    return 0


def _cmp_cells(pt: dict) -> str:
    eq, ew = pt.get("static_equal_quality"), pt.get("static_equal_work")
    a = (f"{eq['work_ratio_to_full']:.3f} ({eq['work_saved']:+.1%}); ΔNDCG {eq['ndcg_diff']:+.4f} "
         f"[{eq['ci95'][0]:+.4f}, {eq['ci95'][1]:+.4f}]" if eq else "none within 0.5 %")
    b = (f"{ew['ndcg@10']:.4f} | {ew['ndcg_added']:+.4f} [{ew['ci95'][0]:+.4f}, {ew['ci95'][1]:+.4f}]"
         if ew else "– | –")
    return f"{a} | {b}"


def render(r: dict) -> str:
    unseen = r["unseen_queries"]
    md = [f"# Adaptive funnel vs the static frontier: {r['collection']}, rotation `{r['rotation']}`", "",
          f"{r['documents']:,} documents, {r['test_queries']} judged test queries"
          + (f" ({unseen} unseen)" if unseen else "") + f". Protocol: {r['protocol']} ({r['policy_training']}).",
          f"Cost model: {r['cost_model']}. Work is given as a ratio to exhaustive full width "
          f"({r['full_width']['work']:,.0f} multiply-adds, NDCG@10 {r['full_width']['ndcg@10']:.4f}).", "",
          f"Command: `{r['command']}`", "", "## Static Pareto frontier (same queries)", "",
          "| m1 | C | r | work × full | NDCG@10 | NDCG@10 unseen | top-10 agreement with full width |",
          "|---|---|---|---|---|---|---|"]
    for s in r["static_frontier"]:
        c = s["config"]
        md.append(f"| {c['m1']} | {c['shortlist']} | {c['rescore_width']} | {s['work_ratio_to_full']:.4f} | "
                  f"{s['ndcg@10']:.4f} | " + (f"{s['ndcg@10_unseen']:.4f}" if s['ndcg@10_unseen'] is not None else "–")
                  + f" | {s['agreement']:.3f} |")
    head = ("| work × full | NDCG@10 | NDCG@10 unseen | static at equal NDCG (±0.5 %): work × full (work saved); ΔNDCG@10 [95 % CI] | "
            "best static at ≤ work: NDCG@10 | NDCG@10 added [95 % CI] |")
    for title, key, pts in (("Threshold policy (label-free agreement target), τ sweep", "tau", r["threshold_policy"]),
                            ("Trade-off policy (NDCG@10 target), λ sweep", "lambda", r["tradeoff_policy"])):
        md += ["", f"## {title}", "", f"| {key} " + head, "|---" * 7 + "|"]
        for pt in pts:
            u = f"{pt['ndcg@10_unseen']:.4f}" if pt["ndcg@10_unseen"] is not None else "–"
            md.append(f"| {pt[key]:g} | {pt['work_ratio_to_full']:.4f} | {pt['ndcg@10']:.4f} | {u} | {_cmp_cells(pt)} |")
    h = r.get("selected_on_train")
    if h:
        tp, ts = h["test_policy"], h["test_static"]
        c = ts["config"]
        md += ["", "## Chosen on the train split only, scored on test", "",
               f"τ = {h['tau']} (the cheapest τ whose out-of-fold training choices reach 99.5 % of the best static "
               f"training NDCG@10) against the static funnel chosen the same way on train (m1 = {c['m1']}, "
               f"C = {c['shortlist']}, r = {c['rescore_width']}).", "",
               "| | work × full | NDCG@10 | NDCG@10 unseen |", "|---|---|---|---|",
               f"| adaptive, τ = {h['tau']} | {tp['work_ratio_to_full']:.4f} | {tp['ndcg@10']:.4f} | "
               + (f"{tp['ndcg@10_unseen']:.4f}" if tp['ndcg@10_unseen'] is not None else "–") + " |",
               f"| static ({c['m1']}, {c['shortlist']}, {c['rescore_width']}) | {ts['work_ratio_to_full']:.4f} | "
               f"{ts['ndcg@10']:.4f} | " + (f"{ts['ndcg@10_unseen']:.4f}" if ts['ndcg@10_unseen'] is not None else "–") + " |",
               "", f"Work saved {h['work_saved']:+.1%}; ΔNDCG@10 (adaptive − static) {h['ndcg_diff']:+.4f} "
               f"[{h['ci95'][0]:+.4f}, {h['ci95'][1]:+.4f}] (95 % bootstrap over test queries)."]
    md += ["", "## Oracle (true NDCG@10 − λ · work), the headroom of any policy on this grid", "",
           "| λ | work × full | NDCG@10 | NDCG@10 unseen |", "|---|---|---|---|"]
    for o in r["oracle"]:
        u = f"{o['ndcg@10_unseen']:.4f}" if o["ndcg@10_unseen"] is not None else "–"
        md.append(f"| {o['lambda']:g} | {o['work_ratio_to_full']:.4f} | {o['ndcg@10']:.4f} | {u} |")
    return "\n".join(md) + "\n"


def plot(r: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    st = r["static"]
    ax.scatter([s["work_ratio_to_full"] for s in st], [s["ndcg@10"] for s in st], s=8, alpha=0.4, label="static configurations")
    fr = r["static_frontier"]
    ax.plot([s["work_ratio_to_full"] for s in fr], [s["ndcg@10"] for s in fr], lw=1, label="static frontier")
    for key, label, style in (("threshold_policy", "adaptive, agreement τ", "o-"), ("tradeoff_policy", "adaptive, NDCG λ", "s-"),
                              ("oracle", "oracle", "x--")):
        ax.plot([p["work_ratio_to_full"] for p in r[key]], [p["ndcg@10"] for p in r[key]], style, ms=4, label=label)
    ax.axhline(r["full_width"]["ndcg@10"], color="k", ls=":", lw=0.8, label="full width (exhaustive)")
    ax.set_xscale("log")
    ax.set_xlabel("multiply-adds per query / exhaustive full width")
    ax.set_ylabel("NDCG@10")
    ax.set_title(f"{r['collection']}, rotation {r['rotation']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
