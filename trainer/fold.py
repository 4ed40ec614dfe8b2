"""Folding (issue 18, phase 2): the writes of a collection's write-ahead log into a new index version.

``python -m trainer fold --collection NAME [--promote] [--drift-threshold X]``

1. The live version (the registry's) and its folded sequence number ``S0`` (manifest ``writes.folded_seq``;
   0 for a version built from a corpus alone).
2. The log records after ``S0`` (:func:`engine.write_logs.log_records`: the collection's Redis stream when
   ``REDIS_URL`` is set, else the file log read without the gateway's writer lock; the last whole record read
   is the new folded sequence number ``S``).
3. The new corpus: the live version's documents (its ids, its encoder texts ``encoder_text.json`` and its
   keyword fields ``doc_fields.json``: what the embeddings, BM25 and the filters read; the BEIR folder of the
   manifest only when the version keeps no texts) with the upserts applied in sequence order (a replaced
   document keeps its row position, a new one is appended) and the deletes removed.
4. A build that reuses the live version's rotation, routers, recall policy and level layout
   (:class:`trainer.build.BuildOptions` ``reuse_from``): only new or changed texts are encoded (the embedding
   cache keys by content, and the embeddings the gateway logged with each upsert are put into the cache first
   when they come from the trainer's own encoder, :func:`seed_logged_embeddings`, so a fold usually encodes
   nothing); the level store, the lexical side, stage 1 and the served evaluation (when the
   BEIR folder has qrels) are computed as usual.  The drift check (:func:`trainer.build._drift_check`) refits
   instead when the online-CUS agreement moved beyond the threshold; the manifest's ``writes`` section says
   which happened.
5. The version is written atomically and published as a candidate; ``--promote`` promotes it through the
   quality gate (:func:`trainer.registry_cli.promote_with_gate`), the normal blue/green path.
6. Version retention (:func:`trainer.retention.run_retention`) runs after publishing and again after the
   promotion; the report's ``retention`` says what was kept and deleted.  A fold that would not fit on the
   disk is refused before encoding (:class:`engine.version.retention.DiskSpaceError`, exit 2).

When it goes live, the gateway drops the delta-segment entries with ``seq <= S`` (deploy/CUTOVER.md).
Versions built with CARS, the DART difficulty head, the funnel policy or an ANN first stage are not folded yet
(exit 2: rebuild).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.encoder import encoder_fingerprint
from engine.io.beir import Document, load_corpus
from engine.live import encoder_text, manifest_folded_seq
from engine.registry import open_registry
from engine.version import files, store
from engine.version.manifest import Manifest, read_manifest
from engine.wal import unpack_embeddings
from engine.write_logs import log_records
from trainer.build import DEFAULT_PAIRS, BuildOptions, build_index
from trainer.embed_cache import EmbeddingCache, content_key
from trainer.registry_cli import promote_with_gate
from trainer.retention import retention_after_build

log = logging.getLogger(__name__)


class FoldError(ValueError):
    """The collection cannot be folded (no live version, a version kind not folded yet, no document left)."""


@dataclass
class PendingWrites:
    """The log records after a version's folded sequence number."""

    base_version: str
    base_dir: Path
    manifest: Manifest
    base_seq: int
    last_seq: int
    records: list[dict] = field(default_factory=list)

    @property
    def documents(self) -> int:
        """Documents written (upserted or deleted ids, counted per record)."""
        return sum(len(r.get("docs") or r.get("ids") or []) for r in self.records)


def live_version(settings, collection: str) -> str | None:
    """The collection's live version in the registry (``REDIS_URL`` or the file registry), else its LIVE pointer."""
    registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root)
    try:
        live = registry.get(collection).live
    finally:
        registry.close()
    return live or store.read_live_pointer(Path(settings.index_root) / collection)


