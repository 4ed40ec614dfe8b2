"""Build one index version of a BEIR collection: encode, rotate, train adapter and router, evaluate, publish.

Steps (each logged with its duration):

1. encode the corpus and the queries with the ONNX encoder (embeddings cached by content hash);
2. rotations: PCA of the document second moment (baseline), and the orthogonal
   prefix adapter trained on the training split (§3.1 of 001) when one exists;
3. the served rotation (``--rotation``) rotates the documents; stage 1 is a faiss
   inner-product index over their normalised m0-prefixes;
4. a LightGBM router per action pair, fitted on training queries (§3.2 of 001); the stage-1 backend
   (``--ann``): the level store and its recall policy, or an ANN index with its tuned effort curve; with
   ``--ann auto`` on a corpus of at least ``ann_min_docs`` both are built, timed through the served pipeline
   at the default recall target, and only the faster is kept (:func:`_measure_backends`);
5. offline evaluation on the evaluation split through the served code path;
6. the capacity report (:mod:`adawidth.capacity`: δ, Warren's d*, regime, dimension
   cliff, CUS, failure AUC, prefix-sufficiency scaling) on the evaluation split and
   the served rotation, plus the offline baseline of the gateway's online CUS;
7. the version is written atomically (manifest last) and, with ``publish``,
   registered in the version registry as a candidate (the collection's first
   version, or any with ``promote``, is promoted at once).

A build holds the collection's build lock (:func:`engine.version.store.build_lock`) and first removes the
stale ``.tmp-*`` drafts a killed build left.  Once the corpus is read it refuses to go on when the new version
would not fit on the index volume (:func:`trainer.retention.check_build_disk`: a
:class:`engine.version.retention.DiskSpaceError`), and after publishing it applies the version retention rule
(:func:`trainer.retention.run_retention`, :mod:`engine.version.retention`).

**Reuse (a fold, issue 18).**  With ``reuse_from`` (a version directory) and ``documents`` (the corpus to
index instead of the dataset's: :mod:`trainer.fold`), the expensive fitting steps are skipped: the rotation,
the routers, the recall policy (its loaded, compiled model) and the level layout are the base version's.
Only new or changed documents are encoded (the embedding cache keys by content; the gateway's logged
embeddings seed it), rotated (unchanged documents keep the base's stored rows) and tokenized (the base's BM25
term counts are reused; the BM25 index is then rebuilt from the counts in a few vectorised passes, equal to a
from-scratch build).  The level store and stage 1 are rebuilt from the rows; the served evaluation runs
exhaustive full width and the default request only; the capacity report is carried from the base (marked
``meta.carried_from``, plots copied) with its online-CUS baseline measured again.  A drift check then
compares the new version's label-free online-CUS agreement (:func:`online_cus_agreement` on the evaluation
queries) with the base version's; beyond
``drift_threshold`` the build starts again without reuse (refits) and the manifest's ``writes.fitting`` says
``refitted``.

:func:`build_index` runs the steps as functions over one :class:`BuildContext`; every file is written by the
format's writers (:mod:`engine.version.files`, :mod:`engine.version.lexical`) and the manifest is the typed
:class:`engine.version.manifest.Manifest` assembled from their sections.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from pathlib import Path

import numpy as np

from adawidth import stage1_policy
from adawidth.levels import LevelLayout, LevelStore, default_seeds
from adawidth.pseudo_queries import pseudo_queries
from adawidth.blocked import BlockedCorpus
from adawidth.capacity import CapacityOptions, capacity_report
from adawidth.metrics import ranking_metric
from adawidth.rotation import orthogonality_error, pca_rotation
from adawidth.router import FEATURE_NAMES, router_feature_matrix, threshold_for_rate
from adawidth.tiers import RERANK_DEPTH
from engine import ann
from engine.home import home_defaults
from engine.index import IndexVersion, Router
from engine.pipeline import Pipeline, capabilities
from engine.plan import PlanDefaults, SearchSpec, is_blank
from engine.recall import RecallPolicy
from engine.stage1 import AnnStage1
from engine.io.beir import (Collection, DatasetFormatError, available_splits, load_collection, load_qrels,
                            load_queries)
from engine.registry import open_registry
from engine.registry.state import COLLECTION_NAME
from engine.scorers import CrossEncoderNotFoundError, CrossEncoderScorer
from engine.version import files
from engine.version.files import Files
from engine.version.lexical import lexical_files, lexical_reuse
from engine.version.manifest import (SCHEMA_VERSION, AdapterSection, BackendSection, CarsSection, CorpusSection, EncoderSection,
                                     Manifest, PolicySection, RouterPairSection, RouterSection, TiersSection,
                                     WritesSection, read_manifest)
from engine.version.store import build_lock, new_version_id, utc_timestamp, write_version
from trainer.adapter import AdapterConfig, train_adapter
from trainer.capacity_report import file_writers as capacity_file_writers, summary as capacity_summary
from trainer.cars import apply_cars
from trainer.dart.tier_head import fit_head, tier_quality
from trainer.embed_cache import EmbeddingCache, encode_with_cache
from trainer.evaluate import Funnel, QuerySet, exact_rankings, routed_policy_report, score_rankings
from trainer.milvus_stage1 import write_for_settings
from trainer.ray_encode import read_shards
from trainer.retention import check_build_disk, retention_after_build
from trainer.recall_fit import (calibration_report, concat_tables, fit_effort_models, fit_recall_policy, recall_table,
                                thread_calibration, thread_counts)
from trainer.router_fit import escalation_gains, fit_router
from trainer.stage1_policy_fit import PolicyFit, fit_stage1_policy, policy_training_data

log = logging.getLogger(__name__)

ROTATIONS = ("adapter", "adapter_on_pca", "pca", "identity")
DEFAULT_PAIRS = ((64, 128), (64, 256), (128, 256))
REPORT_RHOS = (0.1, 0.2, 0.3)


@dataclass
class BuildOptions:
    """What to build; defaults follow the main-job issue and §3 of 001."""

    dataset: Path
    collection: str | None = None          # default: the folder name
    train_split: str | None = "train"      # None or missing file: no adapter / router training on labels
    eval_split: str | None = "test"
    rotation: str = "adapter"
    m0: int = 64
    shortlist: int = 500
    action_pairs: tuple[tuple[int, int], ...] = DEFAULT_PAIRS
    default_pair: tuple[int, int] = (64, 128)
    default_rho: float = 0.2
    seed: int = 0
    publish: bool = True                   # register as a candidate (first version of a collection: promoted)
    promote: bool = False                  # also promote it right away (no quality gate; use `trainer promote`)
    adapter: dict = field(default_factory=dict)  # overrides of trainer.adapter.AdapterConfig
    router_crossfit_folds: int = 4         # adapters trained without each fold produce the router's training data
    capacity: bool = True                  # compute the capacity report (needs the evaluation split)
    capacity_options: dict = field(default_factory=dict)  # overrides of adawidth.capacity.CapacityOptions
    lexical: bool = True                   # BM25 index, document texts and keyword fields (issue 6)
    cars: dict | None = None               # CARS Shared/Dual adapter selection (trainer.cars.CarsConfig overrides)
    stage1_policy: bool = False            # also fit the per-query funnel policy (adawidth.stage1_policy)
    stage1_policy_tau: float = 0.95        # its agreement bar: cheapest configuration predicted to keep >= τ of the top-10
    embeddings: Path | None = None         # read corpus embeddings from Ray shards (trainer encode) instead
    tiers: bool = False                    # fit the DART difficulty head (tier 'auto'); needs a cross-encoder export
    cross_encoder: Path | None = None      # its export (default <home>/models/minilm-cross-encoder)
    tier_head_queries: int | None = None   # label at most this many held-out training queries (None: all of them)
    levels: bool = True                    # the level-major corpus of the certified level scan (width 'full', 'recall')
    recall_policy: bool = True             # fit policy 'recall' (the default 'auto'); needs levels
    recall_bound: str = "data_aware_doc"   # the level scan's probabilistic bound of policy 'recall'
    calibration_threads: int | None = None  # calibrate policy 'recall' at every kernel thread count up to this
    #                                         (None: the build machine's cores, at most 8; 1: one thread only)
    pseudo_queries: int = 600              # calibration queries drawn from the corpus when there is no train split
    strict: bool = False                   # refuse a corpus with empty documents instead of skipping them (issue 18)
    ann: str = "none"                      # ANN first stage (issue 19): none, auto or a kind of engine.ann.ANN_KINDS
    ann_params: dict = field(default_factory=dict)  # overrides of engine.ann.default_params (M, ef_construction, nlist)
    ann_tuning_queries: int = 1000         # at most this many queries tune the effort curve
    ann_effort_model: bool = True          # fit and time the per-query effort model (engine.ann.probe)
    documents: list | None = None          # the corpus (engine.io.beir.Document) instead of the dataset's (a fold)
    reuse_from: Path | None = None         # a version whose rotation, routers, recall policy, level layout are reused
    writes: dict | None = None             # the manifest's writes section (folded_seq, base_version, base_folded_seq)
    drift_threshold: float = 0.05          # reuse: refit when the online-CUS agreement moves more than this
    free_bytes: Callable[[Path], int] | None = None  # free bytes of the index volume (default shutil.disk_usage)
    retention: bool = True                 # apply version retention after publishing (trainer.retention)


class _Timer:
    def __init__(self):
        self.t = {}

    def __call__(self, name):
        timer = self

        class _Ctx:
            def __enter__(self):
                self.s = time.perf_counter()
                log.info("%s ...", name)

            def __exit__(self, *exc):
                timer.t[name] = round(time.perf_counter() - self.s, 3)
                log.info("%s done in %.1f s", name, timer.t[name])

        return _Ctx()


def _query_set(col: Collection, qrels: dict[str, dict[str, int]], emb_of: dict[str, np.ndarray]) -> QuerySet:
    ids = [q for q, j in qrels.items() if q in col.queries and any(v > 0 for v in j.values())]
    return QuerySet(ids, np.stack([emb_of[q] for q in ids]) if ids else np.empty((0, 0)), [qrels[q] for q in ids])


def corpus_fingerprint(col: Collection) -> str:
    """sha256 over ids and encoder texts of the corpus, in order."""
    h = hashlib.sha256()
    for d in col.corpus:
        h.update(d.doc_id.encode("utf-8", "surrogatepass") + b"\x00" + d.encoder_text().encode("utf-8", "surrogatepass") + b"\x01")
    return h.hexdigest()


def dataset_fingerprint(folder: Path | str) -> str:
    """sha256 over the relative paths and bytes of the BEIR files of a folder (corpus, queries, every qrels split).

    The trainer daemon (``trainer serve``) rebuilds when this changes.

    Raises:
        FileNotFoundError: if the folder does not exist.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"dataset folder {folder} is a file, not a BEIR folder (give the folder that holds "
                                f"corpus.jsonl)" if folder.is_file() else f"dataset folder {folder} does not exist")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and (
        p.name.startswith(("corpus.jsonl", "queries.jsonl")) or p.parent.name == "qrels"))
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(folder).as_posix().encode() + b"\x00")
        with open(p, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        h.update(b"\x01")
    return h.hexdigest()


def capacity_for_version(opts: BuildOptions, test: QuerySet, X_rot: np.ndarray, R: np.ndarray, doc_ids: list[str],
                         version: IndexVersion, texts: list[str], name: str) -> dict:
    """Capacity report of the served rotation on the evaluation queries, with the online-CUS baseline.

    The baseline is the share of evaluation queries whose top-1 under the version's default ``auto`` policy
    (the plain request ``{"query", "k"}`` through the gateway's pipeline on ``version``, the version being
    built) equals the exhaustive full-width top-1: the value the gateway's online label-free CUS should
    reproduce on traffic like the evaluation queries (``adawidth_online_cus_baseline_ratio``).  Absent when
    the version serves no ``auto`` policy.
    """
    q_rot = np.ascontiguousarray(test.emb @ R.T, dtype=np.float32)
    cap_opts = CapacityOptions(**{"r_floor": opts.m0, "seed": opts.seed, **opts.capacity_options})
    report = capacity_report(q_rot, X_rot, test.judgments, doc_ids, test.ids, cap_opts)
    report["meta"] = {"collection": name, "rotation": opts.rotation, "split": opts.eval_split,
                      "dataset": str(opts.dataset)}
    baseline = online_cus_agreement(version, test, texts)
    if baseline is not None:
        report["online_cus_baseline"] = baseline
    return report


def online_cus_agreement(version: IndexVersion, test: QuerySet, texts: list[str],
                         served_rows: list | None = None) -> dict | None:
    """The offline baseline of the gateway's label-free online CUS: the share of ``test`` queries whose top-1
    under the version's default ``auto`` policy (the plain request ``{"query", "k": 10}``) equals the exhaustive
    full-width top-1 over ``version.docs``.  ``{"agreement", "queries", "policy"}``, or None when the version
    serves no ``auto`` policy or there are no queries.  Cheap: one served search and one (N, Q) product;
    ``served_rows`` (Q row arrays of the plain request's results, already run) skips the search."""
    default = capabilities(version).default_policy
    if default is None or not len(test.ids):
        return None
    if served_rows is None:
        served_rows = [r.rows for r in Pipeline().search(version, [SearchSpec(query=t, k=10) for t in texts],
                                                         embeddings=test.emb)]
    q_rot = np.ascontiguousarray(test.emb @ np.asarray(version.rotation, np.float32).T, dtype=np.float32)
    full_top1 = np.argmax(np.asarray(version.docs, np.float32) @ q_rot.T, axis=0)
    agree = [len(r) > 0 and int(r[0]) == int(full_top1[i]) for i, r in enumerate(served_rows)]
    return {"agreement": float(np.mean(agree)), "queries": len(agree), "policy": f"auto: {default}"}


@dataclass
class BuildContext:
    """What the steps of :func:`build_index` read and write, in the order they fill it.

    Arrays: ``X`` (N, D) float32 frozen document embeddings (CARS-mapped when CARS is on), ``R`` (D, D) the
    served rotation, ``X_rot`` (N, D) float32 rotated documents; query sets hold (Q, D) embeddings.
    """

    opts: BuildOptions
    settings: object
    encoder: object
    timer: _Timer = field(default_factory=lambda: _Timer())
    dataset_fingerprint: str = ""
    train_split: str | None = None
    eval_split: str | None = None
    col: Collection | None = None
    name: str = ""
    doc_ids: list[str] = field(default_factory=list)
    row_of: dict[str, int] = field(default_factory=dict)
    train_qrels: dict = field(default_factory=dict)
    eval_qrels: dict = field(default_factory=dict)
    X: np.ndarray | None = None
    n_encoded: int = 0
    skipped_empty: list = field(default_factory=list)  # ids of the empty documents left out (issue 18)
    train: QuerySet | None = None
    test: QuerySet | None = None
    tier_head: np.ndarray | None = None
    tiers_meta: dict | None = None
    cars_meta: dict | None = None
    frozen: tuple | None = None            # (X, train) before CARS mapped them (the difficulty head reads these)
    cars_writers: dict = field(default_factory=dict)
    rotations: dict = field(default_factory=dict)
    positives: list | None = None
    adapter_report: dict | None = None
    R: np.ndarray | None = None
    X_rot: np.ndarray | None = None
    funnel: Funnel | None = None
    routers: dict = field(default_factory=dict)
    router_meta: dict = field(default_factory=dict)
    parts: list | None = None
    policy: PolicyFit | None = None
    levels: LevelStore | None = None
    recall: dict | None = None             # the fitted recall policy: booster, oof, table, section fields
    backend: ann.BackendChoice | None = None  # the stage-1 backend chosen from N and the memory budget (issue 19)
    ann: dict | None = None                # the ANN first stage: index, params, curve, section fields
    backend_measured: dict | None = None   # auto: the backends timed at the default recall target, and the pick
    evaluation: dict | None = None
    capacity: dict | None = None
    base: IndexVersion | None = None       # reuse_from, loaded (its fitted parts are reused)
    drift: dict | None = None              # the drift check of a reuse build

    @property
    def has_train(self) -> bool:
        """True when there are labelled training queries."""
        return self.train is not None and bool(self.train.ids)

    @property
    def has_test(self) -> bool:
        """True when there are labelled evaluation queries."""
        return self.test is not None and bool(self.test.ids)


def _check_options(opts: BuildOptions, settings, dimension: int) -> None:
    """Refuse inconsistent options before any work (ValueError), and ``--tiers`` without an export."""
    name = opts.collection or Path(opts.dataset).name
    if not COLLECTION_NAME.match(name or ""):  # a name is a folder under the index root: nothing else
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise ValueError(f"collection name {shown!r} is not a plain name: letters, digits, '.', '_' and '-', at "
                         f"most 128 characters, not starting with '.' or '-'"
                         + ("" if opts.collection else " (the dataset folder's name; give --collection)"))
    if not 1 <= opts.m0 <= dimension:
        raise ValueError(f"--m0 must be in [1, {dimension}], got {opts.m0}")
    if opts.shortlist < 1:
        raise ValueError(f"--shortlist must be at least 1, got {opts.shortlist}")
    if opts.calibration_threads is not None and not 1 <= opts.calibration_threads <= 256:
        raise ValueError(f"--calibration-threads must be in [1, 256], got {opts.calibration_threads}")
    if opts.rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {opts.rotation!r}")
    for low, high in opts.action_pairs:
        if not opts.m0 <= low < high <= dimension:
            raise ValueError(f"action pair ({low}, {high}) must satisfy m0={opts.m0} <= l < h <= {dimension}")
    if tuple(opts.default_pair) not in {tuple(p) for p in opts.action_pairs}:
        raise ValueError(f"default pair {opts.default_pair} is not among the action pairs")
    if opts.tiers:  # fail before encoding, not after
        ce_dir = _cross_encoder_dir(opts, settings)
        if not (Path(ce_dir) / "cross_encoder.json").is_file():
            raise CrossEncoderNotFoundError(f"--tiers needs a cross-encoder export at {ce_dir} "
                                            "(python -m trainer.dart.cross_encoder --dataset ...)")


def _cross_encoder_dir(opts: BuildOptions, settings) -> Path:
    return Path(opts.cross_encoder or home_defaults(Path(settings.home))["cross_encoder_dir"])


def _read_dataset(ctx: BuildContext) -> None:
    """Splits, corpus, queries and qrels (the fingerprint first: a change while building is seen next poll)."""
    opts = ctx.opts
    if opts.documents is not None:
        _read_given_documents(ctx)
        return
    ctx.dataset_fingerprint = dataset_fingerprint(opts.dataset)
    splits = available_splits(opts.dataset)
    ctx.eval_split = opts.eval_split if opts.eval_split in splits else None
    ctx.train_split = opts.train_split if opts.train_split in splits else None
    if ctx.train_split is None and (opts.rotation.startswith("adapter") or opts.stage1_policy):
        what = f"rotation {opts.rotation!r}" if opts.rotation.startswith("adapter") else "the stage-1 policy"
        raise ValueError(f"{what} needs training qrels ({opts.train_split!r} split not found in {opts.dataset}; "
                         f"it has {splits or 'no'} splits)")
    if opts.tiers and ctx.train_split is None:
        raise ValueError(f"the difficulty head (--tiers) needs training qrels ({opts.train_split!r} split not found)")
    ctx.col = load_collection(opts.dataset, ctx.eval_split or (splits[0] if splits else "test"))
    _skip_empty_documents(ctx)
    ctx.name = opts.collection or ctx.col.name
    ctx.doc_ids = [d.doc_id for d in ctx.col.corpus]
    ctx.row_of = {d: i for i, d in enumerate(ctx.doc_ids)}
    ctx.train_qrels = load_qrels(opts.dataset, ctx.train_split) if ctx.train_split else {}
    ctx.eval_qrels = ctx.col.qrels if ctx.eval_split else {}


def _read_given_documents(ctx: BuildContext) -> None:
    """``documents`` given (a fold): that corpus; the queries and qrels of the dataset folder when it still
    exists (qrels of documents no longer in the corpus are kept: they count as misses).  A reuse build reads
    no training qrels (nothing is fitted on them)."""
    opts = ctx.opts
    folder = Path(opts.dataset)
    splits = available_splits(folder) if folder.is_dir() else []
    ctx.dataset_fingerprint = dataset_fingerprint(folder) if folder.is_dir() else ""
    ctx.eval_split = opts.eval_split if opts.eval_split in splits else None
    ctx.train_split = opts.train_split if opts.train_split in splits else None
    if ctx.train_split is None and opts.reuse_from is None and opts.rotation.startswith("adapter"):
        raise ValueError(f"rotation {opts.rotation!r} needs training qrels ({opts.train_split!r} split not found in "
                         f"{folder})")
    queries = load_queries(folder) if splits else {}
    eval_qrels = load_qrels(folder, ctx.eval_split) if ctx.eval_split else {}
    ctx.col = Collection(opts.collection or folder.name, list(opts.documents), queries, eval_qrels,
                         ctx.eval_split or "test")
    _skip_empty_documents(ctx)
    ctx.name = opts.collection or ctx.col.name
    ctx.doc_ids = [d.doc_id for d in ctx.col.corpus]
    ctx.row_of = {d: i for i, d in enumerate(ctx.doc_ids)}
    train = load_qrels(folder, ctx.train_split) if ctx.train_split and opts.reuse_from is None else {}
    # training judgments of documents no longer in the corpus (deleted) are dropped: a query left with no
    # relevant document trains nothing (the adapter refuses such queries)
    kept = {q: {d: g for d, g in j.items() if d in ctx.row_of} for q, j in train.items()}
    ctx.train_qrels = {q: j for q, j in kept.items() if any(g > 0 for g in j.values())}
    ctx.eval_qrels = eval_qrels


def _skip_empty_documents(ctx: BuildContext) -> None:
    """Drop the documents whose title and text are both blank (they would be indexed as the encoder's embedding
    of nothing and rank for unrelated queries), counted in the manifest's ``corpus.skipped_empty``; with
    ``strict`` refuse the corpus instead.

    Raises:
        engine.io.beir.DatasetFormatError: ``strict`` and at least one empty document.
    """
    empty = [d.doc_id for d in ctx.col.corpus if is_blank(d.title) and is_blank(d.text)]
    ctx.skipped_empty = empty
    if not empty:
        return
    if ctx.opts.strict:
        raise DatasetFormatError(Path(ctx.opts.dataset) / "corpus.jsonl", None,
                                 f"{len(empty)} empty documents (title and text blank), the first {empty[0]!r}; "
                                 "drop --strict to skip them")
    log.warning("skipping %d empty documents (title and text blank), the first %r", len(empty), empty[0])
    if len(empty) == len(ctx.col.corpus):
        raise DatasetFormatError(Path(ctx.opts.dataset) / "corpus.jsonl", None, "every document is empty")
    gone = set(empty)
    ctx.col.corpus = [d for d in ctx.col.corpus if d.doc_id not in gone]


def _check_disk(ctx: BuildContext) -> None:
    """Refuse a build whose version would not fit on the index volume (:func:`trainer.retention.check_build_disk`)."""
    needed = check_build_disk(ctx.settings, ctx.name, len(ctx.doc_ids), ctx.encoder.dimension, ctx.opts.free_bytes)
    log.info("disk check: the new version needs about %d bytes", needed)


def _encode(ctx: BuildContext) -> None:
    """Corpus and query embeddings (cached by content hash), or the corpus from Ray shards."""
    col, settings, encoder = ctx.col, ctx.settings, ctx.encoder
    cache = EmbeddingCache(settings.embedding_cache, encoder.dimension)
    try:
        with ctx.timer("encode corpus"):
            if ctx.opts.embeddings is not None:  # shards of the Ray Data encoding job (trainer/ray_encode.py)
                ctx.X, ctx.n_encoded = read_shards(ctx.opts.embeddings, ctx.doc_ids), 0
            else:
                ctx.X, ctx.n_encoded = encode_with_cache(encoder, [d.encoder_text() for d in col.corpus], cache,
                                                         batch_size=settings.encode_batch_size,
                                                         desc=f"encoding {ctx.name} corpus")
        qids = [q for q in sorted(set(ctx.train_qrels) | set(ctx.eval_qrels)) if q in col.queries]
        with ctx.timer("encode queries"):
            QE, _ = encode_with_cache(encoder, [col.queries[q] for q in qids], cache,
                                      desc=f"encoding {ctx.name} queries")
    finally:
        cache.close()
    emb_of = dict(zip(qids, QE))
    ctx.train = _query_set(col, ctx.train_qrels, emb_of) if ctx.train_qrels else None
    ctx.test = _query_set(col, ctx.eval_qrels, emb_of) if ctx.eval_qrels else None


def _difficulty_head(ctx: BuildContext) -> None:
    """``--tiers``: the DART difficulty head on held-out training queries."""
    if not ctx.opts.tiers:
        return
    if not ctx.has_train:
        raise ValueError("the difficulty head (--tiers) needs training queries (a train split)")
    with ctx.timer("difficulty head"):
        X, train = ctx.frozen or (ctx.X, ctx.train)
        ctx.tier_head, ctx.tiers_meta = _fit_tier_head(ctx.opts, ctx.settings, ctx.encoder, X, ctx.col, train,
                                                       ctx.opts.seed, served_version(ctx), ctx.train.emb)


def _cars(ctx: BuildContext) -> None:
    """CARS: map the corpus and every query set into the selected adapter's space."""
    if ctx.opts.cars is None:
        return
    with ctx.timer("cars"):
        ctx.frozen = (ctx.X, ctx.train)
        ctx.X, ctx.train, ctx.test, ctx.cars_writers, ctx.cars_meta = apply_cars(
            ctx.opts.cars, ctx.X, ctx.train, ctx.test, ctx.row_of, ctx.opts.seed)


def _reused_rotated_rows(ctx: BuildContext, X: np.ndarray) -> np.ndarray:
    """(N, D) float32 rotated documents of a fold: a document whose id and encoder text the base version holds
    keeps the base's stored row (the vector it served, same embedding, same rotation); only new and changed
    documents are rotated now (``X @ R.T``)."""
    base = ctx.base
    R = ctx.R
    if base.texts is None or len(base.texts) != base.size:
        return np.ascontiguousarray(X @ R.T, dtype=np.float32)
    row_of = {d: i for i, d in enumerate(base.doc_ids)}
    src = np.full(len(ctx.doc_ids), -1, np.int64)
    for i, (d, doc) in enumerate(zip(ctx.doc_ids, ctx.col.corpus)):
        j = row_of.get(d)
        if j is not None and base.texts[j] == doc.encoder_text():
            src[i] = j
    out = np.empty((len(ctx.doc_ids), X.shape[1]), np.float32)
    keep = src >= 0
    out[keep] = np.asarray(base.docs, np.float32)[src[keep]]
    if (~keep).any():
        out[~keep] = X[~keep] @ R.T
    return out


def _rotations(ctx: BuildContext) -> None:
    """PCA, identity and (with a learned rotation) the adapter; the served one rotates the documents."""
    opts, X = ctx.opts, ctx.X
    D = ctx.encoder.dimension
    if ctx.base is not None:  # reuse: the base version's rotation
        ctx.R = np.asarray(ctx.base.rotation, np.float64)
        ctx.rotations = {opts.rotation: ctx.R}
        ctx.adapter_report = dict(ctx.base.manifest.adapter.training or {}) if ctx.base.manifest.adapter else None
        ctx.X_rot = _reused_rotated_rows(ctx, X)
        ctx.funnel = Funnel.build(ctx.X_rot, ctx.doc_ids, opts.m0, opts.shortlist)
        return
    ctx.rotations = {"identity": np.eye(D)}
    with ctx.timer("pca rotation"):
        ctx.rotations["pca"] = pca_rotation(X)
    if opts.rotation.startswith("adapter"):
        if not ctx.has_train:
            raise ValueError(f"rotation {opts.rotation!r} needs training qrels ({opts.train_split!r} split not found)")
        base = ctx.rotations["pca"] if opts.rotation == "adapter_on_pca" else ctx.rotations["identity"]
        cfg = AdapterConfig(seed=opts.seed, **opts.adapter)
        ctx.positives = [np.array([ctx.row_of[d] for d, g in j.items() if g > 0 and d in ctx.row_of])
                         for j in ctx.train.judgments]
        with ctx.timer("adapter training"):
            R_learned, ctx.adapter_report = train_adapter(ctx.train.emb @ base.T, X @ base.T, ctx.positives, cfg)
        ctx.rotations[opts.rotation] = R_learned @ base
        ctx.adapter_report["config"] = cfg.as_manifest()
        ctx.adapter_report["loss_history"] = cfg.history
    ctx.R = ctx.rotations[opts.rotation]
    if orthogonality_error(ctx.R) > 1e-4:
        raise RuntimeError(f"served rotation is not orthogonal (error {orthogonality_error(ctx.R):.2e})")
    ctx.X_rot = np.ascontiguousarray(X @ ctx.R.T, dtype=np.float32)
    ctx.funnel = Funnel.build(ctx.X_rot, ctx.doc_ids, opts.m0, opts.shortlist)


def _routers(ctx: BuildContext) -> None:
    """One LightGBM router per action pair, on (cross-fitted) training queries."""
    opts = ctx.opts
    if ctx.base is not None:  # reuse: the base version's routers and their calibration
        for pair, router in ctx.base.routers.items():
            ctx.routers[pair] = _ReusedRouter(router.booster, np.asarray(router.calibration, np.float64))
            sec = ctx.base.manifest.router.pairs[files.router_key(pair)]
            ctx.router_meta[pair] = {k: v for k, v in sec.model_dump().items()
                                     if k not in ("file", "action_pair", "calibration_predictions")}
        return
    if not ctx.has_train:
        return
    crossfit = opts.rotation.startswith("adapter") and opts.router_crossfit_folds >= 2
    with ctx.timer("router training data" + (f" ({opts.router_crossfit_folds}-fold cross-fitted adapters)"
                                             if crossfit else "")):
        s1_scores, gains_by_pair, ctx.parts = _router_training_data(
            opts, ctx.train, ctx.X, ctx.doc_ids, ctx.R, ctx.rotations, ctx.positives if crossfit else None, opts.seed)
    for pair in opts.action_pairs:
        with ctx.timer(f"router {pair}"):
            fit = fit_router(s1_scores, gains_by_pair[pair], pair, seed=opts.seed)
        ctx.routers[pair] = fit
        gains = gains_by_pair[pair]
        ctx.router_meta[pair] = {
            "calibration": "5-fold out-of-fold router predictions on the training queries"
                           + (", whose features come from adapters that did not see them (cross-fitted)"
                              if crossfit else ""),
            "train_queries": len(gains),
            "share_gain_positive": float(np.mean(gains > 0)),
            "share_gain_negative": float(np.mean(gains < 0)),
        }


def _choose_backend(ctx: BuildContext) -> None:
    """The stage-1 backend from N, ``--ann``, ``ann_min_docs`` and ``memory_budget_bytes`` (settings), before any
    encoding: a build that would not fit raises :class:`engine.ann.MemoryBudgetError` (a ValueError: the CLI
    exits 2 with the bytes needed).  An ANN version holds no level store (its exact path is the flat scan)."""
    opts, settings = ctx.opts, ctx.settings
    D = ctx.encoder.dimension
    layout = LevelLayout.default(D)
    level_bpd = (4.0 * D + 2.0 * layout.fp16_width + 4.0 * (layout.L + 1)) if opts.levels else 0.0
    ctx.backend = ann.select_backend(opts.ann, len(ctx.doc_ids), D,
                                     ann_min_docs=int(getattr(settings, "ann_min_docs", 200_000)),
                                     memory_budget_bytes=getattr(settings, "memory_budget_bytes", None),
                                     level_bytes_per_document=level_bpd, fp16_width=layout.fp16_width,
                                     params=opts.ann_params)
    log.info("stage-1 backend: %s (%s)", ctx.backend.backend, ctx.backend.reason)


def _pseudo_query_embeddings(ctx: BuildContext):
    """Pseudo-queries drawn from the corpus (no train split) and their (Q, D) float32 frozen embeddings."""
    docs = ctx.col.corpus
    pseudo = pseudo_queries([d.title for d in docs], [d.text for d in docs], ctx.opts.pseudo_queries, ctx.opts.seed)
    cache = EmbeddingCache(ctx.settings.embedding_cache, ctx.encoder.dimension)
    try:
        QP, _ = encode_with_cache(ctx.encoder, pseudo.texts, cache, desc=f"encoding {ctx.name} pseudo-queries")
    finally:
        cache.close()
    return pseudo, QP


def _ann(ctx: BuildContext) -> None:
    """The ANN first stage of the chosen backend over the documents in its space (:func:`engine.ann.index_space`:
    as encoded, or rotated for Panorama's kinds), and its effort curve tuned on the training queries (or corpus
    pseudo-queries): recall@10 against exhaustive search after the exact rescoring."""
    opts = ctx.opts
    if ctx.backend is None or ctx.backend.backend == "flat":
        return
    kind = ctx.backend.backend
    N = len(ctx.doc_ids)
    params = ann.default_params(kind, N, **opts.ann_params)
    space = ann.index_space(kind)
    X_ann = ctx.X_rot if space == "rotated" else np.ascontiguousarray(ctx.X, np.float32)
    with ctx.timer(f"ann {kind}"):
        index = ann.build_index(X_ann, params, seed=opts.seed)
    with ctx.timer("ann effort tuning"):
        if ctx.has_train:
            Q, source, pseudo = ctx.train.emb, "train", None
        else:
            pseudo, Q = _pseudo_query_embeddings(ctx)
            source = f"pseudo:{pseudo.record['mode']}"
        rng = np.random.default_rng(opts.seed)
        if len(Q) > opts.ann_tuning_queries:
            Q = Q[np.sort(rng.choice(len(Q), opts.ann_tuning_queries, replace=False))]
        Q_rot = np.ascontiguousarray(Q @ ctx.R.T, np.float32)
        Q_ann = Q_rot if space == "rotated" else np.ascontiguousarray(Q, np.float32)
        truth = ann.exhaustive_top_k(X_ann, Q_ann, 10)
        margin = 0.25 if pseudo is None else 0.5
        curve = ann.tune_effort(index, params, X_ann, Q_ann, k=10, depth=10, truth=truth,
                                refine_for=tuple(ann.goal(t, margin) for t in ann.DEFAULT_TARGETS))
    targets = {f"{t:g}": ann.effort_for(curve, t, margin) for t in ann.DEFAULT_TARGETS}
    ctx.ann = {"index": index, "params": params, "curve": curve, "X": X_ann,
               "section": {"space": space, "search": "resumable" if kind in ann.RESUMABLE_KINDS else "faiss",
                           "targets": targets, "margin_share": margin, "tuning_source": source,
                           "tuning_queries": int(len(Q_rot)), "bytes_per_document": ctx.backend.bytes_per_document,
                           "pseudo_queries": pseudo.record if pseudo is not None else None}}
    log.info("ann %s: %s; served efforts %s", kind, params.as_dict(), targets)
    if opts.ann_effort_model:
        with ctx.timer("ann per-query effort model"):
            _ann_effort_model(ctx, Q, Q_rot, truth, source)


def _ann_effort_model(ctx: BuildContext, Q: np.ndarray, Q_rot: np.ndarray, truth: np.ndarray, source: str) -> None:
    """The ANN's per-query effort models (LAET / DARTH style; :func:`trainer.recall_fit.fit_effort_models`,
    :func:`engine.ann.probe`): per default target the probe effort among :func:`engine.ann.probe_candidates`
    with the tuning queries' lowest median work at its calibrated bar (targets choosing the same probe share one
    model; for an index over the documents as encoded without the energy features,
    :data:`engine.ann.ENERGY_FEATURES`, so its queries skip the rotation), fitted out of fold on the tuning
    queries, calibrated per target like the level scan's recall policy
    (one standard error of the calibration mean on training queries, half the miss budget on pseudo-queries),
    then timed through the served pipeline against the one tuned effort at each default target on up to
    :data:`MEASURE_QUERIES` of them; a model serves a target only where its p50 is at most
    :data:`EFFORT_MODEL_MAX_RATIO` of the tuned effort's (the probe costs a search of its own, so a per-query
    effort that saves work need not save time)."""
    a, opts = ctx.ann, ctx.opts
    margin = ({"margin_rule": "standard_error", "margin_share": 0.25} if source == "train"
              else {"margin_rule": "share", "margin_share": 0.5})
    space = a["section"]["space"]
    Q_ann = Q_rot if space == "rotated" else np.ascontiguousarray(Q, np.float32)
    fits = fit_effort_models(a["index"], a["params"], a["X"], Q_ann, a["curve"], k=10, truth=truth,
                             margin_share=a["section"]["margin_share"], margin_rule=margin["margin_rule"],
                             rule_share=margin["margin_share"], seed=opts.seed,
                             energy=space == "rotated")  # as encoded: no rotated prefix (ENERGY_FEATURES)
    policies = [RecallPolicy(f.booster, list(f.table.feature_names), np.asarray(f.table.z_grid, np.float64), "ann",
                             f.oof, f.table.recall, f.table.coordinates, k=10, **margin) for f in fits]
    by_target = {t: p for f, p in zip(fits, policies) for t in f.targets} if len(fits) > 1 else None
    rng = np.random.default_rng(opts.seed + 11)
    Qm = Q if len(Q) <= MEASURE_QUERIES else Q[np.sort(rng.choice(len(Q), MEASURE_QUERIES, replace=False))]
    stages = {"fixed": AnnStage1(a["index"], a["params"], a["curve"], a["section"]["margin_share"], space=space),
              "per_query": AnnStage1(a["index"], a["params"], a["curve"], a["section"]["margin_share"],
                                     effort_policy=policies[0], target_policies=by_target, space=space)}
    versions = {n: IndexVersion.in_memory(ctx.X_rot, ctx.R, ctx.doc_ids, ann=s) for n, s in stages.items()}
    measured, chosen = {}, []
    for t in ann.DEFAULT_TARGETS:
        if stages["fixed"].exact_because(t, None) is not None or stages["per_query"].policy_for(t).bar(t) is None:
            continue  # served exactly (or the model cannot meet it): nothing to choose
        m = time_backends(versions, ctx.X_rot, np.ascontiguousarray(Qm, np.float32), t)
        measured[f"{t:g}"] = {n: {k: round(v, 4) for k, v in got.items()} for n, got in m.items()}
        if m["per_query"]["p50_ms"] <= EFFORT_MODEL_MAX_RATIO * m["fixed"]["p50_ms"]:
            chosen.append(float(t))
    models = []
    for f, policy in zip(fits, policies):
        mine = {f"{t:g}" for t in f.targets}
        models.append({"booster": f.booster, "oof": f.oof, "recall": f.table.recall,
                       "coordinates": f.table.coordinates, "policy": policy,
                       "section": {"feature_names": list(f.table.feature_names),
                                   "z_grid": [float(z) for z in f.table.z_grid], "k": 10, **margin,
                                   "probe_choice": f.probes, "targets": list(f.targets) if len(fits) > 1 else [],
                                   "calibration_source": source,
                                   "per_query_targets": [t for t in chosen if f"{t:g}" in mine],
                                   "measured": {t: v for t, v in measured.items() if t in mine}}})
    a["effort_model"] = models
    log.info("ann per-query effort models: probes %s, serve targets %s (measured %s)",
             {f.probe: f.targets for f in fits}, chosen, measured)


EFFORT_MODEL_MAX_RATIO = 0.95
"""The per-query effort model serves a target when its measured p50 is at most this share of the one tuned
effort's (below it the difference is within run-to-run noise: the tuned effort serves)."""


def ann_stage(a: dict) -> AnnStage1:
    """The served ANN first stage of a build's ``ctx.ann`` (with its per-query effort model where it has one)."""
    models = a.get("effort_model") or []
    return AnnStage1(a["index"], a["params"], a["curve"], a["section"]["margin_share"],
                     a["section"]["bytes_per_document"], effort_policy=models[0]["policy"] if models else None,
                     model_targets={t: t in e["section"]["per_query_targets"] for e in models
                                    for t in map(float, e["section"]["measured"])} if models else None,
                     target_policies={t: e["policy"] for e in models for t in e["section"]["targets"]}
                     if len(models) > 1 else None, space=a["section"]["space"])


def _levels_and_recall(ctx: BuildContext) -> None:
    """The level store of the served rotation and policy ``recall``: a LightGBM model of recall@k per confidence,
    calibrated out of fold on the training queries (through the cross-fitted rotations when the rotation is
    learned, as the routers are), or on pseudo-queries drawn from the corpus when there is no train split."""
    opts = ctx.opts
    if not opts.levels or (ctx.backend is not None and ctx.backend.backend != "flat"
                           and "flat" not in ctx.backend.alternatives):
        return
    base_levels = ctx.base.levels if ctx.base is not None else None
    with ctx.timer("level store"):
        ctx.levels = LevelStore.build(ctx.X_rot, base_levels.layout if base_levels is not None else None)
    if not opts.recall_policy:
        return
    if ctx.base is not None:  # reuse: the base version's recall model and its calibration
        loaded, sec_m = ctx.base.recall_policy, ctx.base.manifest.recall_policy
        if loaded is None or sec_m is None:
            return
        section = {k: v for k, v in sec_m.model_dump().items()
                   if k not in ("file", "calibration_file", "calibration_queries")}
        # the base's loaded policy as it is (booster, calibration, compiled forest): nothing is read or compiled
        ctx.recall = {"booster": loaded.booster, "oof": loaded.calibration_pred,
                      "table": _ReusedTable(loaded.calibration_recall, loaded.calibration_coordinates),
                      "by_threads": loaded.calibration_by_threads, "section": section, "loaded": loaded}
        return
    with ctx.timer("recall policy"):
        if ctx.has_train:
            source = "train" + (" (cross-fitted rotations)" if ctx.parts and len(ctx.parts) > 1 else "")
            parts = ctx.parts if ctx.parts and len(ctx.parts) > 1 else [(np.arange(len(ctx.train.ids)), ctx.R)]
            runs = [(ctx.levels if Rf is ctx.R else LevelStore.build(np.ascontiguousarray(ctx.X @ Rf.T, np.float32)),
                     np.ascontiguousarray(ctx.train.emb[idx] @ Rf.T, np.float32)) for idx, Rf in parts]
            pseudo = None
        else:
            pseudo, QP = _pseudo_query_embeddings(ctx)
            source = f"pseudo:{pseudo.record['mode']}"
            runs = [(ctx.levels, np.ascontiguousarray(QP @ ctx.R.T, np.float32))]
        table = concat_tables([recall_table(store, Q, bound=opts.recall_bound) for store, Q in runs])
        booster, oof = fit_recall_policy(table, seed=opts.seed)
        # the same queries scanned on each thread count the gateway may serve with (a sharded scan prunes less)
        most = opts.calibration_threads if opts.calibration_threads is not None else min(os.cpu_count() or 1, 8)
        counts = thread_counts(ctx.levels.N, most)
        by_threads = thread_calibration(runs, counts, bound=opts.recall_bound) if counts else {}
        # training queries: one standard error of the calibration mean as margin; pseudo-queries are not the
        # users' queries: half the miss budget
        margin = ({"margin_rule": "standard_error", "margin_share": 0.25} if pseudo is None
                  else {"margin_rule": "share", "margin_share": 0.5})
        ctx.recall = {"booster": booster, "oof": oof, "table": table, "by_threads": by_threads,
                      "section": {"feature_names": list(table.feature_names), "z_grid": [float(z) for z in table.z_grid],
                                  "bound": opts.recall_bound, "k": 10, "seeds": default_seeds(10),
                                  **margin, "calibration_source": source,
                                  "calibration": calibration_report(table, oof, **margin),
                                  "pseudo_queries": pseudo.record if pseudo is not None else None}}


MEASURE_QUERIES = 200
"""Tuning queries each backend of ``--ann auto`` is timed on (one at a time, the served pipeline)."""


def time_backends(versions: dict, X_rot: np.ndarray, Q: np.ndarray, target: float, k: int = 10) -> dict[str, dict]:
    """Time versions through the served pipeline, policy ``recall`` at ``target``, one query at a time.

    Args:
        versions: backend name -> in-memory :class:`engine.index.IndexVersion` over the same rotated documents.
        X_rot: (N, D) float32 rotated documents (the exhaustive reference).
        Q: (Q, D) float32 query embeddings (unrotated; the pipeline rotates).
        target: the declared recall@k.

    Returns:
        name -> ``{"p50_ms", "p95_ms"}`` (lower is better) and ``"recall_at_10"`` against exhaustive search.
    """
    R = next(iter(versions.values())).rotation
    Qr = np.ascontiguousarray(Q @ R.T, np.float32)
    truth = ann.exhaustive_top_k(X_rot, Qr, k, chunk=16)
    pipe, spec = Pipeline(), SearchSpec("q", k=k, width="auto", policy="recall", recall_target=target)
    measured = {}
    for name, v in versions.items():
        pipe.search(v, [spec], embeddings=Q[:1])  # warm
        lat, rows = np.empty(len(Q)), []
        for i in range(len(Q)):
            t = time.perf_counter()
            rows.append(pipe.search(v, [spec], embeddings=Q[i:i + 1])[0].rows)
            lat[i] = time.perf_counter() - t
        measured[name] = {"p50_ms": float(np.median(lat) * 1e3), "p95_ms": float(np.quantile(lat, 0.95) * 1e3),
                          "recall_at_10": float(ann.recall_at(rows, truth).mean())}
    return measured


def _measure_backends(ctx: BuildContext) -> None:
    """``--ann auto`` with both the ANN and the flat level scan built (:attr:`engine.ann.BackendChoice.alternatives`):
    time each through the served pipeline (policy ``recall`` at the default target, one query at a time, one
    thread) on up to :data:`MEASURE_QUERIES` tuning queries and keep the faster (:func:`engine.ann.pick_by_latency`);
    the other's structures are dropped before anything is written.  Measured on the build machine: the manifest
    records both p50s and recalls, so a reader can see the margin."""
    b = ctx.backend
    if b is None or not b.alternatives or ctx.ann is None or ctx.levels is None or ctx.recall is None:
        return
    opts, r, a = ctx.opts, ctx.recall, ctx.ann
    Q = ctx.train.emb if ctx.has_train else _pseudo_query_embeddings(ctx)[1]
    rng = np.random.default_rng(opts.seed + 7)
    if len(Q) > MEASURE_QUERIES:
        Q = Q[np.sort(rng.choice(len(Q), MEASURE_QUERIES, replace=False))]
    Q = np.ascontiguousarray(Q, np.float32)
    target = PlanDefaults().default_recall_target
    sec = r["section"]
    policy = r.get("loaded") or RecallPolicy(r["booster"], sec["feature_names"], np.asarray(sec["z_grid"]), sec["bound"],
                                             r["oof"], r["table"].recall, r["table"].coordinates, k=sec["k"],
                                             margin_share=sec["margin_share"],
                                             margin_rule=sec.get("margin_rule", "share"), seeds=sec.get("seeds"),
                                             calibration_by_threads=r.get("by_threads") or {})
    versions = {
        "flat": IndexVersion.in_memory(ctx.X_rot, ctx.R, ctx.doc_ids, levels=ctx.levels, recall_policy=policy),
        b.backend: IndexVersion.in_memory(ctx.X_rot, ctx.R, ctx.doc_ids, ann=ann_stage(a)),
    }
    with ctx.timer("backend timing"):
        measured = time_backends(versions, ctx.X_rot, Q, target)
    pick, why = ann.pick_by_latency(measured)
    ctx.backend_measured = {"recall_target": target, "queries": int(len(Q)), "threads": 1, "backends": measured,
                            "chosen": pick}
    log.info("stage-1 backend by measurement: %s", why)
    if pick == "flat":
        flat = ann.select_backend("none", len(ctx.doc_ids), ctx.X_rot.shape[1],
                                  memory_budget_bytes=getattr(ctx.settings, "memory_budget_bytes", None),
                                  level_bytes_per_document=ctx.levels.nbytes / max(len(ctx.doc_ids), 1),
                                  fp16_width=ctx.levels.layout.fp16_width)
        ctx.backend = replace(flat, reason=f"{b.reason}; {why}")
        ctx.ann = None
    else:
        ctx.backend = replace(b, reason=f"{b.reason}; {why}", alternatives=())
        ctx.levels, ctx.recall = None, None


def _funnel_policy(ctx: BuildContext) -> None:
    """``--stage1-policy``: the per-query funnel policy over the default grid."""
    if not ctx.opts.stage1_policy:
        return
    if not ctx.has_train:
        raise ValueError("the stage-1 policy needs training queries (a train split)")
    grid = stage1_policy.default_grid()
    with ctx.timer("stage-1 policy"):
        feats, agree = policy_training_data(ctx.X, ctx.train.emb, ctx.parts, grid)
        ctx.policy = fit_stage1_policy(feats, agree, grid, ctx.X.shape[0], ctx.encoder.dimension, seed=ctx.opts.seed)


def served_version(ctx: BuildContext) -> IndexVersion:
    """The version this build writes, held in memory: rotation, faiss stage 1, routers, level store and recall
    policy, so the evaluation runs the gateway's :class:`engine.pipeline.Pipeline` on what it will serve."""
    opts = ctx.opts
    routers = {pair: Router(pair, fit.booster, np.sort(np.asarray(fit.oof_predictions, np.float64)))
               for pair, fit in ctx.routers.items()}
    recall = None
    if ctx.recall is not None:
        r, sec = ctx.recall, ctx.recall["section"]
        recall = r.get("loaded")  # a fold: the base's policy as loaded
        if recall is None:
            recall = RecallPolicy(r["booster"], list(sec["feature_names"]), np.asarray(sec["z_grid"], np.float64),
                                  sec["bound"], np.asarray(r["oof"], np.float64), r["table"].recall,
                                  r["table"].coordinates, k=sec["k"], margin_share=sec["margin_share"],
                                  margin_rule=sec.get("margin_rule", "share"),
                                  seeds=sec.get("seeds"), calibration_by_threads=r.get("by_threads") or {})
    a = ann_stage(ctx.ann) if ctx.ann is not None else None
    return IndexVersion.in_memory(ctx.X_rot, ctx.R, ctx.doc_ids, m0=opts.m0, shortlist=opts.shortlist,
                                  routers=routers, default_pair=tuple(opts.default_pair) if routers else None,
                                  default_rho=opts.default_rho, levels=ctx.levels, recall_policy=recall,
                                  backend="faiss", collection=ctx.name, theta=0.05, ann=a)


SERVED_POLICIES = {
    "full": {"width": "full"},
    "recall 0.95": {"width": "auto", "policy": "recall", "recall_target": 0.95},
    "recall 0.99": {"width": "auto", "policy": "recall", "recall_target": 0.99},
    "router": {"width": "auto", "policy": "router"},
    "width 64": {"width": 64},
    "width 128": {"width": 128},
}
"""The served policies the build's evaluation reports (request fields beside query and k)."""


def served_evaluation(version: IndexVersion, test: QuerySet, texts: list[str], subsets: dict, k: int = 10,
                      policies: set[str] | None = None, rows: dict | None = None) -> dict:
    """NDCG@10, recall@10 against ``full`` and coordinates per query of each served policy at ``k`` (the default
    request's k), through the gateway's pipeline on ``version`` (what ``trainer evaluate`` and
    ``POST /v1/search`` run).

    Args:
        version: the in-memory version (:func:`served_version`) or a loaded one.
        test: the evaluation queries with their frozen (unrotated) embeddings, (Q, D) float32.
        texts: Q query texts (the plan checks them; the embeddings are used).
        subsets: name -> (Q,) bool mask or None (all queries).
        policies: names of :data:`SERVED_POLICIES` to evaluate (None: all; ``full`` is always run, the
            others' recall is measured against it).
        rows: when given, filled with policy -> Q result row arrays (for a caller that reuses the searches).

    Returns:
        policy -> {subset -> {"ndcg@10", "recall@10_vs_full" (in [0, 1], higher is better),
        "coordinates_share" (coordinates scored / (N * D), lower is cheaper), "queries"}}; a policy the
        version lacks is left out.
    """
    pipe, out, full = Pipeline(), {}, None
    has = {"recall": (version.recall_policy is not None and version.levels is not None) or version.ann is not None,
           "router": bool(version.routers)}
    for name, fields in SERVED_POLICIES.items():
        if fields.get("policy") and not has[fields["policy"]]:
            continue
        if policies is not None and name != "full" and name not in policies:
            continue
        results = pipe.search(version, [SearchSpec(query=t, k=k, **fields) for t in texts], embeddings=test.emb)
        ranks = [r.ids for r in results]
        if rows is not None:
            rows[name] = [r.rows for r in results]
        if name == "full":
            full = [set(r) for r in ranks]
        nd = ranking_metric(ranks, test.judgments, "ndcg", 10)
        work = np.array([r.trace["coordinates_scored"] for r in results], np.float64) / (version.size * version.dimension)
        agree = np.array([len(full[i] & set(r)) / max(len(full[i]), 1) for i, r in enumerate(ranks)])
        out[name] = {}
        for s, m in subsets.items():
            idx = np.arange(len(ranks)) if m is None else np.flatnonzero(m)
            mean = (lambda a: float(a[idx].mean()) if len(idx) else float("nan"))
            out[name][s] = {"ndcg@10": mean(nd), "recall@10_vs_full": mean(agree),
                            "coordinates_share": mean(work), "queries": int(len(idx))}
    return out


def _evaluation_and_capacity(ctx: BuildContext) -> None:
    """Offline quality table and the capacity report on the evaluation split."""
    if not ctx.has_test:
        return
    opts = ctx.opts
    with ctx.timer("evaluation"):
        texts = [ctx.col.queries[q] for q in ctx.test.ids]
        subsets = {"all": None}
        if ctx.base is not None:  # a fold: the served policies only (the static table compares rotations)
            ctx.evaluation = {"split": ctx.eval_split, "queries": len(ctx.test.ids),
                              "note": "a fold reusing the base version's fitted parts: served/<policy> only, the "
                                      "gateway's pipeline on the version as written (engine.pipeline.Pipeline)"}
        else:
            ctx.evaluation = _evaluate(opts, ctx.rotations, ctx.X, ctx.doc_ids, ctx.test, ctx.train_qrels,
                                       ctx.funnel, ctx.R, ctx.routers)
            if ctx.train_qrels:
                subsets["unseen"] = np.asarray(ctx.evaluation.pop("_unseen"))
            else:
                ctx.evaluation.pop("_unseen")
        version = served_version(ctx)
        served, rows = None, {}
        if ctx.base is not None:  # a fold: exhaustive full width and the default request (what the CUS follows)
            served = {"full"} | ({"recall 0.99"} if version.recall_policy is not None else {"router"})
        ctx.evaluation["served"] = served_evaluation(version, ctx.test, texts, subsets, policies=served, rows=rows)
        if ctx.policy is not None:
            ctx.evaluation["stage1_policy"] = _evaluate_policy(opts, ctx.policy, ctx.X_rot, ctx.R, ctx.doc_ids,
                                                               ctx.test, ctx.train_qrels)
    if opts.capacity and ctx.base is not None and (ctx.base.path / "capacity.json").is_file():
        with ctx.timer("capacity report (carried, online-CUS baseline measured)"):
            ctx.capacity = _carried_capacity(ctx.base, version, ctx.test, texts, _plain_request_rows(version, rows))
    elif opts.capacity:
        with ctx.timer("capacity report"):
            ctx.capacity = capacity_for_version(opts, ctx.test, ctx.X_rot, ctx.R, ctx.doc_ids, version, texts,
                                                ctx.name)


def _plain_request_rows(version: IndexVersion, rows: dict) -> list | None:
    """The result rows of the plain request ``{"query", "k": 10}`` among the served evaluation's ``rows``
    (policy -> Q row arrays), when one of its policies is what that request resolves to; else None."""
    plain = PlanDefaults()
    if ("recall 0.99" in rows and plain.default_policy == "recall" and "recall" in capabilities(version).policies
            and plain.default_recall_target == SERVED_POLICIES["recall 0.99"]["recall_target"]):
        return rows["recall 0.99"]
    return None


def _carried_capacity(base: IndexVersion, version: IndexVersion, test: QuerySet, texts: list[str],
                      served_rows: list | None) -> dict:
    """A fold's capacity report: the base version's, marked ``meta.carried_from``, with the online-CUS
    baseline measured again on ``version`` (the folded corpus).

    A fold reuses the base's rotation, and the report describes that rotation on the evaluation queries
    (spectrum, cliff, scaling in N), which folding a few per cent of the corpus does not move; the baseline is
    what the gateway's label-free CUS and the drift check compare against, so it follows the corpus.  A refit
    (the drift check, or a full build) computes the whole report again."""
    report = json.loads((base.path / "capacity.json").read_text(encoding="utf-8"))
    report.setdefault("meta", {})["carried_from"] = {
        "version": base.version, "documents": int(base.size),
        "note": "a fold carries its base's capacity report; a refit or full build computes it again"}
    report.pop("online_cus_baseline", None)
    baseline = online_cus_agreement(version, test, texts, served_rows=served_rows)
    if baseline is not None:
        report["online_cus_baseline"] = baseline
    return report


def _version_files(ctx: BuildContext) -> tuple[str, Files, Manifest]:
    """The version id, every file's writer and the typed manifest (the sections name the files)."""
    opts, col, encoder, R = ctx.opts, ctx.col, ctx.encoder, ctx.R
    fingerprint = corpus_fingerprint(col)
    version = new_version_id(hashlib.sha256(
        (fingerprint + encoder.info.onnx_sha256 + R.astype(np.float32).tobytes().hex()[:4096]).encode()).hexdigest())
    writers, core, stage1 = files.dense_files(R, ctx.X_rot, ctx.doc_ids, opts.m0, ctx.funnel.doc_sqnorm_m0)
    router_writers, router_names = files.router_files({pair: fit.booster for pair, fit in ctx.routers.items()})
    writers.update(router_writers)
    pairs = {files.router_key(pair): RouterPairSection(
        file=router_names[pair], action_pair=pair,
        calibration_predictions=sorted(float(v) for v in fit.oof_predictions), **ctx.router_meta[pair])
        for pair, fit in ctx.routers.items()}
    writers.update(ctx.cars_writers)
    texts = [d.encoder_text() for d in col.corpus]  # the rerank tiers (MaxSim, cross-encoder) read these
    rerank_writers, rerank = files.rerank_files(texts, RERANK_DEPTH)
    writers.update(rerank_writers)
    tiers = None
    if ctx.tier_head is not None:
        head_writers, head = files.tier_head_files(ctx.tier_head, **ctx.tiers_meta["head"])
        writers.update(head_writers)
        tiers = TiersSection(**{**ctx.tiers_meta, "head": head})
    lexical = None
    if opts.lexical:
        with ctx.timer("lexical index"):
            reuse = None
            if ctx.base is not None and ctx.base.texts is not None:  # a fold: unchanged documents keep their
                reuse = lexical_reuse(ctx.base.path, ctx.base.manifest, ctx.base.texts)  # normalised text, counts
            lex_writers, lexical = lexical_files(texts, [d.fields for d in col.corpus], reuse=reuse)
        writers.update(lex_writers)
    policy = None
    if ctx.policy is not None:
        policy_writers, policy = files.funnel_policy_files(
            ctx.policy.booster, ctx.policy.grid, opts.stage1_policy_tau,
            model="lightgbm regression of the top-10 agreement with exhaustive full-width search",
            train_queries=ctx.policy.train_queries,
            mean_agreement_by_config=[float(v) for v in ctx.policy.mean_agreement])
        writers.update(policy_writers)
    levels_section = recall_section = None
    if ctx.levels is not None:
        level_writers, levels_section = files.level_files(ctx.levels)
        writers.update(level_writers)
    if ctx.recall is not None:
        r = ctx.recall
        recall_writers, recall_section = files.recall_policy_files(r["booster"], r["oof"], r["table"].recall,
                                                                   r["table"].coordinates, r.get("by_threads"),
                                                                   **r["section"])
        writers.update(recall_writers)
    ann_section = None
    if ctx.ann is not None:
        models = ctx.ann.get("effort_model")
        ann_writers, ann_section = files.ann_files(ctx.ann["index"], ctx.ann["params"], ctx.ann["curve"],
                                                   effort_model=[{k: v for k, v in e.items() if k != "policy"}
                                                                 for e in models] if models else None,
                                                   **ctx.ann["section"])
        writers.update(ann_writers)
    backend_section = None
    if ctx.backend is not None:
        b, st = ctx.backend, ctx.settings
        N, D = len(ctx.doc_ids), encoder.dimension
        every = {"flat": ann.bytes_per_document("flat", N, D, level_bytes_per_document=ctx.levels.nbytes / max(N, 1)
                                                if ctx.levels is not None else 0.0,
                                                fp16_width=ctx.levels.layout.fp16_width if ctx.levels is not None else 0)}
        for kind in ann.ANN_KINDS:
            every[kind] = ann.bytes_per_document(kind, N, D, ann.default_params(kind, N, **opts.ann_params))
        backend_section = BackendSection(chosen=b.backend, reason=b.reason, requested=opts.ann,
                                         ann_min_docs=getattr(st, "ann_min_docs", None),
                                         memory_budget_bytes=getattr(st, "memory_budget_bytes", None),
                                         needed_bytes=b.needed_bytes, bytes_per_document=every,
                                         measured=ctx.backend_measured)
    default_policy = ("recall" if recall_section is not None or ann_section is not None else "funnel" if ctx.policy is not None
                      else "router" if ctx.routers else None)
    if ctx.capacity is not None:
        cap_writers = capacity_file_writers(ctx.capacity, f"{ctx.name} ({opts.rotation} rotation, "
                                                          f"{ctx.eval_split} split)")
        if ctx.base is not None and "carried_from" in (ctx.capacity.get("meta") or {}):
            for name in [n for n in cap_writers if n.endswith(".png")]:  # the base's plots: copied, not drawn
                src = ctx.base.path / name
                if src.is_file():
                    cap_writers[name] = (lambda src: (lambda p: shutil.copyfile(src, p)))(src)
        writers.update(cap_writers)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, version=version, collection=ctx.name, created=utc_timestamp(),
        encoder=EncoderSection(**encoder.info.as_manifest()), dimension=encoder.dimension, m0=opts.m0,
        shortlist=opts.shortlist, theta=0.05, core=core, stage1=stage1,
        adapter=AdapterSection(kind=opts.rotation, sha256=hashlib.sha256(R.astype(np.float32).tobytes()).hexdigest(),
                               training=ctx.adapter_report),
        router=RouterSection(feature_names=list(FEATURE_NAMES),
                             model="lightgbm regression of g(q) = NDCG@10_h - NDCG@10_l (Eq. 12 of 001)",
                             default_pair=tuple(opts.default_pair) if ctx.routers else None,
                             default_rho=opts.default_rho, pairs=pairs),
        corpus=CorpusSection(fingerprint=fingerprint, documents=len(ctx.doc_ids), dataset=str(opts.dataset),
                             dataset_fingerprint=ctx.dataset_fingerprint, encoded_now=ctx.n_encoded,
                             train_split=ctx.train_split, eval_split=ctx.eval_split,
                             skipped_empty=len(ctx.skipped_empty), skipped_empty_ids=ctx.skipped_empty[:20]),
        stage1_policy=policy, evaluation=ctx.evaluation, lexical=lexical,
        cars=CarsSection(**ctx.cars_meta) if ctx.cars_meta is not None else None,
        rerank=rerank, tiers=tiers, levels=levels_section, recall_policy=recall_section, ann=ann_section,
        backend=backend_section,
        policy=PolicySection(default=default_policy), capacity=capacity_summary(ctx.capacity) if ctx.capacity is not None else None,
        writes=WritesSection(**{"fitting": "reused" if ctx.base is not None else "refitted", **opts.writes,
                                "drift": ctx.drift}) if opts.writes is not None else None,
        build_seconds=ctx.timer.t)
    return version, writers, manifest


