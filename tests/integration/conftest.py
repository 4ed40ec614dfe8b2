"""Fixtures for the gateway hardening tests: apps with their own settings over the session's index."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from service.app import create_app
from service.config import GatewaySettings

STRONG_ADMIN_KEY = "adm-7Gq2xV9pLr4TzW8kNc3Hs6Jb"
STRONG_SEARCH_KEY = "srch-Yf5Rm1Qa8Ud3Ke6Wn2Xp9Lt"


def post(client, body, **kw):
    """POST /v1/search with ``body`` as JSON (dict) or as raw text/bytes."""
    kw.setdefault("headers", {"content-type": "application/json"})
    return client.post("/v1/search", content=body if isinstance(body, (bytes, str)) else json.dumps(body), **kw)


def wait_until(condition, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until true (a liveness bound, not a timing assertion)."""
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.005)


class GatedEncoder:
    """Wraps the real encoder; ``encode`` blocks until :attr:`release` is set (deterministic slow encoder)."""

    def __init__(self, inner):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, **kw):
        self.calls += 1
        self.entered.set()
        if not self.release.wait(timeout=120):
            raise RuntimeError("gate never opened")
        return self.inner.encode(texts, **kw)


@pytest.fixture
def make_gateway(scifact_home):
    """Factory: ``with make_gateway(home=..., **settings) as (client, state)`` runs an app with its lifespan."""
    @contextmanager
    def factory(home=None, **settings):
        # these tests count encoder calls (GatedEncoder); the query-embedding cache has its own tests
        settings.setdefault("query_cache_entries", 0)
        app = create_app(GatewaySettings(home=home or scifact_home, collection="scifact", **settings),
                         CollectorRegistry())
        with TestClient(app) as client:
            yield client, app.state.gw

    return factory
