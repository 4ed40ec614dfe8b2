"""Live documents over real HTTP on real gateway processes (issue 18, phase 1): upserts are top-1 for their own
text at width "full" within a second of their 202; no deleted id is returned after its 202 and k results still
come back; every bad input gets its code and changes nothing; a gateway killed with -9 during a write burst
comes back with every acknowledged write (replayed from its write-ahead log).

These run a few hundred writes (UPSERTS, DELETES) on a SciFact PCA build (seconds, from the shared embedding
cache); the issue's scale of 10,000 upserts and 1,000 deletes, folded, is
``tests/integration/test_fold.py::test_ten_thousand_upserts_and_a_thousand_deletes_...``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from adawidth_client import Client, ServerExited
from engine.io.beir import load_corpus, load_qrels, load_queries
from tests.conftest import ROOT, SCIFACT, build_home, free_port
from tests.cutover_support import stop_process_group
from tests.live_support import AUTH, C, WRITE_KEY, fold, wait_live, writes  # noqa: F401  (re-exported to the tests)

pytestmark = pytest.mark.integration

UPSERTS = 240          # SciFact test queries (claims) written as new documents
DELETES = 40           # version documents deleted (plus a share of the new ones)
BATCH = 20
MAX_BODY = 64 * 1024
MAX_CHARS = 20_000


class Gateway:
    """A gateway process of the test's own (so it can be killed with -9 and restarted on the same home)."""

    def __init__(self, home: Path, **env: str):
        """``env``: extra environment variables of the process (``ADAWIDTH_...`` settings)."""
        self.home, self.proc, self.url, self.env = home, None, None, env

    def start(self) -> "Gateway":
        port = free_port()
        env = dict(os.environ, ADAWIDTH_HOME=str(self.home), ADAWIDTH_PORT=str(port), ADAWIDTH_COLLECTION="scifact",
                   ADAWIDTH_WRITE_API_KEY=WRITE_KEY, ADAWIDTH_MAX_WRITE_BODY_BYTES=str(MAX_BODY),
                   ADAWIDTH_MAX_DOCUMENT_CHARS=str(MAX_CHARS), ADAWIDTH_MAX_WRITE_BATCH="100",
                   ADAWIDTH_ONLINE_CUS_SAMPLE_RATE="0", **self.env)
        for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):
            env.pop(name, None)
        self.log_path = self.home / f"gateway-{port}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        with Client(self.url) as client:
            try:
                client.wait_ready(120, alive=lambda: self.proc.poll() is None)
            except ServerExited:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-3000:]}") from None
        return self

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        stop_process_group(self.proc, 30)


@contextmanager
def running(home: Path, **env: str):
    gw = Gateway(home, **env).start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def pristine_home(tmp_path_factory, encoder_dir, encoder) -> Path:
    return build_home(tmp_path_factory.mktemp("live-home"), encoder_dir, encoder, rotation="pca", capacity=False,
                      eval_split=None)