def pending_writes(settings, collection: str) -> PendingWrites:
    """The live version of ``collection`` and the log records after its folded sequence number.

    Raises:
        FoldError: the collection has no live version.
        engine.wal.WalCorrupt: the log is unreadable.
        engine.wal.WalCut: the log was cut after the live version's folded seq (never done by retention).
        engine.wal.WalUnavailable: (Redis) the log is unreachable.
    """
    coll_dir = Path(settings.index_root) / collection
    version = live_version(settings, collection)
    if version is None:
        raise FoldError(f"collection {collection!r} under {settings.index_root} has no live version to fold onto")
    base_dir = coll_dir / version
    manifest = read_manifest(base_dir)
    base_seq = manifest_folded_seq(manifest)
    records = log_records(collection, base_seq, redis_url=settings.redis_url, index_root=settings.index_root)
    return PendingWrites(version, base_dir, manifest, base_seq, records[-1]["seq"] if records else base_seq, records)


def base_documents(base_dir: Path, m: Manifest) -> list[Document]:
    """The documents of a version, in row order: ids, encoder texts (as ``text``, title empty: the encoder and
    BM25 read ``encoder_text()``, which is then the same string) and keyword fields; from the BEIR folder of the
    manifest when the version keeps no texts.

    Raises:
        FoldError: the version keeps no texts and its dataset folder lacks some of its documents.
    """
    ids = json.loads((base_dir / m.core.doc_ids).read_text(encoding="utf-8"))
    fields = [{} for _ in ids]
    if m.lexical is not None:
        fields = json.loads((base_dir / m.lexical.fields_file).read_text(encoding="utf-8"))
    texts = files.read_rerank_texts(base_dir, m)
    if texts is not None:
        return [Document(i, "", t, dict(f)) for i, t, f in zip(ids, texts, fields)]
    folder = Path(m.corpus.dataset or "")
    if not m.corpus.dataset or not folder.is_dir():
        raise FoldError(f"{base_dir.name} keeps no document texts and its dataset folder {folder} is missing")
    by_id = {d.doc_id: d for d in load_corpus(folder)}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise FoldError(f"{base_dir.name} keeps no document texts and {folder} lacks {len(missing)} of its "
                        f"documents (the first {missing[0]!r})")
    return [Document(i, by_id[i].title, by_id[i].text, dict(f)) for i, f in zip(ids, fields)]


def apply_writes(docs: list[Document], records: list[dict]) -> tuple[list[Document], dict]:
    """The corpus after ``records`` (log records in sequence order): an upsert replaces a document in place or
    appends it, a delete removes it.  Returns (documents, counts ``{"upserted", "added", "replaced",
    "deleted"}``; ``deleted`` counts ids that were present)."""
    out = {d.doc_id: d for d in docs}
    base = set(out)
    upserted, deleted = set(), set()
    for rec in records:
        if rec.get("op") == "upsert":
            for d in rec["docs"]:
                out[d["id"]] = Document(d["id"], d.get("title") or "", d["text"], dict(d.get("fields") or {}))
                upserted.add(d["id"])
                deleted.discard(d["id"])
        elif rec.get("op") == "delete":
            for i in rec["ids"]:
                if out.pop(i, None) is not None:
                    deleted.add(i)
                upserted.discard(i)
    present = set(out)
    return list(out.values()), {"upserted": len(upserted), "added": len(present - base),
                                "replaced": len(upserted & base), "deleted": len(base - present)}


