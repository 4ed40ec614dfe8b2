"""Fine-tune the encoder with one DART objective, export it to ONNX and (optionally) build an index version.

    python -m trainer.dart --dataset data/scifact --objective at_dw_infonce --out var/models/minilm-dart \
        [--build --collection scifact-dart]

CPU setting by default (top layer trained on cached frozen states, documents at 128 tokens while training);
``--trainable-layers 6 --doc-max-tokens 256`` is full fine-tuning, the GPU setting. The exported encoder always
encodes at the served 256 tokens. ``--build`` runs the ordinary trainer build (``trainer.build.build_index``)
with the new encoder: a new encoder means every document is re-encoded (the embedding cache is keyed by the
ONNX hash) and the manifest records the new encoder's name and hashes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import numpy as np
import torch

from engine.encoder import OnnxEncoder
from engine.io.beir import load_collection
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.dart.export import export_finetuned
from trainer.dart.finetune import (OBJECTIVES, FinetuneConfig, TrainData, add_setting_arguments, cached_states,
                                   load_bert, merge_into, split_dev, train)


def main(argv=None) -> int:
    """``python -m trainer.dart``: fine-tune, export and optionally build; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m trainer.dart", description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", type=Path, required=True, help="BEIR folder with train (and test) qrels")
    ap.add_argument("--objective", choices=OBJECTIVES, default="at_dw_infonce")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=2.0)
    add_setting_arguments(ap, max_epochs=2)
    ap.add_argument("--out", type=Path, required=True, help="ONNX export folder to write")
    ap.add_argument("--home", type=Path, help="working folder (env ADAWIDTH_HOME, default var)")
    ap.add_argument("--build", action="store_true", help="build an index version with the new encoder")
    ap.add_argument("--collection", help="collection name of the built version (default <dataset>-dart)")
    ap.add_argument("--no-publish", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    settings = TrainerSettings(**({"home": args.home} if args.home else {})).resolved()
    col = load_collection(args.dataset, "train")
    bert, tok = load_bert()
    L, t = len(bert.encoder.layer), args.trainable_layers
    doc_ids = [d.doc_id for d in col.corpus]
    row = {d: i for i, d in enumerate(doc_ids)}
    qids = sorted(col.judged_queries())
    cache_dir = settings.home / "dart"
    dst = cached_states(cache_dir, bert, tok, [d.encoder_text() for d in col.corpus], frozen_layers=L - t,
                        max_tokens=args.doc_max_tokens, desc="corpus")
    qst = cached_states(cache_dir, bert, tok, [col.queries[q] for q in qids], frozen_layers=L - t, max_tokens=64,
                        desc="queries")
    qrow = {q: i for i, q in enumerate(qids)}
    tr, dev = split_dev(qids, 0.1, seed=0)
    pos = [[row[d] for d, g in col.qrels[q].items() if g > 0] for q in tr]
    data = TrainData(doc_ids, np.array([qrow[q] for q in tr]), pos, np.array([len(p) for p in pos]),
                     np.array([qrow[q] for q in dev]), [col.qrels[q] for q in dev], k_max=max(map(len, pos)))
    cfg = FinetuneConfig(objective=args.objective, seed=args.seed, alpha=args.alpha, trainable_layers=t,
                         doc_max_tokens=args.doc_max_tokens, max_epochs=args.max_epochs)
    top, report, _ = train(cfg, bert, dst, qst, data)
    out = export_finetuned(merge_into(bert, top), args.out, tag=f"{args.objective}-seed{args.seed}", report=report)
    result = {"encoder_dir": str(out), "best_dev_ndcg10": report["best_dev_ndcg10"]}
    if args.build:
        settings = settings.model_copy(update={"encoder_dir": out})
        encoder = OnnxEncoder(out, threads=settings.encoder_threads)
        path, manifest = build_index(BuildOptions(dataset=args.dataset,
                                                  collection=args.collection or f"{args.dataset.name}-dart",
                                                  publish=not args.no_publish), settings, encoder)
        result.update(version=manifest.version, path=str(path), encoder=manifest.encoder.model_dump(mode="json"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
