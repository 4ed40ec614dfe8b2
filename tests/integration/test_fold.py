"""Folding (issue 18, phase 2) over real processes: writes to a SciFact gateway, ``python -m trainer fold
--promote``, and the gateway serves the folded version (every upsert top-1 for its own text at width "full"
from the version itself, no deleted id returned, the delta segment emptied); a rollback serves the old version
again with the writes replayed into the delta segment (none lost) and the next fold folds them again; a fold
killed with -9 while it writes its version leaves no version (its draft is cleaned) and the next fold completes;
and the issue's scale: 10,000 upserts and 1,000 deletes, each upsert top-1 for its own text at once and after the
fold, no deleted id returned by any search sent after its 202 (a searcher beside the writes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from threadpoolctl import threadpool_limits

from engine.io.beir import load_corpus, load_qrels, load_queries
from engine.registry import open_registry
from engine.version import store
from engine.version.manifest import read_manifest
from engine.wal import FileWriteLog, WalCut
from tests.conftest import ROOT, SCIFACT, VAR, build_home
from tests.integration.test_live_documents import copy_home, put, running, search
from tests.live_support import AUTH, C, coll_dir, fold, fold_env, trainer, wait_live, writes
from trainer.build import BuildOptions
from trainer.config import TrainerSettings
from trainer.fold import fold_collection
from trainer.serve import TrainerDaemon, TrainerMetrics

pytestmark = pytest.mark.integration

UPSERTS = 40
DELETES = 12


@pytest.fixture(scope="module")
def pristine_home(tmp_path_factory, encoder_dir, encoder) -> Path:
    # PCA rotation, routers and recall policy from the train split, the test split evaluated (the drift check's
    # queries); seconds from the shared embedding cache
    return build_home(tmp_path_factory.mktemp("fold-home"), encoder_dir, encoder, rotation="pca", capacity=False)


@pytest.fixture(scope="module")
def claims() -> list[tuple[str, str]]:
    queries = load_queries(SCIFACT)
    qids = sorted(load_qrels(SCIFACT, "test"))[-UPSERTS:]
    return [(f"fold-claim-{q}", queries[q].replace('"', " ")) for q in qids]


def test_fold_promote_rollback_and_fold_again(pristine_home, tmp_path, claims):
    home = copy_home(pristine_home, tmp_path / "home")
    base = store.read_live_pointer(coll_dir(home))
    base_ids = json.loads((coll_dir(home) / base / "doc_ids.json").read_text())
    base_texts = dict(zip(base_ids, json.loads((coll_dir(home) / base / "encoder_text.json").read_text())))
    nothing = fold(home)  # nothing pending: no version
    assert nothing["folded"] is False and store.list_versions(coll_dir(home)) == [base]
    with running(home) as gw, httpx.Client(base_url=gw.url, timeout=60) as http:
        half = UPSERTS // 2
        assert put(http, [{"id": i, "text": t, "fields": {"source": "claim"}} for i, t in claims[:half]]).status_code == 202
        deleted = base_ids[:DELETES] + [claims[0][0]]
        text_of = {**{d: base_texts[d][:2000].replace('"', " ") for d in base_ids[:DELETES]}, claims[0][0]: claims[0][1]}
        r = http.post(f"{C}/documents/delete", json={"ids": deleted}, headers=AUTH)
        assert r.status_code == 202
        folded_seq = r.json()["seq"]
        kept_claims = claims[1:half]

        report = fold(home, "--promote")
        assert report["folded"] and report["promoted"] and report["fitting"] == "reused"
        assert report["folded_seq"] == folded_seq and report["base_version"] == base
        assert report["changes"] == {"upserted": half - 1, "added": half - 1, "replaced": 0, "deleted": DELETES}
        assert report["drift"]["available"] and not report["drift"]["exceeded"]
        assert report["encoded_now"] <= half  # only the new texts (the corpus comes from the cache)
        new = report["version"]
        m = read_manifest(coll_dir(home) / new)
        assert m.schema_version == 5 and m.writes.folded_seq == folded_seq and m.writes.base_version == base
        assert m.corpus.documents == len(base_ids) - DELETES + half - 1
        assert m.adapter.sha256 == read_manifest(coll_dir(home) / base).adapter.sha256  # the rotation reused

        wait_live(http, new)
        w = writes(http)
        assert (w["live_folded_seq"], w["pending_upserts"], w["pending_deletes"]) == (folded_seq, 0, 0)
        for i, t in kept_claims:  # served by the folded version itself, not the delta segment
            body = search(http, t, k=10, width="full")
            assert body["results"][0]["id"] == i, (i, body["results"][:3])
            assert body["trace"]["index_version"] == new and not (body["trace"].get("delta") or {}).get("documents")
        for d in deleted:
            for kw in ({"width": "full"}, {}, {"mode": "lexical"}):
                hits = search(http, text_of[d], k=10, **kw)["results"]
                assert hits and d not in {h["id"] for h in hits}, (d, kw)
        assert http.get(f"{C}/documents/{kept_claims[0][0]}", headers=AUTH).json()["served_from"] == new

        # writes after the fold, then a rollback: the old version serves; every write since its folded seq
        # (0) is replayed into the delta segment, none lost
        late = claims[half:]
        assert put(http, [{"id": i, "text": t} for i, t in late]).status_code == 202
        rb = trainer(home, "rollback", "scifact", "--reason", "test")
        assert rb.returncode == 0, rb.stderr
        wait_live(http, base)
        w = writes(http)
        assert w["live_folded_seq"] == 0 and w["pending_upserts"] == len(kept_claims) + len(late)
        for i, t in kept_claims[:5] + late[:5]:
            body = search(http, t, k=10, width="full")
            assert body["results"][0]["id"] == i and body["trace"]["index_version"] == base
        assert w["pending_deletes"] == len(deleted)
        for d in deleted:
            assert d not in {h["id"] for h in search(http, text_of[d], k=10, width="full")["results"]}

        # the next fold folds them all again onto the (rolled-back) live version
        again = fold(home, "--promote")
        assert again["promoted"] and again["base_version"] == base and again["base_folded_seq"] == 0
        assert again["folded_seq"] == writes(http)["last_accepted_seq"]
        wait_live(http, again["version"])
        assert writes(http)["pending_upserts"] == 0
        for i, t in kept_claims[:5] + late:
            body = search(http, t, k=10, width="full")
            assert body["results"][0]["id"] == i and body["trace"]["index_version"] == again["version"]


def test_fold_killed_mid_write_leaves_no_version_and_the_next_completes(pristine_home, tmp_path, claims):
    home = copy_home(pristine_home, tmp_path / "home")
    with running(home) as gw, httpx.Client(base_url=gw.url, timeout=60) as http:
        assert put(http, [{"id": i, "text": t} for i, t in claims[:10]]).status_code == 202
    before = store.list_versions(coll_dir(home))
    registry = open_registry(redis_url=None, index_root=home / "indexes")
    state_before = registry.get("scifact").as_dict()
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "fold", "--collection", "scifact"], cwd=ROOT,
                            env=fold_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    seen = None
    deadline = time.monotonic() + 240
    while seen is None and proc.poll() is None and time.monotonic() < deadline:
        seen = next((p.name for p in coll_dir(home).glob(".tmp-*") if p.is_dir()), None)
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert seen is not None, "the fold finished (or never wrote) before it could be killed mid-write"
    assert store.list_versions(coll_dir(home)) == before  # no half-written version is visible
    assert registry.get("scifact").as_dict() == state_before
    assert (coll_dir(home) / seen).exists()  # its draft is left ...

    report = fold(home)
    assert report["folded"] and report["folded_seq"] == 1
    assert not (coll_dir(home) / seen).exists()  # ... and cleaned by the next fold
    assert store.list_versions(coll_dir(home)) == sorted(before + [report["version"]])
    assert registry.get("scifact").candidates[-1] == report["version"]
    registry.close()


def test_fold_refuses_bad_input(tmp_path, pristine_home):
    r = trainer(tmp_path, "fold", "--collection", "nowhere")
    assert r.returncode == 2 and "no live version" in r.stderr and "Traceback" not in r.stderr
    r = trainer(pristine_home, "fold", "--collection", "scifact", "--drift-threshold", "-1")
    assert r.returncode == 2 and "--drift-threshold" in r.stderr and "Traceback" not in r.stderr


def test_the_trainer_daemon_folds_at_its_size_threshold(pristine_home, tmp_path, claims, encoder, encoder_dir):
    home = copy_home(pristine_home, tmp_path / "home")
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None, fold_min_writes=5,
                               fold_interval_seconds=0,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    daemon = TrainerDaemon(BuildOptions(dataset=SCIFACT, collection="scifact", rotation="pca"), settings, encoder,
                           TrainerMetrics(CollectorRegistry()))
    log = FileWriteLog(coll_dir(home) / "wal")
    log.append({"op": "upsert", "docs": [{"id": i, "title": "", "text": t, "fields": {}} for i, t in claims[:4]]})
    assert daemon.maybe_fold() is None  # 4 < 5: not due
    log.append({"op": "delete", "ids": [claims[0][0]]})
    log.close()
    with threadpool_limits(limits=1):
        version = daemon.maybe_fold()
    assert version is not None and store.read_live_pointer(coll_dir(home)) == version  # promoted (no gate set)
    assert read_manifest(coll_dir(home) / version).writes.folded_seq == 2
    assert daemon.metrics.folds.labels("success")._value.get() == 1
    assert daemon.maybe_fold() is None  # nothing pending any more


def test_a_drift_beyond_the_threshold_refits(pristine_home, tmp_path, claims, encoder, encoder_dir):
    home = copy_home(pristine_home, tmp_path / "home")
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    train = load_qrels(SCIFACT, "train")
    gone = sorted({d for j in list(train.values())[:3] for d, g in j.items() if g > 0})  # every positive of 3 queries
    log = FileWriteLog(coll_dir(home) / "wal")
    log.append({"op": "upsert", "docs": [{"id": i, "title": "", "text": t, "fields": {}} for i, t in claims[:3]]})
    log.append({"op": "delete", "ids": gone})
    log.close()
    with threadpool_limits(limits=1):
        report = fold_collection(settings, encoder, "scifact", drift_threshold=-1.0)  # any difference is drift
    assert report["folded"] and report["fitting"] == "refitted" and report["drift"]["exceeded"]
    m = read_manifest(coll_dir(home) / report["version"])
    assert m.writes.fitting == "refitted" and m.writes.folded_seq == 2 and m.router.pairs and m.recall_policy
    assert not set(gone) & set(json.loads((coll_dir(home) / report["version"] / "doc_ids.json").read_text()))


def test_a_fold_without_the_embedding_cache_rebuilds_the_base_vectors_instead_of_encoding_them(
        pristine_home, tmp_path, claims, encoder, encoder_dir):
    """A trainer whose embedding cache is empty (another volume, or deleted) folds without encoding the live
    version's documents again: their vectors are rebuilt from docs.npy and the rotation (checked against 8
    re-encoded ones) and only the new texts are encoded; the folded version's vectors equal the base's."""
    home = copy_home(pristine_home, tmp_path / "home")
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=tmp_path / "empty-cache" / "embeddings.sqlite").resolved()
    log = FileWriteLog(coll_dir(home) / "wal")
    log.append({"op": "upsert", "docs": [{"id": i, "title": "", "text": t, "fields": {}} for i, t in claims[:3]]})
    log.close()
    base = coll_dir(home) / store.read_live_pointer(coll_dir(home))
    n = len(json.loads((base / "doc_ids.json").read_text()))
    with threadpool_limits(limits=1):
        report = fold_collection(settings, encoder, "scifact")
    assert report["folded"] and report["embeddings_from_base"] == n
    assert report["encoded_now"] == 3              # the three new texts only, not the 5,183 documents
    new = coll_dir(home) / report["version"]
    old_docs, new_docs = np.load(base / "docs.npy"), np.load(new / "docs.npy")
    assert np.allclose(new_docs[:n], old_docs, atol=1e-5)  # the same rotation, the same vectors


SCALE_UPSERTS = 10_000   # the must-show scale
SCALE_DELETES = 1_000    # half version documents, half new ones
SCALE_BATCH = 100
SEARCHER_PAUSE_S = 0.1   # between the concurrent searcher's batches
QUOTES = set('"\u201c\u201d\u201e\u201f\u00ab\u00bb')


def corpus_sentences(n: int) -> list[str]:
    """``n`` distinct sentences of SciFact abstracts (80..300 characters, no straight or curly quote marks: a
    quoted phrase restricts a search, and restricted searches do not see delta documents), none equal to a
    corpus document's text, none equal to another after case folding (the encoder is uncased: two such texts
    would tie), in a seeded order: new documents that are top-1 for their own text only if the index finds
    exactly them."""
    import random
    import re

    docs = load_corpus(SCIFACT)
    whole = {" ".join(d.encoder_text().lower().split()) for d in docs}
    seen, out = set(), []
    for d in docs:
        for s in re.split(r"(?<=[.!?])\s+", d.text):
            s = " ".join(s.split())
            key = s.lower()
            if 80 <= len(s) <= 300 and not QUOTES & set(s) and key not in seen and key not in whole:
                seen.add(key)
                out.append(s)
    assert len(out) >= n, f"SciFact has only {len(out)} usable sentences"
    random.Random(0).shuffle(out)
    return out[:n]


def test_ten_thousand_upserts_and_a_thousand_deletes_are_searchable_at_once_and_after_folding(pristine_home,
                                                                                               tmp_path):
    """The issue's must-show at its scale: 10,000 upserts and 1,000 deletes over HTTP, the deletes interleaved
    with the upserts (after each upsert batch, 5 version documents and the 5 victims of the batch before).
    Every upsert is top-1 for its own text at width "full" in the first search after its 202 (the delta
    segment) and after the fold (the version); no deleted id is returned by any search sent after its delete's
    202, checked by a searcher running beside the writes (paced: one batch of 24 searches every
    SEARCHER_PAUSE_S, so the writes are not starved on 2 cores), during the fold and after it."""
    home = copy_home(pristine_home, tmp_path / "home")
    base = store.read_live_pointer(coll_dir(home))
    base_ids = json.loads((coll_dir(home) / base / "doc_ids.json").read_text())
    base_texts = dict(zip(base_ids, json.loads((coll_dir(home) / base / "encoder_text.json").read_text())))
    texts = corpus_sentences(SCALE_UPSERTS)
    new = [(f"scale-{k:05d}", t) for k, t in enumerate(texts)]
    text_of = dict(new)
    half, stride = SCALE_DELETES // 2, 2 * SCALE_UPSERTS // SCALE_DELETES
    victims = base_ids[:half] + [i for i, _ in new[::stride]]
    assert len(victims) == SCALE_DELETES
    per_batch = half * SCALE_BATCH // SCALE_UPSERTS  # version documents deleted after each upsert batch
    assert per_batch * SCALE_UPSERTS == half * SCALE_BATCH and SCALE_BATCH % stride == 0
    text_of.update({d: " ".join(base_texts[d][:1000].replace('"', " ").split()) for d in victims[:half]})

    acked_del: set[str] = set()
    violations: list = []
    searches = [0]
    stop = threading.Event()
    lock = threading.Lock()

    def searcher(url: str) -> None:
        """Searches the deleted (and soon deleted) texts in every mode until stopped; records any deleted id
        returned by a search sent after the delete's 202."""
        with httpx.Client(base_url=url, timeout=60) as http:
            k = 0
            while not stop.is_set():
                with lock:
                    gone = set(acked_del)
                pick = victims[k % SCALE_DELETES:k % SCALE_DELETES + 8]
                k += 8
                queries = [{"query": text_of[v], "k": 10, **kw} for v in pick
                           for kw in ({"width": "full"}, {}, {"mode": "lexical"})]
                try:
                    r = http.post(f"{C}/search/batch", json={"queries": queries})
                except httpx.TransportError as e:  # a failed search is a violation too
                    violations.append(("transport", type(e).__name__, str(e)))
                    continue
                if r.status_code != 200:
                    violations.append(("status", r.status_code, r.text[:300]))
                    continue
                searches[0] += len(queries)
                for q, res in zip(queries, r.json()["results"]):
                    hit = {h["id"] for h in res["results"]} & gone
                    if hit:
                        violations.append(("deleted id returned", sorted(hit)[:3], q.get("mode"), q.get("width")))
                stop.wait(SEARCHER_PAUSE_S)

    # a query-embedding cache that holds every text searched here (the 10,000 new ones and the victims'): the
    # checks after the fold then search the folded version without encoding the 10,000 texts a second time
    with running(home, ADAWIDTH_QUERY_CACHE_ENTRIES=str(2 * SCALE_UPSERTS)) as gw, \
            httpx.Client(base_url=gw.url, timeout=120) as http:
        thread = threading.Thread(target=searcher, args=(gw.url,), daemon=True)
        thread.start()
        try:
            late = []
            for b, start in enumerate(range(0, SCALE_UPSERTS, SCALE_BATCH)):
                batch = new[start:start + SCALE_BATCH]
                r = put(http, [{"id": i, "text": t} for i, t in batch])
                assert r.status_code == 202, r.text
                r = http.post(f"{C}/search/batch", json={"queries": [{"query": t, "k": 10, "width": "full"}
                                                                     for _, t in batch]})
                assert r.status_code == 200, r.text
                top = [res["results"][0]["id"] for res in r.json()["results"]]
                late += [(i, got) for (i, _), got in zip(batch, top) if got != i]
                # deletes between the upserts: version documents, and the new victims of the batch before
                chunk = victims[b * per_batch:(b + 1) * per_batch] + [i for i, _ in new[max(start - SCALE_BATCH, 0):
                                                                                      start:stride]]
                r = http.post(f"{C}/documents/delete", json={"ids": chunk}, headers=AUTH)
                assert r.status_code == 202, r.text
                with lock:
                    acked_del.update(chunk)
            assert not late, f"{len(late)} upserts were not top-1 for their own text: {late[:5]}"
            rest = [i for i, _ in new[SCALE_UPSERTS - SCALE_BATCH::stride]]  # the new victims of the last batch
            r = http.post(f"{C}/documents/delete", json={"ids": rest}, headers=AUTH)
            assert r.status_code == 202, r.text
            with lock:
                acked_del.update(rest)
            assert acked_del == set(victims)
            w = writes(http)
            assert (w["pending_upserts"], w["pending_deletes"]) == (SCALE_UPSERTS - SCALE_DELETES // 2,
                                                                    SCALE_DELETES)

            report = fold(home, "--promote")
            assert report["folded"] and report["promoted"] and report["folded_seq"] == w["last_accepted_seq"]
            assert report["changes"] == {"upserted": SCALE_UPSERTS - half, "added": SCALE_UPSERTS - half,
                                         "replaced": 0, "deleted": half}
            assert report["documents"] == len(base_ids) + SCALE_UPSERTS - SCALE_DELETES
            assert report["embeddings_from_log"] == SCALE_UPSERTS  # nothing written is encoded twice
            wait_live(http, report["version"])
            assert (writes(http)["pending_upserts"], writes(http)["pending_deletes"]) == (0, 0)
        finally:
            stop.set()
            thread.join(120)
        assert not violations, violations[:5]
        assert searches[0] > 0
        gone = set(victims)
        kept = [(i, t) for i, t in new if i not in gone]
        wrong = []
        for start in range(0, len(kept), SCALE_BATCH):
            batch = kept[start:start + SCALE_BATCH]
            r = http.post(f"{C}/search/batch", json={"queries": [{"query": t, "k": 10, "width": "full"}
                                                                 for _, t in batch]})
            assert r.status_code == 200, r.text
            for (i, _), res in zip(batch, r.json()["results"]):
                assert res["trace"]["index_version"] == report["version"]
                if res["results"][0]["id"] != i:
                    wrong.append((i, res["results"][0]["id"]))
        assert not wrong, f"{len(wrong)} of {len(kept)} upserts not top-1 after folding: {wrong[:5]}"
        for start in range(0, SCALE_DELETES, 25):
            chunk = victims[start:start + 25]
            r = http.post(f"{C}/search/batch", json={"queries": [{"query": text_of[v], "k": 10, **kw} for v in chunk
                                                                 for kw in ({"width": "full"}, {})]})
            assert r.status_code == 200
            assert not {h["id"] for res in r.json()["results"] for h in res["results"]} & gone