def _publish(ctx: BuildContext, version: str) -> bool:
    """Register the version as a candidate (the collection's first, or any with ``promote``, goes live);
    returns whether it is live."""
    opts, settings = ctx.opts, ctx.settings
    if not (opts.publish or opts.promote):
        return False
    registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root)
    try:
        state = registry.publish(ctx.name, version, actor="trainer build")
        if opts.promote or state.live is None:
            registry.promote(ctx.name, version, actor="trainer build")
            return True
        return False
    finally:
        registry.close()


def build_index(opts: BuildOptions, settings, encoder) -> tuple[Path, Manifest]:
    """Build (and optionally publish) a version; returns its directory and the manifest.

    The steps (module docstring) run in order over one :class:`BuildContext`.

    Args:
        opts: :class:`BuildOptions`.
        settings: resolved :class:`trainer.config.TrainerSettings`.
        encoder: a :class:`engine.encoder.OnnxEncoder`.

    Raises:
        engine.io.beir.DatasetFormatError: on malformed input files.
        ValueError: on inconsistent options (e.g. an action pair below m0).
        engine.ann.MemoryBudgetError: the stage-1 backend does not fit ``settings.memory_budget_bytes`` (a
            ValueError naming the bytes needed; raised before encoding).
        engine.scorers.CrossEncoderNotFoundError: ``tiers`` without a cross-encoder export.
        engine.version.retention.DiskSpaceError: the new version would not fit on the index volume (a
            ValueError naming the bytes needed and free; raised before encoding).
    """
    _check_options(opts, settings, encoder.dimension)
    name = opts.collection or Path(opts.dataset).name
    with build_lock(Path(settings.index_root) / name):
        path, manifest = _build_locked(opts, settings, encoder)
        if opts.retention and (opts.publish or opts.promote):
            retention_after_build(settings, name)
        return path, manifest


