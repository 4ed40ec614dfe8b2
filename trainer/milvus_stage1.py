"""Write an index version's stage-1 and rescoring prefixes to Milvus (the ``milvus`` stage-1 backend).

The collection's name, schema, rows and description are the format's (:mod:`engine.version.milvus`); this
module writes a built version into it (``trainer milvus-write``, and ``trainer build`` / ``publish`` with
``ADAWIDTH_STAGE1_BACKEND=milvus``) and drops the collections of versions the registry no longer names
(``trainer milvus-gc``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from engine.stage1 import open_milvus_client
from engine.version import manifest as mf
from engine.version.files import read_core
from engine.version.milvus import (META_PROPERTY, create_version_collection, insert_rows, milvus_collection_name,
                                   version_description)

log = logging.getLogger(__name__)


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
        engine.version.manifest.IndexVersionError: the version does not verify.
    """
    version_dir = Path(version_dir)
    manifest = mf.verify(version_dir)
    m0, D, N = manifest.m0, manifest.dimension, manifest.corpus.documents
    H = int(rescore_width or D)
    name = milvus_collection_name(manifest.collection, manifest.version, prefix)
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
    core = read_core(version_dir, manifest)
    docs, sq = core.docs, core.doc_sqnorm_m0
    create_version_collection(client, name, m0, H, desc)
    batches = ((np.arange(s, min(s + batch_size, N)), docs[s:s + batch_size], sq[s:s + batch_size])
               for s in range(0, N, batch_size))
    n = insert_rows(client, name, batches, m0, H)
    client.flush(name)
    client.load_collection(name)
    seconds = time.perf_counter() - start
    log.info("wrote %d rows of %s to Milvus collection %s in %.1f s", n, manifest.version, name, seconds)
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
