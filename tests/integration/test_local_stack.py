"""deploy/local/stack.py brings up redis, the trainer daemon, two gateways and Prometheus as processes.

The smoke test runs the script as an operator would (``up``, ``status``, ``down``) on a home holding the
session's SciFact version, queries both gateways over HTTP, and reads Prometheus's HTTP API: every scrape
target up, our series present for both replicas and the trainer, our rules loaded.  Needs
``redis-server`` and Debian's ``prometheus`` (``make test`` installs prometheus; the test fails without them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT, make_cutover_home

pytestmark = pytest.mark.integration

STACK = ROOT / "deploy" / "local" / "stack.py"


def stack(home, *args, timeout_s=400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("ADAWIDTH_")}
    return subprocess.run([sys.executable, str(STACK), *args, "--home", str(home)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def prom_query(base: str, expr: str) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def pid_alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def local_stack(tmp_path_factory, scifact_version, encoder_dir):
    for exe in ("redis-server", "prometheus"):
        assert shutil.which(exe), f"{exe} is not installed (apt-get install redis-server prometheus)"
    home = make_cutover_home(tmp_path_factory.mktemp("local-stack") / "home", encoder_dir, [scifact_version])
    r = stack(home, "up", "--scrape-seconds", "1", "--timeout", "300")
    if r.returncode != 0:
        stack(home, "down")
        pytest.fail(f"stack up failed: {r.stdout[-2000:]} {r.stderr[-4000:]}")
    info = json.loads(r.stdout)
    try:
        yield home, info
    finally:
        stack(home, "down")


def test_both_gateways_serve_the_published_version(local_stack, scifact_version):
    _, info = local_stack
    comps = info["components"]
    assert info["index_version"] == scifact_version.name
    answers = {}
    for name in ("gateway-blue", "gateway-green"):
        url = comps[name]["url"]
        ready = httpx.get(f"{url}/readyz", timeout=5).json()
        assert ready["index_version"] == scifact_version.name and ready["registry"] == "redis", ready
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
        r = httpx.post(f"{url}/v1/search", json={"query": "vitamin D deficiency and multiple sclerosis", "k": 5,
                                                 "width": "auto"}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["results"]) == 5 and body["trace"]["index_version"] == scifact_version.name
        answers[name] = [h["id"] for h in body["results"]]
        bad = httpx.post(f"{url}/v1/search", json={"query": "x", "k": 0}, timeout=10)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "k_out_of_range"
    assert answers["gateway-blue"] == answers["gateway-green"]


def test_prometheus_scrapes_both_gateways_and_the_trainer(local_stack, scifact_version):
    _, info = local_stack
    comps = info["components"]
    prom = comps["prometheus"]["url"]
    gw_instances = {f"127.0.0.1:{comps[n]['port']}" for n in ("gateway-blue", "gateway-green")}
    trainer_instance = f"127.0.0.1:{comps['trainer']['port']}"
    # make sure each gateway has served a search before the scrapes we look at
    for name in ("gateway-blue", "gateway-green"):
        httpx.post(f"{comps[name]['url']}/v1/search", json={"query": "statins and heart disease"}, timeout=30)
    deadline = time.monotonic() + 90
    while True:
        targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        health = {t["labels"]["instance"]: (t["labels"]["job"], t["health"]) for t in targets}
        searches = prom_query(prom, 'adawidth_http_requests_total{route="/v1/search",status="2xx"}')
        if (all(h == "up" for _, h in health.values()) and len(health) == 3
                and {s["metric"]["instance"] for s in searches} == gw_instances):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"targets {health}, search series {searches}")
        time.sleep(1)
    assert health == {**{i: ("adawidth-gateway", "up") for i in gw_instances},
                      trainer_instance: ("adawidth-trainer", "up")}
    up = prom_query(prom, "up")
    assert {s["metric"]["instance"]: s["value"][1] for s in up} == {i: "1" for i in gw_instances | {trainer_instance}}
    live = prom_query(prom, "adawidth_live_version_info")
    assert {s["metric"]["instance"] for s in live} == gw_instances
    assert {s["metric"]["version"] for s in live} == {scifact_version.name}
    polls = prom_query(prom, "adawidth_trainer_polls_total")
    assert [s["metric"]["instance"] for s in polls] == [trainer_instance] and float(polls[0]["value"][1]) >= 1
    cus = prom_query(prom, "adawidth_capacity_cus_label_free_ratio")
    assert cus and cus[0]["metric"]["version"] == scifact_version.name
    rules = httpx.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
    alerts = {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"}
    assert {"AdawidthReplicasOnDifferentVersions", "AdawidthTrainerNotScraped"} <= alerts
    # the skew alert's expression evaluates on the live data: both replicas on one version, so nothing fires
    firing = [a["labels"]["alertname"] for a in httpx.get(f"{prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"]]
    assert "AdawidthReplicasOnDifferentVersions" not in firing


def test_status_then_down_stops_every_process(local_stack):
    home, info = local_stack
    r = stack(home, "status")
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(r.stdout)
    assert set(st["components"]) == {"redis", "trainer", "gateway-blue", "gateway-green", "prometheus"}
    assert all(c["healthy"] for c in st["components"].values()), st
    pids = [c["pid"] for c in info["components"].values()]
    r = stack(home, "down")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["stopped"]) == set(info["components"])
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids)
    r = stack(home, "status")
    assert r.returncode == 1 and json.loads(r.stdout)["running"] is False
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{info['components']['gateway-blue']['url']}/healthz", timeout=2)