def _build_locked(opts: BuildOptions, settings, encoder) -> tuple[Path, Manifest]:
    ctx = BuildContext(opts, settings, encoder)
    if opts.reuse_from is not None:
        ctx.base = IndexVersion.load(opts.reuse_from, lexical=False)  # the fold reads the lexical files itself
    for step in _STEPS:
        step(ctx)
    if ctx.base is not None:
        ctx.drift = _drift_check(ctx)
        if ctx.drift.get("exceeded"):
            log.warning("drift check: online-CUS agreement %.3f vs the base version's %.3f (threshold %.3f): "
                        "refitting instead of reusing", ctx.drift["new"], ctx.drift["base"], opts.drift_threshold)
            refit = replace(opts, reuse_from=None, writes={**(opts.writes or {}), "fitting": "refitted"})
            path, manifest = _build_refit(refit, settings, encoder, ctx.drift)
            return path, manifest
    return _write_and_publish(ctx)


def _build_refit(opts: BuildOptions, settings, encoder, drift: dict) -> tuple[Path, Manifest]:
    """The build of ``opts`` without reuse (the drift check said retrain); the manifest records ``drift``."""
    ctx = BuildContext(opts, settings, encoder)
    for step in _STEPS:
        step(ctx)
    ctx.drift = drift
    return _write_and_publish(ctx)


