"""Writers and readers of the dense files of an index version: core arrays, stage 1, routers, funnel policy,
CARS maps, rerank texts and the difficulty head.

A writer function returns ``(files, section)``: ``files`` maps a file name to a function writing it (for
:func:`engine.version.store.write_version`), ``section`` is the typed manifest entry naming those files.  A
reader takes the version directory and its verified :class:`~engine.version.manifest.Manifest`, reads the
files the manifest names, checks their shapes against it and raises
:class:`~engine.version.manifest.IndexVersionError` (``schema`` / ``dimension_mismatch``) when they disagree.
The lexical files are :mod:`engine.version.lexical`; the Milvus collection is :mod:`engine.version.milvus`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import faiss
import lightgbm as lgb
import numpy as np

from adawidth import stage1_policy
from adawidth.levels import LevelStore
from adawidth.prefix import prefix_normalize
from adawidth.tiers import TIERS
from engine import ann
from engine.version.manifest import (AnnEffortSection, AnnSection, CarsSection, CoreSection, FunnelPolicySection, IndexVersionError, LevelsSection,
                                     Manifest, RecallPolicySection,
                                     RerankSection, Stage1Section, TierHeadSection)

Files = dict[str, Callable[[Path], None]]
"""File name -> a function that writes the file at the path it is given."""


def _json_writer(obj) -> Callable[[Path], None]:
    return lambda p: p.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")


def _npy_writer(array: np.ndarray) -> Callable[[Path], None]:
    return lambda p: np.save(p, array)


# -- core ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Core:
    """The core arrays of a loaded version.

    Attributes:
        rotation: R, (D, D) float32 (documents were stored as ``R @ d``).
        docs: (N, D) float32 rotated documents, memory-mapped read-only.
        doc_sqnorm_m0: (N,) float32 ``||(R d)[:m0]||^2``.
        doc_ids: N external document ids in index order.
    """

    rotation: np.ndarray
    docs: np.ndarray
    doc_sqnorm_m0: np.ndarray
    doc_ids: list[str]


def doc_sqnorm(docs: np.ndarray, m0: int) -> np.ndarray:
    """``||d[:m0]||^2`` of each row: (N, >= m0) -> (N,) float32 (the stage-1 partial norm the rescoring reuses)."""
    head = np.asarray(docs[:, :m0], dtype=np.float32)
    return np.einsum("ij,ij->i", head, head).astype(np.float32)


def core_files(rotation: np.ndarray, docs: np.ndarray, doc_ids: Sequence[str], m0: int,
               doc_sqnorm_m0: np.ndarray | None = None) -> tuple[Files, CoreSection]:
    """Writers of the core files.

    Args:
        rotation: R, (D, D) (stored as float32).
        docs: (N, D) float32 rotated documents (stored as given).
        doc_ids: N ids in row order.
        m0: stage-1 width (for ``doc_sqnorm_m0``).
        doc_sqnorm_m0: (N,) precomputed ``||docs[:, :m0]||^2`` (default: computed here).

    Raises:
        ValueError: shapes that disagree (R not (D, D), ids not N).
    """
    D = docs.shape[1]
    if rotation.shape != (D, D) or len(doc_ids) != docs.shape[0]:
        raise ValueError(f"rotation {rotation.shape}, docs {docs.shape} and {len(doc_ids)} ids disagree")
    sq = doc_sqnorm(docs, m0) if doc_sqnorm_m0 is None else np.asarray(doc_sqnorm_m0, dtype=np.float32)
    section = CoreSection()
    files = {section.rotation: _npy_writer(np.asarray(rotation, dtype=np.float32)),
             section.docs: _npy_writer(docs),
             section.doc_sqnorm_m0: _npy_writer(sq),
             section.doc_ids: _json_writer(list(doc_ids))}
    return files, section


def mapped(path: Path) -> np.ndarray:
    """The ``.npy`` file at ``path`` memory-mapped read-only, as a plain ndarray view of the mapping.

    The view shares the mapped pages (nothing is copied; it keeps the mapping open) without ``np.memmap``'s
    subclass hooks, which cost about a microsecond on every slice of the query path.
    """
    return np.asarray(np.load(path, mmap_mode="r"))


def read_core(path: Path, m: Manifest) -> Core:
    """The core arrays of a verified version (``docs`` memory-mapped).

    Raises:
        IndexVersionError: ``dimension_mismatch`` when docs are not (N, D) or R is not (D, D).
    """
    c = m.core
    docs = mapped(path / c.docs)
    doc_ids = json.loads((path / c.doc_ids).read_text(encoding="utf-8"))
    if docs.shape != (len(doc_ids), m.dimension):
        raise IndexVersionError("dimension_mismatch", f"{c.docs} has shape {docs.shape}")
    rotation = np.load(path / c.rotation)
    if rotation.shape != (m.dimension, m.dimension):
        raise IndexVersionError("dimension_mismatch", f"{c.rotation} has shape {rotation.shape}")
    return Core(rotation, docs, np.load(path / c.doc_sqnorm_m0), doc_ids)


# -- stage 1 ---------------------------------------------------------------------------------------------------

def stage1_index(docs: np.ndarray, m0: int) -> faiss.Index:
    """A faiss ``IndexFlatIP`` over ``prefix_normalize(docs, m0)``; docs (N, >= m0) float32."""
    index = faiss.IndexFlatIP(m0)
    if docs.shape[0]:
        index.add(prefix_normalize(docs, m0))
    return index


def stage1_files(docs: np.ndarray, m0: int, index: faiss.Index | None = None) -> tuple[Files, Stage1Section]:
    """Writer of ``stage1.faiss`` (``index``, default :func:`stage1_index` of ``docs``)."""
    index = stage1_index(docs, m0) if index is None else index
    section = Stage1Section()
    return {section.file: lambda p: faiss.write_index(index, str(p))}, section


def read_stage1_index(path: Path, m: Manifest) -> faiss.Index:
    """The version's faiss stage-1 index.

    Raises:
        IndexVersionError: ``schema`` when its width is not m0.
    """
    index = faiss.read_index(str(path / m.stage1.file))
    if index.d != m.m0:
        raise IndexVersionError("schema", f"{m.stage1.file} has width {index.d}, the manifest m0 {m.m0}")
    return index


def dense_files(rotation: np.ndarray, docs: np.ndarray, doc_ids: Sequence[str], m0: int,
                doc_sqnorm_m0: np.ndarray | None = None) -> tuple[Files, CoreSection, Stage1Section]:
    """Writers of every file a dense-only version needs (:func:`core_files` and :func:`stage1_files`), and the
    two sections; see :func:`core_files` for the arguments."""
    writers, core = core_files(rotation, docs, doc_ids, m0, doc_sqnorm_m0)
    s1, stage1 = stage1_files(docs, m0)
    writers.update(s1)
    return writers, core, stage1


# -- routers ---------------------------------------------------------------------------------------------------

def router_key(pair: tuple[int, int]) -> str:
    """``"<l>_<h>"``, the key of an action pair in ``router.pairs``."""
    return f"{pair[0]}_{pair[1]}"


def router_files(boosters: Mapping[tuple[int, int], lgb.Booster]) -> tuple[Files, dict[tuple[int, int], str]]:
    """Writers of one LightGBM text model per action pair; returns (files, pair -> file name)."""
    names = {pair: f"router_{router_key(pair)}.txt" for pair in boosters}
    files = {names[pair]: (lambda b: (lambda p: b.save_model(str(p))))(b) for pair, b in boosters.items()}
    return files, names


@dataclass(frozen=True)
class RouterFile:
    """One loaded router: the booster and its calibration predictions, (n,) float64 ascending."""

    pair: tuple[int, int]
    booster: lgb.Booster
    calibration: np.ndarray


def read_routers(path: Path, m: Manifest) -> dict[tuple[int, int], RouterFile]:
    """The version's routers by action pair (empty when it has none).

    Raises:
        IndexVersionError: ``schema`` when a model's feature names differ from the manifest's.
    """
    out: dict[tuple[int, int], RouterFile] = {}
    if m.router is None:
        return out
    for meta in m.router.pairs.values():
        booster = lgb.Booster(model_file=str(path / meta.file))
        if booster.feature_name() != list(m.router.feature_names):
            raise IndexVersionError("schema", f"{meta.file} feature names differ from the manifest")
        pair = tuple(meta.action_pair)
        out[pair] = RouterFile(pair, booster, np.asarray(meta.calibration_predictions, dtype=np.float64))
    return out


# -- funnel policy ---------------------------------------------------------------------------------------------

POLICY_FILE = "stage1_policy.txt"


def funnel_policy_files(booster: lgb.Booster, grid: Sequence[stage1_policy.Config], tau: float,
                        **report) -> tuple[Files, FunnelPolicySection]:
    """Writer of the funnel policy's LightGBM model and its section (``report``: fit details kept as written)."""
    section = FunnelPolicySection(file=POLICY_FILE, block=stage1_policy.BLOCK, tau=float(tau),
                                  grid=[vars(c) for c in grid],
                                  feature_names=list(stage1_policy.EVIDENCE_NAMES + stage1_policy.CONFIG_NAMES),
                                  **report)
    return {POLICY_FILE: lambda p: booster.save_model(str(p))}, section


