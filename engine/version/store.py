"""Versions on disk: the atomic write of a version directory, the ``LIVE`` pointer, listing and naming.

One index version is one immutable directory ``<root>/<collection>/<version>/`` (DESIGN.md).
:func:`write_version` builds it in a hidden temporary sibling (:func:`engine.io.atomic.atomic_path`), fsyncs
every file, writes ``manifest.json`` **last** (with the sha256 of every other file) and renames the directory
into place, so a crash at any point leaves either no version or a complete one.  What the files are and how a
version is verified before use is :mod:`engine.version.manifest`; the writers and readers of each file are
:mod:`engine.version.files`, :mod:`engine.version.lexical` and :mod:`engine.version.milvus`.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from engine.io import atomic
from engine.io.checksum import sha256_file
from engine.version.manifest import (MANIFEST, SCHEMA_VERSION, IndexVersionError, Manifest, check_structure,
                                     parse_manifest, read_manifest)

LIVE_POINTER = "LIVE"
BUILD_LOCK = ".build.lock"

log = logging.getLogger(__name__)


class BuildLocked(RuntimeError):
    """Another build or fold of the collection is running (it holds ``<collection>/.build.lock``)."""


@contextmanager
def build_lock(collection_dir: Path | str) -> Iterator[list[str]]:
    """Hold the collection's build lock (an exclusive ``flock`` on ``<collection>/.build.lock``, released by the
    kernel when the holder dies, kill -9 included) and, holding it, remove the stale drafts of version
    directories a killed build left (``.tmp-*`` directories: only a build holding this lock writes one, so
    none of them is in use).  Yields the names removed.

    Raises:
        BuildLocked: another process holds the lock.
    """
    collection_dir = Path(collection_dir)
    collection_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(collection_dir / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildLocked(f"another build or fold of {collection_dir.name} is running "
                              f"(it holds {collection_dir / BUILD_LOCK})") from None
        yield clean_stale_drafts(collection_dir)
    finally:
        os.close(fd)


def clean_stale_drafts(collection_dir: Path | str) -> list[str]:
    """Remove the ``.tmp-*`` version drafts of ``collection_dir`` (call holding :func:`build_lock`); returns
    their names.  Files (an atomic pointer write in flight) are left alone."""
    removed = []
    d = Path(collection_dir)
    for p in sorted(d.glob(".tmp-*")) if d.is_dir() else []:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    if removed:
        log.warning("removed %d stale build draft(s) in %s: %s", len(removed), d, removed)
    return removed

Writers = Mapping[str, Callable[[Path], None]]
"""File name -> a function that writes that file at the path it is given."""


def new_version_id(fingerprint: str, now: _dt.datetime | None = None) -> str:
    """A sortable version id: ``YYYYmmddTHHMMSSffffffZ-<first 8 hex of fingerprint>`` (UTC, microseconds;
    ``now`` default: the clock).  Names sort by creation time, which retention's "newest" rule reads: a fold
    takes under a second, so two versions made in the same second must still sort in order (ids of the
    earlier second-resolution form, ``YYYYmmddTHHMMSSZ-...``, stay valid and sort by their second)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%S%fZ')}-{fingerprint[:8]}"


def utc_timestamp(now: _dt.datetime | None = None) -> str:
    """``YYYY-mm-ddTHH:MM:SSZ`` (UTC), the manifest's ``created``."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def write_version(collection_dir: Path | str, version: str, writers: Writers, manifest: Manifest | Mapping) -> Path:
    """Write a version atomically and return its final directory.

    Args:
        collection_dir: ``<root>/<collection>``; created if missing.
        version: the version id (a directory name; must not exist yet).
        writers: file name -> function that writes that file at the given path.
        manifest: the manifest's sections (a :class:`Manifest`, or a mapping validated as one); ``files``
            (name -> sha256 and size_bytes), ``schema_version`` and ``version`` are filled in here.

    Returns:
        The path of the published directory.

    Raises:
        FileExistsError: if the version already exists.
        IndexVersionError: ``schema`` when the manifest is not valid (checked before any file is written) or a
            section names a file no writer wrote.
        ValueError: a writer's file name is ``manifest.json`` or contains a ``/``.
        Any exception of a writer; the temporary directory is then removed and nothing becomes visible.
    """
    collection_dir = Path(collection_dir)
    draft = manifest.model_dump(mode="json") if isinstance(manifest, Manifest) else dict(manifest)
    draft.update(schema_version=SCHEMA_VERSION, version=version, files={})
    parse_manifest(draft, f"manifest of {version}")  # fail before the (expensive) writers run
    final = collection_dir / version
    with atomic.atomic_path(final, directory=True, replace=False) as tmp:
        files = {}
        for name, write in writers.items():
            if name == MANIFEST or "/" in name:
                raise ValueError(f"invalid artifact file name {name!r}")
            path = tmp / name
            write(path)
            files[name] = {"sha256": sha256_file(path), "size_bytes": path.stat().st_size}
        full = parse_manifest(dict(draft, files=files), f"manifest of {version}")
        check_structure(full)
        (tmp / MANIFEST).write_text(full.to_json(), encoding="utf-8")
    return final


def list_versions(collection_dir: Path | str) -> list[str]:
    """Complete versions (directories with a manifest) in a collection, oldest first (names sort by time)."""
    d = Path(collection_dir)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())


def write_live_pointer(collection_dir: Path | str, version: str) -> None:
    """Point ``<collection>/LIVE`` at ``version`` by an atomic rename.

    Raises:
        IndexVersionError: ``missing`` / ``schema`` when the version is not complete.
    """
    collection_dir = Path(collection_dir)
    read_manifest(collection_dir / version)
    atomic.write_json(collection_dir / LIVE_POINTER, {"version": version}, indent=None)


def read_live_pointer(collection_dir: Path | str) -> str | None:
    """The version ``LIVE`` names, or None when there is no pointer."""
    p = Path(collection_dir) / LIVE_POINTER
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))["version"]


def resolve_version_path(index_root: Path | str, collection: str, version: str | None) -> Path:
    """The directory of ``version``, or of the collection's LIVE version when None.

    Raises:
        IndexVersionError: ``missing`` when there is no such version or no LIVE pointer.
    """
    coll = Path(index_root) / collection
    version = version or read_live_pointer(coll)
    if version is None:
        raise IndexVersionError("missing", f"collection {collection!r} under {index_root} has no live version "
                                           f"(build one: python -m trainer build --dataset ...)")
    path = coll / version
    if not path.is_dir():
        raise IndexVersionError("missing", f"no version {version!r} in {coll}")
    return path