_STEPS = (_read_dataset, _check_disk, _choose_backend, _encode, _cars, _rotations, _routers, _ann, _levels_and_recall,
          _measure_backends,
          _difficulty_head, _funnel_policy, _evaluation_and_capacity)
"""The steps of a build, in order (module docstring)."""


def _drift_check(ctx: BuildContext) -> dict:
    """Compare the reuse build's online-CUS agreement with the base version's (its manifest's baseline, else
    measured now on the base version with the same queries); ``exceeded`` when they differ by more than
    ``drift_threshold``.  Without evaluation queries or an ``auto`` policy the check cannot run (reuse)."""
    metric = "online-CUS agreement: top-1 of the default auto policy vs exhaustive full width, evaluation queries"
    out = {"metric": metric, "threshold": ctx.opts.drift_threshold}
    if not ctx.has_test:
        return {**out, "available": False, "reason": "no evaluation queries", "exceeded": False}
    texts = [ctx.col.queries[q] for q in ctx.test.ids]
    new = (ctx.capacity or {}).get("online_cus_baseline") or online_cus_agreement(served_version(ctx), ctx.test, texts)
    base_cap = ctx.base.manifest.capacity or {}
    base = base_cap.get("online_cus_baseline")
    source = "base manifest"
    if base is None or base.get("queries") != len(ctx.test.ids):
        base, source = online_cus_agreement(ctx.base, ctx.test, texts), "measured on the base version"
    if new is None or base is None:
        return {**out, "available": False, "reason": "the version serves no auto policy", "exceeded": False}
    diff = abs(float(new["agreement"]) - float(base["agreement"]))
    return {**out, "available": True, "base": float(base["agreement"]), "new": float(new["agreement"]),
            "base_source": source, "queries": int(new["queries"]), "difference": diff,
            "exceeded": bool(diff > ctx.opts.drift_threshold)}


