"""What an incremental fold (issue 18) reuses from its base version, and that reusing it changes nothing a
search sees: on a real SciFact PCA version with its capacity report, 30 upserts (half logged with their
embeddings as the gateway writes them, half raw) and 20 deletes are folded in process, and

* the BM25 index equals one built from scratch over the folded corpus, score for score (the fold tokenized only
  the new texts: the base's term counts were reused);
* every unchanged document keeps the base's stored row bit for bit, and each upsert is the full-width top-1
  for its own text;
* the capacity report is the base's, marked as carried, with the online-CUS baseline measured again on the
  folded corpus (equal to measuring it from scratch on the written version), its plots copied;
* the fold's evaluation ran exhaustive full width and the default request only.
"""

from __future__ import annotations

import json
from pathlib import Path

import bm25s
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from engine.encoder import encoder_fingerprint
from engine.index import IndexVersion
from engine.io.beir import load_qrels, load_queries
from engine.live import encoder_text
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from engine.version import store
from engine.version.lexical import BM25_FILES, lexical_files
from engine.version.manifest import read_manifest
from engine.wal import FileWriteLog, pack_embeddings
from tests.conftest import SCIFACT, VAR, build_home
from trainer.build import online_cus_agreement
from trainer.config import TrainerSettings
from trainer.evaluate import QuerySet
from trainer.fold import fold_collection

pytestmark = pytest.mark.integration

UPSERTS, DELETES = 30, 20


@pytest.fixture(scope="module")
def folded(tmp_path_factory, encoder_dir, encoder):
    home = build_home(tmp_path_factory.mktemp("fold-reuse"), encoder_dir, encoder, rotation="pca", capacity=True)
    coll = home / "indexes" / "scifact"
    base = store.read_live_pointer(coll)
    base_ids = json.loads((coll / base / "doc_ids.json").read_text())
    queries = load_queries(SCIFACT)
    qids = sorted(load_qrels(SCIFACT, "test"))[:UPSERTS]
    docs = [{"id": f"reuse-{q}", "title": "", "text": f"{queries[q]} (a revised claim)", "fields": {}} for q in qids]
    log = FileWriteLog(coll / "wal")
    try:
        half = UPSERTS // 2
        log.append({"op": "upsert", "docs": docs[:half],  # as the gateway logs it
                    "emb": pack_embeddings(encoder.encode([encoder_text(d) for d in docs[:half]]),
                                           encoder_fingerprint(encoder))})
        log.append({"op": "upsert", "docs": docs[half:]})  # raw: the fold encodes these
        log.append({"op": "delete", "ids": base_ids[:DELETES]})
    finally:
        log.close()
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    with threadpool_limits(limits=1):
        report = fold_collection(settings, encoder, "scifact")
    return {"home": home, "coll": coll, "base": coll / base, "new": Path(report["path"]), "report": report,
            "docs": docs, "deleted": base_ids[:DELETES]}


def _postings(scores: dict, vocab: dict) -> dict:
    out = {}
    for tok, j in vocab.items():
        if j + 1 < len(scores["indptr"]):
            a, b = scores["indptr"][j], scores["indptr"][j + 1]
            out[tok] = dict(zip(scores["indices"][a:b].tolist(), scores["data"][a:b].tolist()))
    return out


def test_the_folded_bm25_index_equals_one_built_from_scratch(folded, tmp_path):
    new = folded["new"]
    m = read_manifest(new)
    assert folded["report"]["fitting"] == "reused" and m.lexical.counts_file == "bm25_counts.npz"
    texts = json.loads((new / "encoder_text.json").read_text())
    fields = json.loads((new / "doc_fields.json").read_text())
    writers, section = lexical_files(texts, fields)
    for name, write in writers.items():
        write(tmp_path / name)
    got = bm25s.BM25.load(new, load_corpus=False, show_progress=False, **BM25_FILES)
    want = bm25s.BM25.load(tmp_path, load_corpus=False, show_progress=False, **BM25_FILES)
    assert got.scores["num_docs"] == want.scores["num_docs"] == m.corpus.documents
    assert set(got.vocab_dict) == set(want.vocab_dict)
    assert _postings(got.scores, got.vocab_dict) == _postings(want.scores, want.vocab_dict)
    assert json.loads((new / "doc_text.json").read_text()) == json.loads((tmp_path / "doc_text.json").read_text())


def test_unchanged_rows_are_the_base_rows_and_each_upsert_is_its_own_top_1(folded, encoder):
    base, new = IndexVersion.load(folded["base"]), IndexVersion.load(folded["new"])
    row_of = {d: i for i, d in enumerate(base.doc_ids)}
    kept = [(i, row_of[d]) for i, d in enumerate(new.doc_ids) if d in row_of]
    assert len(kept) == base.size - DELETES and not set(folded["deleted"]) & set(new.doc_ids)
    a, b = np.asarray(new.docs)[[i for i, _ in kept]], np.asarray(base.docs)[[j for _, j in kept]]
    np.testing.assert_array_equal(a, b)
    specs = [SearchSpec(query=d["text"], k=3, width="full") for d in folded["docs"]]
    results = Pipeline(encoder).search(new, specs)
    assert [r.ids[0] for r in results] == [d["id"] for d in folded["docs"]]
    assert folded["report"]["embeddings_from_log"] == UPSERTS // 2


def test_the_capacity_report_is_carried_with_a_fresh_online_cus_baseline(folded, encoder):
    base, new = folded["base"], folded["new"]
    cap = json.loads((new / "capacity.json").read_text())
    base_cap = json.loads((base / "capacity.json").read_text())
    assert cap["meta"]["carried_from"]["version"] == base.name
    assert cap["per_query"] == base_cap["per_query"]  # carried, not recomputed
    for png in ("capacity_cliff.png", "capacity_cus.png", "capacity_scaling.png"):
        assert (new / png).read_bytes() == (base / png).read_bytes()
    # the baseline the gateway's online CUS compares against was measured on the folded corpus: the same
    # value as measuring it from scratch on the version as written (the fold reused its evaluation's searches)
    version = IndexVersion.load(new)
    qrels = load_qrels(SCIFACT, "test")
    queries = load_queries(SCIFACT)
    ids = [q for q, j in qrels.items() if q in queries and any(v > 0 for v in j.values())]
    test = QuerySet(ids, np.asarray(encoder.encode([queries[q] for q in ids]), np.float32), [qrels[q] for q in ids])
    fresh = online_cus_agreement(version, test, [queries[q] for q in ids])
    assert cap["online_cus_baseline"]["queries"] == fresh["queries"] == len(ids)
    assert cap["online_cus_baseline"]["agreement"] == pytest.approx(fresh["agreement"], abs=1.5 / len(ids))
    m = read_manifest(new)
    assert set(m.evaluation["served"]) == {"full", "recall 0.99"}
    assert m.build_seconds.get("capacity report (carried, online-CUS baseline measured)") is not None
