"""A schema-1 index version frozen in the repository still loads and answers as it did when it was written.

``tests/data/frozen/schema1-v1`` (60 SciFact documents, PCA rotation, one router) was written by the
schema-1 writer; if a change to the loader, the funnel or the artifact format breaks old versions,
this test fails.  Regenerating the fixture is a format change and needs a schema version bump; this build
writes schema 3 (``engine.version.manifest``) and must keep reading schema 1.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from engine.index import IndexVersion
from engine.pipeline import Pipeline
from engine.plan import SearchSpec
from engine.version.manifest import READABLE_SCHEMAS, Expect, verify

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data"


def test_frozen_version_loads_and_answers_identically():
    path = DATA / "frozen" / "schema1-v1"
    manifest = verify(path, Expect(dimension=384, max_tokens=256, collection="frozen", version="schema1-v1"))
    assert manifest.schema_version == 1 and 1 in READABLE_SCHEMAS
    v = IndexVersion.load(path)
    expected = json.loads((DATA / "frozen_expected.json").read_text())
    embeddings = np.load(DATA / "frozen_queries.npy")
    for query, emb in zip(expected["queries"], embeddings):
        for width, ids in expected["expected"][query].items():
            w = int(width) if width.isdigit() else width
            got = Pipeline().search(v, [SearchSpec(query=query, k=5, width=w)], embeddings=emb[None, :])[0]
            assert got.ids == ids, (query, width)
