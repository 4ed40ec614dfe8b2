"""Encode debdocs' passages into the embedding cache in the order ``bench.scale`` reads them.

``bench.scale`` serves the largest cached prefix of a seeded permutation (numpy ``default_rng(0)``) of the
221k passages, so this job encodes that permutation front to back, in chunks, committing each chunk to the
content-hash cache (``<home>/cache/embeddings.sqlite``): stopped at any point, it loses at most one chunk and
resumes where the cache ends.  About 9-15 passages a second on 2 cores (4-6 hours for all of them)::

    OMP_NUM_THREADS=2 python -m bench.encode_debdocs --home var --threads 2 --limit 50000 --ship

The work carries across sessions through the repository: ``--ship`` writes the passages of the permutation
from where the shipped files end up to ``--limit``, and the training and test queries ``bench.scale`` reads,
as one float16 shipped-embeddings file (:mod:`trainer.shipped_embeddings`) under
``bench/data/debdocs/embeddings/``.  Every run first seeds the cache from those files (each checked by
re-encoding a sample; cosine >= 0.9999), so a fresh checkout starts where the last shipped file ends.  The
shipped vectors are float16-rounded (cosine to the encoder's output about 1 - 1e-7): every method of a
``bench.scale`` run reads the same vectors.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.common import ROOT
from engine.encoder import OnnxEncoder
from engine.io.beir import load_corpus, load_qrels, load_queries
from trainer.embed_cache import EmbeddingCache, content_key, encoder_fingerprint
from trainer.shipped_embeddings import seed_cache, write_shipped

SHIPPED = ROOT / "bench" / "data" / "debdocs" / "embeddings"
"""Shipped float16 chunks of the permutation: ``<sha256(fingerprint)[:16]>-<start>-<end>.npz``."""
PERMUTATION_SEED = 0
QUERY_SEED = 1


def permutation(n: int) -> np.ndarray:
    """(n,) int64: the order in which passages are encoded and ``bench.scale`` takes its prefix."""
    return np.random.default_rng(PERMUTATION_SEED).permutation(n)


def query_ids(folder: Path, n_train: int, n_test: int) -> tuple[list[str], list[str]]:
    """The training and test query ids ``bench.scale`` samples (seed 1) from the train and test qrels."""
    queries = load_queries(folder)
    rng = np.random.default_rng(QUERY_SEED)
    tr = sorted(q for q in load_qrels(folder, "train") if q in queries)
    te = sorted(q for q in load_qrels(folder, "test") if q in queries)
    tr = sorted(rng.choice(tr, min(n_train, len(tr)), replace=False).tolist())
    te = sorted(rng.choice(te, min(n_test, len(te)), replace=False).tolist())
    return tr, te


def shipped_files(fingerprint: str) -> list[tuple[int, int, Path]]:
    """(start, end, path) of the shipped chunks of this encoder, by start."""
    tag = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    out = []
    for p in SHIPPED.glob(f"{tag}-*-*.npz"):
        m = re.fullmatch(rf"{tag}-(\d+)-(\d+)\.npz", p.name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(out)


def seed_from_shipped(folder: Path, enc, cache: EmbeddingCache) -> int:
    """Seed the cache from every shipped chunk of this encoder; returns the end of the shipped prefix
    (0 when none, or when a chunk fails its check)."""
    end = 0
    for start, stop, path in shipped_files(encoder_fingerprint(enc)):
        report = seed_cache(folder, enc, cache, path=path)
        print(f"{path.name}: {report.message}", flush=True)
        if report.fallback or start != end:
            break
        end = stop
    return end


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, default=ROOT / "var")
    ap.add_argument("--debdocs", type=Path, default=ROOT.parent / "shared" / "data" / "debdocs")
    ap.add_argument("--limit", type=int, default=None, help="stop after this many passages of the permutation")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--ship", action="store_true",
                    help=f"write the newly cached prefix as a float16 chunk under {SHIPPED.relative_to(ROOT)}")
    ap.add_argument("--train-queries", type=int, default=800, help="queries shipped with --ship (bench.scale's)")
    ap.add_argument("--test-queries", type=int, default=300)
    ap.add_argument("--no-seed", action="store_true", help="do not seed the cache from the shipped chunks")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    enc = OnnxEncoder(args.home / "models" / "minilm-onnx", threads=args.threads)
    cache = EmbeddingCache(args.home / "cache" / "embeddings.sqlite", enc.dimension)
    try:
        shipped_end = 0 if args.no_seed else seed_from_shipped(args.debdocs, enc, cache)
        docs = load_corpus(args.debdocs)
        order = permutation(len(docs))[:args.limit]
        fp = encoder_fingerprint(enc)
        texts = [docs[i].encoder_text() for i in order]
        keys = [content_key(t, fp) for t in texts]
        have: set[str] = set()
        for s in range(0, len(keys), 20_000):
            have |= set(cache.get_many(keys[s:s + 20_000]))
        start = next((i for i, key in enumerate(keys) if key not in have), len(keys))  # resume after the prefix
        t0 = time.perf_counter()
        with tqdm(total=len(keys), initial=start, desc="debdocs", unit="passage") as bar:
            for s in range(start, len(keys), args.chunk):
                part = slice(s, min(s + args.chunk, len(keys)))
                vecs = enc.encode(texts[part], batch_size=32)
                cache.put_many(dict(zip(keys[part], vecs)))
                bar.update(part.stop - part.start)
        print(f"encoded {len(keys) - start} passages in {time.perf_counter() - t0:.0f} s; "
              f"the cached prefix is now {len(keys)} of {len(docs)}")
        if args.ship and len(keys) > shipped_end:
            queries = load_queries(args.debdocs)
            tr, te = query_ids(args.debdocs, args.train_queries, args.test_queries)
            tag = hashlib.sha256(fp.encode()).hexdigest()[:16]
            out = SHIPPED / f"{tag}-{shipped_end}-{len(keys)}.npz"
            path, meta = write_shipped(
                args.debdocs, enc, cache, out, texts=(texts[shipped_end:], [queries[q] for q in tr + te]),
                dtype="float16", command="OMP_NUM_THREADS=2 python -m bench.encode_debdocs --threads 2 "
                                         f"--limit {len(keys)} --ship",
                note=f"debdocs passages {shipped_end}..{len(keys)} of the permutation default_rng("
                     f"{PERMUTATION_SEED}) of {len(docs)}, and bench.scale's {len(tr)} training and {len(te)} "
                     f"test queries (default_rng({QUERY_SEED}))")
            print(f"shipped {meta['count']} vectors to {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    finally:
        cache.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
