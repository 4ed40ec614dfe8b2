"""Incremental cost of folding (issue 18): a fold of 1 % of SciFact against a full rebuild of the same corpus.

Usage::

    OMP_NUM_THREADS=1 python -m bench.fold [--rotation pca|adapter] [--upserts 52] [--deletes 26]
                                           [--records gateway raw]

In a temporary home (the ONNX encoder of ``var/models``; a fresh copy of ``var/cache/embeddings.sqlite`` before
each timed step, so the base corpus comes from the cache and the new texts are encoded every time):

1. a full build of SciFact (the base version, live);
2. ``--upserts`` new documents (SciFact test claims with a per-run suffix: texts the cache never saw) and
   ``--deletes`` deletes of base documents, appended to the collection's write-ahead log; ``--records
   gateway``: with their embeddings, as the gateway logs an upsert (it encodes the batch to serve it from the
   delta segment at once, :meth:`engine.live.LiveCollection.upsert`, so the fold encodes nothing);
   ``raw``: without them (a log written by another tool: the fold encodes the new texts);
3. **fold**: :func:`trainer.fold.fold_collection` (reuses the base's rotation, routers, recall policy; encodes
   only the new texts; level store, lexical side, stage 1, served evaluation, drift check), timed;
4. **full rebuild**: :func:`trainer.build.build_index` of the folded corpus with the same options, fitting
   everything again, timed.

One process, one thread (torch, BLAS, OpenMP), the same machine; ``summary.{json,md}`` under
``bench/results/fold/`` record the command, the machine, both times, their ratio (the issue's target: fold of
1 % <= 10 % of a full rebuild) and the per-step seconds of each.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits

from bench.common import RESULTS, ROOT, command, machine, write_results
from engine.encoder import OnnxEncoder
from engine.io.beir import load_qrels, load_queries
from engine.version import store
from engine.encoder import encoder_fingerprint
from engine.live import encoder_text
from engine.wal import FileWriteLog, pack_embeddings
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.fold import apply_writes, base_documents, fold_collection, pending_writes

OUT = RESULTS / "fold"
SCIFACT = ROOT / "data" / "scifact"
VAR = ROOT / "var"


def _fresh_cache(tmp: Path, n: int) -> Path:
    """A fresh copy of the shared embedding cache (the new texts of the run are never in it)."""
    dst = tmp / f"cache-{n}.sqlite"
    shutil.copyfile(VAR / "cache" / "embeddings.sqlite", dst)
    return dst


def run(rotation: str, upserts: int, deletes: int, records: str = "gateway") -> dict:
    """Build, write, fold, rebuild; returns the timings (module docstring)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-fold-"))
    try:
        encoder = OnnxEncoder(VAR / "models" / "minilm-onnx", threads=1)

        def settings(n: int) -> TrainerSettings:
            return TrainerSettings(home=tmp / "home", encoder_dir=VAR / "models" / "minilm-onnx", redis_url=None,
                                   embedding_cache=_fresh_cache(tmp, n)).resolved()

        opts = BuildOptions(dataset=SCIFACT, collection="scifact", rotation=rotation)
        t0 = time.perf_counter()
        base_path, base_manifest = build_index(opts, settings(0), encoder)
        t_base = time.perf_counter() - t0

        nonce = uuid.uuid4().hex[:8]
        queries = load_queries(SCIFACT)
        qids = sorted(load_qrels(SCIFACT, "test"))[:upserts]
        docs = [{"id": f"bench-{nonce}-{q}", "title": "", "text": f"{queries[q]} (revised claim {nonce}-{k})",
                 "fields": {}} for k, q in enumerate(qids)]
        base_ids = json.loads((base_path / base_manifest.core.doc_ids).read_text(encoding="utf-8"))
        log = FileWriteLog(tmp / "home" / "indexes" / "scifact" / "wal")
        try:
            rec = {"op": "upsert", "docs": docs}
            if records == "gateway":  # the gateway's record: the batch's embeddings, made when it was written
                rec["emb"] = pack_embeddings(encoder.encode([encoder_text(d) for d in docs]),
                                             encoder_fingerprint(encoder))
            log.append(rec)
            log.append({"op": "delete", "ids": base_ids[:deletes]})
        finally:
            log.close()

        s_fold = settings(1)
        pending = pending_writes(s_fold, "scifact")
        folded_docs, _ = apply_writes(base_documents(pending.base_dir, pending.manifest), pending.records)
        t0 = time.perf_counter()
        report = fold_collection(s_fold, encoder, "scifact")
        t_fold = time.perf_counter() - t0
        fold_manifest = json.loads((Path(report["path"]) / "manifest.json").read_text(encoding="utf-8"))

        full_opts = BuildOptions(dataset=SCIFACT, collection="scifact", rotation=rotation, documents=folded_docs,
                                 publish=False)
        t0 = time.perf_counter()
        full_path, full_manifest = build_index(full_opts, settings(2), encoder)
        t_full = time.perf_counter() - t0
        assert full_manifest.corpus.documents == report["documents"]
        return {
            "rotation": rotation, "records": records, "corpus_documents": base_manifest.corpus.documents,
            "upserts": upserts, "deletes": deletes,
            "share_of_corpus": round((upserts + deletes) / base_manifest.corpus.documents, 4),
            "base_build_seconds": round(t_base, 2),
            "fold_seconds": round(t_fold, 2), "full_rebuild_seconds": round(t_full, 2),
            "fold_over_full_rebuild": round(t_fold / t_full, 4),
            "target": "fold of 1 % <= 10 % of a full rebuild",
            "target_met": bool(t_fold <= 0.10 * t_full),
            "fold": {"encoded_now": report["encoded_now"], "embeddings_from_log": report.get("embeddings_from_log"), "fitting": report["fitting"], "drift": report["drift"],
                     "changes": report["changes"], "steps_seconds": fold_manifest.get("build_seconds")},
            "full_rebuild": {"encoded_now": full_manifest.corpus.model_dump().get("encoded_now"),
                             "steps_seconds": full_manifest.build_seconds},
            "versions": {"base": base_manifest.version, "fold": report["version"], "full": full_manifest.version,
                         "live_after": store.read_live_pointer(tmp / "home" / "indexes" / "scifact")},
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


RECORDS = {"gateway": "gateway's (embeddings logged)", "raw": "raw (no embeddings)"}


def markdown(cmd: str, rows: list[dict], note: str) -> str:
    """The summary table."""
    lines = [f"`{cmd}`", "", f"Machine: {machine()}. {note}", "",
             "| rotation | log records | corpus | writes (upserts + deletes) | fold (s) | full rebuild (s) | "
             "fold / full | target <= 0.10 | encoded by the fold |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rotation']} | {RECORDS[r['records']]} | {r['corpus_documents']} | {r['upserts']} + {r['deletes']} "
                     f"({100 * r['share_of_corpus']:.1f} %) | {r['fold_seconds']:.1f} | {r['full_rebuild_seconds']:.1f} "
                     f"| {r['fold_over_full_rebuild']:.3f} | {'met' if r['target_met'] else 'missed'} "
                     f"| {r['fold']['encoded_now']} |")
    lines += ["", "Per-step seconds (the manifests' `build_seconds`):", ""]
    for r in rows:
        lines.append(f"- {r['rotation']}, {r['records']} records, fold: {json.dumps(r['fold']['steps_seconds'])}")
        lines.append(f"- {r['rotation']}, {r['records']} records, full rebuild: "
                     f"{json.dumps(r['full_rebuild']['steps_seconds'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark for each ``--rotation`` and write ``bench/results/fold/summary.{json,md}``."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rotation", nargs="+", default=["pca", "adapter"], choices=["pca", "adapter"])
    p.add_argument("--upserts", type=int, default=52, help="new documents (52: 1 %% of SciFact's 5183)")
    p.add_argument("--deletes", type=int, default=26, help="base documents deleted")
    p.add_argument("--records", nargs="+", default=["gateway", "raw"], choices=list(RECORDS),
                   help="upsert records as the gateway logs them (with embeddings) and/or raw (without)")
    p.add_argument("--note", default="Other agents' jobs shared the machine's 2 cores during the run; times are "
                                      "wall-clock of one process on one thread.")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    rows = []
    with threadpool_limits(limits=1):
        for rotation in args.rotation:
            for records in args.records:
                rows.append(run(rotation, args.upserts, args.deletes, records))
                print(json.dumps(rows[-1], default=str))
    cmd = command("fold", argv, env="OMP_NUM_THREADS=1")
    write_results(OUT / "summary", {"command": cmd, "machine": machine(), "note": args.note, "runs": rows},
                  markdown(cmd, rows, args.note), default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
