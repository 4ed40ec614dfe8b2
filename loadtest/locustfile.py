"""Locust scenario for the gateway: SciFact test queries with mixed k and width policies.

Run headless against a running gateway (``make serve``), as its own command (importing locust
monkey-patches the process with gevent)::

    .venv/bin/pip install '.[loadtest]'
    .venv/bin/locust -f loadtest/locustfile.py --headless -u 8 -r 4 -t 60s --host http://127.0.0.1:8000
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from locust import HttpUser, between, task

QUERIES_FILE = Path(__file__).resolve().parents[1] / "data" / "scifact" / "queries.jsonl.gz"


def _queries() -> list[str]:
    with gzip.open(QUERIES_FILE, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


QUERIES = _queries()


class SearchUser(HttpUser):
    wait_time = between(0.0, 0.05)

    @task(8)
    def auto(self):
        self.client.post("/v1/search", json={"query": random.choice(QUERIES), "k": random.choice([10, 10, 100])},
                         name="/v1/search auto")

    @task(2)
    def fixed(self):
        self.client.post("/v1/search", json={"query": random.choice(QUERIES), "k": 10,
                                             "width": random.choice([64, 128, "full"])}, name="/v1/search fixed")

    @task(1)
    def invalid(self):
        with self.client.post("/v1/search", json={"query": "   ", "k": 0}, name="/v1/search invalid",
                              catch_response=True) as r:
            if r.status_code == 422:
                r.success()
            else:
                r.failure(f"expected 422, got {r.status_code}")
