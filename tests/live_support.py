"""Helpers of the live-document tests (issue 18): the write key and routes, GET /writes, the trainer's fold
as a real subprocess on a test home, and waiting for a version to go live."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, VAR

WRITE_KEY = "wrt-Qz8Lp3Vx7Kd2Rm5Tn9Hc"
AUTH = {"authorization": f"Bearer {WRITE_KEY}"}
C = "/v1/collections/scifact"


def writes(http) -> dict:
    r = http.get(f"{C}/writes", headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def fold_env(home: Path) -> dict:
    """The trainer's environment: the test home, the shared embedding cache (the corpus is not re-encoded), the
    file registry, one thread."""
    env = dict(os.environ, ADAWIDTH_HOME=str(home), ADAWIDTH_EMBEDDING_CACHE=str(VAR / "cache" / "embeddings.sqlite"),
               ADAWIDTH_ENCODER_THREADS="1", OMP_NUM_THREADS="1")
    for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):
        env.pop(name, None)
    return env


def trainer(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=fold_env(home), capture_output=True,
                          text=True, timeout=timeout)


def fold(home: Path, *args: str) -> dict:
    r = trainer(home, "fold", "--collection", "scifact", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def coll_dir(home: Path) -> Path:
    return home / "indexes" / "scifact"


def wait_live(http, version: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while writes(http)["live_version"] != version:
        assert time.monotonic() < deadline, f"{version} never went live: {writes(http)}"
        time.sleep(0.2)
