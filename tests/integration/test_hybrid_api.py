"""The lexical/hybrid lanes, filters, tenant policy and a CARS version over HTTP, on a SciFact subset with
tenant and ACL fields, built by the real trainer (cached embeddings: seconds, not the 5-minute session index)."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from adawidth.hybrid import contains_phrases, normalize_text
from service.app import create_app
from service.config import GatewaySettings
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.embed_cache import EmbeddingCache, encode_with_cache

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCIFACT = ROOT / "data" / "scifact"
VAR = ROOT / "var"
TENANTS = ("acme", "globex", "initech")


def _read_jsonl_gz(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _qrels(split: str) -> dict[str, dict[str, int]]:
    path = next((SCIFACT / "qrels").glob(f"{split}.tsv*"))
    opener = gzip.open if path.suffix == ".gz" else open
    out: dict[str, dict[str, int]] = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            q, d, s = line.rstrip("\n").split("\t")
            out.setdefault(q, {})[d] = int(s)
    return out


@pytest.fixture(scope="module")
def tenant_dataset(tmp_path_factory) -> Path:
    """600 SciFact documents (those cited by 60 test and 120 train queries, then others) with fields."""
    corpus = _read_jsonl_gz(next(SCIFACT.glob("corpus.jsonl*")))
    queries = _read_jsonl_gz(next(SCIFACT.glob("queries.jsonl*")))
    test = dict(list(sorted(_qrels("test").items()))[:60])
    train = dict(list(sorted(_qrels("train").items()))[:120])
    keep = {d for j in (*test.values(), *train.values()) for d in j}
    keep |= {d["_id"] for d in corpus[:600 - len(keep)]}
    rng = random.Random(0)
    out = tmp_path_factory.mktemp("tenant-scifact")
    (out / "qrels").mkdir()
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for i, d in enumerate(x for x in corpus if x["_id"] in keep):
            doc = {"_id": d["_id"], "title": d["title"], "text": d["text"], "tenant": rng.choice(TENANTS),
                   "year": 2000 + i % 4}
            if i % 4 == 0:
                doc["acl"] = ["eng"] if i % 8 == 0 else ["legal", "hr"]
            fh.write(json.dumps(doc) + "\n")
    used = set(test) | set(train)
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in queries:
            if q["_id"] in used:
                fh.write(json.dumps({"_id": q["_id"], "text": q["text"]}) + "\n")
    for name, qrels in (("test", test), ("train", train)):
        with open(out / "qrels" / f"{name}.tsv", "w") as fh:
            fh.write("query-id\tcorpus-id\tscore\n")
            for q, j in qrels.items():
                for d, s in j.items():
                    fh.write(f"{q}\t{d}\t{s}\n")
    return out


def _build(home: Path, dataset: Path, encoder_dir: Path, encoder, **options):
    settings = TrainerSettings(home=home, encoder_dir=encoder_dir, redis_url=None,
                               embedding_cache=VAR / "cache" / "embeddings.sqlite").resolved()
    return build_index(BuildOptions(dataset=dataset, collection="tenants", capacity=False, action_pairs=((64, 128),),
                                    **options), settings, encoder)


@pytest.fixture(scope="module")
def tenant_home(tmp_path_factory, tenant_dataset, encoder_dir, encoder) -> Path:
    home = tmp_path_factory.mktemp("tenant-home")
    _build(home, tenant_dataset, encoder_dir, encoder, rotation="pca", train_split=None)
    (home / "models").mkdir()
    (home / "models" / "minilm-onnx").symlink_to(encoder_dir)
    return home


def _client(home: Path, **settings) -> TestClient:
    return TestClient(create_app(GatewaySettings(home=home, collection="tenants", redis_url=None, **settings),
                                 CollectorRegistry()))


@pytest.fixture(scope="module")
def corpus_fields(tenant_dataset) -> dict[str, dict]:
    return {d["_id"]: d for d in _read_jsonl_gz(tenant_dataset / "corpus.jsonl")}


def test_modes_filters_and_errors_over_http(tenant_home, corpus_fields):
    with _client(tenant_home) as c:
        q = "vitamin D deficiency and bone health"
        for mode in ("dense", "lexical", "hybrid"):
            r = c.post("/v1/search", json={"query": q, "k": 10, "mode": mode, "width": "full"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["trace"]["mode"] == mode and len(body["results"]) == 10
        r = c.post("/v1/search", json={"query": q, "k": 10, "mode": "hybrid", "fusion": "convex", "alpha": 0.3,
                                       "width": 128})
        assert r.status_code == 200 and r.json()["trace"]["fusion"] == "convex"
        # k results when enough pass: a quarter of the documents have year 2001; k = 120 of them come back
        # (filtering the unfiltered top-120 afterwards would leave about 30)
        passing = [d for d, f in corpus_fields.items() if f["year"] == 2001]
        assert len(passing) >= 120
        for mode in ("dense", "hybrid"):
            r = c.post("/v1/search", json={"query": q, "k": 120, "mode": mode, "width": 128, "filter": {"year": 2001}})
            hits = r.json()["results"]
            assert len(hits) == 120 and all(corpus_fields[h["id"]]["year"] == 2001 for h in hits)
            assert r.json()["trace"]["allowed_documents"] == len(passing)
        # an exact phrase: every hit contains it (normalised), and the lexical lane finds all that do
        r = c.post("/v1/search", json={"query": 'role of "T cells" in immunity', "k": 1000, "mode": "lexical"})
        hits = r.json()["results"]
        holders = {d for d, f in corpus_fields.items()
                   if contains_phrases(normalize_text(f"{f['title']} {f['text']}"), ["t cells"])}
        assert holders and {h["id"] for h in hits} == holders
        for body, code in [({"query": q, "mode": "sparse"}, "unknown_mode"),
                           ({"query": q, "mode": "hybrid", "fusion": "max"}, "unknown_fusion"),
                           ({"query": q, "alpha": 1.5}, "alpha_out_of_range"),
                           ({"query": q, "filter": {"year": 1.5}}, "invalid_filter"),
                           ({"query": q, "filter": ["year"]}, "invalid_filter"),
                           ({"query": q, "width": 64, "filter": {"colour": "red"}}, "unknown_filter_field")]:
            r = c.post("/v1/search", json=body)
            assert r.status_code == 422 and r.json()["error"]["code"] == code, (body, r.text)


def test_tenant_header_policy_is_enforced(tenant_home, corpus_fields):
    with _client(tenant_home, access_policy="header") as c:
        r = c.post("/v1/search", json={"query": "cancer"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_required"
        for tenant in TENANTS:
            for groups in ("", "eng", "legal,hr"):
                for mode in ("dense", "lexical", "hybrid"):
                    # a request filter cannot widen the policy: asking for another tenant gives nothing
                    other = [t for t in TENANTS if t != tenant]
                    r = c.post("/v1/search", headers={"X-Tenant": tenant, "X-Groups": groups},
                               json={"query": "cancer treatment outcomes", "k": 50, "mode": mode, "width": 128})
                    hits = r.json()["results"]
                    assert hits and all(corpus_fields[h["id"]]["tenant"] == tenant for h in hits)
                    for h in hits:
                        acl = corpus_fields[h["id"]].get("acl")
                        assert not acl or set(acl) & set(groups.split(","))
                    r = c.post("/v1/search", headers={"X-Tenant": tenant},
                               json={"query": "cancer", "k": 50, "mode": mode, "width": 128, "filter": {"tenant": other}})
                    assert r.status_code == 200 and r.json()["results"] == []


def test_api_key_policy_maps_keys_to_tenants(tenant_home, corpus_fields):
    key = "k3y-for-acme-tenant-0123456789"
    with _client(tenant_home, access_policy="api_key",
                 principals={hashlib.sha256(key.encode()).hexdigest(): {"tenant": "acme", "groups": ["eng"]}}) as c:
        assert c.post("/v1/search", json={"query": "cancer"}).json()["error"]["code"] == "missing_api_key"
        r = c.post("/v1/search", json={"query": "cancer"}, headers={"Authorization": "Bearer not-a-known-key-xx"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.post("/v1/search", json={"query": "cancer", "k": 40, "mode": "hybrid", "width": "full"},
                   headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and all(corpus_fields[h["id"]]["tenant"] == "acme" for h in r.json()["results"])


def test_cars_version_is_served_with_its_query_map(tmp_path, tenant_dataset, encoder_dir, encoder):
    """A --cars build records the choice and its evidence; over HTTP, width 'full' equals the exact bilinear
    ranking qᵀ(I + M)d recomputed from the stored maps and the frozen embeddings."""
    path, manifest = _build(tmp_path, tenant_dataset, encoder_dir, encoder, rotation="pca",
                            cars={"rank": 8, "steps": 60, "splits": 2}, router_crossfit_folds=0)
    cars = manifest.cars.model_dump()
    assert cars["selected"] in ("shared", "dual") and len(cars["splits"]) == 2
    assert {"query_map.npy", "doc_map.npy"} <= set(manifest.files)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "minilm-onnx").symlink_to(encoder_dir)
    Qm = np.load(path / "query_map.npy").astype(np.float64)
    Dm = np.load(path / "doc_map.npy").astype(np.float64)
    if cars["selected"] == "shared":
        assert np.array_equal(Qm, Dm)
    docs = _read_jsonl_gz(tenant_dataset / "corpus.jsonl")
    cache = EmbeddingCache(VAR / "cache" / "embeddings.sqlite", encoder.dimension)
    X, _ = encode_with_cache(encoder, [f"{d['title']} {d['text']}".strip() for d in docs], cache)
    cache.close()
    query = "statins and cardiovascular risk"
    q = encoder.encode([query])[0].astype(np.float64)
    want = [docs[i]["_id"] for i in np.argsort(-((X @ Dm.T) @ (Qm @ q)))[:10]]
    with _client(tmp_path) as c:
        r = c.post("/v1/search", json={"query": query, "k": 10, "width": "full"})
        assert [h["id"] for h in r.json()["results"]] == want
        assert c.post("/v1/search", json={"query": query, "k": 10, "width": "auto"}).status_code == 200