def fold_options(pending: PendingWrites, collection: str, documents: list[Document],
                 drift_threshold: float) -> BuildOptions:
    """The :class:`trainer.build.BuildOptions` of a fold: the base version's settings, its parts reused.

    Raises:
        FoldError: the base version is of a kind not folded yet (CARS, difficulty head, funnel policy).
    """
    m = pending.manifest
    for present, what in ((m.cars, "CARS"), (m.tiers, "the DART difficulty head (--tiers)"),
                          (m.stage1_policy, "the funnel policy (--stage1-policy)"),
                          (m.ann, "an ANN first stage (--ann; its index is rebuilt per corpus)")):
        if present is not None:
            raise FoldError(f"{pending.base_version} was built with {what}, which folding does not reuse yet; "
                            "rebuild the collection instead (python -m trainer build)")
    pairs = tuple(sorted(tuple(p.action_pair) for p in m.router.pairs.values())) if m.router and m.router.pairs else ()
    corpus = m.corpus.model_dump()
    dataset = Path(m.corpus.dataset) if m.corpus.dataset else pending.base_dir / "no-dataset"
    return BuildOptions(
        dataset=dataset, collection=collection, train_split=corpus.get("train_split"),
        eval_split=corpus.get("eval_split"), rotation=m.adapter.kind if m.adapter else "identity", m0=m.m0,
        shortlist=m.shortlist, action_pairs=pairs or DEFAULT_PAIRS,
        default_pair=tuple(m.router.default_pair) if m.router and m.router.default_pair else (pairs or DEFAULT_PAIRS)[0],
        default_rho=m.router.default_rho if m.router else 0.2, publish=True, promote=False,
        capacity=m.capacity is not None, lexical=m.lexical is not None, levels=m.levels is not None,
        recall_policy=m.recall_policy is not None,
        recall_bound=m.recall_policy.bound if m.recall_policy is not None else "data_aware_doc",
        ann="none", documents=documents, reuse_from=pending.base_dir, drift_threshold=drift_threshold,
        writes={"folded_seq": pending.last_seq, "base_version": pending.base_version,
                "base_folded_seq": pending.base_seq})


def seed_logged_embeddings(records: list[dict], encoder, cache_path: Path | str) -> int:
    """Put the embeddings logged with upsert ``records`` into the embedding cache at ``cache_path``, keyed by
    content as the build reads them, when they were made by ``encoder`` (same fingerprint) and the cache does
    not hold the text yet; returns how many documents' embeddings the log provided (0 for records of another
    encoder or without embeddings: the build encodes those)."""
    fp = encoder_fingerprint(encoder)
    items = {}
    for rec in records:
        if rec.get("op") != "upsert":
            continue
        E = unpack_embeddings(rec, fp, encoder.dimension)
        if E is not None:
            items.update({content_key(encoder_text(d), fp): e for d, e in zip(rec["docs"], E)})
    if not items:
        return 0
    cache = EmbeddingCache(cache_path, encoder.dimension)
    try:
        # never replace a cached vector: a text the cache holds (a corpus document or a query written again as
        # a document) keeps the vector every build read, so builds stay reproducible; the logged one is equal
        # up to batch rounding (~1e-7) and only new texts need it
        have = cache.get_many(list(items))
        fresh = {k: v for k, v in items.items() if k not in have}
        cache.put_many(fresh)
    finally:
        cache.close()
    return len(items)


BASE_CHECK_SAMPLE = 8        # base documents re-encoded to check the vectors rebuilt from a version
BASE_CHECK_MIN_COSINE = 0.9999