def _write_and_publish(ctx: BuildContext) -> tuple[Path, Manifest]:
    opts, settings = ctx.opts, ctx.settings
    version, writers, manifest = _version_files(ctx)
    path = write_version(Path(settings.index_root) / ctx.name, version, writers, manifest)
    write_for_settings(settings, path)  # stage 1 on Milvus: the version's collection exists before it is published
    live = _publish(ctx, version)
    log.info("wrote %s%s", path, " (live)" if live else " (candidate)" if opts.publish else "")
    return path, read_manifest(path)


@dataclass
class _ReusedRouter:
    """A base version's router in the shape of a fit (:func:`trainer.router_fit.fit_router`)."""

    booster: object
    oof_predictions: np.ndarray


@dataclass
class _ReusedTable:
    """A base version's recall calibration in the shape the writers read (``recall``: (Q, Z) realised;
    ``coordinates``: (Q, Z) multiply-adds, None for a base written before they were kept)."""

    recall: np.ndarray
    coordinates: np.ndarray | None = None


def _fit_tier_head(opts: BuildOptions, settings, encoder, X: np.ndarray, col: Collection, train: QuerySet,
                   seed: int, version: IndexVersion, served_emb: np.ndarray) -> tuple[np.ndarray, dict]:
    """The difficulty head of ``--tiers`` (:mod:`trainer.dart.tier_head`): labels on the training queries the
    cross-encoder did not train on, then the post-hoc head on their frozen embeddings.  The tiers rerank the
    candidates the served first stage gives (the pipeline on ``version``, the version being built, at its
    default policy, on ``served_emb``: the training queries as the version's pipeline sees them, CARS-mapped
    when CARS is on), as the gateway's rerank stage does; the head itself reads the frozen embeddings.

    Raises:
        engine.scorers.CrossEncoderNotFoundError: no cross-encoder export.
        ValueError: no training query left to label.
    """
    ce_dir = _cross_encoder_dir(opts, settings)
    ce = CrossEncoderScorer(ce_dir, threads=settings.encoder_threads)
    trained_on = set(ce.meta.get("train_query_ids") or [])
    pick = [i for i, q in enumerate(train.ids) if q not in trained_on]
    if not pick:
        raise ValueError(f"every training query was used to train the cross-encoder at {ce_dir}; "
                         "train it with --holdout-queries > 0")
    if opts.tier_head_queries is not None and len(pick) > opts.tier_head_queries:
        pick = sorted(np.random.default_rng(seed).choice(pick, opts.tier_head_queries, replace=False).tolist())
    doc_ids = [d.doc_id for d in col.corpus]
    texts = [col.queries[train.ids[i]] for i in pick]
    served = Pipeline().search(version, [SearchSpec(query=t, k=RERANK_DEPTH, tier="mips") for t in texts],
                               embeddings=served_emb[pick])
    if any(len(r.rows) != RERANK_DEPTH for r in served):
        raise ValueError(f"the corpus has fewer than {RERANK_DEPTH} documents to rerank")
    quality = tier_quality(encoder, ce, X, [d.encoder_text() for d in col.corpus], doc_ids, texts, train.emb[pick],
                           [train.judgments[i] for i in pick], candidates=np.stack([r.rows for r in served]))
    W, report = fit_head(train.emb[pick], quality["ndcg10"], seed=seed)
    report.update(split=opts.train_split, cross_encoder_held_out=True,
                  labels={"query_ids": [train.ids[i] for i in pick],
                          "ndcg10": [[round(float(v), 4) for v in row] for row in quality["ndcg10"]]})
    return W, {"head": report,
               "cross_encoder": {k: ce.meta.get(k) for k in ("model_name", "onnx_sha256", "max_tokens", "dataset")},
               "rerank_depth": RERANK_DEPTH}