@dataclass(frozen=True)
class FunnelPolicyFile:
    """A loaded funnel policy: the agreement model, the configuration grid (K entries) and the bar τ."""

    booster: lgb.Booster
    grid: list[stage1_policy.Config]
    tau: float
    block: int


def read_funnel_policy(path: Path, m: Manifest) -> FunnelPolicyFile | None:
    """The version's funnel policy, or None when it was built without one.

    Raises:
        IndexVersionError: ``schema`` when the model's feature names differ from the section's.
    """
    meta = m.stage1_policy
    if meta is None:
        return None
    booster = lgb.Booster(model_file=str(path / meta.file))
    if booster.feature_name() != list(meta.feature_names):
        raise IndexVersionError("schema", f"{meta.file} does not match this gateway's funnel policy")
    return FunnelPolicyFile(booster, [stage1_policy.Config(**c) for c in meta.grid], float(meta.tau), meta.block)


# -- CARS --------------------------------------------------------------------------------------------------------

def cars_files(query_map: np.ndarray, doc_map: np.ndarray) -> tuple[Files, dict]:
    """Writers of the CARS maps, (D, D) each (stored float32); returns (files, the section's file fields)."""
    names = {"query_map_file": "query_map.npy", "doc_map_file": "doc_map.npy"}
    files = {names["query_map_file"]: _npy_writer(np.asarray(query_map, dtype=np.float32)),
             names["doc_map_file"]: _npy_writer(np.asarray(doc_map, dtype=np.float32))}
    return files, names


