"""`auto` on a collection without training queries (issue 15, item 3): the plain request works and meets its
declared recall.

Each collection is built as a user with only a corpus (and test qrels, used here only to pick the queries)
would: ``trainer build --rotation pca``, no train split.  The recall policy is then calibrated on
pseudo-queries drawn from the corpus (:mod:`adawidth.pseudo_queries`), and the manifest says so.  Served
over HTTP, ``{"query": ..., "k": 10}`` answers 200 with policy ``recall``, its realised recall@10 against
the exhaustive search (``width: "full"``) over every test query is at least the declared 0.99, and the width
router, which needs labels, is refused with 409 ``policy_unavailable``.

Collections: SciFact with its train split removed (bundled), and Cranfield (``../shared/data``, no train
split; CI has it beside the clone, and the test fails, never skips, without it).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.io.beir import load_collection
from engine.version import store
from engine.version.manifest import read_manifest
from tests.conftest import ROOT, SCIFACT, VAR, serve_home
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings

pytestmark = pytest.mark.integration

SHARED = Path(os.environ.get("ADAWIDTH_SHARED_DATA", ROOT.parent / "shared" / "data"))


def label_free_copy(src: Path, dst: Path) -> Path:
    """A BEIR folder of ``src``'s corpus and queries with only its test qrels (links, nothing copied)."""
    (dst / "qrels").mkdir(parents=True)
    for name in os.listdir(src):
        if name.startswith(("corpus", "queries")):
            os.symlink(src / name, dst / name)
    os.symlink(src / "qrels" / "test.tsv", dst / "qrels" / "test.tsv")
    return dst


@pytest.fixture(scope="module", params=["scifact-no-train", "cranfield"])
def label_free(request, tmp_path_factory, encoder_dir, encoder):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    if name == "cranfield":
        assert (SHARED / "cranfield" / "corpus.jsonl").is_file(), f"Cranfield is not in {SHARED}"
        dataset = label_free_copy(SHARED / "cranfield", root / "data" / name)
    else:
        dataset = label_free_copy(SCIFACT, root / "data" / name)
    home = root / "home"
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    build_index(BuildOptions(dataset=dataset, collection=name, rotation="pca", capacity=False), settings, encoder)
    (home / "models").mkdir()
    os.symlink(encoder_dir, home / "models" / "minilm-onnx")
    coll = home / "indexes" / name
    manifest = read_manifest(coll / store.read_live_pointer(coll))
    col = load_collection(dataset, "test")
    texts = [col.queries[q] for q in sorted(col.judged_queries())]
    with serve_home(home, name) as url:
        yield name, manifest, texts, url


def test_the_version_was_calibrated_on_pseudo_queries(label_free):
    _, manifest, _, _ = label_free
    assert manifest.corpus.train_split is None  # extra fields of a section are kept as written
    rp = manifest.recall_policy
    assert rp is not None and rp.calibration_source.startswith("pseudo:")
    assert rp.calibration_queries >= 300
    assert manifest.policy.default == "recall" and not manifest.router.pairs


def test_the_plain_request_meets_its_declared_recall(label_free):
    name, _, texts, url = label_free
    recalls, work = [], []
    with httpx.Client(timeout=60) as client:
        for text in texts:
            plain = client.post(f"{url}/v1/search", json={"query": text, "k": 10})
            assert plain.status_code == 200, plain.text
            full = client.post(f"{url}/v1/search", json={"query": text, "k": 10, "width": "full"}).json()
            body = plain.json()
            assert body["trace"]["policy"] == "recall" and body["trace"]["recall_target"] == 0.99
            want = {h["id"] for h in full["results"]}
            recalls.append(len(want & {h["id"] for h in body["results"]}) / len(want))
            work.append(body["trace"]["coordinates_scored"] / full["trace"]["coordinates_scored"])
        refused = client.post(f"{url}/v1/search", json={"query": texts[0], "k": 10, "policy": "router"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "policy_unavailable", refused.text
    print(f"{name}: {len(texts)} queries, recall@10 {np.mean(recalls):.4f}, work vs exact mode {np.mean(work):.3f}")
    assert np.mean(recalls) >= 0.99, (name, np.mean(recalls))
    assert np.mean(work) < 1.0  # and it prunes: less work than the certified exact mode
