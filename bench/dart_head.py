"""DART difficulty head (Eq. 2 of 000) on SciFact: oracle tiers, post-hoc vs joint head, offline tier routing.

Usage::

    OMP_NUM_THREADS=1 python -m bench.dart_head --out bench/results/dart/head_scifact.json

Tiers available here: MIPS (bi-encoder, exact) and MaxSim (late interaction over the same encoder's token
embeddings, top-50 MIPS candidates). No cross-encoder has been trained yet, so t* is the cheaper of these two
tiers whose NDCG@10 is best, and the 3-way head never sees the third class. Encoder: all-MiniLM-L6-v2 with
the CPU setting of bench/dart.py (top layer over cached frozen states, documents at 128 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from adawidth.metrics import ranking_metric
from adawidth.tiers import oracle_tier, predict_tier
from bench.common import ROOT, command
from engine.io import atomic
from engine.io.beir import load_collection
from trainer.dart.difficulty import fit_posthoc
from trainer.dart.finetune import (FinetuneConfig, TopEncoder, TrainData, cached_states, encode_states, load_bert,
                                   split_dev, train)
from trainer.dart.tier_rankings import tier_rankings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", type=Path, default=ROOT / "data" / "scifact")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dart" / "head_scifact.json")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    home = Path(os.environ.get("ADAWIDTH_HOME", ROOT / "var"))
    tr, te = load_collection(args.dataset, "train"), load_collection(args.dataset, "test")
    bert, tok = load_bert()
    doc_ids = [d.doc_id for d in tr.corpus]
    row_of = {d: i for i, d in enumerate(doc_ids)}
    train_q, test_q = sorted(tr.judged_queries()), sorted(te.judged_queries())
    all_q = train_q + test_q
    qrow = {q: i for i, q in enumerate(all_q)}
    dst = cached_states(home / "dart", bert, tok, [d.encoder_text() for d in tr.corpus], frozen_layers=5,
                        max_tokens=128, desc="corpus")
    qst = cached_states(home / "dart", bert, tok, [tr.queries[q] for q in all_q], frozen_layers=5, max_tokens=64,
                        desc="queries")
    tr_ids, dev_ids = split_dev(train_q, 0.1, seed=0)
    tr_rows = np.array([qrow[q] for q in tr_ids])
    te_rows = np.array([qrow[q] for q in test_q])

    def quality(top, X, rows, qids, qrels):
        t0 = time.monotonic()
        R = tier_rankings(top, qst, rows, dst, X)
        secs = time.monotonic() - t0
        judged = [qrels[q] for q in qids]
        return np.stack([ranking_metric(R[t], judged, "ndcg", 10, doc_ids) for t in ("mips", "maxsim")], axis=1), secs

    def evaluate(name, top, X, W):
        qual_te, secs = quality(top, X, te_rows, test_q, te.qrels)
        t_te = oracle_tier(qual_te)
        Qte = encode_states(top, qst, te_rows)
        pred = np.minimum(predict_tier(W, Qte), 1)  # the cross-encoder class is never trained here
        routed = qual_te[np.arange(len(pred)), pred]
        majority = int(np.bincount(t_te_train_ref, minlength=2).argmax())
        return {
            "encoder": name,
            "test_oracle_tier_share": {"mips": float(np.mean(t_te == 0)), "maxsim": float(np.mean(t_te == 1))},
            "head_accuracy_test": float(np.mean(pred == t_te)),
            "majority_class_accuracy_test": float(np.mean(t_te == majority)),
            "routed_to_maxsim_share": float(np.mean(pred == 1)),
            "ndcg10_test": {"mips": float(qual_te[:, 0].mean()), "maxsim": float(qual_te[:, 1].mean()),
                            "head_routed": float(routed.mean()),
                            "oracle_routed": float(qual_te.max(1).mean())},
            "tier_seconds_for_test_queries": secs,
        }

    out = {"command": command("dart_head"), "machine": f"{platform.machine()} {os.cpu_count()} cpus, "
           "torch threads 1", "tiers": ["mips", "maxsim"], "depth": 50}
    base = TopEncoder(bert, 1)
    X0 = encode_states(base, dst)
    qual_tr, _ = quality(base, X0, tr_rows, tr_ids, tr.qrels)
    t_tr = oracle_tier(qual_tr)
    t_te_train_ref = t_tr
    out["train_oracle_tier_share"] = {"mips": float(np.mean(t_tr == 0)), "maxsim": float(np.mean(t_tr == 1))}
    out["train_ndcg10"] = {"mips": float(qual_tr[:, 0].mean()), "maxsim": float(qual_tr[:, 1].mean())}
    W = fit_posthoc(encode_states(base, qst, tr_rows), t_tr, seed=args.seed)
    out["posthoc"] = evaluate("frozen all-MiniLM-L6-v2 (post-hoc head)", base, X0, W)
    print(json.dumps(out, indent=2), flush=True)

    pos = [[row_of[d] for d, g in tr.qrels[q].items() if g > 0] for q in tr_ids]
    data = TrainData(doc_ids, tr_rows, pos, np.array([len(p) for p in pos]),
                     np.array([qrow[q] for q in dev_ids]), [tr.qrels[q] for q in dev_ids],
                     k_max=max(map(len, pos)), train_tier=t_tr)
    cfg = FinetuneConfig(objective="at_dw_infonce", seed=args.seed, head_lambda=0.1, max_epochs=1)
    top, report, X = train(cfg, bert, dst, qst, data, X0=X0)
    if top.difficulty_head is None:
        out["joint"] = {"note": "dev NDCG@10 did not improve over the frozen encoder; no joint head kept",
                        "train": report["history"]}
    else:
        out["joint"] = evaluate("AT-DW-InfoNCE + head, λ = 0.1 (joint)", top, X, top.difficulty_head)
        out["joint"]["train_history"] = report["history"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(args.out, json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
