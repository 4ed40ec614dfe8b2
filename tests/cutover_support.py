"""Helpers of the cutover tests: a private redis-server, gateway processes, a concurrent load generator,
the trainer CLI, and the offline reference of served answers."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from adawidth_client import Client, NotReadyError, ServerExited
from engine.index import IndexVersion
from engine.io.beir import load_collection
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from tests.conftest import ROOT, SCIFACT, free_port

ADMIN_KEY = "adm-cutover-9Xq4Lm2Vz7Rk5Tw8Hb"


def stop_process_group(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL it after ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class RedisServer:
    """A redis-server of the test's own on a free port, append-only file in ``workdir`` (survives restarts)."""

    def __init__(self, workdir: Path):
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server); the cutover tests need it")
        self.exe, self.workdir, self.port = exe, Path(workdir), free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.workdir / "redis.log", "a")
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.5).ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(self.workdir / 'redis.log').read_text()[-1000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL (a crash, not a clean shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@dataclass
class Gateway:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process_group(self.proc, 30)


def judged_test_queries(n: int) -> list[str]:
    """The texts of the first ``n`` judged SciFact test queries (by query id): a cutover test's load."""
    col = load_collection(SCIFACT, "test")
    return [col.queries[q] for q in sorted(col.judged_queries())][:n]


def gateway_env(home: Path, redis_url: str | None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",) and not k.startswith("ADAWIDTH_")}
    env.update(ADAWIDTH_HOME=str(home), ADAWIDTH_COLLECTION="scifact", ADAWIDTH_ADMIN_API_KEY=ADMIN_KEY,
               ADAWIDTH_REGISTRY_POLL_S="0.5", ADAWIDTH_REGISTRY_BACKOFF_MAX_S="1", ADAWIDTH_ENCODER_THREADS="1")
    if redis_url:
        env["ADAWIDTH_REDIS_URL"] = redis_url
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_gateways(home: Path, redis_url: str | None, names: list[str], timeout_s: float = 180,
                   **extra_env) -> list[Gateway]:
    """Start one ``python -m service`` per name (in parallel) and wait until each answers /readyz 200.

    ``extra_env``: more settings of the gateways (e.g. ``ADAWIDTH_STAGE1_BACKEND="milvus"``)."""
    gws = []
    for name in names:
        port = free_port()
        log_path = home / f"gateway-{name}.log"
        env = gateway_env(home, redis_url, ADAWIDTH_PORT=port, ADAWIDTH_REPLICA_ID=name, **extra_env)
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=open(log_path, "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        gws.append(Gateway(name, f"http://127.0.0.1:{port}", proc, log_path))
    deadline = time.monotonic() + timeout_s
    for gw in gws:
        with Client(gw.url) as client:
            try:
                client.wait_ready(max(0.0, deadline - time.monotonic()), poll_s=0.2, alive=lambda: gw.proc.poll() is None)
            except ServerExited:
                raise RuntimeError(f"gateway {gw.name} exited: {gw.log()[-3000:]}") from None
            except NotReadyError:
                for g in gws:
                    g.stop()
                raise TimeoutError(f"gateway {gw.name} not ready in {timeout_s} s: {gw.log()[-3000:]}") from None
    return gws


def trainer_cli(home: Path, redis_url: str | None, *args: str, timeout_s: float = 180,
                extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m trainer <args>`` against ``home`` (and Redis when given; ``extra_env``: more settings)."""
    env = gateway_env(home, redis_url, **(extra_env or {}))
    env.pop("ADAWIDTH_ADMIN_API_KEY")
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def readyz(url: str) -> tuple[int, dict]:
    r = httpx.get(f"{url}/readyz", timeout=5)
    return r.status_code, r.json()


def wait_converged(gateways: list[Gateway], version: str, since: float, bound_s: float = 5.0) -> float:
    """Poll every replica's /readyz until all serve ``version``; return seconds since ``since`` (unix time).

    Fails the test when they have not converged ``bound_s`` seconds after ``since``.
    """
    pending = {g.name for g in gateways}
    last = {}
    while pending:
        for g in gateways:
            if g.name in pending:
                try:
                    code, body = readyz(g.url)
                    last[g.name] = body.get("index_version")
                    if code == 200 and body.get("index_version") == version:
                        pending.discard(g.name)
                except httpx.HTTPError as e:
                    last[g.name] = repr(e)
        if not pending:
            break
        if time.time() - since > bound_s:
            pytest.fail(f"replicas {sorted(pending)} not on {version} {bound_s} s after the switch: {last}")
        time.sleep(0.05)
    return time.time() - since


def metric(url: str, name: str, **labels) -> float:
    """Value of one Prometheus sample of a replica (0.0 when the series does not exist yet)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        series = key.split("{")[0]
        lab = key[len(series):].strip("{}")
        if series == name and ",".join(sorted(lab.split(","))) == want:
            return float(value)
    return 0.0


@dataclass
class Outcome:
    query: int
    width: object
    status: int | None
    version: str | None = None
    ids: list[str] | None = None
    scores: list[float] | None = None
    error: str | None = None
    started_at: float = 0.0
    done_at: float = 0.0


@dataclass
class LoadGenerator:
    """``concurrency`` clients looping over (query, width) pairs round-robin across the replicas until stopped;
    ``path``: the search route posted to (e.g. ``/v1/collections/<name>/search``)."""

    urls: list[str]
    queries: list[str]
    widths: tuple = (64, "full", "auto")
    concurrency: int = 24
    outcomes: list[Outcome] = field(default_factory=list)
    path: str = "/v1/search"

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._lock = threading.Lock()
        self._pairs = itertools.cycle([(q, w) for q in range(len(self.queries)) for w in self.widths])
        self._url = itertools.cycle(self.urls)

    @property
    def count(self) -> int:
        return len(self.outcomes)

    def start(self) -> "LoadGenerator":
        self.started = time.monotonic()
        self._thread.start()
        return self

    def wait_for(self, n: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count < n:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise TimeoutError(f"load generator reached {self.count} of {n} requests")
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(60)
        return time.monotonic() - self.started

    async def _main(self):
        # idle keep-alive connections expire on the client (2 s) before uvicorn closes them (5 s): with equal
        # timeouts a request sent on a connection the server is closing fails with ReadError, a client-side
        # race that says nothing about the gateway (a load balancer must be configured the same way)
        limits = httpx.Limits(max_connections=self.concurrency * 2, max_keepalive_connections=self.concurrency * 2,
                              keepalive_expiry=2.0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.concurrency)))

    async def _worker(self, client):
        while not self._stop.is_set():
            with self._lock:
                q, w = next(self._pairs)
                url = next(self._url)
            started = time.time()
            try:
                r = await client.post(f"{url}{self.path}", json={"query": self.queries[q], "k": 10, "width": w})
                if r.status_code == 200:
                    data = r.json()
                    o = Outcome(q, w, 200, data["trace"]["index_version"], [h["id"] for h in data["results"]],
                                [h["score"] for h in data["results"]])
                else:
                    o = Outcome(q, w, r.status_code, error=r.text[:300])
            except Exception as e:  # a refused/reset connection is a failed request too
                o = Outcome(q, w, None, error=repr(e))
            o.started_at, o.done_at = started, time.time()
            self.outcomes.append(o)


def check_offline(outcomes: list[Outcome], queries: list[str], version_dirs: dict[str, Path], encoder,
                  stage1=None) -> int:
    """Assert every answer equals what its version returns offline for that query; returns the pairs checked.

    The offline answer is :meth:`engine.pipeline.Pipeline.search` of ``IndexVersion.load(dir)`` with the same
    request fields, the query embedded by ``encoder``; ``stage1``: the gateways' stage-1 provider (None: faiss in
    process), so the offline version serves the policies theirs serve.
    """
    pipe = Pipeline()
    loaded = {v: IndexVersion.load(p, stage1=stage1) for v, p in version_dirs.items()}
    emb = {}
    expected = {}
    for o in outcomes:
        key = (o.query, o.width, o.version)
        if key not in expected:
            if o.query not in emb:
                emb[o.query] = encoder.encode([queries[o.query]])
            out = pipe.search(loaded[o.version], [SearchSpec(query=queries[o.query], k=10, width=o.width)],
                              embeddings=emb[o.query])[0]
            expected[key] = (out.ids, [float(s) for s in out.scores])
        ids, scores = expected[key]
        assert o.ids == ids, f"query {o.query} width {o.width} on {o.version}: served {o.ids[:3]}... != offline {ids[:3]}..."
        assert np.allclose(o.scores, scores, atol=1e-5), (o.query, o.width, o.version)
    return len(expected)


class MilvusLiteServer:
    """A Milvus Lite gRPC server of the test's own (``python -m milvus_lite server``) on a free port: the
    trainer and every gateway process talk to it over the Milvus protocol, as to a Milvus cluster."""

    def __init__(self, workdir: Path):
        self.workdir, self.port = Path(workdir), free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        from pymilvus import MilvusClient

        log = open(self.workdir / "milvus.log", "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir",
                                      str(self.workdir / "data"), "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client = MilvusClient(uri=self.uri, timeout=2)
                client.list_collections()
                client.close()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Milvus Lite server did not start: "
                                       f"{(self.workdir / 'milvus.log').read_text()[-2000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        stop_process_group(self.proc, 20)
        self.proc = None
