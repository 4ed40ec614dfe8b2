"""The SciFact embeddings shipped in the repository pass the check against the real encoder and seed a cache from
which the build encodes nothing; a tampered copy falls back with a warning on the command's stderr."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.io.beir import load_corpus
from trainer.embed_cache import EmbeddingCache, encode_with_cache, encoder_fingerprint
from trainer.shipped_embeddings import _shuffle, read_shipped, seed_cache, shipped_path

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCIFACT = ROOT / "data" / "scifact"


def test_shipped_scifact_file_is_this_encoders_and_seeds_the_build(encoder, tmp_path):
    path = shipped_path(SCIFACT, encoder_fingerprint(encoder))
    assert path.is_file(), "data/scifact/embeddings has no file for this encoder: python -m trainer ship-embeddings"
    assert path.stat().st_size < 10_000_000
    cache = EmbeddingCache(tmp_path / "cache.sqlite", encoder.dimension)
    report = seed_cache(SCIFACT, encoder, cache)
    assert report.status == "seeded", report.message
    assert report.checked_documents >= 32 and report.min_cosine >= 0.9999
    texts = [d.encoder_text() for d in load_corpus(SCIFACT)]
    X, n_encoded = encode_with_cache(encoder, texts, cache)
    assert n_encoded == 0 and X.shape == (5183, 384)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)


def test_tampered_file_falls_back_with_a_visible_warning(encoder_dir, encoder, tmp_path):
    src = read_shipped(shipped_path(SCIFACT, encoder_fingerprint(encoder)))
    bad = src.vectors.copy()
    bad[:, :8] = -bad[:, :8]  # flips the sign of 8 of 384 coordinates of every vector
    with np.load(shipped_path(SCIFACT, encoder_fingerprint(encoder))) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["vectors"] = _shuffle(bad)
    tampered = tmp_path / "tampered.npz"
    np.savez_compressed(tampered, **arrays)
    cache_path = tmp_path / "cache.sqlite"
    env = dict(os.environ, ADAWIDTH_ENCODER_DIR=str(encoder_dir), ADAWIDTH_EMBEDDING_CACHE=str(cache_path),
               ADAWIDTH_ENCODER_THREADS="2")
    out = subprocess.run([sys.executable, "-m", "trainer", "--home", str(tmp_path), "seed-embeddings",
                          "--dataset", str(SCIFACT), "--file", str(tampered)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["status"] == "check_failed" and report["fallback"] and report["seeded"] == 0
    assert report["min_cosine"] < 0.9999 and report["checked_documents"] >= 32
    assert "WARNING: shipped embeddings tampered.npz fail the check" in out.stderr
    assert "encoded instead" in out.stderr
    assert EmbeddingCache(cache_path, 384).db.execute("SELECT COUNT(*) FROM emb").fetchone()[0] == 0
