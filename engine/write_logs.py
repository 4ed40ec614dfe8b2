"""Which write-ahead log a collection has, picked from the settings as :func:`engine.registry.open_registry` picks
the registry: the collection's Redis stream when ``REDIS_URL`` is set (:class:`engine.wal_redis.RedisWriteLog`,
shared by every replica), else the file log on the index volume (:class:`engine.wal.FileWriteLog`, one writer).

* :func:`open_write_log`: the gateway's log of a collection (the writer);
* :func:`log_records`: the records after a sequence number, read as a reader (the trainer's fold);
* :func:`cut_log`: the cut after a fold (the trainer's retention step).
"""

from __future__ import annotations

from pathlib import Path

from engine.wal import FileWriteLog, WriteLog, cut_file_log, read_log
from engine.wal_redis import RedisWriteLog


def wal_directory(index_root: Path | str, collection: str) -> Path:
    """``<index_root>/<collection>/wal``: the file log of a collection."""
    return Path(index_root) / collection / "wal"


def open_write_log(collection: str, *, redis_url: str | None, index_root: Path | str,
                   require_fsync: bool = True) -> WriteLog:
    """The writer's log of ``collection``: a Redis stream when ``redis_url`` is set
    (:class:`engine.wal_redis.RedisWriteLog`, shared by replicas), else the file log on the index volume
    (:class:`FileWriteLog`, one writer).

    Raises:
        WalLocked: (file) another process holds the log.
        WalUnavailable: (Redis) unreachable, or not configured to fsync before answering (``require_fsync``).
        WalCorrupt: the existing log is unreadable.
    """
    if redis_url:
        return RedisWriteLog(redis_url, collection, require_fsync=require_fsync)
    return FileWriteLog(wal_directory(index_root, collection))


def log_records(collection: str, after: int = 0, *, redis_url: str | None, index_root: Path | str) -> list[dict]:
    """The records with ``seq > after`` of ``collection``'s log, read as a reader (no writer lock, no
    durability check): the Redis stream when ``redis_url`` is set, else :func:`read_log` of the file log.

    Raises:
        WalCut: ``after`` is below the log's cut point.
        WalCorrupt: an unreadable record or a gap.
        WalUnavailable: (Redis) unreachable.
    """
    if redis_url:
        log = RedisWriteLog(redis_url, collection, check_durability=False)
        try:
            return list(log.replay(after))
        finally:
            log.close()
    return list(read_log(wal_directory(index_root, collection), after))


def cut_log(collection: str, before_seq: int, *, redis_url: str | None, index_root: Path | str,
            dry_run: bool = False) -> dict:
    """Cut ``collection``'s log up to ``before_seq`` (:func:`cut_file_log`, or ``XTRIM MINID`` of the Redis
    stream); returns ``{"backend": "file" | "redis", "cut_seq": int, ...}``.

    Raises:
        WalError: the store refused or is unreachable.
    """
    if redis_url:
        log = RedisWriteLog(redis_url, collection, check_durability=False)
        try:
            return {"backend": "redis", **log.cut_report(before_seq, dry_run=dry_run)}
        finally:
            log.close()
    return {"backend": "file", **cut_file_log(wal_directory(index_root, collection), before_seq, dry_run=dry_run)}
