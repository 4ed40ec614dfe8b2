"""The one atomic-write helper of the repository: write a temporary sibling, fsync it, rename it into place,
fsync the parent directory.

A reader therefore sees the old file (or directory) or the new one, never a half-written one, and after a
crash the rename is durable once the call returned.  Every writer whose output another process reads uses
it: index versions and the ``LIVE`` pointer (:mod:`engine.version.store`), the file registry's state and
replica reports (:mod:`engine.registry.file`), the ONNX exports of the trainer, cached training states and
the benchmark results (:func:`bench.common.write_results`).

:func:`atomic_path` is the general form (a file or a whole directory); :func:`write_bytes`,
:func:`write_text` and :func:`write_json` are its one-call forms for a single file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path


def fsync_path(path: Path | str) -> None:
    """fsync a file or a directory by path (a directory's fsync makes renames inside it durable).

    Raises:
        OSError: the path cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for sub in sorted(path.rglob("*")):
            if sub.is_file() and not sub.is_symlink():
                fsync_path(sub)
    fsync_path(path)


@contextlib.contextmanager
def atomic_path(dest: Path | str, *, directory: bool = False, replace: bool = True,
                fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of ``dest`` to write; publish it as ``dest`` when the block exits normally.

    Args:
        dest: the final path.  Its parent directory is created when missing.
        directory: yield an (empty, created) temporary directory instead of a file path.
        replace: replace an existing ``dest`` (a file by ``os.replace``; a directory is moved aside, the new
            one renamed in, the old one removed).  False: raise ``FileExistsError`` when ``dest`` exists.
        fsync: fsync the written file (every file of the directory) before the rename and the parent
            directory after it.  False for small, frequently rewritten files whose durability does not
            matter (replica reports).

    Yields:
        The temporary path (``.tmp-<name>-<8 hex>`` beside ``dest``; hidden, so
        :func:`engine.version.store.list_versions` never lists it); write it within the block.

    Raises:
        FileExistsError: ``replace`` is False and ``dest`` exists (checked before and at the rename).
        Any exception of the block: the temporary file or directory is removed and ``dest`` is untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not replace and dest.exists():
        raise FileExistsError(f"{dest} already exists")
    tmp = dest.with_name(f".tmp-{dest.name}-{uuid.uuid4().hex[:8]}")
    if directory:
        tmp.mkdir()
    try:
        yield tmp
        if fsync:
            _fsync_tree(tmp)
        if not replace and dest.exists():
            raise FileExistsError(f"{dest} already exists")
        if directory and dest.exists():  # replace: move the old directory aside, then remove it
            old = dest.with_name(f".old-{dest.name}-{uuid.uuid4().hex[:8]}")
            os.rename(dest, old)
            os.rename(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        elif directory or replace:
            os.replace(tmp, dest)  # an empty directory, or a file: one atomic rename
        else:
            os.link(tmp, dest)  # no replace: fails if dest appeared meanwhile
            os.unlink(tmp)
        if fsync:
            fsync_path(dest.parent)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise


def write_bytes(dest: Path | str, data: bytes, *, fsync: bool = True) -> Path:
    """Atomically replace ``dest`` with ``data``; returns ``dest`` as a Path (see :func:`atomic_path`)."""
    with atomic_path(dest, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return Path(dest)


def write_text(dest: Path | str, text: str, *, fsync: bool = True) -> Path:
    """Atomically replace ``dest`` with ``text`` encoded as UTF-8; returns ``dest`` as a Path."""
    return write_bytes(dest, text.encode("utf-8"), fsync=fsync)


def write_json(dest: Path | str, obj, *, indent: int | None = 1, sort_keys: bool = True, fsync: bool = True,
               **dump_kw) -> Path:
    """Atomically replace ``dest`` with ``obj`` as JSON (UTF-8, a trailing newline); returns ``dest``.

    ``dump_kw`` goes to :func:`json.dumps` (e.g. ``default=str``, ``allow_nan``).

    Raises:
        TypeError / ValueError: ``obj`` is not JSON-serialisable (nothing is written).
    """
    return write_text(dest, json.dumps(obj, indent=indent, sort_keys=sort_keys, **dump_kw) + "\n", fsync=fsync)
