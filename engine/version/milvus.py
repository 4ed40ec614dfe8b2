"""The Milvus side of an index version (stage 1 on Milvus): collection name, schema, description, rows.

One collection per index version, named by the version (:func:`milvus_collection_name`), so publishing a
new version never touches the collection live traffic reads, and the registry alone says which version is
live (the gateway never follows a Milvus alias).  Fields:

=============  ==========================  ================================================
``row``        INT64, primary key          the document's row in the version (``doc_ids.json``)
``stage1``     FLOAT_VECTOR (m0)           ``prefix_normalize(docs, m0)``; index FLAT, metric IP
``rescore``    FLOAT_VECTOR (H, default D)  rotated document prefix ``docs[:, :H]``; index FLAT, metric IP
``sqnorm_m0``  FLOAT                       ``||d[:m0]||^2`` (``doc_sqnorm_m0.npy``)
=============  ==========================  ================================================

The stage-1 vectors are the very float32 values the version's ``stage1.faiss`` was built from, and FLAT is
exhaustive, so Milvus's shortlist equals faiss's up to ties (``tests/integration/test_milvus_stage1.py``).
The collection's property :data:`META_PROPERTY` holds :func:`version_description`: the trainer writes it
(:mod:`trainer.milvus_stage1`), the gateway (:meth:`engine.stage1.MilvusStage1.attach`) refuses a collection
whose description differs from the manifest's.  ``pymilvus`` is an optional dependency, imported where used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import numpy as np

from adawidth.prefix import prefix_normalize
from engine.version.manifest import Manifest

STAGE1_FIELD = "stage1"
"""Milvus vector field: normalised m0-prefixes, (m0,) float32 (metric IP, FLAT)."""
RESCORE_FIELD = "rescore"
"""Milvus vector field: rotated documents at the rescoring width H (not normalised), (H,) float32."""
SQNORM_FIELD = "sqnorm_m0"
"""Milvus scalar field: ``||d[:m0]||^2`` (float32), the stage-1 partial norm the rescoring reuses."""
META_PROPERTY = "adawidth.version"
"""Collection property: :func:`version_description` of the version the collection holds."""
ROW_FIELD = "row"
"""Milvus primary key: the document's row in the index version (int64; ``doc_ids.json`` names it)."""


def milvus_collection_name(collection: str, version: str, prefix: str = "adawidth") -> str:
    """Milvus collection holding one index version: ``<prefix>_<collection>_<version>``.

    Milvus names allow letters, digits and underscores (first a letter or underscore, at most 255
    characters); every other character becomes ``_``.

    Raises:
        ValueError: when the name would exceed 255 characters.
    """
    name = re.sub(r"[^A-Za-z0-9_]", "_", f"{prefix}_{collection}_{version}")
    if not re.match(r"[A-Za-z_]", name):
        name = "_" + name
    if len(name) > 255:
        raise ValueError(f"Milvus collection name {name[:40]}... is longer than 255 characters")
    return name


def version_description(manifest: Manifest, rescore_width: int) -> str:
    """JSON the trainer stores in the Milvus collection's properties, and the gateway checks on attach:
    collection, version, adapter sha256, documents N, m0 and the rescoring width H."""
    return json.dumps({"collection": manifest.collection, "version": manifest.version,
                       "adapter_sha256": manifest.adapter.sha256 if manifest.adapter else "",
                       "documents": manifest.corpus.documents, "m0": manifest.m0,
                       "rescore_width": int(rescore_width)}, sort_keys=True)


def read_description(client, name: str) -> dict:
    """The :data:`META_PROPERTY` of an existing collection, parsed ({} when absent or not JSON)."""
    desc = client.describe_collection(name)
    try:
        return json.loads((desc.get("properties") or {}).get(META_PROPERTY) or "{}")
    except ValueError:
        return {}


def create_version_collection(client, name: str, m0: int, rescore_width: int, description: str) -> None:
    """Create the (empty) collection of one version with FLAT / IP indexes on both vector fields.

    Raises:
        pymilvus.MilvusException: when Milvus refuses (e.g. the name exists).
    """
    from pymilvus import DataType, MilvusClient  # optional dependency (pip install .[milvus])

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(ROW_FIELD, DataType.INT64, is_primary=True)
    schema.add_field(STAGE1_FIELD, DataType.FLOAT_VECTOR, dim=int(m0))
    schema.add_field(RESCORE_FIELD, DataType.FLOAT_VECTOR, dim=int(rescore_width))
    schema.add_field(SQNORM_FIELD, DataType.FLOAT)
    index = client.prepare_index_params()
    index.add_index(field_name=STAGE1_FIELD, index_type="FLAT", metric_type="IP")
    index.add_index(field_name=RESCORE_FIELD, index_type="FLAT", metric_type="IP")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
    client.alter_collection_properties(name, {META_PROPERTY: description})


def insert_rows(client, name: str, batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], m0: int,
                rescore_width: int) -> int:
    """Insert batches of ``(rows (b,) int64, rotated docs (b, >= H) float32, sqnorm_m0 (b,))``; returns rows inserted.

    The stage-1 field gets ``prefix_normalize(docs, m0)``, computed here exactly as the faiss index's input.
    """
    n = 0
    for rows, docs, sq in batches:
        docs = np.asarray(docs, dtype=np.float32)
        s1 = prefix_normalize(docs, m0)
        resc = np.ascontiguousarray(docs[:, :rescore_width])
        data = [{ROW_FIELD: int(r), STAGE1_FIELD: s1[i], RESCORE_FIELD: resc[i], SQNORM_FIELD: float(sq[i])}
                for i, r in enumerate(rows)]
        client.insert(name, data)
        n += len(data)
    return n
