"""The versioned index artifact: atomic write, checksums, and verified load.

One index version is one immutable directory ``<root>/<collection>/<version>/``
(DESIGN.md).  :func:`write_version` builds it in a hidden temporary sibling,
fsyncs every file, writes ``manifest.json`` **last** (with the sha256 of every
other file) and renames the directory into place, so a crash at any point
leaves either no version or a complete one.  :func:`open_version` refuses a
version whose manifest is missing, whose checksums do not match, or whose
encoder or dimension differ from what the caller runs.

Files of a version (schema 1):

=====================  =====================================================
manifest.json          written last; see :func:`build_manifest`
rotation.npy           R, float32, shape (D, D)
docs.npy               rotated documents, float32, shape (N, D), memory-mappable
doc_sqnorm_m0.npy      ||(R d)[:m0]||^2, float32, shape (N,)
doc_ids.json           external document ids in index order (list of N str)
stage1.faiss           faiss inner-product index over the normalised m0-prefixes
router_<l>_<h>.txt     LightGBM model (text format) per action pair
=====================  =====================================================
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LIVE_POINTER = "LIVE"


class IndexVersionError(RuntimeError):
    """A version cannot be used.  ``code`` is machine-readable:

    ``missing`` (no such version / no manifest), ``schema`` (unknown schema
    version), ``checksum`` (a file is missing or differs from the manifest),
    ``encoder_mismatch``, ``dimension_mismatch``.
    """

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(f"[{code}] {message}")


def sha256_file(path: Path | str, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_version_id(fingerprint: str, now: _dt.datetime | None = None) -> str:
    """A sortable version id: ``YYYYmmddTHHMMSSZ-<first 8 hex of fingerprint>``."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{fingerprint[:8]}"


def write_version(collection_dir: Path | str, version: str,
                  writers: Mapping[str, Callable[[Path], None]], manifest: dict) -> Path:
    """Write a version atomically and return its final directory.

    Args:
        collection_dir: ``<root>/<collection>``; created if missing.
        version: the version id (a directory name; must not exist yet).
        writers: file name -> function that writes that file at the given path.
        manifest: manifest fields; ``files`` (name -> sha256 and size_bytes),
            ``schema_version`` and ``version`` are filled in here.

    Returns:
        The path of the published directory.

    Raises:
        FileExistsError: if the version already exists.
        Any exception of a writer; the temporary directory is then removed and
        nothing becomes visible.
    """
    collection_dir = Path(collection_dir)
    collection_dir.mkdir(parents=True, exist_ok=True)
    final = collection_dir / version
    if final.exists():
        raise FileExistsError(f"index version {final} already exists")
    tmp = collection_dir / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = {}
        for name, write in writers.items():
            if name == MANIFEST or "/" in name:
                raise ValueError(f"invalid artifact file name {name!r}")
            path = tmp / name
            write(path)
            _fsync_path(path)
            files[name] = {"sha256": sha256_file(path), "size_bytes": path.stat().st_size}
        full = dict(manifest, schema_version=SCHEMA_VERSION, version=version, files=files)
        mpath = tmp / MANIFEST
        with open(mpath, "w", encoding="utf-8") as fh:
            json.dump(full, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_path(tmp)
        os.rename(tmp, final)
        _fsync_path(collection_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_manifest(version_dir: Path | str) -> dict:
    """Parse ``manifest.json``.  Raises :class:`IndexVersionError` (``missing`` / ``schema``)."""
    path = Path(version_dir) / MANIFEST
    if not path.is_file():
        raise IndexVersionError("missing", f"{version_dir} has no {MANIFEST} (incomplete or not a version)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexVersionError("schema", f"{path} is not valid JSON: {e}") from e
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise IndexVersionError("schema", f"{path} has schema_version {manifest.get('schema_version')!r}, "
                                          f"this build reads {SCHEMA_VERSION}")
    return manifest


def verify_version(version_dir: Path | str, *, encoder_sha256: str | None = None,
                   dimension: int | None = None) -> dict:
    """Check a version before loading it and return its manifest.

    Args:
        version_dir: the version directory.
        encoder_sha256: if given, the ONNX encoder hash the caller runs; must
            equal ``manifest["encoder"]["onnx_sha256"]``.
        dimension: if given, the encoder width D the caller runs.

    Raises:
        IndexVersionError: ``missing``, ``schema``, ``checksum``,
            ``encoder_mismatch`` or ``dimension_mismatch``.
    """
    version_dir = Path(version_dir)
    manifest = read_manifest(version_dir)
    for name, meta in manifest.get("files", {}).items():
        path = version_dir / name
        if not path.is_file():
            raise IndexVersionError("checksum", f"{path} listed in the manifest is missing")
        if path.stat().st_size != meta["size_bytes"] or sha256_file(path) != meta["sha256"]:
            raise IndexVersionError("checksum", f"{path} does not match the manifest checksum")
    if encoder_sha256 is not None and manifest["encoder"]["onnx_sha256"] != encoder_sha256:
        raise IndexVersionError("encoder_mismatch",
                                f"version encoder {manifest['encoder']['onnx_sha256'][:12]} != "
                                f"running encoder {encoder_sha256[:12]}")
    if dimension is not None and manifest["dimension"] != dimension:
        raise IndexVersionError("dimension_mismatch",
                                f"version dimension {manifest['dimension']} != running {dimension}")
    return manifest


def list_versions(collection_dir: Path | str) -> list[str]:
    """Complete versions (directories with a manifest) in a collection, oldest first."""
    d = Path(collection_dir)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())


def write_live_pointer(collection_dir: Path | str, version: str) -> None:
    """Point ``<collection>/LIVE`` at ``version`` by an atomic rename.

    Raises :class:`IndexVersionError` (``missing``) if the version is not complete.
    """
    collection_dir = Path(collection_dir)
    read_manifest(collection_dir / version)
    tmp = collection_dir / f".{LIVE_POINTER}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": version}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, collection_dir / LIVE_POINTER)
    _fsync_path(collection_dir)


def read_live_pointer(collection_dir: Path | str) -> str | None:
    """The version ``LIVE`` names, or None when there is no pointer."""
    p = Path(collection_dir) / LIVE_POINTER
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))["version"]