def _evaluate(opts: BuildOptions, rotations: dict, X: np.ndarray, doc_ids: list[str], test: QuerySet,
              train_qrels: dict, funnel: Funnel, R: np.ndarray, routers: dict) -> dict:
    """Offline quality table on the evaluation split (see module docstring)."""
    cited = {d for j in train_qrels.values() for d, g in j.items() if g > 0}
    unseen = np.array([not any(d in cited for d, g in j.items() if g > 0) for j in test.judgments])
    subsets = {"all": None}
    if train_qrels:
        subsets["unseen"] = unseen
    rows = {}
    for rot_name, Rm in rotations.items():
        for w in sorted({32, 64, 96, 128, 256, X.shape[1]}):
            ranks = exact_rankings(Rm, X, test, doc_ids, w)
            rows[f"exact/{rot_name}/{w}"] = {s: score_rankings(ranks, test, m) for s, m in subsets.items()}
    q_rot = (test.emb @ R.T).astype(np.float32)
    s1 = funnel.stage1(q_rot)
    for w in sorted({opts.m0, 96, 128, 256, X.shape[1]}):
        ranks = funnel.rankings(q_rot, s1, [w] * len(test.ids))
        rows[f"funnel/{opts.rotation}/{w}"] = {s: score_rankings(ranks, test, m) for s, m in subsets.items()}
    routed = {}
    if routers:
        feats = router_feature_matrix(list(s1[1]))
        for pair, fit in routers.items():
            pred = fit.booster.predict(feats)
            thresholds = {rho: threshold_for_rate(fit.oof_predictions, rho) for rho in REPORT_RHOS}
            routed[f"{pair[0]}_{pair[1]}"] = {
                s: routed_policy_report(funnel, q_rot, test, s1, pair, pred, thresholds, subset=m)
                for s, m in subsets.items()}
    return {"split": opts.eval_split, "queries": len(test.ids), "unseen_queries": int(unseen.sum()),
            "static": rows, "routed": routed, "_unseen": unseen,
            "note": "exact/<rotation>/<w>: exhaustive search at width w; funnel/<rotation>/<w>: stage 1 at m0 over "
                    "the corpus, shortlist rescored at w (the served path). 'unseen': test queries none of whose "
                    "relevant documents is cited by a training query. served/<policy>: the gateway's pipeline on the "
                    "version as written (engine.pipeline.Pipeline), as POST /v1/search answers it."}


