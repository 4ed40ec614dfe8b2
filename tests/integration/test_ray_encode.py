"""The Ray Data encoding job against the single-process encoder, on a SciFact subset (issue 10).

A local Ray with one CPU and a 100 MiB object store encodes the first 160
SciFact documents into parquet shards; every embedding must have cosine >= 0.9999
with the single-process path (the :class:`engine.encoder.OnnxEncoder` the
builder's :func:`trainer.embed_cache.encode_with_cache` calls), the rotation pass
must equal ``X @ R.T``, the builder's reader must refuse incomplete shards, and
``build_index(embeddings=shards)`` must index the shards' vectors without encoding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from adawidth.rotation import pca_rotation
from engine.encoder import OnnxEncoder
from engine.io.beir import load_corpus
from tests.conftest import SCIFACT
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.ray_encode import encode_corpus, init_ray, read_shards, rotate_shards

pytestmark = pytest.mark.integration

SUBSET = 160


@pytest.fixture(scope="module")
def ray_local():
    import ray

    init_ray(num_cpus=1)
    yield
    ray.shutdown()


def test_ray_shards_equal_single_process_embeddings_and_rotation(tmp_path, ray_local, encoder_dir):
    out = encode_corpus(SCIFACT, tmp_path / "emb", encoder_dir, num_cpus=1, rows_per_task=64, limit=SUBSET)
    assert out["shards"] >= 1
    assert out["documents"] == SUBSET
    docs = load_corpus(SCIFACT)[:SUBSET]
    ids = [d.doc_id for d in docs]
    X_ray = read_shards(tmp_path / "emb", ids)
    X_one = OnnxEncoder(encoder_dir, threads=1).encode([d.encoder_text() for d in docs])
    cos = np.einsum("ij,ij->i", X_ray, X_one) / (np.linalg.norm(X_ray, axis=1) * np.linalg.norm(X_one, axis=1))
    assert cos.min() >= 0.9999, (cos.min(), ids[int(cos.argmin())])
    assert np.allclose(np.linalg.norm(X_ray, axis=1), 1.0, atol=1e-4)

    R = pca_rotation(X_one).astype(np.float32)
    rot = rotate_shards(tmp_path / "emb", R, tmp_path / "rot", num_cpus=1)
    assert rot["documents"] == SUBSET
    assert np.allclose(read_shards(tmp_path / "rot", ids, column="rotated"), X_ray @ R.T, atol=1e-5)

    # the builder reads shards by document id: a document the shards lack is an error, not a zero row
    with pytest.raises(ValueError, match="missing"):
        read_shards(tmp_path / "emb", ids + ["no-such-document"])

    # the index builder reads the shards instead of encoding (a BEIR folder of the same documents)
    subset = _subset_folder(tmp_path / "subset", docs)
    settings = TrainerSettings(home=tmp_path / "home", encoder_dir=encoder_dir, redis_url=None).resolved()
    path, manifest = build_index(BuildOptions(dataset=subset, rotation="pca", eval_split=None, train_split=None,
                                              capacity=False, publish=False, embeddings=tmp_path / "emb"),
                                 settings, OnnxEncoder(encoder_dir, threads=1))
    assert manifest.corpus.encoded_now == 0 and manifest.corpus.documents == SUBSET
    built = np.load(path / "docs.npy") @ np.load(path / "rotation.npy")  # back to encoder coordinates
    assert np.allclose(built, X_ray, atol=1e-5)


def _subset_folder(folder, docs):
    """A BEIR folder holding ``docs`` only (one query and judgment so the loader accepts it)."""
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as fh:
        for d in docs:
            fh.write(json.dumps({"_id": d.doc_id, "title": d.title, "text": d.text}) + "\n")
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a question"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\t{docs[0].doc_id}\t1\n")
    return folder