def read_cars_query_map(path: Path, m: Manifest) -> np.ndarray | None:
    """The CARS query map Q, (D, D) float32, or None for a version without CARS.

    Raises:
        IndexVersionError: ``dimension_mismatch`` when it is not (D, D).
    """
    name = m.cars.query_map_file if isinstance(m.cars, CarsSection) else None
    if not name:
        return None
    Q = np.load(path / name)
    if Q.shape != (m.dimension, m.dimension):
        raise IndexVersionError("dimension_mismatch", f"{name} has shape {Q.shape}")
    return Q


# -- rerank texts and the difficulty head ----------------------------------------------------------------------

RERANK_TEXT_FILE = "encoder_text.json"
TIER_HEAD_FILE = "difficulty_head.npy"


def rerank_files(texts: Sequence[str], depth: int) -> tuple[Files, RerankSection]:
    """Writer of the documents' encoder texts (title + " " + text, as encoded) the rerank tiers read."""
    section = RerankSection(text_file=RERANK_TEXT_FILE, depth=depth,
                            text="title + ' ' + text, as encoded; tiers 'maxsim' and 'cross_encoder' rerank on it")
    return {RERANK_TEXT_FILE: _json_writer(list(texts))}, section


def read_rerank_texts(path: Path, m: Manifest) -> list[str] | None:
    """The N encoder texts, or None for a version built without them.

    Raises:
        IndexVersionError: ``schema`` when the file does not hold N texts.
    """
    if m.rerank is None:
        return None
    texts = json.loads((path / m.rerank.text_file).read_text(encoding="utf-8"))
    if not isinstance(texts, list) or len(texts) != m.corpus.documents:
        raise IndexVersionError("schema", f"{m.rerank.text_file} does not hold {m.corpus.documents} texts")
    return texts