def _router_training_data(opts: BuildOptions, train: QuerySet, X: np.ndarray, doc_ids: list[str], R: np.ndarray,
                          rotations: dict, positives: list[np.ndarray] | None, seed: int):
    """Stage-1 scores (n, C), gains g(q) per action pair, and the (query indices, rotation) parts.

    With ``positives`` (a learned adapter), the data are **cross-fitted**: the
    training queries are split into ``router_crossfit_folds`` folds and each
    fold is ranked through an adapter trained on the other folds only.  A
    served adapter has memorised its own training queries (FINDINGS.md), so
    their stage-1 scores look more confident than any unseen query's; a router
    fitted on them learns the wrong distribution and its threshold escalates
    far more unseen queries than its target ρ.
    """
    n = len(train.ids)
    C = min(opts.shortlist, X.shape[0])
    scores = np.empty((n, C), dtype=np.float32)
    gains = {pair: np.empty(n) for pair in opts.action_pairs}
    if positives is None:
        parts = [(np.arange(n), R)]
    else:
        folds = opts.router_crossfit_folds
        fold_of = np.random.default_rng(seed + 1).permutation(n) % folds
        base = rotations["pca"] if opts.rotation == "adapter_on_pca" else rotations["identity"]
        parts = []
        for f in range(folds):
            fit_idx = np.flatnonzero(fold_of != f)
            cfg = AdapterConfig(seed=seed, **opts.adapter)
            R_f, _ = train_adapter(train.emb[fit_idx] @ base.T, X @ base.T, [positives[i] for i in fit_idx], cfg)
            parts.append((np.flatnonzero(fold_of == f), R_f @ base))
    for idx, Rf in parts:
        funnel = Funnel.build(X @ Rf.T, doc_ids, opts.m0, opts.shortlist)
        q_rot = (train.emb[idx] @ Rf.T).astype(np.float32)
        rows, sc = funnel.stage1(q_rot)
        scores[idx] = sc
        for pair in opts.action_pairs:
            gains[pair][idx] = escalation_gains(q_rot, funnel.docs, funnel.doc_sqnorm_m0, rows, sc,
                                                [train.judgments[i] for i in idx], doc_ids, m0=opts.m0, pair=pair)
    return scores, gains, parts


