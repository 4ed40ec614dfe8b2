"""The trainer's side of version retention (:mod:`engine.version.retention`): run it on a collection with the
registry's state and replica reports, and the disk check of a build or fold.

``python -m trainer retention --collection NAME [--dry-run]`` prints :func:`run_retention`'s report as JSON;
every successful build and fold runs it after publishing (settings ``keep_versions``, ``lease_fresh_seconds``).

**The log cut.**  After the versions are decided, the collection's write-ahead log is cut
(:func:`engine.write_logs.cut_log`) up to the smallest folded sequence number of every version retention kept
(live, previous, candidates, leased, newest): a rollback to any kept version replays the records after its folded
sequence number, so only records every kept version holds are removed.  An unreadable kept manifest, or a kept
version built from the corpus alone (folded sequence 0), cuts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from engine.registry import open_registry
from engine.version import store
from engine.version.manifest import IndexVersionError, read_manifest
from engine.version.retention import apply_retention, check_free_space, directory_bytes, estimate_version_bytes
from engine.wal import WalError
from engine.write_logs import cut_log

log = logging.getLogger("trainer.retention")


def run_retention(settings, collection: str, *, dry_run: bool = False) -> dict:
    """Apply the retention rule to ``collection`` under ``settings.index_root`` (registry state and replica
    reports from the configured registry); returns :func:`engine.version.retention.apply_retention`'s report
    with ``collection`` and ``keep_last`` added."""
    registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root, mirror_live=False)
    try:
        state = registry.get(collection)
        replicas = registry.replicas(collection)
    finally:
        registry.close()
    report = apply_retention(Path(settings.index_root) / collection, state, replicas,
                             keep_last=settings.keep_versions, lease_fresh_s=settings.lease_fresh_seconds,
                             dry_run=dry_run)
    report["log_cut"] = cut_after_retention(settings, collection, report["kept"], dry_run=dry_run)
    return {"collection": collection, "keep_last": settings.keep_versions, **report}


def cut_after_retention(settings, collection: str, kept, *, dry_run: bool = False) -> dict:
    """Cut ``collection``'s write-ahead log up to the smallest folded sequence number of the ``kept`` versions
    (module docstring).  Returns ``{"before_seq": int | None, "cut_seq", "backend", ...}`` (``before_seq`` None:
    nothing may be cut, with ``reason``); a log error is reported in ``error``, never raised (the versions are
    already decided)."""
    coll = Path(settings.index_root) / collection
    folded = {}
    for v in sorted(kept):
        try:
            writes = getattr(read_manifest(coll / v), "writes", None)
        except (IndexVersionError, OSError, ValueError) as e:
            return {"before_seq": None, "reason": f"kept version {v} is unreadable: {e}"}
        folded[v] = int(getattr(writes, "folded_seq", 0) or 0)
    if not folded:
        return {"before_seq": None, "reason": "no version kept"}
    before = min(folded.values())
    if before <= 0:
        return {"before_seq": 0, "reason": "a kept version folded nothing: " + min(folded, key=folded.get)}
    try:
        out = cut_log(collection, before, redis_url=settings.redis_url, index_root=settings.index_root,
                      dry_run=dry_run)
    except WalError as e:
        log.warning("write-ahead log of %s not cut: %s", collection, e)
        return {"before_seq": before, "error": f"{type(e).__name__}: {e}"}
    if not dry_run and (out.get("removed") or 0):
        log.info("write-ahead log of %s cut up to seq %d (kept versions fold at least %d): %s", collection,
                 out["cut_seq"], before, out)
    return {"before_seq": before, **out}


def retention_after_build(settings, collection: str) -> dict | None:
    """:func:`run_retention` after a successful build or fold; a failure is logged, never raised (the new version
    is already published), and gives None."""
    try:
        return run_retention(settings, collection)
    except Exception:
        log.exception("retention of %s failed; old versions kept", collection)
        return None


def check_build_disk(settings, collection: str, documents: int, dimension: int,
                     free_bytes: Callable[[Path], int] | None = None) -> int:
    """Refuse a build or fold of ``documents`` documents that would not fit on the index volume
    (:func:`engine.version.retention.estimate_version_bytes` from the collection's ``LIVE`` version, the free
    bytes less ``settings.disk_margin_bytes``); returns the estimated bytes.

    Raises:
        engine.version.retention.DiskSpaceError: it would not fit (a ValueError naming the bytes needed and free).
    """
    coll = Path(settings.index_root) / collection
    live = store.read_live_pointer(coll)
    live_bytes = live_docs = None
    if live is not None and (coll / live).is_dir():
        try:
            live_docs = read_manifest(coll / live).corpus.documents
            live_bytes = directory_bytes(coll / live)
        except IndexVersionError:
            live_bytes = live_docs = None
    needed = estimate_version_bytes(documents=documents, live_bytes=live_bytes, live_documents=live_docs,
                                    dimension=dimension)
    check_free_space(settings.index_root, needed, settings.disk_margin_bytes, free_bytes)
    return needed
