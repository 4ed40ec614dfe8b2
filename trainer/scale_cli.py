"""Scale-out commands of the trainer CLI: ``encode`` (Ray Data), ``milvus-write`` and ``milvus-gc`` (docs/SCALING.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.registry import open_registry
from engine.version.manifest import IndexVersionError
from trainer.milvus_stage1 import drop_unlisted, open_client, write_version
from trainer.ray_encode import encode_corpus

COMMANDS = ("encode", "milvus-write", "milvus-gc")


def add_commands(sub) -> None:
    """Add the scale-out sub-commands to the trainer's argument parser."""
    enc = sub.add_parser("encode", help="encode a BEIR corpus with Ray Data into parquet shards "
                                        "(then: trainer build --embeddings SHARDS)")
    enc.add_argument("--dataset", type=Path, required=True, help="BEIR folder")
    enc.add_argument("--out", type=Path, required=True, help="shard folder (must be empty or absent)")
    enc.add_argument("--ray-address", help="Ray cluster (default env ADAWIDTH_RAY_ADDRESS; unset: local Ray)")
    enc.add_argument("--num-cpus", type=int, default=1, help="CPUs of a local Ray")
    enc.add_argument("--actors", type=int, default=1, help="encoder actors (one ONNX session each)")
    enc.add_argument("--encoder-threads", type=int, default=1, help="ONNX Runtime threads per actor")
    enc.add_argument("--limit", type=int, help="encode only the first N documents")

    mw = sub.add_parser("milvus-write", help="write a version's stage-1 and rescoring prefixes to Milvus "
                                             "(build and publish do it when ADAWIDTH_STAGE1_BACKEND=milvus)")
    mw.add_argument("collection")
    mw.add_argument("version")

    gc = sub.add_parser("milvus-gc", help="drop the Milvus collections of versions the registry no longer names")
    gc.add_argument("collection")


def run(args, settings) -> int:
    """Execute one scale-out command; returns the exit code."""
    if args.command == "encode":
        out = encode_corpus(args.dataset, args.out, settings.encoder_dir,
                            address=args.ray_address or settings.ray_address, num_cpus=args.num_cpus,
                            actors=args.actors, encoder_threads=args.encoder_threads, limit=args.limit)
        print(json.dumps(out))
        return 0
    client = open_client(settings)
    try:
        if args.command == "milvus-write":
            try:
                print(json.dumps(write_version(client, Path(settings.index_root) / args.collection / args.version,
                                               prefix=settings.milvus_prefix)))
            except IndexVersionError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            return 0
        registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root)
        try:
            st = registry.get(args.collection)
        finally:
            registry.close()
        keep = {v for v in (st.live, st.previous, *st.candidates) if v}
        print(json.dumps({"kept": sorted(keep), "dropped": drop_unlisted(client, args.collection, keep,
                                                                          settings.milvus_prefix)}))
        return 0
    finally:
        client.close()