def tier_head_files(W: np.ndarray, **report) -> tuple[Files, TierHeadSection]:
    """Writer of the difficulty head W_t, (T, D) float32 over :data:`adawidth.tiers.TIERS` (``report`` kept)."""
    section = TierHeadSection(file=TIER_HEAD_FILE, **{"classes": list(TIERS), **report})
    return {TIER_HEAD_FILE: _npy_writer(np.asarray(W, dtype=np.float32))}, section


def read_tier_head(path: Path, m: Manifest) -> np.ndarray | None:
    """The difficulty head, (T, D) float32, or None for a version built without one.

    Raises:
        IndexVersionError: ``schema`` when it is not (T, D).
    """
    head = m.tiers.head if m.tiers is not None else None
    if head is None:
        return None
    W = np.load(path / head.file).astype(np.float32)
    if W.shape != (len(TIERS), m.dimension):
        raise IndexVersionError("schema", f"{head.file} is not a ({len(TIERS)}, D) head over {list(TIERS)}")
    return W


# -- the level scan and the recall policy (schema 3) -------------------------------------------------------------

RECALL_POLICY_FILE = "recall_policy.txt"
RECALL_CALIBRATION_FILE = "recall_calibration.npy"
RECALL_THREADS_FILE = "recall_calibration_threads.npy"


def level_files(store: LevelStore) -> tuple[Files, LevelsSection]:
    """Writers of a level store's arrays (one ``levels_<name>.npy`` each) and its section."""
    arrays = store.arrays()
    names = {name: f"levels_{name}.npy" for name in arrays}
    section = LevelsSection(bounds=[int(b) for b in store.layout.bounds], fp16_levels=int(store.layout.fp16_levels),
                            files=names, size_bytes=int(store.nbytes))
    return {names[n]: _npy_writer(a) for n, a in arrays.items()}, section


def read_levels(path: Path, m: Manifest) -> LevelStore | None:
    """The version's level store with its arrays memory-mapped (never copied), or None without levels.

    Raises:
        IndexVersionError: ``schema`` when the arrays do not form a store of the manifest's N and D.
    """
    if m.levels is None:
        return None
    try:
        store = LevelStore.from_arrays({n: mapped(path / f) for n, f in m.levels.files.items()})
    except ValueError as e:
        raise IndexVersionError("schema", f"the level files do not form a level store: {e}") from e
    if (store.N, store.D) != (m.corpus.documents, m.dimension):
        raise IndexVersionError("schema", f"the level store holds ({store.N}, {store.D}), the manifest "
                                          f"({m.corpus.documents}, {m.dimension})")
    return store


