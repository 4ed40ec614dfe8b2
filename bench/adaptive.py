"""Per-query stage-1 width, shortlist depth and rescoring width, learned, against the best static funnel.

Every query first scans the corpus on one coordinate block (16 coordinates; ``adawidth.blocked``).
From that cheap evidence — the 18 order statistics of §3.2.2 of 001 on its top-500 stage-1 scores,
the query's energy in its leading coordinates, and the stability of its top-10 when the top-100
candidates are rescored at 32 coordinates (100 × 16 multiply-adds) — a policy picks one funnel
configuration (m1, C, r) from the same grid as the static sweep (``bench/frontier.py``), paying
N·m1 + C·(r − m1) multiply-adds plus the evidence.  The policy is a LightGBM regressor of each
configuration's NDCG@10 (configuration parameters are features), fitted on training queries only;
at query time it picks the configuration maximising predicted NDCG@10 − λ · work / full work.
Sweeping λ traces a curve to compare with the static Pareto frontier evaluated on the same test
queries; the oracle picks with the true NDCG@10 (the upper bound of any policy on this grid).

For a learned rotation, the training queries are ranked through cross-fitted adapters (trained on
the other folds), so the policy never learns from queries its rotation memorised.

Usage::

    .venv/bin/python bench/adaptive.py --dataset data/scifact --rotation pca
    .venv/bin/python bench/adaptive.py --dataset data/scifact --rotation adapter_on_pca

Writes ``bench/results/adaptive_<collection>_<rotation>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adawidth.beir import load_collection, load_qrels  # noqa: E402
from adawidth.blocked import BlockedCorpus  # noqa: E402
from adawidth.funnel import exact_stage1_batch, resolve  # noqa: E402
from adawidth.metrics import ndcg_at_k  # noqa: E402
from adawidth.prefix import prefix_normalize, top_k  # noqa: E402
from adawidth.rotation import pca_rotation  # noqa: E402
from adawidth.router import router_features  # noqa: E402

STAGE1_WIDTHS = (16, 32, 48, 64)
SHORTLISTS = (100, 200, 500, 1000)
RESCORE_WIDTHS = (128, 256, 384)
CONFIGS = [(m1, C, r) for m1 in STAGE1_WIDTHS for C in SHORTLISTS for r in RESCORE_WIDTHS]
BLOCK = 16
EVIDENCE_WORK = 100 * 16  # rescoring the top-100 from 16 to 32 coordinates


def config_ndcg(X_rot: np.ndarray, Q_rot: np.ndarray, judgments: list[dict], doc_ids: list[str]) -> np.ndarray:
    """(Q, len(CONFIGS)) NDCG@10 of every query under every static configuration."""
    N = X_rot.shape[0]
    out = np.empty((len(Q_rot), len(CONFIGS)))
    col = 0
    for m1 in STAGE1_WIDTHS:
        sq = np.einsum("ij,ij->i", X_rot[:, :m1], X_rot[:, :m1])
        rows, sc = exact_stage1_batch(Q_rot, prefix_normalize(X_rot, m1), m1, max(SHORTLISTS))
        for C in SHORTLISTS:
            C = min(C, N)
            for r in RESCORE_WIDTHS:
                for i in range(len(Q_rot)):
                    res = resolve(Q_rot[i], X_rot, sq, rows[i, :C], sc[i, :C], m0=m1, k=10, width=r)
                    out[i, col] = ndcg_at_k([doc_ids[j] for j in res.rows], judgments[i], 10)
                col += 1
    return out


def config_work(N: int) -> np.ndarray:
    return np.array([N * m1 + min(C, N) * (r - m1) for m1, C, r in CONFIGS], dtype=np.float64)


def evidence(X_rot: np.ndarray, Q_rot: np.ndarray) -> np.ndarray:
    """(Q, 22) features from the first block: 18 router features, prefix energies, top-10 stability."""
    bc = BlockedCorpus(X_rot, BLOCK)
    full = bc.full_matrix()
    feats = []
    for q in Q_rot:
        s = bc.extend(bc.start(), q, BLOCK)
        rows, cos = bc.shortlist(s, 500)
        p32 = bc.partial_scores(s, rows[:100]).extend(q, full, 32)
        top32 = set(rows[:100][top_k(p32.cosine(), 10)].tolist())
        stability = len(top32 & set(rows[:10].tolist())) / 10
        energy = [float(q[:w] @ q[:w]) for w in (16, 32, 64)]
        feats.append(np.concatenate([router_features(cos), energy, [stability]]))
    return np.array(feats)


def design(feats: np.ndarray, work: np.ndarray, full_work: float) -> np.ndarray:
    """Rows (query, configuration): evidence features + configuration parameters."""
    Q = feats.shape[0]
    cfg = np.array([[m1, C, r, w / full_work] for (m1, C, r), w in zip(CONFIGS, work)])
    return np.concatenate([np.repeat(feats, len(CONFIGS), 0), np.tile(cfg, (Q, 1))], axis=1)


def fit_policy(feats: np.ndarray, ndcg: np.ndarray, work: np.ndarray, full_work: float, seed: int = 0):
    import lightgbm as lgb

    params = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 40,
              "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1, "verbose": -1,
              "num_threads": 2, "seed": seed, "deterministic": True, "force_row_wise": True}
    return lgb.train(params, lgb.Dataset(design(feats, work, full_work), ndcg.ravel()), num_boost_round=300)


def choose(pred: np.ndarray, work: np.ndarray, full_work: float, lam: float) -> np.ndarray:
    """Per query, the configuration maximising predicted NDCG − λ · work / full work."""
    return np.argmax(pred - lam * work[None, :] / full_work, axis=1)


def pareto_idx(work: np.ndarray, quality: np.ndarray) -> list[int]:
    order = np.lexsort((-quality, work))
    out, best = [], -np.inf
    for i in order:
        if quality[i] > best:
            out.append(int(i))
            best = quality[i]
    return out


def bootstrap_ci(diff: np.ndarray, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), (n, len(diff)))
    means = diff[idx].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--collection")
    p.add_argument("--rotation", default="pca", choices=["identity", "pca", "adapter", "adapter_on_pca"])
    p.add_argument("--crossfit-folds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--home", type=Path, default=ROOT / "var")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from service.encoder import OnnxEncoder
    from trainer.adapter import AdapterConfig, train_adapter
    from trainer.embed_cache import EmbeddingCache, encode_with_cache
    from trainer.export_onnx import export_encoder

    t0 = time.time()
    name = args.collection or args.dataset.name
    encoder = OnnxEncoder(export_encoder(args.home / "models" / "minilm-onnx"))
    col = load_collection(args.dataset, "test")
    train_qrels = load_qrels(args.dataset, "train")
    doc_ids = [d.doc_id for d in col.corpus]
    row_of = {d: i for i, d in enumerate(doc_ids)}
    cache = EmbeddingCache(args.home / "cache" / "embeddings.sqlite", encoder.dimension)
    X, _ = encode_with_cache(encoder, [d.encoder_text() for d in col.corpus], cache)
    test_ids = sorted(col.judged_queries())
    train_ids = sorted(q for q, j in train_qrels.items() if q in col.queries and any(v > 0 for v in j.values()))
    E, _ = encode_with_cache(encoder, [col.queries[q] for q in test_ids + train_ids], cache)
    cache.close()
    Qt, Qtr = E[: len(test_ids)], E[len(test_ids):]
    jt, jtr = [col.qrels[q] for q in test_ids], [train_qrels[q] for q in train_ids]
    cited = {d for j in jtr for d, g in j.items() if g > 0}
    unseen = np.array([not any(d in cited for d, g in j.items() if g > 0) for j in jt])
    pos = [np.array([row_of[d] for d, g in j.items() if g > 0 and d in row_of]) for j in jtr]
    N, D = X.shape
    full_work = float(N * D)
    work = config_work(N)
    R_pca = pca_rotation(X)
    base = R_pca if args.rotation in ("pca", "adapter_on_pca") else np.eye(D)

    def learned(idx):
        if not args.rotation.startswith("adapter"):
            return base
        R_l, _ = train_adapter(Qtr[idx] @ base.T, X @ base.T, [pos[i] for i in idx],
                               AdapterConfig(epochs=args.epochs, seed=args.seed), progress=False)
        return R_l @ base

    # training data: cross-fitted rankings of the training queries
    folds = args.crossfit_folds if args.rotation.startswith("adapter") else 1
    fold_of = np.random.default_rng(args.seed + 1).permutation(len(train_ids)) % folds
    ftr = np.empty((len(train_ids), 22))
    ntr = np.empty((len(train_ids), len(CONFIGS)))
    for f in range(folds):
        held = np.flatnonzero(fold_of == f)
        R = learned(np.flatnonzero(fold_of != f)) if folds > 1 else base
        Xr, Qr = (X @ R.T).astype(np.float32), (Qtr[held] @ R.T).astype(np.float32)
        ftr[held] = evidence(Xr, Qr)
        ntr[held] = config_ndcg(Xr, Qr, [jtr[i] for i in held], doc_ids)
    print(f"training data ready ({time.time() - t0:.0f} s)", file=sys.stderr)
    # test: the served rotation trained on all training queries
    R = learned(np.arange(len(train_ids)))
    Xr, Qr = (X @ R.T).astype(np.float32), (Qt @ R.T).astype(np.float32)
    fte = evidence(Xr, Qr)
    nte = config_ndcg(Xr, Qr, jt, doc_ids)
    model = fit_policy(ftr, ntr, work, full_work, args.seed)
    pred = model.predict(design(fte, work, full_work)).reshape(len(test_ids), len(CONFIGS))
    print(f"policy fitted ({time.time() - t0:.0f} s)", file=sys.stderr)

    static_q = nte.mean(0)
    front = pareto_idx(work, static_q)
    rows = np.arange(len(test_ids))
    lambdas = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0]
    curve, oracle = [], []
    for lam in lambdas:
        pick = choose(pred, work, full_work, lam)
        per_q = nte[rows, pick]
        w = work[pick] + EVIDENCE_WORK  # the first block's scan is part of every m1 >= 16
        pt = {"lambda": lam, "work": float(w.mean()), "work_ratio_to_full": float(w.mean() / full_work),
              "ndcg@10": float(per_q.mean()), "ndcg@10_unseen": float(per_q[unseen].mean()) if unseen.any() else None}
        # the static frontier point of least work with at least this NDCG (within 0.5 %), and the best
        # static point of no more work: paired bootstrap CIs over queries
        ok = [i for i in front if static_q[i] >= 0.995 * pt["ndcg@10"]]
        if ok:
            s = min(ok, key=lambda i: work[i])
            pt["static_equal_quality"] = {"config": CONFIGS[s], "work": float(work[s]), "ndcg@10": float(static_q[s]),
                                          "work_saved": float(1 - pt["work"] / work[s])}
        cheaper = [i for i in range(len(CONFIGS)) if work[i] <= pt["work"]]
        if cheaper:
            s = max(cheaper, key=lambda i: static_q[i])
            diff = per_q - nte[:, s]
            pt["static_equal_work"] = {"config": CONFIGS[s], "work": float(work[s]), "ndcg@10": float(static_q[s]),
                                       "ndcg_added": float(diff.mean()), "ci95": bootstrap_ci(diff)}
        curve.append(pt)
        opick = np.argmax(nte - lam * work[None, :] / full_work, axis=1)
        ow = work[opick]
        oracle.append({"lambda": lam, "work_ratio_to_full": float(ow.mean() / full_work),
                       "ndcg@10": float(nte[rows, opick].mean())})
    result = {
        "command": f"python bench/adaptive.py --dataset {args.dataset} --rotation {args.rotation}",
        "collection": name, "rotation": args.rotation, "documents": N, "test_queries": len(test_ids),
        "unseen_queries": int(unseen.sum()), "train_queries": len(train_ids), "crossfit_folds": folds,
        "configs": CONFIGS, "static": [{"config": c, "work_ratio_to_full": float(w / full_work),
                                        "ndcg@10": float(q)} for c, w, q in zip(CONFIGS, work, static_q)],
        "static_frontier": [int(i) for i in front], "adaptive": curve, "oracle": oracle,
        "seconds": round(time.time() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"adaptive_{name}_{args.rotation}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    md = [f"# Adaptive funnel vs the static frontier: {name}, rotation `{args.rotation}`", "",
          f"{len(test_ids)} test queries ({int(unseen.sum())} unseen), policy fitted on {len(train_ids)} training "
          f"queries ({'cross-fitted ' + str(folds) + '-fold' if folds > 1 else 'no learned rotation'}). Work = "
          "multiply-adds per query (flat stage-1 scan + rescoring + evidence), as a ratio to exhaustive full width.",
          "", f"Command: `{result['command']}`", "",
          "| λ | work × full | NDCG@10 | NDCG@10 unseen | static at equal quality: work × full (saved) | "
          "static at equal work: NDCG@10 | NDCG@10 added [95 % CI] | oracle work × full | oracle NDCG@10 |",
          "|---|---|---|---|---|---|---|---|---|"]
    for pt, orc in zip(curve, oracle):
        eq = pt.get("static_equal_quality")
        ew = pt.get("static_equal_work")
        md.append(f"| {pt['lambda']:g} | {pt['work_ratio_to_full']:.3f} | {pt['ndcg@10']:.4f} | "
                  f"{pt['ndcg@10_unseen']:.4f} | "
                  + (f"{eq['work'] / full_work:.3f} ({eq['work_saved']:+.1%})" if eq else "–") + " | "
                  + (f"{ew['ndcg@10']:.4f} | {ew['ndcg_added']:+.4f} [{ew['ci95'][0]:+.4f}, {ew['ci95'][1]:+.4f}]"
                     if ew else "– | –")
                  + f" | {orc['work_ratio_to_full']:.3f} | {orc['ndcg@10']:.4f} |")
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.scatter(work / full_work, static_q, s=8, alpha=0.4, label="static configurations")
        ax.plot(work[front] / full_work, static_q[front], lw=1, label="static frontier")
        ax.plot([c["work_ratio_to_full"] for c in curve], [c["ndcg@10"] for c in curve], "o-", label="adaptive (λ sweep)")
        ax.plot([c["work_ratio_to_full"] for c in oracle], [c["ndcg@10"] for c in oracle], "x--", label="oracle")
        ax.set_xscale("log")
        ax.set_xlabel("multiply-adds per query / exhaustive full width")
        ax.set_ylabel("NDCG@10")
        ax.set_title(f"{name}, rotation {args.rotation}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out / f"{stem}.png", dpi=110)
    except ImportError:
        pass
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
