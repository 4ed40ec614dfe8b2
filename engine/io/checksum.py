"""Content hashes of files (the manifest's checksums, the ONNX exports' ``onnx_sha256``)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path | str, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 (64 lowercase hex characters) of a file's bytes, read in chunks of ``chunk_bytes``.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()
