"""Write an index version's stage-1 and rescoring prefixes to Milvus (the ``milvus`` stage-1 backend).

One collection per index version, named by the version
(:func:`engine.stage1.milvus_collection_name`), so publishing a new version never
touches the collection live traffic reads, and the registry alone says which
version is live (the gateway never follows a Milvus alias).  Fields:

=============  ==========================  ================================================
``row``        INT64, primary key          the document's row in the version (``doc_ids.json``)
``stage1``     FLOAT_VECTOR (m0)           ``prefix_normalize(docs, m0)``; index FLAT, metric IP
``rescore``    FLOAT_VECTOR (H, default D)  rotated document prefix ``docs[:, :H]``; index FLAT, metric IP
``sqnorm_m0``  FLOAT                       ``||d[:m0]||^2`` (``doc_sqnorm_m0.npy``)
=============  ==========================  ================================================

The stage-1 vectors are the very float32 values the version's ``stage1.faiss``
was built from, and FLAT is exhaustive, so Milvus's shortlist equals faiss's up
to ties (tested in ``tests/integration/test_milvus_stage1.py``).  The collection's
property ``adawidth.version`` records the version, adapter hash, m0, H and the document count; the
gateway refuses a collection that does not match the manifest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from engine.version import store
from adawidth.prefix import prefix_normalize
from engine.stage1 import (META_PROPERTY, RESCORE_FIELD, ROW_FIELD, SQNORM_FIELD, STAGE1_FIELD, milvus_collection_name,
                            version_description)

log = logging.getLogger(__name__)


def create_version_collection(client, name: str, m0: int, rescore_width: int, description: str) -> None:
    """Create the (empty) collection of one version with FLAT / IP indexes on both vector fields.

    Raises:
        pymilvus.MilvusException: when Milvus refuses (e.g. the name exists).
    """
    from pymilvus import DataType, MilvusClient

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


def write_version(client, version_dir: Path | str, *, prefix: str = "adawidth", rescore_width: int | None = None,
                  batch_size: int = 5000) -> dict:
    """Write the collection of the version at ``version_dir`` unless an identical complete one exists.

    Args:
        client: a ``pymilvus.MilvusClient``.
        version_dir: a verified index version (its checksums are checked here first).
        prefix: collection name prefix.
        rescore_width: H (default D: every served width, and ``full``, can be answered from Milvus).
        batch_size: rows per insert call.

    Returns:
        ``{"collection", "rows", "seconds", "written"}`` (written False when it was already there).

    Raises:
        engine.version.store.IndexVersionError: the version does not verify.
    """
    version_dir = Path(version_dir)
    manifest = store.verify_version(version_dir)
    m0, D, N = manifest["m0"], manifest["dimension"], manifest["corpus"]["documents"]
    H = int(rescore_width or D)
    name = milvus_collection_name(manifest["collection"], manifest["version"], prefix)
    desc = version_description(manifest, H)
    start = time.perf_counter()
    if client.has_collection(name):
        have = (client.describe_collection(name).get("properties") or {}).get(META_PROPERTY)
        client.load_collection(name)
        rows = int(client.get_collection_stats(name).get("row_count", -1))
        if have == desc and rows == N:
            return {"collection": name, "rows": rows, "seconds": 0.0, "written": False}
        log.warning("Milvus collection %s is incomplete or differs (%s rows); rewriting it", name, rows)
        client.drop_collection(name)
    docs = np.load(version_dir / "docs.npy", mmap_mode="r")
    sq = np.load(version_dir / "doc_sqnorm_m0.npy")
    create_version_collection(client, name, m0, H, desc)
    batches = ((np.arange(s, min(s + batch_size, N)), docs[s:s + batch_size], sq[s:s + batch_size])
               for s in range(0, N, batch_size))
    n = insert_rows(client, name, batches, m0, H)
    client.flush(name)
    client.load_collection(name)
    seconds = time.perf_counter() - start
    log.info("wrote %d rows of %s to Milvus collection %s in %.1f s", n, manifest["version"], name, seconds)
    return {"collection": name, "rows": n, "seconds": round(seconds, 3), "written": True}


def drop_unlisted(client, collection: str, keep: set[str], prefix: str = "adawidth") -> list[str]:
    """Drop the Milvus collections of ``collection``'s versions not in ``keep`` (live, previous, candidates).

    Returns the dropped collection names.  Run it after the registry moved on and every replica converged.
    """
    wanted = {milvus_collection_name(collection, v, prefix) for v in keep}
    head = milvus_collection_name(collection, "", prefix)
    dropped = [n for n in client.list_collections() if n.startswith(head) and n not in wanted]
    for n in dropped:
        client.drop_collection(n)
    return dropped


def open_client(settings):
    """The trainer's Milvus client from :class:`trainer.config.TrainerSettings` (resolved)."""
    from engine.stage1 import open_milvus_client

    return open_milvus_client(settings.milvus_uri, settings.milvus_token)


def write_for_settings(settings, version_dir: Path | str) -> dict | None:
    """With ``settings.stage1_backend == "milvus"``, write the version's collection (before it is published, so
    no replica is told about a version whose stage 1 is not there yet); otherwise do nothing and return None."""
    if getattr(settings, "stage1_backend", "faiss") != "milvus":
        return None
    client = open_client(settings)
    try:
        return write_version(client, version_dir, prefix=settings.milvus_prefix)
    finally:
        client.close()
