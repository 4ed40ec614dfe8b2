"""Command line of the trainer: ``python -m trainer <command>``.

Commands:
  export-encoder   export all-MiniLM-L6-v2 to ONNX once (cached)
  build            build an index version of a BEIR folder and register it as a candidate
                   (a collection's first version is made live at once)
  list             list the versions of a collection (* live, p previous, c candidate)
  publish          verify a version and register it as a candidate
  promote          make a candidate live on every replica (quality gate first, if configured)
  rollback         swap live and previous on every replica
  status           registry state, history and replica reports (JSON)
  fold             fold the collection's pending writes (write-ahead log) into a new version, reusing the
                   live version's rotation, routers and recall policy (docs/LIVE_DOCUMENTS.md)
  retention        delete old versions of a collection: keep live, previous, candidates, the newest
                   keep_versions and every version a replica leases (JSON; --dry-run deletes nothing)
  serve            long-lived: rebuild and publish when the dataset changes, fold pending writes;
                   /metrics with capacity gauges
  encode           encode a corpus with Ray Data into parquet shards (build --embeddings reads them)
  milvus-write     write a version's stage-1 and rescoring prefixes to Milvus (stage 1 on Milvus)
  milvus-gc        drop Milvus collections of versions the registry no longer names
  ship-embeddings  write a BEIR folder's embeddings for the repository (<dataset>/embeddings/)
  seed-embeddings  check the shipped embeddings (sample re-encoded) and seed the embedding cache
  evaluate         rank a split's judged queries with an index version; metrics and TREC run files

The registry is Redis when REDIS_URL (or ADAWIDTH_REDIS_URL) is set, else the
file registry on the index volume.  See deploy/CUTOVER.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from engine.encoder import OnnxEncoder
from engine.io.beir import DatasetFormatError
from engine.registry.state import RegistryError, RegistryUnavailable, check_version_name
from engine.version.manifest import IndexVersionError
from engine.version.store import BuildLocked
from engine.wal import WalError
from trainer import data_cli, registry_cli, scale_cli
from trainer.config import TrainerSettings
from trainer.export_onnx import export_encoder
from trainer.retention import run_retention

ANN_CHOICES = ("none", "auto", "ivf", "hnsw", "ivf_panorama", "hnsw_panorama", "hnsw_fp16")
"""``build --ann`` values: :data:`engine.ann.BACKEND_CHOICES`, spelled out so the CLI starts without faiss
(tests/unit/test_ann.py checks they are equal)."""


def _pair(text: str) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected 'l,h', got {text!r}") from e
    return low, high


def _threads(text: str) -> int:
    """argparse type of a thread count: an int in 1..256."""
    try:
        n = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from e
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"expected 1..256 threads, got {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer``: parse the command line and run one command; returns the exit status (2: bad input)."""
    parser = argparse.ArgumentParser(prog="trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, help="working folder (env ADAWIDTH_HOME, default var)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("export-encoder", help="export the ONNX encoder (no-op when present)")

    b = sub.add_parser("build", help="build an index version of a BEIR folder",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _build_arguments(b)
    b.add_argument("--no-publish", action="store_true", help="write the version but do not register it")
    b.add_argument("--promote", action="store_true", help="also make it live at once (no quality gate)")

    f = sub.add_parser("fold", help="fold pending writes into a new version (candidate; --promote: gate, live)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    f.add_argument("--collection", required=True, help="collection whose write-ahead log is folded")
    f.add_argument("--promote", action="store_true",
                   help="promote the folded version through the quality gate (the normal blue/green path)")
    f.add_argument("--drift-threshold", type=float, default=None,
                   help="refit instead of reusing when the online-CUS agreement moves more than this "
                        "(default: setting fold_drift_threshold)")

    rt = sub.add_parser("retention", help="delete old versions (keep live, previous, candidates, the newest "
                        "keep_versions, leased); JSON report")
    rt.add_argument("--collection", required=True)
    rt.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")

    sv = sub.add_parser("serve", help="rebuild on data change and export capacity gauges on /metrics",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _build_arguments(sv)
    sv.add_argument("--port", type=int, default=9109, help="TCP port of /metrics")
    sv.add_argument("--host", default="127.0.0.1", help="bind address of /metrics")
    sv.add_argument("--poll-seconds", type=float, default=60.0, help="seconds between dataset fingerprint checks")
    sv.add_argument("--no-fold", action="store_true",
                    help="do not fold pending writes (settings fold_min_writes, fold_interval_seconds)")

    registry_cli.add_commands(sub)
    scale_cli.add_commands(sub)
    data_cli.add_commands(sub)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = TrainerSettings(**({"home": args.home} if args.home else {})).resolved()

    # trainer.build and trainer.serve import torch: imported only by the commands that train, so that the
    # registry and scale-out commands start in a fraction of a second
    if args.command == "export-encoder":
        print(export_encoder(settings.encoder_dir))
        return 0
    if args.command == "fold":
        return _fold(args, settings)
    if args.command == "retention":
        return _retention(args, settings)
    if args.command in ("build", "serve"):
        from trainer.build import BuildOptions, build_index

        export_encoder(settings.encoder_dir)
        encoder = OnnxEncoder(settings.encoder_dir, threads=settings.encoder_threads)
        adapter = {k: v for k, v in {"epochs": args.epochs, "learning_rate": args.learning_rate}.items() if v is not None}
        opts = BuildOptions(dataset=args.dataset, collection=args.collection, train_split=args.train_split,
                            eval_split=args.eval_split, rotation=args.rotation, m0=args.m0, shortlist=args.shortlist,
                            action_pairs=tuple(args.pairs), default_pair=args.default_pair,
                            default_rho=args.default_rho, seed=args.seed,
                            publish=args.command == "serve" or not args.no_publish,
                            # the daemon's rebuilds go live at once (quality gate aside): that is what
                            # "rebuild and publish on new data" means for an unattended trainer
                            promote=args.command == "serve" or getattr(args, "promote", False), adapter=adapter,
                            router_crossfit_folds=args.router_crossfit_folds, capacity=not args.no_capacity,
                            cars={"rank": args.cars_rank, "prior_queries": args.cars_prior_queries} if args.cars else None,
                            stage1_policy=args.stage1_policy, stage1_policy_tau=args.stage1_policy_tau,
                            embeddings=args.embeddings, tiers=args.tiers, cross_encoder=args.cross_encoder,
                            tier_head_queries=args.tier_head_queries, strict=args.strict, ann=args.ann,
                            calibration_threads=args.calibration_threads,
                            ann_params={k: v for k, v in {"M": args.ann_m, "ef_construction": args.ann_ef_construction,
                                                          "nlist": args.ann_nlist}.items() if v is not None})
        if args.command == "serve":
            return _serve(args, opts, settings, encoder)
        try:
            path, manifest = build_index(opts, settings, encoder)
        except DatasetFormatError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except FileNotFoundError as e:  # e.g. --tiers without a cross-encoder export
            print(f"error: {e}", file=sys.stderr)
            return 2
        except ValueError as e:  # inconsistent options, e.g. a learned rotation without training qrels
            hint = " (use --rotation pca for a collection without a train split)" if "needs training" in str(e) else ""
            print(f"error: {e}{hint}", file=sys.stderr)
            return 2
        print(json.dumps({"version": manifest.version, "path": str(path), "registered": not args.no_publish}))
        return 0
    if args.command in registry_cli.COMMANDS:
        return registry_cli.run(args, settings)
    if args.command in scale_cli.COMMANDS:
        return scale_cli.run(args, settings)
    if args.command in data_cli.COMMANDS:
        return data_cli.run(args, settings)
    return 1


def _retention(args, settings) -> int:
    """``trainer retention``: apply (or with ``--dry-run`` only report) the retention rule; prints the report as
    JSON (exit 2: bad collection name or registry refusal, 3: registry unreachable)."""
    try:
        check_version_name(args.collection)
        report = run_retention(settings, args.collection, dry_run=args.dry_run)
    except RegistryUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


def _fold(args, settings) -> int:
    """``trainer fold``: one fold; prints its report as JSON (exit 2 with a message when it cannot fold)."""
    from trainer.fold import FoldError, fold_collection, live_version  # imports trainer.build, so torch (see main)

    threshold = settings.fold_drift_threshold if args.drift_threshold is None else args.drift_threshold
    if not threshold >= 0:
        print(f"error: --drift-threshold must be >= 0, got {threshold}", file=sys.stderr)
        return 2
    try:
        live = live_version(settings, args.collection)
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if live is None:  # before the encoder loads
        print(f"error: collection {args.collection!r} under {settings.index_root} has no live version to fold onto",
              file=sys.stderr)
        return 2
    export_encoder(settings.encoder_dir)
    encoder = OnnxEncoder(settings.encoder_dir, threads=settings.encoder_threads)
    try:
        report = fold_collection(settings, encoder, args.collection, promote=args.promote,
                                 drift_threshold=threshold)
    except (FoldError, BuildLocked, WalError, IndexVersionError, RegistryError, DatasetFormatError, ValueError,
            FileNotFoundError) as e:  # ValueError: e.g. a refit whose dataset folder lost its training split
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, default=str))
    if args.promote and report.get("folded") and not report.get("promoted"):
        print(f"error: promotion refused: {(report.get('gate') or {}).get('reason')}", file=sys.stderr)
        return 2
    return 0


def _serve(args, opts, settings, encoder) -> int:
    """Run the trainer daemon until SIGTERM / SIGINT."""
    from trainer.serve import TrainerDaemon, TrainerMetrics  # imports torch (see main)

    registry = CollectorRegistry()
    daemon = TrainerDaemon(opts, settings, encoder, TrainerMetrics(registry), fold=not args.no_fold)
    server, _ = start_http_server(args.port, addr=args.host, registry=registry)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logging.getLogger("trainer.serve").info("metrics on http://%s:%d/metrics; polling %s every %.0f s",
                                            args.host, args.port, opts.dataset, args.poll_seconds)
    daemon.run(stop, args.poll_seconds)
    server.shutdown()
    return 0


def _build_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--dataset", type=Path, required=True, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    b.add_argument("--collection", help="collection name (default: folder name)")
    b.add_argument("--train-split", default="train", help="qrels split for adapter and router training")
    b.add_argument("--eval-split", default="test", help="qrels split for the offline evaluation")
    b.add_argument("--rotation", default="adapter", choices=["adapter", "adapter_on_pca", "pca", "identity"],
                   help="served rotation; adapter and adapter_on_pca need a train split")
    b.add_argument("--m0", type=int, default=64, help="stage-1 width in coordinates")
    b.add_argument("--shortlist", type=int, default=500, help="stage-1 shortlist size")
    b.add_argument("--pairs", type=_pair, nargs="+", default=[(64, 128), (64, 256), (128, 256)],
                   help="router action pairs l,h")
    b.add_argument("--default-pair", type=_pair, default=(64, 128), help="action pair of width 'auto'")
    b.add_argument("--default-rho", type=float, default=0.2,
                   help="escalation fraction of width 'auto' when a request gives no rho")
    b.add_argument("--epochs", type=int, help="adapter epochs (default 100)")
    b.add_argument("--learning-rate", type=float, help="adapter AdamW learning rate (default 1e-2)")
    b.add_argument("--router-crossfit-folds", type=int, default=4,
                   help="train the router on queries ranked by adapters that did not see them (0: off)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--strict", action="store_true",
                   help="refuse a corpus holding empty documents (title and text blank) instead of skipping them "
                        "with a counted warning in the manifest")
    b.add_argument("--no-capacity", action="store_true", help="skip the capacity report")
    b.add_argument("--cars", action="store_true",
                   help="fit Shared and Dual low-rank adapters, select one by CARS, serve it (docs/METHOD.md)")
    b.add_argument("--cars-rank", type=int, default=16, help="rank r of the CARS adapters")
    b.add_argument("--cars-prior-queries", type=float, default=0.0,
                   help="CARS weight decay = this / training queries (0: fixed 1e-3; bench/results/cars/ compares)")
    b.add_argument("--stage1-policy", action="store_true",
                   help="also fit the per-query funnel policy (stage-1 width, shortlist, rescoring width); "
                        "width 'auto' then uses it (bench/results/adaptive/)")
    b.add_argument("--stage1-policy-tau", type=float, default=0.95,
                   help="the policy's bar: cheapest configuration predicted to keep this share of the full-width top-10")
    b.add_argument("--embeddings", type=Path, help="corpus embeddings from `trainer encode` shards (Ray) instead of "
                                                   "encoding in this process")
    b.add_argument("--tiers", action="store_true",
                   help="fit the DART difficulty head that routes tier 'auto' (MIPS / MaxSim / cross-encoder); "
                        "needs a cross-encoder export (python -m trainer.dart.cross_encoder)")
    b.add_argument("--cross-encoder", type=Path, default=None,
                   help="cross-encoder export for --tiers (default <home>/models/minilm-cross-encoder)")
    b.add_argument("--tier-head-queries", type=int, default=None,
                   help="label at most this many held-out training queries for the head (default: all)")
    b.add_argument("--ann", default="none", choices=list(ANN_CHOICES),
                   help="ANN first stage over the rotated documents (issue 19): none (flat certified scan), auto "
                        "(flat below ADAWIDTH_ANN_MIN_DOCS, else HNSW or IVF within ADAWIDTH_MEMORY_BUDGET_BYTES), "
                        "or one kind")
    b.add_argument("--ann-m", type=int, default=None, help="HNSW neighbours M (default 32)")
    b.add_argument("--ann-ef-construction", type=int, default=None, help="HNSW efConstruction (default 80)")
    b.add_argument("--ann-nlist", type=int, default=None, help="IVF lists (default round(4 sqrt(N)))")
    b.add_argument("--calibration-threads", type=_threads, default=None,
                   help="calibrate the declared recall at every level-scan thread count up to this, for the "
                        "gateway's level_threads (default: this machine's cores, at most 8; 1: one thread)")


if __name__ == "__main__":
    sys.exit(main())
