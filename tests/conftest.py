"""Shared fixtures: the ONNX encoder, a full SciFact index built once per session, a live gateway process.

The SciFact index is built by the real trainer into a temporary home; the
embedding cache (``var/cache/embeddings.sqlite`` of the checkout) is shared with
``make demo`` so the corpus is encoded at most once per machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from engine.encoder import OnnxEncoder
from engine.pipeline import Pipeline, Result
from engine.plan import SearchSpec
from engine.version import store
from service.app import create_app
from service.config import GatewaySettings
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.export_onnx import export_encoder

from adawidth_client import Client, NotReadyError, ServerExited

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT / "data" / "scifact"
VAR = ROOT / "var"


def served(version, embedding, k: int, width, *, policy: str | None = None, allowed=None) -> Result:
    """One query through the served pipeline on a (D,) float32 embedding; ``width="auto"`` is the width router
    unless ``policy`` names another; ``allowed``: (N,) bool restriction or None."""
    spec = SearchSpec(query="test", k=k, width=width, policy=(policy or "router") if width == "auto" else None)
    return Pipeline().search(version, [spec], embeddings=np.asarray(embedding, np.float32)[None, :],
                             allowed=allowed)[0]


@pytest.fixture(scope="session")
def encoder_dir() -> Path:
    return export_encoder(VAR / "models" / "minilm-onnx")


@pytest.fixture(scope="session")
def encoder(encoder_dir):
    return OnnxEncoder(encoder_dir, threads=2)


def build_home(home: Path, encoder_dir: Path, encoder, **options) -> Path:
    """Build a SciFact version with the real trainer into ``home`` (file registry; the first version goes live)
    and link the encoder there, so a gateway can serve the home.  ``options`` override BuildOptions."""
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    # one torch / BLAS / OpenMP thread, as `make index` builds (BUILD_THREADS=1): the adapter's training is not
    # bit-reproducible across thread counts, and with 2 threads on 2 shared cores it runs 7x slower
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            build_index(BuildOptions(dataset=SCIFACT, **options), settings, encoder)
    finally:
        torch.set_num_threads(torch_threads)
    (home / "models").mkdir(exist_ok=True)
    os.symlink(encoder_dir, home / "models" / "minilm-onnx")
    return home


@pytest.fixture(scope="session")
def scifact_home(tmp_path_factory, encoder_dir, encoder) -> Path:
    """A home folder with a live SciFact index built by the trainer (adapter + routers)."""
    return build_home(tmp_path_factory.mktemp("home"), encoder_dir, encoder)


@pytest.fixture(scope="session")
def scifact_version(scifact_home):
    coll = scifact_home / "indexes" / "scifact"
    return coll / store.read_live_pointer(coll)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_home(home: Path, collection: str, **env_settings):
    """A real gateway process (uvicorn) serving ``home``'s ``collection``; yields its base URL.

    ``env_settings`` are extra ``ADAWIDTH_*`` variables (name without the prefix, e.g. ``DEFAULT_POLICY``)."""
    port = free_port()
    env = dict(os.environ, ADAWIDTH_HOME=str(home), ADAWIDTH_PORT=str(port), ADAWIDTH_COLLECTION=collection,
               **{f"ADAWIDTH_{k}": str(v) for k, v in env_settings.items()})
    for name in ("REDIS_URL", "ADAWIDTH_REDIS_URL"):  # the file registry of this home, whatever the shell says
        env.pop(name, None)
    log_path = home / f"gateway-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with Client(url) as client:
            try:
                client.wait_ready(120, alive=lambda: proc.poll() is None)
            except ServerExited:
                raise RuntimeError(f"gateway exited: {log_path.read_text()[-2000:]}") from None
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="session")
def gateway_url(scifact_home):
    """A real gateway process (uvicorn) serving the session's SciFact index."""
    with serve_home(scifact_home, "scifact") as url:
        yield url


@pytest.fixture(scope="session")
def app_client(scifact_home, tmp_path_factory):
    """An in-process TestClient over the same index (lifespan runs, so the index is loaded), on a copy of the
    home without its write-ahead log: the session's gateway process holds that log, and a second replica of a
    file log is degraded (it does not see the writer's writes)."""
    home = tmp_path_factory.mktemp("app-client") / "home"
    shutil.copytree(scifact_home, home, symlinks=True, ignore=shutil.ignore_patterns("wal", "gateway-*.log"))
    app = create_app(GatewaySettings(home=home, collection="scifact", redis_url=None), CollectorRegistry())
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="session")
def pca_version(tmp_path_factory, encoder_dir, encoder) -> Path:
    """A second SciFact version for the cutover tests: PCA rotation, one router, no evaluation (built in seconds
    from the cached embeddings; its rankings differ from the adapter version's).  Not registered anywhere."""
    home = tmp_path_factory.mktemp("pca-build")
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    path, _ = build_index(BuildOptions(dataset=SCIFACT, rotation="pca", eval_split=None, action_pairs=((64, 128),),
                                       default_pair=(64, 128), publish=False), settings, encoder)
    return path


def make_cutover_home(root: Path, encoder_dir: Path, versions: list[Path]) -> Path:
    """A fresh home whose scifact collection links the given (immutable) version directories; no registry yet."""
    coll = root / "indexes" / "scifact"
    coll.mkdir(parents=True)
    for v in versions:
        os.symlink(v, coll / v.name)
    (root / "models").mkdir()
    os.symlink(encoder_dir, root / "models" / "minilm-onnx")
    return root
