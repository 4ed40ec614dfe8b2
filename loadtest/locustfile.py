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

**Writers (mixed read/write runs).**  :class:`WriterUser` exists only when ``ADAWIDTH_LOCUST_WRITE_KEY`` (the
gateway's ``write_api_key``) is set; without it the file is the read-only scenario above, unchanged.  With it,
``ADAWIDTH_LOCUST_WRITERS`` users (default 1; locust's ``fixed_count``, so ``-u`` counts them beside the search
users) write the live documents of ``ADAWIDTH_LOCUST_WRITE_COLLECTION`` (default ``ADAWIDTH_LOCUST_COLLECTION``,
else ``scifact``), in a fixed cycle of
two upserts and one delete, waiting ``ADAWIDTH_LOCUST_WRITE_WAIT`` seconds between writes (``lo,hi``, default
``0.5,1.0``):

* upsert: ``PUT /v1/collections/{name}/documents``, a JSON array of ``ADAWIDTH_LOCUST_WRITE_BATCH`` (default 4)
  new documents, ids ``locust-<run>-w<user>-<n>`` (unique per user and run; ``<run>`` from
  ``ADAWIDTH_LOCUST_RUN``, default the process id and start time).  Text: a SciFact corpus document (the bundled
  ``corpus.jsonl.gz``, or ``ADAWIDTH_LOCUST_CORPUS``) with a SciFact claim put first, so each written text is
  new (its own embedding) and real (the n-th document of a run: corpus document 7919 n, claim n, modulo their
  counts, n counted from ``ADAWIDTH_LOCUST_TEXT_OFFSET``, default 0: runs against one gateway need offsets
  far apart, or they write the same texts under other ids); double quotes (straight and curly) become single ones (a quoted phrase
  would restrict a search of the text);
* delete: ``POST /v1/collections/{name}/documents/delete`` of this user's two oldest live ids.

A write succeeds on 202 with a ``seq``; anything else (a 4xx, a 5xx, a 429) is a failure.  Each acknowledged
write is appended to ``ADAWIDTH_LOCUST_WRITE_LOG`` when set (one JSON line: ``op``, ``seq``, ``ids``, and for
upserts ``texts``: id -> the title and text joined, what a search of it should find), so a test can check that
every acknowledged write is searchable afterwards.

**Per-request samples.**  With ``ADAWIDTH_LOCUST_SAMPLES`` set, every request is appended to that file as one
CSV line ``name,response_time_ms,ok`` (flushed when locust quits), so a benchmark can compute exact percentiles
over any group of request names (locust's own CSV rounds them and keeps them per name).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path

from locust import HttpUser, between, events, task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adawidth_client import ApiError, MalformedResponse, SearchRequest, SearchResponse  # noqa: E402
from adawidth_client.models import search_path  # noqa: E402
from loadtest import DELETE_NAME, UPSERT_NAME  # noqa: E402

DEFAULT_QUERIES = Path(__file__).resolve().parents[1] / "data" / "scifact" / "queries.jsonl.gz"
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "data" / "scifact" / "corpus.jsonl.gz"
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


# -- writers (mixed read/write runs; module docstring) ----------------------------------------------------------
WRITE_KEY = os.environ.get("ADAWIDTH_LOCUST_WRITE_KEY") or None
WRITE_COLLECTION = (os.environ.get("ADAWIDTH_LOCUST_WRITE_COLLECTION") or os.environ.get("ADAWIDTH_LOCUST_COLLECTION")
                    or "scifact")
WRITE_CYCLE = ("upsert", "upsert", "delete")
NO_DOUBLE_QUOTES = str.maketrans({c: "'" for c in '"\u201c\u201d\u201e'})
"""Every character a query parser reads as a phrase quote (``adawidth.hybrid``), made a single quote."""


def load_corpus_texts(path: Path | str) -> list[tuple[str, str]]:
    """(title, text) of a BEIR ``corpus.jsonl`` (or ``.jsonl.gz``), in file order; documents with no text dropped."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    docs = [(r.get("title", "") or "", r.get("text", "") or "") for r in rows]
    docs = [(t, x) for t, x in docs if x.strip()]
    if not docs:
        raise ValueError(f"{path} holds no document text")
    return docs


def _wait_range(value: str) -> tuple[float, float]:
    lo, _, hi = value.partition(",")
    lo, hi = float(lo), float(hi or lo)
    if not 0 <= lo <= hi:
        raise ValueError(f"ADAWIDTH_LOCUST_WRITE_WAIT must be 'lo,hi' with 0 <= lo <= hi, not {value!r}")
    return lo, hi


class _Samples:
    """Per-request samples (``ADAWIDTH_LOCUST_SAMPLES``): buffered CSV lines, written when locust quits."""

    def __init__(self, path: str | None):
        self.path, self.lines = path, []

    def on_request(self, name, response_time, exception=None, **_):
        self.lines.append(f"{json.dumps(name)},{response_time:.3f},{int(exception is None)}\n")

    def flush(self, **_):
        if self.path:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.writelines(self.lines)
        self.lines = []


_SAMPLES = _Samples(os.environ.get("ADAWIDTH_LOCUST_SAMPLES") or None)
if _SAMPLES.path:
    events.request.add_listener(_SAMPLES.on_request)
    events.quitting.add_listener(_SAMPLES.flush)


class WriterUser(HttpUser):
    """Upserts and deletes live documents beside the search users (module docstring); abstract (never spawned)
    without ``ADAWIDTH_LOCUST_WRITE_KEY``."""

    abstract = WRITE_KEY is None
    fixed_count = int(os.environ.get("ADAWIDTH_LOCUST_WRITERS", "1"))
    wait_time = between(*_wait_range(os.environ.get("ADAWIDTH_LOCUST_WRITE_WAIT", "0.5,1.0")))
    batch = int(os.environ.get("ADAWIDTH_LOCUST_WRITE_BATCH", "4"))
    run_tag = os.environ.get("ADAWIDTH_LOCUST_RUN") or f"{os.getpid()}-{int(time.time())}"
    _users = itertools.count()
    # one counter for every writer: no two documents of a run share a text (nor of runs given other offsets)
    _texts = itertools.count(int(os.environ.get("ADAWIDTH_LOCUST_TEXT_OFFSET", "0")))
    _corpus: list[tuple[str, str]] | None = None

    def on_start(self):
        cls = type(self)
        if cls._corpus is None:
            cls._corpus = load_corpus_texts(os.environ.get("ADAWIDTH_LOCUST_CORPUS", DEFAULT_CORPUS))
        self.user = next(cls._users)
        self.rng = random.Random(10_000 + self.user)
        self.written = itertools.count()
        self.cycle = itertools.cycle(WRITE_CYCLE)
        self.alive: list[str] = []  # this user's acknowledged, not deleted ids, oldest first
        self.headers = {"authorization": f"Bearer {WRITE_KEY}"}
        self.base = f"/v1/collections/{WRITE_COLLECTION}/documents"
        self.log_path = os.environ.get("ADAWIDTH_LOCUST_WRITE_LOG") or None

    def _document(self) -> dict:
        n = next(type(self)._texts)
        title, text = self._corpus[(n * 7919) % len(self._corpus)]
        claim = QUERIES[n % len(QUERIES)]
        clean = lambda t: t.translate(NO_DOUBLE_QUOTES)  # noqa: E731
        return {"id": f"locust-{self.run_tag}-w{self.user}-{next(self.written)}", "title": clean(title),
                "text": clean(f"{claim} {text}"), "fields": {"source": "locust"}}

    def _log(self, record: dict) -> None:
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")

    def _write(self, method: str, path: str, name: str, body) -> int | None:
        """Send one write; its ``seq`` on 202, else None (the request counted as a failure)."""
        with self.client.request(method, path, json=body, headers=self.headers, name=name, catch_response=True) as r:
            if r.status_code != 202:
                r.failure(str(ApiError.from_parts(r.status_code, r.content, r.headers)))
                return None
            try:
                seq = int(r.json()["seq"])
            except (ValueError, KeyError, TypeError) as e:
                r.failure(f"malformed 202 response: {e}")
                return None
            r.success()
            return seq

    @task
    def write(self):
        if next(self.cycle) == "delete" and len(self.alive) >= 2:
            ids, self.alive = self.alive[:2], self.alive[2:]
            seq = self._write("POST", f"{self.base}/delete", DELETE_NAME, {"ids": ids})
            if seq is not None:
                self._log({"op": "delete", "seq": seq, "ids": ids})
            else:
                self.alive = ids + self.alive  # not acknowledged: not known deleted
            return
        docs = [self._document() for _ in range(self.batch)]
        seq = self._write("PUT", self.base, UPSERT_NAME, docs)
        if seq is not None:
            self.alive += [d["id"] for d in docs]
            self._log({"op": "upsert", "seq": seq, "ids": [d["id"] for d in docs],
                       "texts": {d["id"]: f"{d['title']} {d['text']}".strip() for d in docs}})
