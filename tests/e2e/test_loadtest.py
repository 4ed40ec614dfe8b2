"""loadtest/run.py drives the session's gateway with locust (its own process) and writes its report.

Every request type of the locust scenario is sent, no request fails (so every invalid request got its
documented 4xx status and error code, and every valid one a well-formed 200), the gateway counted no 5xx,
and the report holds p50/p95/p99 and throughput.  Needs locust (the ``loadtest`` extra; ``make test``
installs it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

NAMES = {"/v1/search auto", "/v1/search router+rho", "/v1/search default", "/v1/search fixed width",
         "/v1/search full", "/v1/search invalid (4xx expected)"}


def test_headless_locust_run_against_the_gateway(gateway_url, tmp_path):
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "loadtest.run", "--host", gateway_url, "--home",
                        str(tmp_path), "--users", "4", "--spawn-rate", "4", "--seconds", "15", "--out", str(out),
                        "--stem", "smoke"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "smoke.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    # 15 s at up to 4 users: the 5 % share of invalid requests is sent too (seeded users)
    assert set(rows) == NAMES, set(rows)
    assert all(row["failures"] == 0 for row in rows.values()), report["failures"]
    assert rows["/v1/search invalid (4xx expected)"]["requests"] >= 1
    agg = report["aggregate"]
    assert agg["requests"] >= 50 and agg["rps"] > 0
    assert 0 < agg["p50_ms"] <= agg["p95_ms"] <= agg["p99_ms"]
    assert report["gateway_5xx"] == 0
    assert "| /v1/search auto |" in (out / "smoke.md").read_text()
