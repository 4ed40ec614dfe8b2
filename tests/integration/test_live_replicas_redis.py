"""Live documents on two gateway replicas sharing one Redis write-ahead log and one index home (issue 18).

A private ``redis-server`` (append-only file, fsync per write: the log's durability check passes), the Redis
registry, and two real gateway processes (``a``, ``b``) that both accept writes: an upsert to ``a`` is top-1
for its own text at width ``full`` on ``b`` within a second of its 202; a delete on ``b`` hides the document on
``a``; concurrent writes to both get distinct, gapless sequence numbers and both replicas end with the same
documents and the same ``last_accepted_seq``; ``python -m trainer fold --promote`` with ``REDIS_URL`` folds
them and both replicas go live on the fold; a replica killed with -9 in a write burst loses no 202'd write.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from engine.io.beir import load_qrels, load_queries
from engine.registry.redis_store import RedisRegistry
from engine.wal_redis import RedisWriteLog
from tests.conftest import SCIFACT, VAR, build_home
from tests.cutover_support import RedisServer, readyz, start_gateways, trainer_cli

pytestmark = pytest.mark.integration

WRITE_KEY = "wrt-Rp4Lx8Vq2Kd7Mm3Tz6Hc"
AUTH = {"authorization": f"Bearer {WRITE_KEY}"}
C = "/v1/collections/scifact"
TRAINER_ENV = {"ADAWIDTH_EMBEDDING_CACHE": str(VAR / "cache" / "embeddings.sqlite"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def claims() -> list[tuple[str, str]]:
    """(new id, text) of SciFact test claims (quote marks dropped: a quoted phrase restricts a search)."""
    queries = load_queries(SCIFACT)
    return [(f"rc-{q}", queries[q].replace('"', " ")) for q in sorted(load_qrels(SCIFACT, "test"))[:120]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, encoder_dir, encoder):
    root = tmp_path_factory.mktemp("replicas-redis")
    home = build_home(root / "home", encoder_dir, encoder, rotation="pca", capacity=False, eval_split=None)
    srv = RedisServer(root / "redis")
    srv.start()
    version = sorted(p.name for p in (home / "indexes" / "scifact").iterdir() if p.name[0].isdigit())[-1]
    for args in (("publish", "scifact", version), ("promote", "scifact", version)):
        r = trainer_cli(home, srv.url, *args)
        assert r.returncode == 0, r.stderr
    env = dict(ADAWIDTH_WRITE_API_KEY=WRITE_KEY, ADAWIDTH_ONLINE_CUS_SAMPLE_RATE="0", ADAWIDTH_MAX_WRITE_BATCH="100")
    gws = start_gateways(home, srv.url, ["a", "b"], **env)
    state = {"home": home, "redis": srv, "gateways": gws, "version": version, "env": env}
    try:
        yield state
    finally:
        for g in state["gateways"]:
            g.stop()
        srv.kill()


def http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30)


def put(c: httpx.Client, docs: list[dict]) -> httpx.Response:
    return c.put(f"{C}/documents", json=docs, headers=AUTH)


def top_ids(c: httpx.Client, text: str, k: int = 10, **kw) -> list[str]:
    body = {"query": text, "k": k, **({} if "mode" in kw else {"width": "full"}), **kw}
    r = c.post(f"{C}/search", json=body)
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["results"]]


def writes(c: httpx.Client) -> dict:
    r = c.get(f"{C}/writes", headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def within(seconds: float, check, what: str):
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not within {seconds} s"
        time.sleep(0.02)


def test_writes_on_one_replica_are_searchable_on_the_other_and_deletes_cross_too(cluster, claims):
    a_gw, b_gw = cluster["gateways"]
    with http(a_gw.url) as a, http(b_gw.url) as b:
        assert writes(a)["log"] == "redis" and writes(a)["last_accepted_seq"] == writes(b)["last_accepted_seq"] == 0
        for doc_id, text in claims[:10]:
            r = put(a, [{"id": doc_id, "text": text}])
            assert r.status_code == 202, r.text
            acked = time.monotonic()
            assert top_ids(a, text)[0] == doc_id  # read-your-writes on the replica that took it
            within(1.0, lambda: top_ids(b, text)[0] == doc_id, f"{doc_id} on b")
            assert time.monotonic() - acked < 1.0
        got = b.get(f"{C}/documents/{claims[0][0]}", headers=AUTH).json()
        assert got["served_from"] == "delta" and got["seq"] == 1 and got["document"]["text"] == claims[0][1]
        # deletes on b hide the documents on a (every mode: the version's copies and the delta's)
        gone = [claims[1][0], claims[2][0]]
        r = b.post(f"{C}/documents/delete", json={"ids": gone}, headers=AUTH)
        assert r.status_code == 202 and r.json()["seq"] == 11
        for doc_id, text in (claims[1], claims[2]):
            assert doc_id not in top_ids(b, text)
            within(1.0, lambda: doc_id not in top_ids(a, text), f"delete of {doc_id} on a")
            assert doc_id not in top_ids(a, text, mode="hybrid") and doc_id not in top_ids(a, text, width=64)
        wa, wb = writes(a), writes(b)
        assert wa["last_accepted_seq"] == wb["last_accepted_seq"] == 11
        assert wa["applied_seq"] == wb["applied_seq"] == 11
        for w in (wa, wb):
            assert (w["pending_upserts"], w["pending_deletes"]) == (8, 2)
        assert wa["follower_error"] is None and wb["follower_error"] is None


def test_concurrent_writes_to_both_replicas_are_ordered_once(cluster, claims):
    gws = cluster["gateways"]
    seqs: list[list[int]] = [[], []]
    batch = claims[10:50]

    def writer(k: int):
        with http(gws[k].url) as c:
            for i in range(k, len(batch), 2):
                doc_id, text = batch[i]
                r = put(c, [{"id": doc_id, "text": text, "fields": {"replica": gws[k].name}}])
                assert r.status_code == 202, r.text
                seqs[k].append(r.json()["seq"])

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_seqs = sorted(seqs[0] + seqs[1])
    assert all_seqs == list(range(12, 12 + len(batch)))
    with http(gws[0].url) as a, http(gws[1].url) as b:
        within(2.0, lambda: writes(a)["applied_seq"] == writes(b)["applied_seq"] == all_seqs[-1], "catch-up")
        wa, wb = writes(a), writes(b)
        assert wa["last_accepted_seq"] == wb["last_accepted_seq"] == all_seqs[-1]
        assert wa["pending_upserts"] == wb["pending_upserts"] == 8 + len(batch)
        for doc_id, text in batch[::7]:
            assert top_ids(a, text)[0] == doc_id and top_ids(b, text)[0] == doc_id


def test_a_fold_with_redis_folds_every_replicas_writes_and_both_go_live(cluster, claims):
    home, url = cluster["home"], cluster["redis"].url
    before = cluster["version"]
    r = trainer_cli(home, url, "fold", "--collection", "scifact", "--promote", timeout_s=600, extra_env=TRAINER_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    new = RedisRegistry(url).get("scifact").live
    assert new != before
    log = RedisWriteLog(url, "scifact", check_durability=False)
    last = log.last_seq
    log.close()
    with http(cluster["gateways"][0].url) as a, http(cluster["gateways"][1].url) as b:
        for c in (a, b):
            within(30.0, lambda: writes(c)["live_version"] == new, "the fold going live")
            w = writes(c)
            assert w["live_folded_seq"] == last and (w["pending_upserts"], w["pending_deletes"]) == (0, 0)
            assert top_ids(c, claims[0][1])[0] == claims[0][0]  # from the folded version now
            assert claims[1][0] not in top_ids(c, claims[1][1])
            got = c.get(f"{C}/documents/{claims[0][0]}", headers=AUTH).json()
            assert got["served_from"] == new
    cluster["version"] = new


def test_a_replica_killed_mid_write_loses_no_acknowledged_write(cluster, claims):
    a_gw, b_gw = cluster["gateways"]
    acked: list[tuple[str, str, int]] = []
    stop = threading.Event()
    burst = claims[50:120]

    def writer():
        with http(a_gw.url) as c:
            for doc_id, text in burst:
                if stop.is_set():
                    return
                try:
                    r = put(c, [{"id": doc_id, "text": text}])
                except httpx.HTTPError:
                    return  # killed: this write was never acknowledged
                if r.status_code == 202:
                    acked.append((doc_id, text, r.json()["seq"]))

    t = threading.Thread(target=writer)
    t.start()
    within(60.0, lambda: len(acked) >= 10, "ten acknowledged writes")
    os.killpg(a_gw.proc.pid, signal.SIGKILL)
    a_gw.proc.wait(30)
    stop.set()
    t.join(60)
    assert 10 <= len(acked) < len(burst), len(acked)
    with http(b_gw.url) as b:
        last = acked[-1][2]
        within(2.0, lambda: writes(b)["applied_seq"] >= last, "b applying a's writes")
        for doc_id, text, _ in acked:
            assert top_ids(b, text)[0] == doc_id, doc_id
    # a comes back with every acknowledged write (replayed from the stream after the live version's folded seq)
    a2, = start_gateways(cluster["home"], cluster["redis"].url, ["a"], **cluster["env"])
    cluster["gateways"][0] = a2
    with http(a2.url) as a, http(b_gw.url) as b:
        assert readyz(a2.url)[1]["index_version"] == cluster["version"]
        for doc_id, text, _ in acked:
            assert top_ids(a, text)[0] == doc_id, doc_id
        assert writes(a)["last_accepted_seq"] == writes(b)["last_accepted_seq"]


def test_redis_down_answers_writes_503_and_the_replicas_catch_up_on_its_return(cluster, claims):
    srv, (a_gw, b_gw) = cluster["redis"], cluster["gateways"]
    doc = {"id": "while-down", "text": "Grey wolves reintroduced to Yellowstone changed the course of its rivers."}
    srv.kill()
    try:
        with http(a_gw.url) as a, http(b_gw.url) as b:
            r = put(a, [doc])
            assert (r.status_code, r.json()["error"]["code"]) == (503, "writes_unavailable")
            assert "retry-after" in r.headers
            within(10.0, lambda: any("write-ahead log follower" in d for d in readyz(b_gw.url)[1]["degraded"]),
                   "b degraded")
            assert readyz(b_gw.url)[0] == 200 and top_ids(b, claims[0][1])[0] == claims[0][0]  # reads go on
            srv.start()  # same port and append-only file: every acknowledged record is back
            within(15.0, lambda: put(a, [doc]).status_code == 202, "writes again")
            within(1.0, lambda: top_ids(b, doc["text"])[0] == doc["id"], "b catching up")
            within(10.0, lambda: readyz(b_gw.url)[1]["status"] == "ready", "b ready again")
            assert writes(a)["last_accepted_seq"] == writes(b)["last_accepted_seq"] == writes(b)["applied_seq"]
    finally:
        if srv.proc is None:
            srv.start()
