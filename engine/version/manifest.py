"""The typed manifest of an index version and its one verification, :func:`verify`.

``manifest.json`` is written last into a version directory (:func:`engine.version.store.write_version`)
and lists the sha256 of every other file.  :class:`Manifest` is its schema: the sections a reader needs are
typed; reports (``evaluation``, ``capacity``, ``build_seconds``, a section's training details) are kept as
they were written.  Every file of a version is named by a section:

========================  =====================================  =============================================
section                   files                                  writer / reader
========================  =====================================  =============================================
``core`` (schema 2)       rotation.npy, docs.npy,                :func:`engine.version.files.core_files` /
                          doc_sqnorm_m0.npy, doc_ids.json        :func:`engine.version.files.read_core`
``stage1``                stage1.faiss                           ``stage1_files`` / ``read_stage1_index``
``router.pairs``          router_<l>_<h>.txt                     ``router_files`` / ``read_routers``
``stage1_policy``         stage1_policy.txt                      ``funnel_policy_files`` / ``read_funnel_policy``
``cars``                  query_map.npy, doc_map.npy             ``cars_files`` / ``read_cars_query_map``
``rerank``                encoder_text.json                      ``rerank_files`` / ``read_rerank_texts``
``tiers.head``            difficulty_head.npy                    ``tier_head_files`` / ``read_tier_head``
``levels``                levels_<array>.npy                     ``level_files`` / ``read_levels``
``recall_policy``         recall_policy.txt,                     ``recall_policy_files`` / ``read_recall_policy``
                          recall_calibration.npy,
                          recall_calibration_threads.npy
``lexical``               bm25_*.npy / .json, doc_text.json,     :mod:`engine.version.lexical`
                          doc_fields.json
``ann``                   ann.faiss                              ``ann_files`` / ``read_ann``
``capacity``              capacity.json / .md / _*.png           ``trainer.capacity_report.file_writers``
                                                                 (reports; nothing reads them to serve)
========================  =====================================  =============================================

The Milvus collection of a version (stage 1 on Milvus) is described by :mod:`engine.version.milvus`.

Schema versions (bump :data:`SCHEMA_VERSION` when a section is added; every schema in
:data:`READABLE_SCHEMAS` stays readable, ``tests/integration/test_frozen_artifact.py`` keeps schema 1 so):

* 1 -- the first format: core and stage-1 file names fixed, not listed in the manifest.
* 2 -- adds the ``core`` section (the names of the core files), ``stage1.file``, and ``lexical.text_file`` /
  ``lexical.fields_file``: every file of a version is named by a section, and :func:`verify` checks that
  every file a section names is covered by the checksums; and the ``policy`` section (the default policy of
  ``width: "auto"``).  A schema-1 manifest reads with the fixed names and no ``policy``.
* 3 -- adds ``levels`` (the level-major corpus of the certified level scan) and ``recall_policy`` (policy
  ``recall``, a declared recall@k); the default policy of a version that has both is ``recall``.  Versions of
  schema 1 and 2 have neither and serve their old policies (``width: "full"`` by the exhaustive scan).
* 4 -- adds ``ann`` (an ANN first stage over the full-width rotated documents, issue 19: its faiss index,
  parameters, effort tuning curve and memory per document) and ``backend`` (which stage-1 backend the build
  chose, why, and every candidate's bytes per document).  Versions of schema 1 to 3 have neither and serve as
  before (``backend``: flat).
* 5 -- adds ``writes`` (issue 18): the last write-ahead-log sequence number folded into the version, the version
  it was folded onto, and whether the rotation, routers and recall policy were reused or refitted (the drift
  check).  Versions of schemas 1-4 (and any built from a corpus alone) folded nothing: folded sequence 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adawidth import stage1_policy
from adawidth.router import FEATURE_NAMES
from adawidth.tiers import TIERS
from engine.io.checksum import sha256_file

SCHEMA_VERSION = 5
"""The schema this build writes."""
READABLE_SCHEMAS = (1, 2, 3, 4, 5)
"""The schemas this build reads."""
MANIFEST = "manifest.json"

LEXICAL_ANALYZER = "nfkc-casefold-\\w+-v1"
"""Name of the lexical analyzer this build implements (:func:`adawidth.hybrid.analyze`); stored in the manifest."""


class IndexVersionError(RuntimeError):
    """A version cannot be used.  ``code`` is machine-readable (a refusal reason of the gateway's replicas):

    ``missing`` (no such version / no manifest), ``schema`` (unknown schema version, a manifest or file that
    does not match the format), ``checksum`` (a file is missing or differs from the manifest),
    ``encoder_mismatch`` (encoder hash or max tokens), ``dimension_mismatch``, ``router_mismatch`` (router
    features differ from this build's), ``collection_mismatch``.
    """

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(f"[{code}] {message}")


class _Section(BaseModel):
    """A manifest section: typed fields a reader needs; anything else written (reports) is kept."""

    model_config = ConfigDict(extra="allow")


class FileEntry(BaseModel):
    """Checksum of one file of the version."""

    model_config = ConfigDict(extra="forbid")
    sha256: str = Field(description="Hex sha256 of the file's bytes.")
    size_bytes: int = Field(ge=0)


class EncoderSection(_Section):
    """The encoder the version was built with (``encoder.json`` of the ONNX export)."""

    onnx_sha256: str
    model_name: str | None = None
    dimension: int | None = None
    max_tokens: int | None = Field(None, description="Truncation of documents (and so of queries), in tokens.")
    pooling: str | None = None
    normalization: str | None = None
    truncation: str | None = None
    tokenizer_sha256: str | None = None


class CoreSection(_Section):
    """Names of the core files (schema 2; a schema-1 manifest reads with these defaults)."""

    rotation: str = Field("rotation.npy", description="R, float32, shape (D, D).")
    docs: str = Field("docs.npy", description="Rotated documents, float32, shape (N, D), memory-mappable.")
    doc_sqnorm_m0: str = Field("doc_sqnorm_m0.npy", description="||(R d)[:m0]||^2, float32, shape (N,).")
    doc_ids: str = Field("doc_ids.json", description="External document ids in index order (list of N str).")


class Stage1Section(_Section):
    """Stage 1: a faiss inner-product index over the L2-normalised m0-prefixes of the rotated documents."""

    kind: str = "faiss.IndexFlatIP"
    metric: str | None = "inner product of L2-normalised m0-prefixes"
    file: str = "stage1.faiss"


class AdapterSection(_Section):
    """The served rotation: ``kind`` (adapter, adapter_on_pca, pca, identity), the sha256 of R's float32 bytes."""

    kind: str
    sha256: str = ""
    training: dict | None = None


class RouterPairSection(_Section):
    """One action pair's LightGBM gain regressor and its calibration predictions (ascending)."""

    file: str
    action_pair: tuple[int, int]
    calibration_predictions: list[float]


class RouterSection(_Section):
    """The width routers (§3.2 of 001)."""

    feature_names: list[str]
    default_pair: tuple[int, int] | None = None
    default_rho: float = 0.2
    pairs: dict[str, RouterPairSection] = Field(default_factory=dict)


class CorpusSection(_Section):
    """The corpus: ``documents`` N and its provenance (fingerprints, dataset, splits)."""

    documents: int = Field(ge=0)
    fingerprint: str | None = None
    dataset: str | None = None
    dataset_fingerprint: str | None = None


class FunnelPolicySection(_Section):
    """The per-query funnel policy (:mod:`adawidth.stage1_policy`): a LightGBM agreement model over ``grid``."""

    file: str
    block: int
    tau: float
    grid: list[dict]
    feature_names: list[str]


class LexicalSection(_Section):
    """The BM25 index, the normalised texts and keyword fields (:mod:`engine.version.lexical`)."""

    kind: str
    analyzer: str
    k1: float
    b: float
    method: str
    files: list[str]
    fields: list[str] = Field(default_factory=list)
    text_file: str = "doc_text.json"
    fields_file: str = "doc_fields.json"
    counts_file: str | None = None  # bm25_counts.npz (a fold reuses it); None in versions built before it


class CarsSection(_Section):
    """CARS Shared/Dual maps (docs/METHOD.md): documents were stored through the doc map."""

    query_map_file: str | None = None
    doc_map_file: str | None = None


class RerankSection(_Section):
    """The documents' encoder texts the rerank tiers (MaxSim, cross-encoder) read."""

    text_file: str
    depth: int | None = None


class TierHeadSection(_Section):
    """The difficulty head W_t (tier 'auto'), float32 of shape (T, D) over ``classes``."""

    file: str
    classes: list[str] = Field(default_factory=lambda: list(TIERS))


class TiersSection(_Section):
    """DART tiers (Algorithm 1 of 000): the difficulty head and the cross-encoder it was labelled with."""

    head: TierHeadSection | None = None


class LevelsSection(_Section):
    """The level-major copy of the rotated corpus the level scan reads (:class:`adawidth.levels.LevelStore`)."""

    bounds: list[int] = Field(description="Level boundaries in coordinates, 0 .. D.")
    fp16_levels: int = Field(ge=0, description="Leading levels also stored in float16.")
    files: dict[str, str] = Field(description="Array name of LevelStore.arrays() -> file name (.npy).")
    size_bytes: int = Field(ge=0, description="Bytes of the level store.")


class RecallPolicySection(_Section):
    """Policy ``recall``: the LightGBM model of recall@k per confidence and its out-of-fold calibration."""

    file: str = Field(description="LightGBM text model over feature_names + ['z'].")
    calibration_file: str = Field(description="(2, Q, Z) float64: out-of-fold predictions, realised recall@k; "
                                              "(3, Q, Z) with each run's multiply-adds too.")
    feature_names: list[str]
    z_grid: list[float]
    bound: str = Field(description="The level scan's probabilistic bound (data_aware or data_aware_doc).")
    k: int = 10
    margin_share: float = 0.25
    margin_rule: Literal["standard_error", "share"] = Field(
        "share", description="How a target's margin is set (adawidth.recall_policy.calibration_goal): "
                             "'standard_error' (one standard error of the calibration mean; training queries) or "
                             "'share' (margin_share of the miss budget; pseudo-queries, and versions written "
                             "before this field).")
    calibration_source: str = Field(description="What the calibration queries were: 'train' (the training "
                                                "split's queries) or 'pseudo:<kind>' (drawn from the corpus).")
    calibration_queries: int = 0
    seeds: int | None = Field(None, description="Documents exactly scored after the first level to seed the "
                                                "threshold, as the evidence was computed (null: written before it "
                                                "was recorded, max(4 k, 32)).")
    threads_calibration_file: str | None = Field(
        None, description="(T, 2, Q, Z) float64: the calibration queries' realised recall@k and multiply-adds at each "
                          "z, scanned on each of calibration_threads kernel threads (a sharded scan prunes less, so "
                          "z is calibrated per thread count); null: one thread only (a corpus too small to shard, "
                          "or a version written before 2026-12-07).")
    calibration_threads: list[int] = Field(default_factory=list,
                                           description="The kernel thread counts (each > 1) of "
                                                       "threads_calibration_file, in its order.")


class WritesSection(_Section):
    """Live documents folded into the version (issue 18, :mod:`trainer.fold`).

    The version holds the documents of ``base_version`` with every write-ahead-log record of sequence number
    in (``base_folded_seq``, ``folded_seq``] applied (upserts replaced or added, deletes removed).  ``fitting``
    says whether the rotation, routers and recall policy (and the level layout) were reused from the base
    version (``reused``) or fitted again (``refitted``: the drift check said retrain); ``drift`` holds the
    check's figures.
    """

    folded_seq: int = Field(ge=0, description="The last write sequence number this version holds.")
    base_version: str | None = None
    base_folded_seq: int = Field(0, ge=0)
    fitting: str = Field("reused", description="'reused' or 'refitted'.")
    drift: dict | None = None


class AnnEffortSection(_Section):
    """The per-query effort model of an ANN first stage (LAET / DARTH style, :func:`engine.ann.probe`): a LightGBM
    model of recall@k at each effort of the grid from a probe's evidence, its out-of-fold calibration, and which
    targets it serves (the build timed it against the one tuned effort)."""

    file: str = Field(description="LightGBM text model over feature_names + ['z'] (z: the effort).")
    calibration_file: str = Field(description="(3, Q, E) float64: out-of-fold predictions, realised recall@k, "
                                              "multiply-adds of each calibration query at each effort.")
    feature_names: list[str]
    z_grid: list[float] = Field(description="The efforts (nprobe or efSearch), increasing; the first is the probe's.")
    k: int = 10
    margin_share: float = 0.25
    margin_rule: Literal["standard_error", "share"] = "standard_error"
    calibration_source: str = "train"
    calibration_queries: int = 0
    per_query_targets: list[float] = Field(
        default_factory=list, description="The recall targets the model serves (the build measured it faster there "
                                          "than the one tuned effort); every other target is served at its one "
                                          "tuned effort.")
    measured: dict | None = Field(None, description="Per target: p50 ms and recall@10 of the one tuned effort and "
                                                    "of the per-query model, on the tuning queries.")
    probe_choice: dict | None = Field(None, description="Per probe effort tried (the first of z_grid is the one "
                                                        "chosen): the tuning queries' median multiply-adds at each "
                                                        "target's calibrated bar (trainer.recall_fit."
                                                        "fit_effort_models; versions built before 2026-12-05 also "
                                                        "hold their geometric mean, the one probe's score); None "
                                                        "in versions built before the probe was chosen.")
    targets: list[float] = Field(default_factory=list,
                                 description="The default recall targets whose lowest median work was at this "
                                             "model's probe: it serves them and the targets nearest them (empty: "
                                             "every target, the version's only model).")


class AnnSection(_Section):
    """An ANN first stage over the full-width documents (:mod:`engine.ann`), served by policy ``recall``."""

    kind: str = Field(description="ivf, hnsw, ivf_panorama, hnsw_panorama or hnsw_fp16 (engine.ann.ANN_KINDS).")
    space: Literal["rotated", "embedding"] = Field(
        "rotated", description="What the index holds: the rotated documents (searched with the rotated query), or "
                               "the documents as encoded (searched with the query embedding; engine.ann.index_space). "
                               "Versions built before 2026-12-06: rotated.")
    search: Literal["faiss", "resumable"] = Field(
        "faiss", description="How the per-query effort model's continuation searches an HNSW: 'resumable' goes on "
                             "from the probe's state through the grid's efforts (engine.ann.ResumableHnsw, what its "
                             "model was calibrated on); 'faiss' searches again and merges the probe (versions "
                             "built before 2026-12-07, and kinds it does not serve).")
    faiss_class: str = Field(description="The faiss index class (IndexIVFFlat, IndexHNSWFlat, ...).")
    metric: str = Field(description="inner product, or L2 (hnsw_panorama; the same ranking on unit vectors).")
    file: str = "ann.faiss"
    params: dict = Field(description="Build parameters: nlist, M, ef_construction, n_levels (engine.ann.AnnParams).")
    effort_name: str = Field(description="nprobe (IVF) or efSearch (HNSW): what the per-query effort sets.")
    curve: list[dict] = Field(description="Tuning curve: [{effort, recall, recall_p10, work}] increasing in effort; "
                                          "recall@10 vs exhaustive of the candidates' full-width scores.")
    targets: dict[str, int | None] = Field(default_factory=dict, description="Served effort of each tuned target "
                                                                            "(None: served exactly).")
    margin_share: float = 0.25
    tuning_source: str = Field("train", description="'train' or 'pseudo:<kind>' (corpus pseudo-queries).")
    tuning_queries: int = 0
    bytes_per_document: dict[str, float] = Field(default_factory=dict)
    size_bytes: int = Field(0, ge=0, description="Bytes of the index file.")
    effort_model: AnnEffortSection | None = Field(None, description="The per-query effort model (None: one tuned "
                                                                    "effort per target); with further models, the "
                                                                    "one of the lowest targets.")
    more_effort_models: list[AnnEffortSection] = Field(
        default_factory=list, description="Per-query effort models of further targets, each with a probe effort "
                                          "of its own (its targets chose it: trainer.recall_fit.fit_effort_models).")


class BackendSection(_Section):
    """Which stage-1 backend the build chose (flat, or an ANN kind) and why, with the bytes per document of each
    candidate backend (engine.ann.bytes_per_document)."""

    chosen: str = "flat"
    reason: str | None = None
    requested: str | None = None
    ann_min_docs: int | None = None
    memory_budget_bytes: int | None = None
    needed_bytes: int | None = None
    bytes_per_document: dict[str, dict[str, float]] = Field(default_factory=dict)
    measured: dict | None = None  # --ann auto: backends timed at the default recall target (trainer.build)


class PolicySection(_Section):
    """The policy ``width: "auto"`` uses on this version by default (``router``, ``funnel``, ``recall``, ...;
    None: the funnel policy when the version has one, else the width router)."""

    default: str | None = None


class Manifest(BaseModel):
    """``manifest.json`` of one index version (see the module docstring for the sections and schemas)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
    version: str
    collection: str
    created: str | None = None
    encoder: EncoderSection
    dimension: int = Field(ge=1, description="Encoder width D.")
    m0: int = Field(ge=1, description="Stage-1 width.")
    shortlist: int = Field(ge=1, description="Shortlist size C kept by stage 1.")
    theta: float = 0.05
    core: CoreSection = Field(default_factory=CoreSection)
    stage1: Stage1Section = Field(default_factory=Stage1Section)
    adapter: AdapterSection | None = None
    router: RouterSection | None = None
    corpus: CorpusSection
    stage1_policy: FunnelPolicySection | None = None
    lexical: LexicalSection | None = None
    cars: CarsSection | None = None
    rerank: RerankSection | None = None
    tiers: TiersSection | None = None
    policy: PolicySection | None = None
    levels: LevelsSection | None = None
    recall_policy: RecallPolicySection | None = None
    ann: AnnSection | None = None
    backend: BackendSection | None = None
    writes: WritesSection | None = None
    evaluation: dict | None = None
    capacity: dict | None = None
    build_seconds: dict | None = None
    files: dict[str, FileEntry] = Field(default_factory=dict)

    def section_files(self) -> Iterator[tuple[str, str]]:
        """(section, file name) of every file a section names, in manifest order."""
        for name in (self.core.rotation, self.core.docs, self.core.doc_sqnorm_m0, self.core.doc_ids):
            yield "core", name
        if self.stage1.kind.startswith("faiss"):
            yield "stage1", self.stage1.file
        for pair in (self.router.pairs.values() if self.router else ()):
            yield "router", pair.file
        if self.stage1_policy is not None:
            yield "stage1_policy", self.stage1_policy.file
        if self.lexical is not None:
            for name in (*self.lexical.files, self.lexical.text_file, self.lexical.fields_file):
                yield "lexical", name
        if self.cars is not None:
            for name in (self.cars.query_map_file, self.cars.doc_map_file):
                if name:
                    yield "cars", name
        if self.rerank is not None:
            yield "rerank", self.rerank.text_file
        if self.tiers is not None and self.tiers.head is not None:
            yield "tiers", self.tiers.head.file
        if self.levels is not None:
            for name in self.levels.files.values():
                yield "levels", name
        if self.recall_policy is not None:
            yield "recall_policy", self.recall_policy.file
            yield "recall_policy", self.recall_policy.calibration_file
            if self.recall_policy.threads_calibration_file:
                yield "recall_policy", self.recall_policy.threads_calibration_file
        if self.ann is not None:
            yield "ann", self.ann.file

    def to_json(self) -> str:
        """The manifest as written: JSON, keys sorted, indented by 2."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True)


def parse_manifest(raw: dict, where: str = "manifest") -> Manifest:
    """Validate a manifest mapping (a parsed ``manifest.json``).

    Raises:
        IndexVersionError: ``schema`` for an unreadable schema version or a mapping that is not a manifest.
    """
    if raw.get("schema_version") not in READABLE_SCHEMAS:
        raise IndexVersionError("schema", f"{where} has schema_version {raw.get('schema_version')!r}, "
                                          f"this build reads {list(READABLE_SCHEMAS)}")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise IndexVersionError("schema", f"{where} is not a valid manifest: {'.'.join(map(str, first['loc']))}: "
                                          f"{first['msg']} ({e.error_count()} error(s))") from e


def read_manifest(version_dir: Path | str) -> Manifest:
    """Parse and validate ``manifest.json`` of a version directory (no checksums: see :func:`verify`).

    Raises:
        IndexVersionError: ``missing`` (no manifest: incomplete or not a version) or ``schema``.
    """
    path = Path(version_dir) / MANIFEST
    if not path.is_file():
        raise IndexVersionError("missing", f"{version_dir} has no {MANIFEST} (incomplete or not a version)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexVersionError("schema", f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise IndexVersionError("schema", f"{path} is not a JSON object")
    return parse_manifest(raw, str(path))


@dataclass(frozen=True)
class Expect:
    """What the caller runs, for :func:`verify`; None skips a check.

    Attributes:
        encoder_sha256: the ONNX encoder's hash (``encoder.onnx_sha256`` must equal it).
        max_tokens: the encoder's truncation in tokens (``encoder.max_tokens``, when recorded, must equal it:
            queries and documents would otherwise be truncated differently).
        dimension: the encoder width D.
        collection: the collection the caller serves.
        version: the version name the caller asked for (the manifest's ``version`` must equal it).
        router_features: the router features this build computes (default :data:`adawidth.router.FEATURE_NAMES`);
            checked when the version has routers.
    """

    encoder_sha256: str | None = None
    max_tokens: int | None = None
    dimension: int | None = None
    collection: str | None = None
    version: str | None = None
    router_features: tuple[str, ...] | None = FEATURE_NAMES

    @classmethod
    def of_encoder(cls, encoder, **kw) -> "Expect":
        """Expectations of a loaded :class:`engine.encoder.OnnxEncoder` (hash, max tokens, D) plus ``kw``."""
        return cls(encoder_sha256=encoder.info.onnx_sha256, max_tokens=encoder.max_tokens,
                   dimension=encoder.dimension, **kw)

    @classmethod
    def of_export(cls, encoder_dir: Path | str, **kw) -> "Expect":
        """Expectations from an encoder export's ``encoder.json`` (without loading the model), plus ``kw``;
        no encoder checks when the export is absent."""
        meta = Path(encoder_dir) / "encoder.json"
        if not meta.is_file():
            return cls(**kw)
        info = json.loads(meta.read_text(encoding="utf-8"))
        return cls(encoder_sha256=info.get("onnx_sha256"), max_tokens=info.get("max_tokens"),
                   dimension=info.get("dimension"), **kw)


def _check_checksums(version_dir: Path, m: Manifest) -> None:
    for name, meta in m.files.items():
        path = version_dir / name
        if not path.is_file():
            raise IndexVersionError("checksum", f"{path} listed in the manifest is missing")
        if path.stat().st_size != meta.size_bytes or sha256_file(path) != meta.sha256:
            raise IndexVersionError("checksum", f"{path} does not match the manifest checksum")


def check_structure(m: Manifest) -> None:
    """Consistency of the sections among themselves and with this build's readers (no file is read).

    Raises:
        IndexVersionError: ``schema`` -- a file a section names is not covered by the checksums, the funnel
            policy or the lexical analyzer is not the one this build implements, or the tiers head is not over
            this build's tiers.
    """
    for section, name in m.section_files():
        if name not in m.files:
            raise IndexVersionError("schema", f"section {section!r} names {name}, which the manifest's checksums "
                                              f"do not cover")
    p = m.stage1_policy
    if p is not None and (list(p.feature_names) != list(stage1_policy.EVIDENCE_NAMES + stage1_policy.CONFIG_NAMES)
                          or p.block != stage1_policy.BLOCK):
        raise IndexVersionError("schema", f"{p.file} does not match this gateway's funnel policy")
    lx = m.lexical
    if lx is not None and (lx.analyzer != LEXICAL_ANALYZER or lx.kind != "bm25s"):
        raise IndexVersionError("schema", f"lexical index {lx.kind}/{lx.analyzer} is not the analyzer this gateway "
                                          f"runs ({LEXICAL_ANALYZER})")
    head = m.tiers.head if m.tiers is not None else None
    if head is not None and list(head.classes) != list(TIERS):
        raise IndexVersionError("schema", f"{head.file} is a head over {head.classes}, this build serves {list(TIERS)}")


def check_expectations(m: Manifest, expect: Expect, where: str = "version") -> None:
    """The manifest against what the caller runs (see :class:`Expect`).

    Raises:
        IndexVersionError: ``schema`` (another version name), ``collection_mismatch``, ``encoder_mismatch``,
            ``dimension_mismatch`` or ``router_mismatch``.
    """
    if expect.version is not None and m.version != expect.version:
        raise IndexVersionError("schema", f"{where} manifest names version {m.version!r}, not {expect.version!r}")
    if expect.collection is not None and m.collection != expect.collection:
        raise IndexVersionError("collection_mismatch", f"{where} belongs to collection {m.collection!r}, "
                                                       f"not {expect.collection!r}")
    if expect.encoder_sha256 is not None and m.encoder.onnx_sha256 != expect.encoder_sha256:
        raise IndexVersionError("encoder_mismatch", f"version encoder {m.encoder.onnx_sha256[:12]} != running "
                                                    f"encoder {expect.encoder_sha256[:12]}")
    if expect.max_tokens is not None and m.encoder.max_tokens is not None and m.encoder.max_tokens != expect.max_tokens:
        raise IndexVersionError("encoder_mismatch", f"{where} truncates at {m.encoder.max_tokens} tokens, the encoder "
                                                    f"at {expect.max_tokens}: queries and documents would differ")
    if expect.dimension is not None and m.dimension != expect.dimension:
        raise IndexVersionError("dimension_mismatch", f"version dimension {m.dimension} != running {expect.dimension}")
    if (expect.router_features is not None and m.router is not None and m.router.pairs
            and list(m.router.feature_names) != list(expect.router_features)):
        raise IndexVersionError("router_mismatch", f"{where} router features {m.router.feature_names} differ from "
                                                   f"this build's {list(expect.router_features)}")


def verify(version_dir: Path | str, expect: Expect = Expect()) -> Manifest:
    """The one verification of a version before it is used; returns its manifest.

    In order: the manifest parses and has a readable schema; every listed file exists with its size and
    sha256; the sections are consistent with each other and with this build (:func:`check_structure`); the
    version matches what the caller runs (:func:`check_expectations`: version name, collection, encoder hash
    and max tokens, dimension, router features).  The loader (:meth:`engine.index.IndexVersion.load`), the
    replicas (:class:`service.version_manager.VersionManager`), the admin endpoints, the trainer CLI and the
    Milvus writer all call this one function.

    Args:
        version_dir: the version directory.
        expect: what the caller runs (:meth:`Expect.of_encoder`, :meth:`Expect.of_export`).

    Raises:
        IndexVersionError: ``missing``, ``schema``, ``checksum``, ``collection_mismatch``, ``encoder_mismatch``,
            ``dimension_mismatch`` or ``router_mismatch``.
    """
    version_dir = Path(version_dir)
    m = read_manifest(version_dir)
    _check_checksums(version_dir, m)
    check_structure(m)
    check_expectations(m, expect, str(version_dir))
    return m
