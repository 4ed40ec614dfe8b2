"""Write a synthetic embedding corpus whose spectrum follows a real index version's documents.

The Gaussian N(mu, Sigma) is fitted to the documents of an index version (``docs.npy`` holds them rotated,
``R x``; the fit is made on ``x``), and ``--n`` documents are drawn from it and L2-normalised
(:func:`adawidth.synthetic.sample_corpus`), written chunk by chunk into a memory-mapped ``.npy`` so a
corpus larger than memory can be produced.

Usage::

    .venv/bin/python -m bench.synthetic --home var --collection scifact --n 1000000 --out /tmp/syn1m.npy
    .venv/bin/python -m bench.synthetic --version-dir var/indexes/scifact/VERSION --n 100000 --rotated --out x.npy

In Python (what ``bench/latency.py`` does)::

    from adawidth.synthetic import fit_gaussian, sample_corpus
    model = fit_gaussian(real_embeddings)                 # (n, D)
    docs = sample_corpus(model, 1_000_000, seed=0)        # (1e6, D) float32, unit rows
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from adawidth.synthetic import fit_gaussian, sample_corpus
from bench.common import ROOT
from engine.io import atomic
from engine.version.store import resolve_version_path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", type=Path, default=Path(os.environ.get("ADAWIDTH_HOME", ROOT / "var")))
    p.add_argument("--collection", default="scifact")
    p.add_argument("--version-dir", type=Path, help="an index version directory (default: the collection's live one)")
    p.add_argument("--n", type=int, required=True, help="documents to draw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rotated", action="store_true", help="write R x (the version's rotated basis) instead of x")
    p.add_argument("--out", type=Path, required=True, help="output .npy (float32, shape (n, D))")
    args = p.parse_args(argv)

    path = args.version_dir or resolve_version_path(args.home / "indexes", args.collection, None)
    R = np.load(path / "rotation.npy").astype(np.float64)
    X = np.load(path / "docs.npy", mmap_mode="r").astype(np.float64) @ R  # rows R x -> x (R orthogonal)
    model = fit_gaussian(X)
    out = np.lib.format.open_memmap(args.out, mode="w+", dtype=np.float32, shape=(args.n, model.dimension))
    sample_corpus(model, args.n, seed=args.seed, rotation=R if args.rotated else None, out=out)
    out.flush()
    meta = {"source_version": str(path), "n": args.n, "seed": args.seed, "rotated": args.rotated,
            "fitted_on": model.n_fitted, "eigenvalue_share_first_64": float(model.eigenvalues[:64].sum()
                                                                           / model.eigenvalues.sum())}
    atomic.write_text(args.out.with_suffix(".json"), json.dumps(meta, indent=1))
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
