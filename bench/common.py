"""Helpers every benchmark shares: the repository root, the command line a result records, atomic result files.

Benchmarks run as modules from the repository root (``python -m bench.<name>``), so they import the project's
packages like any other code: no ``sys.path`` edits.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.io import atomic
from engine.pipeline import Pipeline, Result
from engine.plan import SearchSpec

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (``bench/..``)."""
RESULTS = ROOT / "bench" / "results"
"""Where results are committed."""


def command(module: str, argv: Sequence[str] | None = None, env: str = "") -> str:
    """The command line that reproduces a run: ``[env ]python -m bench.<module> <args>``.

    Args:
        module: the benchmark's module name under ``bench`` (e.g. ``"frontier"``).
        argv: its arguments (default ``sys.argv[1:]``).
        env: environment assignments to show first (e.g. ``"OMP_NUM_THREADS=1"``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(x for x in (env, f"python -m bench.{module}", shlex.join(args)) if x)


def machine() -> str:
    """``<machine>, <n> cores, Python <version>`` of this host, for result headers."""
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_results(stem: Path | str, payload, markdown: str | None = None, *, indent: int | None = 1,
                  **json_kw) -> Path:
    """Write ``<stem>.json`` (``payload``) and, when given, ``<stem>.md`` (``markdown``), each atomically
    (:mod:`engine.io.atomic`), creating the folder; returns the JSON path.

    ``json_kw`` goes to :func:`json.dumps` (e.g. ``default=str``).

    Raises:
        TypeError / ValueError: ``payload`` is not JSON-serialisable (nothing is written).
    """
    stem = Path(stem)
    text = json.dumps(payload, indent=indent, **json_kw) + "\n"
    path = atomic.write_text(stem.with_name(stem.name + ".json"), text)
    if markdown is not None:
        atomic.write_text(stem.with_name(stem.name + ".md"), markdown if markdown.endswith("\n") else markdown + "\n")
    return path


_PIPELINE = Pipeline()


def search_one(version, embedding, k: int, width, *, policy: str | None = None) -> Result:
    """One query through the served pipeline (:class:`engine.pipeline.Pipeline`) on a precomputed embedding.

    Args:
        version: a loaded or in-memory :class:`engine.index.IndexVersion`.
        embedding: the encoder's (D,) float32 unit-norm query embedding.
        k: results; width: ``"full"``, ``"auto"`` or an int prefix width.
        policy: the ``auto`` policy (``router``, ``recall``, ``funnel``); None: the version's default.

    Returns:
        The :class:`engine.stages.render.Result` (ids, scores, trace with widths, work and timings).
    """
    spec = SearchSpec(query="benchmark", k=k, width=width, policy=policy if width == "auto" else None)
    return _PIPELINE.search(version, [spec], embeddings=np.asarray(embedding, np.float32)[None, :])[0]
