"""Encode debdocs' passages into the embedding cache in the order ``bench.scale`` reads them.

``bench.scale`` serves the largest cached prefix of a seeded permutation (numpy ``default_rng(0)``) of the
221k passages, so this job encodes that permutation front to back, in chunks, committing each chunk to the
content-hash cache (``<home>/cache/embeddings.sqlite``): stopped at any point, it loses at most one chunk and
resumes where the cache ends.  About 9-15 passages a second on 2 cores (4-6 hours for all of them)::

    OMP_NUM_THREADS=1 python -m bench.encode_debdocs --home var --threads 1 --limit 60000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.common import ROOT
from engine.encoder import OnnxEncoder
from engine.io.beir import load_corpus
from trainer.embed_cache import EmbeddingCache, content_key, encoder_fingerprint


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, default=ROOT / "var")
    ap.add_argument("--debdocs", type=Path, default=ROOT.parent / "shared" / "data" / "debdocs")
    ap.add_argument("--limit", type=int, default=None, help="stop after this many passages of the permutation")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--chunk", type=int, default=256)
    args = ap.parse_args(argv)

    enc = OnnxEncoder(args.home / "models" / "minilm-onnx", threads=args.threads)
    cache = EmbeddingCache(args.home / "cache" / "embeddings.sqlite", enc.dimension)
    docs = load_corpus(args.debdocs)
    order = np.random.default_rng(0).permutation(len(docs))[:args.limit]
    fp = encoder_fingerprint(enc)
    texts = [docs[i].encoder_text() for i in order]
    keys = [content_key(t, fp) for t in texts]
    have: set[str] = set()
    for s in range(0, len(keys), 20_000):
        have |= set(cache.get_many(keys[s:s + 20_000]))
    start = next((i for i, key in enumerate(keys) if key not in have), len(keys))  # resume after the prefix
    t0 = time.perf_counter()
    try:
        with tqdm(total=len(keys), initial=start, desc="debdocs", unit="passage") as bar:
            for s in range(start, len(keys), args.chunk):
                part = slice(s, min(s + args.chunk, len(keys)))
                vecs = enc.encode(texts[part], batch_size=32)
                cache.put_many(dict(zip(keys[part], vecs)))
                bar.update(part.stop - part.start)
    finally:
        cache.close()
    print(f"encoded {len(keys) - start} passages in {time.perf_counter() - t0:.0f} s; "
          f"the cached prefix is now {len(keys)} of {len(docs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
