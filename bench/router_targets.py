"""Router quality by training target, against random escalation at the same rate and the oracle.

The served router (§3.2.3 of 001) regresses the escalation gain g(q) = NDCG@10_h − NDCG@10_l (Eq. (12))
from the 18 order statistics of the stage-1 scores.  This benchmark fits LightGBM on the same features
with targets that match the decision more closely and compares them at equal escalation rates:

* ``gain``        — the NDCG@10 gain regressor (the served router);
* ``improves``    — a classifier of g(q) > 0 (labelled);
* ``top10_moves`` — a regressor of 1 − |top10_l ∩ top10_h| / 10, how much of the top-10 the wider
  width would change (label-free: every query, judged or not, can train it);
* ``changes``     — a classifier of "the top-10 set changes" (label-free).

Every threshold is calibrated on out-of-fold predictions of the training queries (5 folds), and the
realised escalation rate on the test queries is reported beside the target ρ.  For a learned rotation
the training queries are ranked through cross-fitted adapters (as ``trainer build`` does).

Usage::

    .venv/bin/python -m bench.router_targets --dataset data/scifact --rotation adapter

Writes ``bench/results/router_targets/<collection>_<rotation>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np

from adawidth.funnel import exact_stage1_batch, resolve
from adawidth.metrics import ranking_metric
from adawidth.prefix import prefix_normalize, top_k
from adawidth.router import FEATURE_NAMES, router_feature_matrix, threshold_for_rate
from bench.common import ROOT
from bench.funnels import add_run_arguments, learned_rotation, load_embedded
from engine.io import atomic
from trainer.router_fit import LGB_PARAMS, NUM_ROUNDS

RHOS = (0.1, 0.2, 0.3, 0.5)
TARGETS = ("gain", "improves", "top10_moves", "changes")


def widths_outcome(Xr, Qr, judgments, doc_ids, m0, C, pair):
    """Stage-1 scores (Q, C), NDCG@10 at l and h (Q,), and top-10 overlap between l and h (Q,)."""
    sq = np.einsum("ij,ij->i", Xr[:, :m0], Xr[:, :m0])
    rows, sc = exact_stage1_batch(Qr, prefix_normalize(Xr, m0), m0, C)
    tops = [[resolve(Qr[i], Xr, sq, rows[i], sc[i], m0=m0, k=10, width=w).rows for i in range(len(Qr))]
            for w in pair]
    nd = np.stack([ranking_metric(t, judgments, "ndcg", 10, doc_ids) for t in tops], axis=1).reshape(len(Qr), 2)
    overlap = np.array([len(set(a.tolist()) & set(b.tolist())) / 10.0 for a, b in zip(*tops)])
    return sc, nd, overlap


def target_of(name, nd, overlap):
    gain = nd[:, 1] - nd[:, 0]
    return {"gain": gain, "improves": (gain > 0).astype(float), "top10_moves": 1.0 - overlap,
            "changes": (overlap < 1.0).astype(float)}[name]


def fit_oof(F, y, binary, seed=0, folds=5):
    """The served router's LightGBM settings (trainer.router_fit), as a regressor or a binary classifier."""
    params = dict(LGB_PARAMS, objective="binary" if binary else "regression", seed=seed)

    def train(a, b):
        return lgb.train(params, lgb.Dataset(a, b, feature_name=list(FEATURE_NAMES)), num_boost_round=NUM_ROUNDS)

    fold_of = np.random.default_rng(seed).permutation(len(y)) % folds
    oof = np.empty(len(y))
    for f in range(folds):
        oof[fold_of == f] = train(F[fold_of != f], y[fold_of != f]).predict(F[fold_of == f])
    return train(F, y), oof


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, default=ROOT / "data" / "scifact")
    p.add_argument("--collection")
    p.add_argument("--rotation", default="adapter", choices=["identity", "pca", "adapter", "adapter_on_pca"])
    p.add_argument("--pairs", nargs="+", default=["64,128", "64,256"])
    p.add_argument("--m0", type=int, default=64)
    p.add_argument("--shortlist", type=int, default=500)
    add_run_arguments(p, ROOT / "bench" / "results" / "router_targets")
    args = p.parse_args(argv)
    t0 = time.time()
    emb = load_embedded(args.dataset, args.home, args.collection)
    if not emb.train_ids:
        p.error("needs a train split")
    X = emb.X
    pairs = [tuple(int(x) for x in s.split(",")) for s in args.pairs]
    pos = emb.positives(emb.judg_tr)
    n = len(emb.train_ids)
    folds = args.crossfit_folds if args.rotation.startswith("adapter") else 1
    fold_of = np.random.default_rng(args.seed + 1).permutation(n) % folds
    train = {pair: [np.empty((n, args.shortlist), np.float32), np.empty((n, 2)), np.empty(n)] for pair in pairs}
    for f in range(folds):
        held = np.flatnonzero(fold_of == f)
        fit_idx = np.flatnonzero(fold_of != f) if folds > 1 else np.arange(n)
        R = learned_rotation(args.rotation, X, emb.Qtr[fit_idx], [pos[i] for i in fit_idx], args.epochs, args.seed)
        Xr, Qr = (X @ R.T).astype(np.float32), (emb.Qtr[held] @ R.T).astype(np.float32)
        for pair in pairs:
            sc, nd, ov = widths_outcome(Xr, Qr, [emb.judg_tr[i] for i in held], emb.doc_ids, args.m0, args.shortlist, pair)
            for a, v in zip(train[pair], (sc, nd, ov)):
                a[held] = v
    R = learned_rotation(args.rotation, X, emb.Qtr, pos, args.epochs, args.seed)
    Xr, Qr = (X @ R.T).astype(np.float32), (emb.Qt @ R.T).astype(np.float32)
    unseen = emb.unseen
    results = {}
    for pair in pairs:
        sc_tr, nd_tr, ov_tr = train[pair]
        sc_te, nd_te, ov_te = widths_outcome(Xr, Qr, emb.judg_t, emb.doc_ids, args.m0, args.shortlist, pair)
        F_tr, F_te = router_feature_matrix(list(sc_tr)), router_feature_matrix(list(sc_te))
        gain_te = nd_te[:, 1] - nd_te[:, 0]
        rows = []
        for name in TARGETS:
            model, oof = fit_oof(F_tr, target_of(name, nd_tr, ov_tr), name in ("improves", "changes"), args.seed)
            pred = model.predict(F_te)
            for rho in RHOS:
                esc = pred >= threshold_for_rate(oof, rho)
                per_q = np.where(esc, nd_te[:, 1], nd_te[:, 0])
                rate = float(esc.mean())
                k = int(round(rate * len(gain_te)))
                oracle = nd_te[:, 0].copy()
                top = top_k(gain_te, k)
                oracle[top] = nd_te[top, 1]
                rows.append({"target": name, "rho": rho, "realised_rate": rate, "ndcg@10": float(per_q.mean()),
                             "ndcg@10_unseen": float(per_q[unseen].mean()),
                             "random_same_rate": float(nd_te[:, 0].mean() + rate * gain_te.mean()),
                             "oracle_same_rate": float(oracle.mean()),
                             "mean_width": float(pair[0] + rate * (pair[1] - pair[0]))})
        results[f"{pair[0]},{pair[1]}"] = {"low": float(nd_te[:, 0].mean()), "high": float(nd_te[:, 1].mean()),
                                           "share_improving": float((gain_te > 0).mean()),
                                           "share_worsening": float((gain_te < 0).mean()), "rows": rows}
    out = {"command": f"python -m bench.router_targets --dataset {args.dataset} --rotation {args.rotation}",
           "collection": emb.name, "rotation": args.rotation, "m0": args.m0, "shortlist": args.shortlist,
           "train_queries": n, "crossfit_folds": folds, "test_queries": len(emb.test_ids),
           "unseen_queries": int(unseen.sum()), "pairs": results, "seconds": round(time.time() - t0, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{emb.name}_{args.rotation}"
    atomic.write_text(args.out / f"{stem}.json", json.dumps(out, indent=1))
    md = [f"# Router targets on {emb.name}, rotation `{args.rotation}`", "",
          f"Stage 1 at m0 = {args.m0}, shortlist {args.shortlist}; routers fitted on {n} train queries"
          + (f" ranked through {folds}-fold cross-fitted adapters" if folds > 1 else "")
          + f"; thresholds on 5-fold out-of-fold predictions; scored on {len(emb.test_ids)} test queries "
          f"({int(unseen.sum())} unseen). Random and oracle escalate the same realised share of test queries.", "",
          f"Command: `{out['command']}`", ""]
    for key, r in results.items():
        md += [f"## Action pair ({key}): NDCG@10 at l {r['low']:.4f}, at h {r['high']:.4f}; "
               f"{r['share_improving']:.0%} of test queries gain from h, {r['share_worsening']:.0%} lose", "",
               "| target | ρ | realised rate | mean width | NDCG@10 | random, same rate | oracle, same rate | "
               "router − random | NDCG@10 unseen |", "|---|---|---|---|---|---|---|---|---|"]
        for x in r["rows"]:
            md.append(f"| {x['target']} | {x['rho']:g} | {x['realised_rate']:.3f} | {x['mean_width']:.1f} | "
                      f"{x['ndcg@10']:.4f} | {x['random_same_rate']:.4f} | {x['oracle_same_rate']:.4f} | "
                      f"{x['ndcg@10'] - x['random_same_rate']:+.4f} | {x['ndcg@10_unseen']:.4f} |")
        md.append("")
    atomic.write_text(args.out / f"{stem}.md", "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
