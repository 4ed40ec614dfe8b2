"""Empty documents at build time (issue 18): a BEIR corpus holding documents whose title and text are blank is
built without them, counted in the manifest (``corpus.skipped_empty``), or refused with ``strict``."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.index import IndexVersion
from engine.io.beir import DatasetFormatError
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from tests.conftest import SCIFACT, VAR
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

pytestmark = pytest.mark.integration

EMPTY = [{"_id": "empty-1", "title": "", "text": ""}, {"_id": "empty-2", "title": " \t", "text": "\n\u200b "}]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("empty-docs") / "scifact"
    shutil.copytree(SCIFACT, out, ignore=shutil.ignore_patterns("corpus.jsonl*", "embeddings"))
    with gzip.open(next(SCIFACT.glob("corpus.jsonl*")), "rt", encoding="utf-8") as src, \
            open(out / "corpus.jsonl", "w", encoding="utf-8") as dst:
        lines = src.read().splitlines()
        for i, line in enumerate(lines):
            dst.write(line + "\n")
            if i in (10, 2000):
                dst.write(json.dumps(EMPTY[0 if i == 10 else 1]) + "\n")
    return out


def settings(home: Path, encoder_dir: Path) -> TrainerSettings:
    return TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                           embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()


def test_empty_documents_are_skipped_and_counted(dataset, tmp_path, encoder_dir, encoder):
    path, manifest = build_index(BuildOptions(dataset=dataset, rotation="pca", capacity=False, eval_split=None,
                                              action_pairs=((64, 128),), publish=False),
                                 settings(tmp_path, encoder_dir), encoder)
    corpus = manifest.corpus.model_dump()
    assert corpus["documents"] == 5183 and corpus["skipped_empty"] == 2
    assert corpus["skipped_empty_ids"] == ["empty-1", "empty-2"]
    version = IndexVersion.load(path)
    assert not {"empty-1", "empty-2"} & set(version.doc_ids)
    q = encoder.encode(["wolves"])
    hits = Pipeline().search(version, [SearchSpec(query="wolves", k=10, width="full")], embeddings=q)[0]
    assert len(hits.ids) == 10 and not {"empty-1", "empty-2"} & set(hits.ids)
    assert np.isfinite(hits.scores).all()


def test_strict_refuses_a_corpus_with_empty_documents(dataset, tmp_path, encoder_dir, encoder):
    with pytest.raises(DatasetFormatError, match="2 empty documents.*'empty-1'"):
        build_index(BuildOptions(dataset=dataset, rotation="pca", capacity=False, eval_split=None, strict=True,
                                 publish=False), settings(tmp_path, encoder_dir), encoder)
    assert not list(tmp_path.rglob("manifest.json"))