def recall_policy_files(booster: lgb.Booster, calibration_pred: np.ndarray, calibration_recall: np.ndarray,
                        calibration_coordinates: np.ndarray | None = None, by_threads: dict | None = None,
                        **section) -> tuple[Files, RecallPolicySection]:
    """Writers of the recall policy's model and out-of-fold calibration, and its section.

    The calibration file holds (2, Q, Z) float64 (predictions, realised recall@k), or (3, Q, Z) with each run's
    multiply-adds as well (what :meth:`engine.recall.RecallPolicy.serving` weighs the per-query model against
    one calibrated confidence with).  ``by_threads`` (kernel threads t > 1 -> ((Q, Z) recall, (Q, Z)
    multiply-adds), :func:`trainer.recall_fit.thread_calibration`) adds a (T, 2, Q, Z) float64 file.
    """
    parts = [calibration_pred, calibration_recall] + ([] if calibration_coordinates is None
                                                      else [calibration_coordinates])
    cal = np.stack([np.asarray(a, np.float64) for a in parts])
    writers = {RECALL_POLICY_FILE: lambda p: booster.save_model(str(p)), RECALL_CALIBRATION_FILE: _npy_writer(cal)}
    section = {k: v for k, v in section.items() if k not in ("threads_calibration_file", "calibration_threads")}
    if by_threads:
        threads = sorted(int(t) for t in by_threads)
        writers[RECALL_THREADS_FILE] = _npy_writer(np.stack([np.stack([np.asarray(a, np.float64) for a in by_threads[t]])
                                                             for t in threads]))
        section.update(threads_calibration_file=RECALL_THREADS_FILE, calibration_threads=threads)
    sec = RecallPolicySection(file=RECALL_POLICY_FILE, calibration_file=RECALL_CALIBRATION_FILE,
                              calibration_queries=int(cal.shape[1]), **section)
    return writers, sec


@dataclass(frozen=True)
class RecallPolicyFile:
    """A loaded recall policy: the model, its section, the (Q, Z) calibration predictions, recalls and multiply-adds
    (None for a version written before they were kept)."""

    booster: lgb.Booster
    section: RecallPolicySection | AnnEffortSection
    calibration_pred: np.ndarray
    calibration_recall: np.ndarray
    calibration_coordinates: np.ndarray | None = None
    by_threads: dict = field(default_factory=dict)


def read_recall_policy(path: Path, m: Manifest) -> RecallPolicyFile | None:
    """The version's recall policy, or None when it was built without one.  ``by_threads`` holds kernel threads
    t -> ((Q, Z) recall, (Q, Z) multiply-adds) of its per-thread calibration (empty without one).

    Raises:
        IndexVersionError: ``schema`` when the model's features or the calibration's shape disagree with the
            section.
    """
    if m.recall_policy is None:
        return None
    sec = m.recall_policy
    got = _policy_file(path, sec, (2, 3))
    if not sec.threads_calibration_file:
        return got
    per = np.load(path / sec.threads_calibration_file)
    if per.shape != (len(sec.calibration_threads), 2, *got.calibration_recall.shape):
        raise IndexVersionError("schema", f"{sec.threads_calibration_file} has shape {per.shape}, not "
                                          f"({len(sec.calibration_threads)}, 2, {got.calibration_recall.shape})")
    return replace(got, by_threads={int(t): (per[i, 0], per[i, 1]) for i, t in enumerate(sec.calibration_threads)})


def _policy_file(path: Path, sec, rows: tuple[int, ...]) -> RecallPolicyFile:
    """A LightGBM policy over (features, z) and its (rows, Q, E) calibration array, checked against ``sec``."""
    booster = lgb.Booster(model_file=str(path / sec.file))
    if booster.feature_name() != list(sec.feature_names) + ["z"]:
        raise IndexVersionError("schema", f"{sec.file} feature names differ from the manifest's")
    cal = np.load(path / sec.calibration_file)
    if cal.ndim != 3 or cal.shape[0] not in rows or cal.shape[2] != len(sec.z_grid):
        raise IndexVersionError("schema", f"{sec.calibration_file} has shape {cal.shape}, not "
                                          f"({' or '.join(map(str, rows))}, Q, {len(sec.z_grid)})")
    return RecallPolicyFile(booster, sec, cal[0], cal[1], cal[2] if cal.shape[0] == 3 else None)


# -- the ANN first stage (schema 4) --------------------------------------------------------------------------------

ANN_FILE = "ann.faiss"
ANN_EFFORT_FILE = "ann_effort.txt"
ANN_EFFORT_CALIBRATION_FILE = "ann_effort_calibration.npy"


def _effort_files(i: int) -> tuple[str, str]:
    """The model and calibration files of a version's ``i``-th per-query effort model (0: the first)."""
    if i == 0:
        return ANN_EFFORT_FILE, ANN_EFFORT_CALIBRATION_FILE
    return f"ann_effort_{i}.txt", f"ann_effort_calibration_{i}.npy"