def test_disk_stays_bounded_over_20_consecutive_folds_and_the_log_is_cut(pristine_home, tmp_path, claims, encoder,
                                                                        encoder_dir):
    """Twenty folds in a row (each of a few writes, promoted): the version directories never exceed keep_versions
    + live + previous, the bytes on disk stop growing once retention starts deleting, and the write-ahead log
    is cut up to what every kept version folded."""
    home = copy_home(pristine_home, tmp_path / "home")
    keep = 2
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None, keep_versions=keep,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    coll = coll_dir(home)
    sizes, counts = [], []
    for n in range(20):
        log = FileWriteLog(coll / "wal", segment_bytes=256)  # a segment a record, so whole ones can be cut
        i, t = claims[n % len(claims)]
        log.append({"op": "upsert", "docs": [{"id": f"{i}-fold{n}", "title": "", "text": f"{t} (fold {n})",
                                              "fields": {}}]})
        log.close()
        with threadpool_limits(limits=1):
            report = fold_collection(settings, encoder, "scifact", promote=True)
        assert report["folded"] and report["promoted"], report
        versions = store.list_versions(coll)
        counts.append(len(versions))
        sizes.append(sum(f.stat().st_size for v in versions for f in (coll / v).rglob("*") if f.is_file()))
        assert len(versions) <= keep + 2, (n, versions)  # the newest keep_versions, live and previous
        assert store.read_live_pointer(coll) == report["version"]
    assert max(counts) <= keep + 2  # of the 21 versions made (the build and 20 folds)
    assert max(sizes[-5:]) <= 1.05 * max(sizes[2:7])  # bounded: no growth beyond the folded documents
    folded = min(read_manifest(coll / v).writes.folded_seq for v in store.list_versions(coll))
    assert folded >= 19  # the previous version folded all but the last write
    log = FileWriteLog(coll / "wal", segment_bytes=256)
    assert [r["seq"] for r in log.replay(folded)] == list(range(folded + 1, 21))  # what a rollback needs is kept
    with pytest.raises(WalCut):
        list(log.replay(0))  # what no kept version needs is gone, and a replay from before it says so
    log.close()
    assert (coll / "wal" / "CUT").is_file() and len(list((coll / "wal").glob("*.jsonl"))) <= 3
