"""Locust traffic for the gateway: a collection's queries, mixed k and width policies, a few invalid requests.

Traffic mix (task weights; one request per task):

* 60 % ``auto``: three quarters the default policy (declared recall), a quarter the width router
  (``policy: "router"``) with an explicit ``rho`` in {0.1, 0.2, 0.3};
* 15 % a fixed prefix width in {64, 128, 256, 384};
* 5 % ``full`` (exact full-width search);
* 15 % ``auto`` with no ``width`` field at all (the default policy);
* 5 % invalid: blank query, ``k`` 0 or above ``k_max``, width 0 or above D, ``rho`` 2, an unknown field, a
  string ``k``: each must get its documented 4xx status and error code (``docs/API.md``) and then counts as a
  success; anything else (a 200, a 5xx, a wrong code) is a failure.

``k`` is 10 for most requests, sometimes 1, 50 or 100.  A 200 must carry ``results`` (at most k) and a
``trace`` with the width served.  A 429 (``overloaded``) is a failure: it means the load exceeded what the
gateway admits.  Request names group by policy so the report gives p50/p95/p99 per policy.

Queries come from a BEIR ``queries.jsonl`` (optionally gzipped): env ``ADAWIDTH_LOCUST_QUERIES`` (default
the bundled SciFact queries), drawn uniformly with a per-user seed (``ADAWIDTH_LOCUST_SEED``, default 0).

Requests and answers go through the Python client's models (``adawidth_client``): bodies are built by
:class:`SearchRequest`, every 200 is parsed by :class:`SearchResponse` (a malformed one fails) and every
error by :class:`ApiError`, so the load test exercises the client's code on every run.  The searched path
is the client's too: ``/v1/search``, or ``/v1/collections/{name}/search`` with ``ADAWIDTH_LOCUST_COLLECTION``.

Run it as its own command (importing locust monkey-patches the process with gevent), e.g. through
``loadtest/run.py``, or by hand against a running gateway::

    .venv/bin/locust -f loadtest/locustfile.py --headless -u 8 -r 4 -t 60s --host http://127.0.0.1:8000
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import sys
from pathlib import Path

from locust import HttpUser, between, task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adawidth_client import ApiError, MalformedResponse, SearchRequest, SearchResponse  # noqa: E402
from adawidth_client.models import search_path  # noqa: E402

DEFAULT_QUERIES = Path(__file__).resolve().parents[1] / "data" / "scifact" / "queries.jsonl.gz"
K_CHOICES = (10,) * 7 + (1, 50, 100)
FIXED_WIDTHS = (64, 128, 256, 384)

# (name, body, expected status, expected error code)
INVALID = (
    ("blank query", {"query": "   \t", "k": 10}, 422, "blank_query"),
    ("k zero", {"query": "q", "k": 0}, 422, "k_out_of_range"),
    ("k too large", {"query": "q", "k": 10_001}, 422, "k_out_of_range"),
    ("width zero", {"query": "q", "width": 0}, 422, "width_out_of_range"),
    ("width above D", {"query": "q", "width": 385}, 422, "width_out_of_range"),
    ("rho above 1", {"query": "q", "width": "auto", "policy": "router", "rho": 2}, 422, "rho_out_of_range"),
    ("unknown field", {"query": "q", "limit": 10}, 422, "unknown_field"),
    ("k as string", {"query": "q", "k": "10"}, 422, "invalid_type"),
)


def load_queries(path: Path | str) -> list[str]:
    """Texts of a BEIR queries file (``.jsonl`` or ``.jsonl.gz``), in file order; blank ones dropped."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        texts = [json.loads(line).get("text", "") for line in fh if line.strip()]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"{path} holds no query text")
    return texts


QUERIES = load_queries(os.environ.get("ADAWIDTH_LOCUST_QUERIES", DEFAULT_QUERIES))
_SEEDS = itertools.count(int(os.environ.get("ADAWIDTH_LOCUST_SEED", "0")))
SEARCH_PATH = search_path(os.environ.get("ADAWIDTH_LOCUST_COLLECTION") or None)


class SearchUser(HttpUser):
    wait_time = between(0.0, 0.05)

    def on_start(self):
        self.rng = random.Random(next(_SEEDS))

    def _search(self, name: str, request: SearchRequest):
        with self.client.post(SEARCH_PATH, json=request.to_json(), name=name, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(str(ApiError.from_parts(r.status_code, r.content, r.headers)))
                return
            try:
                res = SearchResponse.from_json(r.json())
            except (ValueError, MalformedResponse) as e:
                r.failure(f"malformed 200 response: {e}")
                return
            if len(res.results) > (request.k or 10) or res.trace.width < 0:
                r.failure("malformed 200 response")
            else:
                r.success()

    def _query(self) -> str:
        return self.rng.choice(QUERIES)

    def _k(self) -> int:
        return self.rng.choice(K_CHOICES)

    @task(45)
    def auto(self):
        self._search("/v1/search auto", SearchRequest(self._query(), k=self._k(), width="auto"))

    @task(15)
    def auto_rho(self):
        self._search("/v1/search router+rho", SearchRequest(self._query(), k=self._k(), width="auto",
                                                            policy="router", rho=self.rng.choice((0.1, 0.2, 0.3))))

    @task(15)
    def default_policy(self):
        self._search("/v1/search default", SearchRequest(self._query(), k=self._k()))

    @task(15)
    def fixed(self):
        self._search("/v1/search fixed width", SearchRequest(self._query(), k=self._k(),
                                                             width=self.rng.choice(FIXED_WIDTHS)))

    @task(5)
    def full(self):
        self._search("/v1/search full", SearchRequest(self._query(), k=self._k(), width="full"))

    @task(5)
    def invalid(self):
        label, body, status, code = self.rng.choice(INVALID)  # raw bodies: some are not valid SearchRequests
        with self.client.post(SEARCH_PATH, json=body, name="/v1/search invalid (4xx expected)",
                              catch_response=True) as r:
            got = ApiError.from_parts(r.status_code, r.content, r.headers).code if r.status_code >= 400 else None
            if r.status_code == status and got == code:
                r.success()
            else:
                r.failure(f"{label}: expected {status} {code}, got {r.status_code} {got}")
