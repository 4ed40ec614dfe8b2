"""Writes and searches at once (issue 18): a headless locust run (``python -m loadtest.run --writers 1``, its own
process) of search users and a writer user (upserts of SciFact documents and deletes, with the write key) against
a real gateway process.  No search and no write fails, the gateway answers no 5xx, and afterwards every
acknowledged (202) write is what searches see: each upserted document is the top-1 of its own text at width
``full`` and each deleted one is returned by no search and by no ``GET``.

Latency under the mix is a benchmark's business (``bench/mixed_rw.py``), not this test's.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import httpx
import pytest

from loadtest import DELETE_NAME, UPSERT_NAME, acknowledged_state
from tests.conftest import ROOT
from tests.integration.test_live_documents import copy_home, pristine_home, running, search  # noqa: F401
from tests.live_support import AUTH, C, WRITE_KEY, writes

pytestmark = pytest.mark.integration

SEARCH_NAMES = {"/v1/search auto", "/v1/search router+rho", "/v1/search default", "/v1/search fixed width",
                "/v1/search full", "/v1/search invalid (4xx expected)"}


def test_mixed_locust_run_fails_nothing_and_every_acknowledged_write_is_searchable(pristine_home, tmp_path):
    home = copy_home(pristine_home, tmp_path / "home")
    write_log = tmp_path / "writes.jsonl"
    with running(home) as gw, httpx.Client(base_url=gw.url, timeout=30) as http:
        r = subprocess.run(
            [sys.executable, "-m", "loadtest.run", "--host", gw.url, "--home", str(tmp_path), "--users", "3",
             "--writers", "1", "--spawn-rate", "4", "--seconds", "12", "--write-key", WRITE_KEY, "--write-log",
             str(write_log), "--out", str(tmp_path / "results"), "--stem", "mixed"],
            cwd=ROOT, env=dict(os.environ, ADAWIDTH_LOCUST_WRITE_WAIT="0.05,0.2", ADAWIDTH_LOCUST_RUN="t"),
            capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        report = json.loads((tmp_path / "results" / "mixed.json").read_text())
        rows = {row["name"]: row for row in report["rows"]}
        assert report["failures"] == [] and all(row["failures"] == 0 for row in rows.values())
        assert report["gateway_5xx"] == 0 and report["writers"] == 1
        assert rows["/v1/search auto"]["requests"] >= 10 and set(rows) - SEARCH_NAMES == {UPSERT_NAME, DELETE_NAME}
        assert rows[UPSERT_NAME]["requests"] >= 2 and rows[DELETE_NAME]["requests"] >= 1

        log = [json.loads(line) for line in write_log.read_text().splitlines()]
        # every write sent was acknowledged (202): the per-request samples also hold the requests that ended
        # during locust's stop timeout, after its stats were written
        samples = list(csv.reader((tmp_path / "locust" / "run_samples.csv").read_text().splitlines()))
        sent = [ok for name, _, ok in samples if name in (UPSERT_NAME, DELETE_NAME)]
        assert len(sent) == len(log) >= rows[UPSERT_NAME]["requests"] + rows[DELETE_NAME]["requests"]
        assert set(sent) == {"1"} and {ok for *_, ok in samples} == {"1"}
        seqs = [rec["seq"] for rec in log]
        assert seqs == sorted(set(seqs)), "one writer: its acknowledged seqs increase"
        alive, deleted = acknowledged_state(log)
        assert alive and deleted
        w = writes(http)
        assert w["last_accepted_seq"] == seqs[-1]
        assert (w["pending_upserts"], w["pending_deletes"]) == (len(alive), len(deleted)), w

        for doc_id, text in alive.items():
            hits = search(http, text, k=10, width="full")["results"]
            assert hits[0]["id"] == doc_id, (doc_id, hits[:3])
            got = http.get(f"{C}/documents/{doc_id}", headers=AUTH)
            assert got.status_code == 200 and got.json()["served_from"] == "delta"
        for doc_id, text in deleted.items():
            for kw in ({"width": "full"}, {}):
                assert doc_id not in {h["id"] for h in search(http, text, k=10, **kw)["results"]}
            got = http.get(f"{C}/documents/{doc_id}", headers=AUTH)
            assert (got.status_code, got.json()["error"]["code"]) == (404, "unknown_document")