def _evaluate_policy(opts: BuildOptions, policy, X_rot: np.ndarray, R: np.ndarray, doc_ids: list[str],
                     test: QuerySet, train_qrels: dict) -> dict:
    """NDCG@10 and mean work of the served funnel policy on the evaluation queries (all and unseen)."""
    bc = BlockedCorpus(X_rot, stage1_policy.BLOCK)
    cited = {d for j in train_qrels.values() for d, g in j.items() if g > 0}
    ranked, work = [], []
    for q in test.emb:
        res, _ = stage1_policy.resolve_adaptive(bc, (R @ q).astype(np.float32), policy.booster.predict, policy.grid,
                                               opts.stage1_policy_tau, 10)
        ranked.append(res.rows)
        work.append(res.coordinates_scored)
    nd = ranking_metric(ranked, test.judgments, "ndcg", 10, doc_ids)
    unseen = np.array([not any(d in cited for d, g in judg.items() if g > 0) for judg in test.judgments], dtype=bool)
    full = X_rot.shape[0] * X_rot.shape[1]
    return {"tau": opts.stage1_policy_tau, "ndcg@10": float(nd.mean()),
            "ndcg@10_unseen": float(nd[unseen].mean()) if unseen.any() else None,
            "mean_work": float(np.mean(work)), "work_ratio_to_full": float(np.mean(work) / full)}