def seed_base_embeddings(base_dir: Path, m: Manifest, documents: list[Document], encoder, cache_path: Path | str,
                         *, sample: int = BASE_CHECK_SAMPLE, seed: int = 0) -> int:
    """Put the base version's document vectors into the embedding cache at ``cache_path`` when the cache lacks
    them (a trainer on another machine or volume than the build's, or a cache deleted since), so a fold encodes
    only new texts whatever the cache holds.

    The version stores each document rotated (``docs.npy`` row ``R d``, ``R`` orthogonal): ``d = R^T (R d)``, i.e.
    ``X = docs @ R``.  The rebuilt vectors are checked first: ``sample`` documents (seeded) are re-encoded with
    ``encoder``, and every cosine with its rebuilt vector must be at least 0.9999 (the shipped embeddings' rule,
    :mod:`trainer.shipped_embeddings`); otherwise (another encoder, a rotation that is not orthogonal) nothing is
    seeded and the build encodes as before.  A vector the cache holds is never replaced.

    Args:
        base_dir: the base (live) version's directory; ``m`` its manifest.
        documents: :func:`base_documents` of it (row order).
        encoder: the trainer's encoder.

    Returns:
        Documents whose rebuilt vector went into the cache (0: the cache held them all, or the check failed).
    """
    fp = encoder_fingerprint(encoder)
    keys = [content_key(d.encoder_text(), fp) for d in documents]
    cache = EmbeddingCache(cache_path, encoder.dimension)
    try:
        have = cache.get_many(list(dict.fromkeys(keys)))
        todo = [i for i, k in enumerate(keys) if k not in have]
        if not todo:
            return 0
        core = files.read_core(base_dir, m)
        R = np.asarray(core.rotation, np.float64)
        if len(core.docs) != len(documents) or R.shape != (encoder.dimension, encoder.dimension):
            return 0
        rng = np.random.default_rng(seed)
        check = sorted(rng.choice(todo, size=min(sample, len(todo)), replace=False).tolist())
        got = np.asarray(encoder.encode([documents[i].encoder_text() for i in check]), np.float64)
        rebuilt = np.asarray(core.docs[check], np.float64) @ R
        cos = np.sum(got * rebuilt, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(rebuilt, axis=1))
        if float(cos.min()) < BASE_CHECK_MIN_COSINE:
            log.warning("the vectors of %s rebuilt from its documents and rotation do not match this encoder "
                        "(min cosine %.6f of %d re-encoded): the fold encodes the documents the cache lacks",
                        base_dir.name, float(cos.min()), len(check))
            return 0
        fresh: dict[str, np.ndarray] = {}
        for start in range(0, len(todo), 65536):
            rows = todo[start:start + 65536]
            X = (np.asarray(core.docs[rows], np.float64) @ R).astype(np.float32)
            fresh.update({keys[i]: x for i, x in zip(rows, X) if keys[i] not in fresh})
        cache.put_many(fresh)
        log.info("seeded the embedding cache with %d vectors rebuilt from %s (min cosine %.7f over %d "
                 "re-encoded)", len(fresh), base_dir.name, float(cos.min()), len(check))
        return len(todo)
    finally:
        cache.close()


def fold_collection(settings, encoder, collection: str, *, promote: bool = False,
                    drift_threshold: float = 0.05, actor: str = "trainer fold") -> dict:
    """Fold the pending writes of ``collection`` into a new version (module docstring); returns a report
    ``{"folded": bool, "version", "path", "folded_seq", "base_version", "base_folded_seq", "records",
    "changes", "fitting", "drift", "encoded_now", "promoted", "gate"}`` (``folded`` False: nothing pending).

    Raises:
        FoldError: no live version, a version kind not folded yet, or no document left.
        engine.version.store.BuildLocked: another build or fold of the collection is running.
        engine.wal.WalCorrupt: the log is unreadable.
    """
    pending = pending_writes(settings, collection)
    report = {"collection": collection, "base_version": pending.base_version, "base_folded_seq": pending.base_seq,
              "folded_seq": pending.last_seq, "records": len(pending.records)}
    if not pending.records:
        return {**report, "folded": False, "reason": "no writes after the live version's folded sequence number"}
    base = base_documents(pending.base_dir, pending.manifest)
    documents, changes = apply_writes(base, pending.records)
    if not documents:
        raise FoldError(f"folding seq {pending.base_seq + 1}..{pending.last_seq} would leave {collection!r} "
                        "without documents")
    opts = fold_options(pending, collection, documents, drift_threshold)
    report["embeddings_from_log"] = seed_logged_embeddings(pending.records, encoder, settings.embedding_cache)
    report["embeddings_from_base"] = seed_base_embeddings(pending.base_dir, pending.manifest, base, encoder,
                                                          settings.embedding_cache)
    log.info("folding %d records (seq %d..%d) onto %s: %s", len(pending.records), pending.base_seq + 1,
             pending.last_seq, pending.base_version, changes)
    path, manifest = build_index(opts, settings, encoder)
    report.update(folded=True, version=manifest.version, path=str(path), changes=changes,
                  fitting=manifest.writes.fitting, drift=manifest.writes.drift,
                  encoded_now=getattr(manifest.corpus, "encoded_now", None), documents=manifest.corpus.documents,
                  promoted=False, gate=None)
    if promote:
        registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root)
        try:
            promoted, gate, _ = promote_with_gate(settings, registry, collection, manifest.version, actor)
        finally:
            registry.close()
        report.update(promoted=promoted, gate=gate)
    # the promotion moved live and previous: the retention rule runs again on the new state
    report["retention"] = retention_after_build(settings, collection)
    return report