def ann_files(index, params: ann.AnnParams, curve: list[dict], effort_model: dict | list[dict] | None = None,
              **section) -> tuple[Files, AnnSection]:
    """Writer of an ANN index (``ann.faiss``, faiss's own format) and its section.

    Args:
        index: the faiss index (:func:`engine.ann.build_index`).
        params: its parameters.
        curve: its tuning curve (:func:`engine.ann.tune_effort`).
        effort_model: the per-query effort model, ``{"booster", "oof" (Q, E), "recall" (Q, E), "coordinates" (Q, E),
            "section": the other :class:`AnnEffortSection` fields}``, a list of them (one per probe effort, the
            lowest targets' first: ``effort_model``, the rest ``more_effort_models``), or None.
        section: the other :class:`AnnSection` fields (targets, margin_share, tuning_source, tuning_queries,
            bytes_per_document, reports).
    """
    size = int(faiss.serialize_index(index).nbytes)
    sec = AnnSection(kind=params.kind, faiss_class=ann.FAISS_CLASS[params.kind],
                     metric="L2 on unit vectors (ranks as inner product)" if params.kind == "hnsw_panorama"
                     else "inner product", file=ANN_FILE, params=params.as_dict(),
                     effort_name=ann.EFFORT_NAME[params.kind], curve=curve, size_bytes=size, **section)
    writers = {ANN_FILE: lambda p: faiss.write_index(index, str(p))}
    models = [] if effort_model is None else [effort_model] if isinstance(effort_model, dict) else list(effort_model)
    for i, e in enumerate(models):
        cal = np.stack([np.asarray(e[n], np.float64) for n in ("oof", "recall", "coordinates")])
        model_file, cal_file = _effort_files(i)
        es = AnnEffortSection(file=model_file, calibration_file=cal_file, calibration_queries=int(cal.shape[1]),
                              **e["section"])
        if i == 0:
            sec.effort_model = es
        else:
            sec.more_effort_models.append(es)
        writers[model_file] = lambda p, booster=e["booster"]: booster.save_model(str(p))
        writers[cal_file] = _npy_writer(cal)
    return writers, sec


def read_ann_effort(path: Path, m: Manifest) -> RecallPolicyFile | None:
    """The ANN first stage's per-query effort model (its booster, section and (Q, E) calibration predictions,
    recalls and multiply-adds), or None when the version has none.

    Raises:
        IndexVersionError: ``schema`` when the model's features or the calibration's shape disagree with the
            section.
    """
    sec = m.ann.effort_model if m.ann is not None else None
    return None if sec is None else _policy_file(path, sec, (3,))


def read_more_ann_efforts(path: Path, m: Manifest) -> list[RecallPolicyFile]:
    """The ANN first stage's further per-query effort models (``more_effort_models``: other targets, other probe
    efforts), checked as :func:`read_ann_effort`; empty without any."""
    return [] if m.ann is None else [_policy_file(path, sec, (3,)) for sec in m.ann.more_effort_models]


def read_ann(path: Path, m: Manifest):
    """The version's ANN index and its parameters, ``(faiss.Index, engine.ann.AnnParams)``, or None without one.

    Raises:
        IndexVersionError: ``schema`` for an unknown kind, or an index whose width or size disagrees with the
            manifest.
    """
    sec = m.ann
    if sec is None:
        return None
    if sec.kind not in ann.ANN_KINDS:
        raise IndexVersionError("schema", f"ann kind {sec.kind!r} is not one this build serves ({ann.ANN_KINDS})")
    index = faiss.read_index(str(path / sec.file))
    if index.d != m.dimension or index.ntotal != m.corpus.documents:
        raise IndexVersionError("schema", f"{sec.file} holds {index.ntotal} vectors of width {index.d}, the manifest "
                                          f"{m.corpus.documents} of width {m.dimension}")
    fields = {k: int(sec.params.get(k, 0) or 0) for k in ("nlist", "M", "ef_construction", "n_levels")}
    return index, ann.AnnParams(sec.kind, **fields)
