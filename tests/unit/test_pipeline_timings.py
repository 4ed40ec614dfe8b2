"""A query's ``timings_seconds.total`` is its own work, also in a batch (engine.pipeline.Pipeline.finish).

Before, a batch ran every item's stages and then each item's rerank, and an item's total was read from its start
to its own finish: the first item's total then held the stages of every item after it.
"""

from __future__ import annotations

import time

import numpy as np

import engine.pipeline as pipeline
from engine.index import IndexVersion
from engine.pipeline import Pipeline, SearchSpec

SLOW_S = 0.05


def test_a_batch_items_total_holds_its_own_stages_only(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 32)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    version = IndexVersion.in_memory(X, np.eye(32, dtype=np.float32), [f"d{i}" for i in range(len(X))], m0=16)
    Q = X[:3] + 0.01
    real = pipeline.stage1

    def stage1(plan, version, q, allowed, embedding):  # the last item's stage 1 is slow
        if np.array_equal(embedding, Q[2]):
            time.sleep(SLOW_S)
        return real(plan, version, q, allowed, embedding)

    monkeypatch.setattr(pipeline, "stage1", stage1)
    t = time.perf_counter()
    res = Pipeline().search(version, [SearchSpec("q", k=5, width="full")] * 3, embeddings=Q)
    wall = time.perf_counter() - t
    totals = [r.trace["timings_seconds"]["total"] for r in res]
    assert totals[2] >= SLOW_S and totals[0] < SLOW_S and totals[1] < SLOW_S, totals
    assert sum(totals) <= wall
    for r in res:  # the parts it is made of (no encoder here: no encode timing)
        tm = r.trace["timings_seconds"]
        parts = sum(v for k, v in tm.items() if k != "total")
        assert tm["total"] >= parts - 1e-6