def copy_home(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def gateway(pristine_home, tmp_path_factory):
    home = copy_home(pristine_home, tmp_path_factory.mktemp("live-a") / "home")
    with running(home) as gw, httpx.Client(base_url=gw.url, timeout=30) as http:
        yield http


@pytest.fixture(scope="module")
def claims() -> list[tuple[str, str]]:
    """(new id, text) of SciFact test claims, written as new documents."""
    queries = load_queries(SCIFACT)
    qids = sorted(load_qrels(SCIFACT, "test"))[:UPSERTS]
    assert len(qids) == UPSERTS
    return [(f"claim-{q}", queries[q]) for q in qids]


@pytest.fixture(scope="module")
def corpus():
    return {d.doc_id: d for d in load_corpus(SCIFACT)}


def search(http, query: str, **kw) -> dict:
    """One search of ``query`` with its quote marks dropped (a quoted string is an exact-phrase restriction, and
    restricted searches do not see delta documents)."""
    r = http.post(f"{C}/search", json={"query": query.replace('"', " "), **kw})
    assert r.status_code == 200, r.text
    return r.json()


def put(http, docs, **kw):
    return http.put(f"{C}/documents", content=json.dumps(docs), headers={**AUTH, "content-type": "application/json"},
                    **kw)


def test_writes_need_the_write_key(gateway):
    assert gateway.put(f"{C}/documents", json=[{"id": "x", "text": "y"}]).json()["error"]["code"] == "missing_api_key"
    r = gateway.get(f"{C}/writes", headers={"authorization": "Bearer wrt-not-the-key-0123456789"})
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")


def metric(http, name: str, **labels) -> float:
    """The value of one series of the gateway's /metrics (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            got = series[len(name):].strip("{}")
            if ",".join(sorted(got.split(","))) == want:
                return float(value)
    return 0.0


def test_write_metrics_count_acknowledged_documents_and_the_delta_segment(gateway):
    before = metric(gateway, "adawidth_documents_written_total", collection="scifact", op="upsert")
    assert put(gateway, [{"id": f"metric-{i}", "text": f"A metrics probe document {i}."} for i in range(3)]
               ).status_code == 202
    assert put(gateway, [{"id": "", "text": "refused"}]).status_code == 422  # refused: not counted
    assert metric(gateway, "adawidth_documents_written_total", collection="scifact", op="upsert") == before + 3
    w = writes(gateway)
    assert metric(gateway, "adawidth_delta_documents", collection="scifact", kind="upsert") == w["pending_upserts"]
    assert metric(gateway, "adawidth_delta_documents", collection="scifact", kind="delete") == w["pending_deletes"]
    assert metric(gateway, "adawidth_write_applied_seq", collection="scifact") == w["last_accepted_seq"]
    assert metric(gateway, "adawidth_write_duration_seconds_count", op="upsert") >= 1


def test_each_upsert_is_top1_for_its_own_text_within_a_second(gateway, claims):
    before = writes(gateway)
    seqs = []
    for start in range(0, UPSERTS, BATCH):
        batch = claims[start:start + BATCH]
        r = put(gateway, [{"id": i, "title": "", "text": t, "fields": {"source": "claim", "n": k}}
                          for k, (i, t) in enumerate(batch)])
        acked = time.monotonic()
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["count"] == len(batch) and body["op"] == "upsert"
        seqs.append(body["seq"])
        for i, t in batch:
            while True:  # visible at once; allowed up to one second after the 202
                hits = search(gateway, t, k=10, width="full")["results"]
                if hits[0]["id"] == i:
                    break
                assert time.monotonic() - acked < 1.0, (i, hits[:3])
                time.sleep(0.05)
            assert len(hits) == 10 and hits[0]["score"] > 0.99
    assert seqs == list(range(before["last_accepted_seq"] + 1, before["last_accepted_seq"] + 1 + len(seqs)))
    w = writes(gateway)
    assert w["last_accepted_seq"] == seqs[-1] and w["pending_upserts"] == before["pending_upserts"] + UPSERTS
    assert w["live_folded_seq"] == 0 and w["live_version"]
    got = gateway.get(f"{C}/documents/{claims[0][0]}", headers=AUTH).json()
    assert got["served_from"] == "delta" and got["document"]["text"] == claims[0][1]
    assert got["document"]["fields"] == {"source": "claim", "n": 0}
    # every width policy merges the delta documents on its own scale (an auto policy, a prefix width)
    for kw in ({}, {"width": 64}, {"width": "auto", "policy": "router"}):
        assert search(gateway, claims[1][1], k=5, **kw)["results"][0]["id"] == claims[1][0]
    # NDJSON upserts replace: the new text is served, once
    nd = "\n".join(json.dumps({"id": claims[2][0], "text": t}) for t in ["Grey wolves reintroduced to Yellowstone "
                                                                         "changed the course of its rivers."]) + "\n"
    r = gateway.put(f"{C}/documents", content=nd, headers={**AUTH, "content-type": "application/x-ndjson"})
    assert r.status_code == 202
    hits = search(gateway, "wolves in Yellowstone change rivers", k=10, width="full")["results"]
    assert hits[0]["id"] == claims[2][0] and [h["id"] for h in hits].count(claims[2][0]) == 1


def test_no_deleted_id_is_returned_after_its_202(gateway, claims, corpus):
    # version documents that are their own text's top-1, and some of the new documents
    version_ids = []
    for doc_id in sorted(corpus)[:200]:
        if search(gateway, corpus[doc_id].encoder_text()[:2000], k=1, width="full")["results"][0]["id"] == doc_id:
            version_ids.append(doc_id)
        if len(version_ids) == DELETES:
            break
    assert len(version_ids) == DELETES
    new_ids = [i for i, _ in claims[3:3 + DELETES // 2]]
    texts = {d: corpus[d].encoder_text()[:2000] for d in version_ids} | dict(claims[3:3 + DELETES // 2])
    gone: set[str] = set()
    for chunk in ([*version_ids[:DELETES // 2], *new_ids[:5]], [*version_ids[DELETES // 2:], *new_ids[5:]]):
        r = gateway.post(f"{C}/documents/delete", json={"ids": chunk}, headers=AUTH)
        assert r.status_code == 202 and r.json()["count"] == len(chunk)
        gone |= set(chunk)
        for d in gone:
            for kw in ({"width": "full"}, {}, {"width": 64}, {"mode": "lexical"}, {"mode": "hybrid"}):
                hits = search(gateway, texts[d], k=10, **kw)["results"]
                assert len(hits) == 10 and not gone & {h["id"] for h in hits}, (d, kw)
    for d in (version_ids[0], new_ids[0]):
        r = gateway.get(f"{C}/documents/{d}", headers=AUTH)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_document")
    kept = sorted(set(corpus) - gone)[0]
    assert gateway.get(f"{C}/documents/{kept}", headers=AUTH).json()["served_from"] == writes(gateway)["live_version"]
    # a batch search is filtered the same way
    r = gateway.post(f"{C}/search/batch", json={"queries": [{"query": texts[d].replace('"', " "), "k": 10}
                                                            for d in sorted(gone)[:8]]})
    assert r.status_code == 200 and all(not gone & {h["id"] for h in s["results"]} for s in r.json()["results"])


BAD = [
    ([{"text": "no id"}], 422, "missing_field"),
    ([{"id": "a1"}], 422, "missing_field"),
    ([{"id": "a1", "text": None}], 422, "missing_field"),
    ([{"id": "", "text": "x"}], 422, "invalid_id"),
    ([{"id": 7, "text": "x"}], 422, "invalid_id"),
    ([{"id": "a\nb", "text": "x"}], 422, "invalid_id"), ([{"id": "a\x00b", "text": "x"}], 422, "invalid_id"),
    ([{"id": "a\x85b", "text": "x"}], 422, "invalid_id"),  # C1 (NEL): a path cannot hold it either
    ([{"id": "a1", "text": "one"}, {"id": "a1", "text": "two"}], 422, "duplicate_id"),
    ([{"id": "a1", "text": "x" * (MAX_CHARS + 1)}], 413, "document_too_long"),
    ([{"id": "a1", "title": "t" * MAX_CHARS, "text": "x"}], 413, "document_too_long"),
    ([{"id": "a1", "text": "x"}] * 0, 422, "empty_batch"),
    ([{"id": f"a{i}", "text": "x"} for i in range(101)], 413, "batch_too_large"),
    ([{"id": "a1", "text": "ok", "fields": {"f": {"nested": 1}}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"f": [1, [2]]}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"f": None}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": ["x"]}], 422, "invalid_field_value"),
    # what a filter could never match would be written, then dropped by the fold's field index
    ([{"id": "a1", "text": "ok", "fields": {"year": 1.5}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"year": [2021, 2.0]}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"tag": "x" * 257}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"n" * 65: "x"}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"title": "shadow"}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "ok", "fields": {"_id": "zzz"}}], 422, "invalid_field_value"),
    ([{"id": "a1", "text": "   ", "title": "\t\n"}], 422, "empty_document"),
    ([{"id": "a1", "text": ""}], 422, "empty_document"),
    ([{"id": "a1", "text": "\u200b\u3000"}], 422, "empty_document"),
    ([{"id": "a1", "text": "ok", "colour": "red"}], 422, "unknown_field"),
    ([{"id": "a1", "text": 42}], 422, "invalid_type"),
    ({"id": "a1", "text": "not an array"}, 422, "invalid_type"),
    (["a string"], 422, "invalid_type"),
]
GOOD = {"id": "fine-doc", "text": "A perfectly good document in a bad batch."}


@pytest.mark.parametrize("body,status,code", BAD)
def test_bad_upserts_get_their_code_and_write_nothing(gateway, body, status, code):
    before = writes(gateway)
    # a good document first: the whole batch is refused, the good one with it
    r = put(gateway, [GOOD, *body] if isinstance(body, list) and code != "empty_batch" else body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert writes(gateway) == before
    assert gateway.get(f"{C}/documents/fine-doc", headers=AUTH).status_code == 404


@pytest.mark.parametrize("raw,ctype,status,code", [
    (b'[{"id": "a1", "text": "caf\xe9"}]', "application/json", 400, "invalid_utf8"),
    (b'[{"id": "a1", "text": "\\ud800"}]', "application/json", 422, "invalid_unicode"),
    (b'[{"id": "a1", "text": "ok", "fields": {"f": "\\udfff"}}]', "application/json", 422, "invalid_unicode"),
    (b'[{"id": "\\ud800", "text": "ok"}]', "application/json", 422, "invalid_unicode"),
    (b'[{"id": "a1", "text": "ok", "fields": {"f": NaN}}]', "application/json", 422, "invalid_field_value"),
    (b'[{"id": "a1", "text": "ok"', "application/json", 400, "invalid_json"),
    (b'{"id": "a1", "text": "ok"}\n{"id": "a1", "text": "again"}\n', "application/x-ndjson", 422, "duplicate_id"),
    (b'{"id": "a1", "text": "ok"}\nnot json\n', "application/x-ndjson", 400, "invalid_json"),
    (b'[{"id": "a1", "text": "' + b"x" * MAX_BODY + b'"}]', "application/json", 413, "body_too_large"),
    (b'[{"id": "a1", "text": "ok"}]', "text/plain", 415, "unsupported_media_type"),
])
def test_bad_bodies_get_their_code_and_write_nothing(gateway, raw, ctype, status, code):
    before = writes(gateway)
    r = gateway.put(f"{C}/documents", content=raw, headers={**AUTH, "content-type": ctype})
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert writes(gateway) == before


@pytest.mark.parametrize("body,status,code", [
    ({"ids": []}, 422, "empty_batch"), ({"ids": ["a", "a"]}, 422, "duplicate_id"), ({"ids": "a"}, 422, "invalid_type"),
    ({"ids": [""]}, 422, "invalid_id"), ({"ids": [None]}, 422, "invalid_id"), ({}, 422, "missing_field"),
    ({"ids": ["a"], "all": True}, 422, "unknown_field"), (["a"], 422, "invalid_type"),
])
def test_bad_deletes_get_their_code_and_write_nothing(gateway, body, status, code):
    before = writes(gateway)
    r = gateway.post(f"{C}/documents/delete", json=body, headers=AUTH)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert writes(gateway) == before


def test_an_unknown_collection_is_404_on_every_write_route(gateway):
    for r in (gateway.put("/v1/collections/nope/documents", json=[GOOD], headers=AUTH),
              gateway.post("/v1/collections/nope/documents/delete", json={"ids": ["a"]}, headers=AUTH),
              gateway.get("/v1/collections/nope/documents/a", headers=AUTH),
              gateway.get("/v1/collections/nope/writes", headers=AUTH)):
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_collection")


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
                   st.text(max_size=20))
_json = st.recursive(_scalar, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c,
                                                                                             max_size=4)),
                     max_leaves=12)
_doc = st.fixed_dictionaries({"id": st.one_of(st.text(max_size=8), _json), "text": st.one_of(st.text(max_size=30), _json)},
                             optional={"title": st.one_of(st.text(max_size=10), _json), "x": _json,
                                       "fields": st.one_of(st.dictionaries(st.text(max_size=5), _json, max_size=3),
                                                           _json)})


def test_generated_writes_get_a_4xx_and_write_nothing_or_a_202_and_one_record(gateway):
    """Hypothesis bodies (documents of any JSON shape, as JSON or NDJSON, and as delete bodies): never a 5xx;
    a refused write leaves /writes as it was, an accepted one adds exactly one record."""
    seen = set()

    @settings(max_examples=120, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body=st.one_of(st.lists(_doc, max_size=4), _json), ndjson=st.booleans())
    # explicit examples always run: accepted writes are exercised whatever the derandomized draw holds
    @example(body=[{"id": "gen-ok-1", "text": "a generated document about sea urchins"}], ndjson=False)
    @example(body=[{"id": "gen-ok-2", "title": "T", "text": "another generated one", "fields": {"lang": "en"}}],
             ndjson=True)
    def check(body, ndjson):
        before = writes(gateway)
        if ndjson and isinstance(body, list):
            r = gateway.put(f"{C}/documents", content="\n".join(json.dumps(x) for x in body),
                            headers={**AUTH, "content-type": "application/x-ndjson"})
        else:
            r = put(gateway, body)
        seen.add(r.status_code)
        assert r.status_code in (202, 400, 413, 422), r.text
        after = writes(gateway)
        assert after["last_accepted_seq"] == before["last_accepted_seq"] + (r.status_code == 202)
        if r.status_code != 202:
            assert after == before
        r = gateway.post(f"{C}/documents/delete", content=json.dumps({"ids": body}),
                         headers={**AUTH, "content-type": "application/json"})
        assert r.status_code in (202, 400, 413, 422), r.text

    check()
    assert {202, 422} <= seen


def test_a_second_replica_on_the_file_log_is_degraded_refuses_writes_and_takes_over_when_the_writer_stops(
        pristine_home, tmp_path, claims):
    """Two gateways on one home without Redis: the first holds the write-ahead log and is ready; the second
    cannot open it, answers writes 503 writes_unavailable and says on /readyz (200 degraded) that it does not
    see the writes not yet folded, rather than reporting ready while it misses them.  When the writer stops, the
    second takes the log over within its wal_takeover_interval_s: it replays the writer's writes (its search
    returns the writer's document), turns ready and accepts writes."""
    home = copy_home(pristine_home, tmp_path / "home")
    with running(home) as a, running(home, ADAWIDTH_WAL_TAKEOVER_INTERVAL_S="0.5") as b, \
            httpx.Client(base_url=a.url, timeout=30) as ha, httpx.Client(base_url=b.url, timeout=30) as hb:
        r = put(ha, [{"id": "writer-doc", "text": claims[0][1]}])
        assert r.status_code == 202, r.text
        ready = ha.get("/readyz").json()
        assert ready["status"] == "ready", ready["degraded"]
        # the version's documents, and apart from them the writes not yet folded
        pending = {"upserts": 1, "deletes": 0}
        assert ready["collections"]["scifact"]["pending_writes"] == pending
        assert ha.get("/v1/collections").json()["collections"][0]["pending_writes"] == pending
        assert hb.get("/readyz").json()["collections"]["scifact"]["pending_writes"] is None  # no write state here
        r = hb.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "degraded", r.json()
        reason = [d for d in r.json()["degraded"] if "write-ahead log not open" in d]
        assert len(reason) == 1 and "WalLocked" in reason[0] and "REDIS_URL" in reason[0], r.json()["degraded"]
        r = put(hb, [{"id": "second-doc", "text": claims[1][1]}])
        assert (r.status_code, r.json()["error"]["code"]) == (503, "writes_unavailable"), r.text
        top = [search(h, claims[0][1], k=10, width="full")["results"][0]["id"] for h in (ha, hb)]
        assert top[0] == "writer-doc" and top[1] != "writer-doc"  # what the reason says
        assert "takes the log over within 0.5 s" in reason[0]

        a.stop()                                     # the writer goes: its lock with it
        deadline = time.monotonic() + 20
        while (ready := hb.get("/readyz").json())["status"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready["status"] == "ready", ready["degraded"]
        assert search(hb, claims[0][1], k=10, width="full")["results"][0]["id"] == "writer-doc"  # replayed
        assert ready["collections"]["scifact"]["pending_writes"] == pending  # the writer's, replayed
        r = put(hb, [{"id": "second-doc", "text": claims[1][1]}])
        assert r.status_code == 202 and r.json()["seq"] == 2, r.text  # after the writer's seq 1, not reusing it
        assert search(hb, claims[1][1], k=10, width="full")["results"][0]["id"] == "second-doc"


def test_every_acknowledged_write_survives_kill_9_during_a_burst(pristine_home, tmp_path, claims):
    home = copy_home(pristine_home, tmp_path / "home")
    gw = Gateway(home).start()
    acked_up: dict[str, int] = {}     # id -> seq of its 202
    acked_del: dict[str, int] = {}
    tried_del: set[str] = set()      # deletes sent (one batch in flight at a time, by writer 0)
    sent: set[str] = set()
    stop = threading.Event()
    lock = threading.Lock()

    def writer(w: int):
        with httpx.Client(base_url=gw.url, timeout=10) as http:
            n = 0
            while not stop.is_set():
                ids = [f"burst-{w}-{n}-{j}" for j in range(5)]
                n += 1
                with lock:
                    sent.update(ids)
                docs = [{"id": i, "text": f"{claims[(hash(i) % UPSERTS)][1]} (burst copy {i})"} for i in ids]
                try:
                    r = put(http, docs)
                    if r.status_code == 202:
                        with lock:
                            acked_up.update({i: r.json()["seq"] for i in ids})
                    if w == 0 and n % 2 == 0:  # delete half of what this writer got acknowledged
                        with lock:
                            victims = [i for i in acked_up if i.startswith("burst-0-") and i not in tried_del][:3]
                            tried_del.update(victims)
                        r = http.post(f"{C}/documents/delete", json={"ids": victims}, headers=AUTH)
                        if r.status_code == 202:
                            with lock:
                                acked_del.update({i: r.json()["seq"] for i in victims})
                except httpx.TransportError:
                    return  # the gateway is gone

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(acked_up) < 150 and time.monotonic() < deadline:
            time.sleep(0.02)
        gw.kill9()  # mid-burst: requests are in flight
        stop.set()
        for t in threads:
            t.join(30)
        assert len(acked_up) >= 150 and acked_del
        gw.start()  # the same home: the log is replayed before /readyz says ready
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            w = writes(http)
            assert w["last_accepted_seq"] >= max([*acked_up.values(), *acked_del.values()])
            present = set()
            for i in sorted(sent):
                r = http.get(f"{C}/documents/{i}", headers=AUTH)
                assert r.status_code in (200, 404), r.text
                if r.status_code == 200:
                    assert r.json()["served_from"] == "delta"
                    present.add(i)
            live = set(acked_up) - set(acked_del)
            # every acknowledged upsert is back, but for the victims of a delete in flight at the kill
            assert live - present <= tried_del - set(acked_del), sorted(live - present)[:5]
            assert not present & set(acked_del)                            # every acknowledged delete holds
            unacked = present - set(acked_up)
            assert len(unacked) <= 3 * 5                                   # at most the batches in flight
            assert w["pending_upserts"] == len(present)                    # counted exactly
            sample = sorted(live & present)[:10]
            r = http.post(f"{C}/search/batch", json={"queries": [
                {"query": f"{claims[(hash(i) % UPSERTS)][1]} (burst copy {i})".replace('"', " "), "k": 10,
                 "width": "full"}
                for i in sample]})
            assert [s["results"][0]["id"] for s in r.json()["results"]] == sample
            # the log takes new writes after the torn tail, numbered on
            r = put(http, [{"id": "after-restart", "text": "Written after the crash."}])
            assert r.status_code == 202 and r.json()["seq"] == w["last_accepted_seq"] + 1
            last_seq = r.json()["seq"]

            # folded into a version: every write the log holds is in it, counted exactly, and its embeddings come
            # from the log (nothing is encoded again)
            base_docs = json.loads((home / "indexes" / "scifact" / writes(http)["live_version"] / "doc_ids.json")
                                   .read_text())
            report = fold(home, "--promote")
            assert report["folded"] and report["promoted"] and report["folded_seq"] == last_seq
            assert report["encoded_now"] == 0 and report["embeddings_from_log"] >= len(present) + 1
            wait_live(http, report["version"])
            w = writes(http)
            assert (w["live_folded_seq"], w["pending_upserts"], w["pending_deletes"]) == (last_seq, 0, 0)
            assert report["documents"] == len(base_docs) + len(present) + 1
            for i in sorted(present) + ["after-restart"]:
                r = http.get(f"{C}/documents/{i}", headers=AUTH)
                assert r.status_code == 200 and r.json()["served_from"] == report["version"], (i, r.text)
            for i in sorted(acked_del):
                assert http.get(f"{C}/documents/{i}", headers=AUTH).status_code == 404, i
            r = http.post(f"{C}/search/batch", json={"queries": [
                {"query": f"{claims[(hash(i) % UPSERTS)][1]} (burst copy {i})".replace('"', " "), "k": 10,
                 "width": "full"} for i in sample]})
            assert [s["results"][0]["id"] for s in r.json()["results"]] == sample
            assert {s["trace"]["index_version"] for s in r.json()["results"]} == {report["version"]}
    finally:
        stop.set()
        gw.stop()
