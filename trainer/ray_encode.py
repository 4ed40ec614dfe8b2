"""Corpus encoding and rotation as a Ray Data batch job (for corpora past one machine's hours).

``python -m trainer encode --dataset DIR --out SHARDS [--ray-address ADDR]``

1. **encode**: ``read_json(corpus.jsonl[.gz])`` -> BEIR's encoder text
   ``(title + " " + text).strip()`` -> an actor pool of ONNX encoders (the
   gateway's :class:`engine.encoder.OnnxEncoder`, same tokenizer, truncation and
   pooling) -> parquet shards of ``doc_id`` (string) and ``embedding`` ((D,) float32,
   unit norm);
2. **rotate** (after the builder has fixed R): the shards -> ``R @ x`` per row ->
   parquet shards of ``doc_id`` and ``rotated`` ((D,) float32), which
   :func:`trainer.milvus_stage1.insert_rows` can take in batches (not wired yet: the
   trainer writes Milvus from the version's ``docs.npy``).

:func:`read_shards` reads either kind back in corpus order (the builder's
``--embeddings SHARDS``); rows are matched by document id, so shard order and
Ray's scheduling do not matter, and a missing or duplicated document is an error.

``ray.init()`` starts a local Ray by default (``num_cpus`` and the object store
are kept small); ``address`` (``TrainerSettings.ray_address``, e.g.
``ray://head:10001`` or ``auto``) joins a cluster instead, whose workers need this
package and the encoder export at the same path.  The single-process path
(:func:`trainer.embed_cache.encode_with_cache`) stays the default for small corpora.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from engine.encoder import OnnxEncoder
from engine.io.beir import Document

log = logging.getLogger(__name__)


def init_ray(address: str | None = None, num_cpus: int = 1, object_store_bytes: int = 100 * 1024 * 1024) -> None:
    """Connect to ``address`` or start a small local Ray (no dashboard); no-op when Ray is already up."""
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # local workers import this checkout's packages (an editable install may point elsewhere)
        root = str(Path(__file__).resolve().parents[1])
        ray.init(num_cpus=num_cpus, object_store_memory=object_store_bytes, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": root}})


def _corpus_file(dataset: Path) -> Path:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (Path(dataset) / name).is_file():
            return Path(dataset) / name
    raise FileNotFoundError(f"{dataset} has no corpus.jsonl(.gz)")


def _encoder_text(batch: dict) -> dict:
    titles = batch["title"] if "title" in batch else [""] * len(batch["_id"])
    return {"doc_id": np.array([str(i) for i in batch["_id"]], dtype=object),
            "text": np.array([Document(str(i), t or "", x).encoder_text()
                              for i, t, x in zip(batch["_id"], titles, batch["text"])], dtype=object)}


class _Encode:
    """Ray Data actor: one ONNX encoder per actor, reused across batches."""

    def __init__(self, encoder_dir: str, threads: int, batch_size: int):
        self.encoder = OnnxEncoder(encoder_dir, threads=threads, prefer_gpu=False, spin=False)
        self.batch_size = batch_size

    def __call__(self, batch: dict) -> dict:
        texts = [str(t) for t in batch["text"]]
        emb = self.encoder.encode(texts, batch_size=self.batch_size) if texts else np.empty((0, 0), np.float32)
        return {"doc_id": batch["doc_id"], "embedding": np.asarray(emb, dtype=np.float32)}


def encode_corpus(dataset: Path | str, out_dir: Path | str, encoder_dir: Path | str, *, address: str | None = None,
                  num_cpus: int = 1, actors: int = 1, encoder_threads: int = 1, batch_size: int = 32,
                  rows_per_task: int = 256, limit: int | None = None) -> dict:
    """Encode a BEIR corpus with Ray Data and write parquet shards of ``doc_id`` and ``embedding``.

    Args:
        dataset: BEIR folder (``corpus.jsonl`` or ``corpus.jsonl.gz``).
        out_dir: shard folder (created; must be empty or absent).
        encoder_dir: the ONNX export (``trainer export-encoder``), readable by every worker.
        address: Ray cluster address; None starts a local Ray with ``num_cpus``.
        actors: encoder actors (one ONNX session each).
        encoder_threads: ONNX Runtime intra-op threads per actor.
        batch_size: texts per ONNX call.
        rows_per_task: documents per Ray Data batch handed to an actor.
        limit: encode only the first ``limit`` documents (tests, samples).

    Returns:
        ``{"documents", "seconds", "shards", "out_dir"}``.

    Raises:
        FileExistsError: ``out_dir`` holds files already.
    """
    import ray

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    init_ray(address, num_cpus)
    start = time.perf_counter()
    path = _corpus_file(Path(dataset))
    kw = {"arrow_open_stream_args": {"compression": "gzip"}} if path.suffix == ".gz" else {}
    # small CPU shares for reading and writing, so a one-CPU local Ray runs the encoder actor alongside them
    light = {"num_cpus": 0.25}
    ds = ray.data.read_json(str(path), num_cpus=0.25, **kw)  # pyarrow reads newline-delimited JSON
    if limit is not None:
        ds = ds.limit(int(limit))
    ds = ds.map_batches(_encoder_text, batch_format="numpy", **light)
    ds = ds.map_batches(_Encode, fn_constructor_args=(str(encoder_dir), encoder_threads, batch_size),
                        batch_size=rows_per_task, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=actors),
                        num_cpus=max(encoder_threads, 1) if address else 0.5)
    ds.write_parquet(str(out_dir), ray_remote_args=light)
    shards = sorted(out_dir.glob("*.parquet"))
    n = sum(_rows(p) for p in shards)
    seconds = time.perf_counter() - start
    log.info("encoded %d documents into %d shards in %.1f s", n, len(shards), seconds)
    return {"documents": n, "seconds": round(seconds, 3), "shards": len(shards), "out_dir": str(out_dir)}


def rotate_shards(in_dir: Path | str, rotation: np.ndarray, out_dir: Path | str, *, address: str | None = None,
                  num_cpus: int = 1) -> dict:
    """Apply an orthogonal rotation R ((D, D) float32) to every embedding shard: ``rotated = R @ x``.

    Returns ``{"documents", "seconds", "out_dir"}``.
    """
    import ray

    init_ray(address, num_cpus)
    start = time.perf_counter()
    R = np.asarray(rotation, dtype=np.float32)  # Ray Data ships fn_args to the workers through the object store

    def _rotate(batch: dict, R) -> dict:
        return {"doc_id": batch["doc_id"], "rotated": np.asarray(batch["embedding"], np.float32) @ R.T}

    light = {"num_cpus": 0.25}
    ds = ray.data.read_parquet(str(in_dir), num_cpus=0.25).map_batches(_rotate, fn_args=(R,),
                                                                    batch_format="numpy", **light)
    ds.write_parquet(str(out_dir), ray_remote_args=light)
    n = sum(_rows(p) for p in Path(out_dir).glob("*.parquet"))
    return {"documents": n, "seconds": round(time.perf_counter() - start, 3), "out_dir": str(out_dir)}


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def read_shards(shard_dir: Path | str, doc_ids: list[str], column: str = "embedding") -> np.ndarray:
    """Read shards back in the order of ``doc_ids``; (N, D) float32.

    Raises:
        ValueError: a document of ``doc_ids`` is missing from the shards, or appears twice.
    """
    import pyarrow.parquet as pq

    shards = sorted(Path(shard_dir).glob("*.parquet"))
    if not shards:
        raise ValueError(f"no parquet shards in {shard_dir}")
    row_of = {d: i for i, d in enumerate(doc_ids)}
    X: np.ndarray | None = None
    seen = np.zeros(len(doc_ids), dtype=bool)
    for p in shards:
        table = pq.read_table(p, columns=["doc_id", column])
        ids = table.column("doc_id").to_pylist()
        col = table.column(column).combine_chunks()
        storage = getattr(col, "storage", col)  # Ray's tensor extension type stores a list<float> array
        vecs = np.asarray(storage.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(ids), -1)
        if X is None:
            X = np.zeros((len(doc_ids), vecs.shape[1]), dtype=np.float32)
        for d, v in zip(ids, vecs):
            i = row_of.get(d)
            if i is None:
                continue  # a document of a later corpus version; the builder indexes doc_ids only
            if seen[i]:
                raise ValueError(f"document {d!r} appears twice in {shard_dir}")
            X[i], seen[i] = v, True
    if not seen.all():
        missing = [doc_ids[i] for i in np.flatnonzero(~seen)[:5]]
        raise ValueError(f"{int((~seen).sum())} documents missing from {shard_dir}, e.g. {missing}")
    return X
