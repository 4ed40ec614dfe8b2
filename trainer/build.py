"""Build one index version of a BEIR collection: encode, rotate, train adapter and router, evaluate, publish.

Steps (each logged with its duration):

1. encode the corpus and the queries with the ONNX encoder (embeddings cached by content hash);
2. rotations: PCA of the document second moment (baseline), and the orthogonal
   prefix adapter trained on the training split (§3.1 of 001) when one exists;
3. the served rotation (``--rotation``) rotates the documents; stage 1 is a faiss
   inner-product index over their normalised m0-prefixes;
4. a LightGBM router per action pair, fitted on training queries (§3.2 of 001);
5. offline evaluation on the evaluation split through the served code path;
6. the capacity report (:mod:`adawidth.capacity`: δ, Warren's d*, regime, dimension
   cliff, CUS, failure AUC, prefix-sufficiency scaling) on the evaluation split and
   the served rotation, plus the offline baseline of the gateway's online CUS;
7. the version is written atomically (manifest last) and, with ``publish``,
   registered in the version registry as a candidate (the collection's first
   version, or any with ``promote``, is promoted at once).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adawidth import stage1_policy
from engine.version import store
from engine.io.beir import Collection, load_collection, load_qrels, available_splits
from adawidth.prefix import prefix_normalize
from adawidth.rotation import orthogonality_error, pca_rotation
from adawidth.tiers import RERANK_DEPTH
from adawidth.router import threshold_for_rate
from trainer.evaluate import Funnel, QuerySet, exact_rankings, routed_policy_report, score_rankings

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
        raise FileNotFoundError(f"dataset folder {folder} does not exist")
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
                         funnel: Funnel, routers: dict, name: str) -> dict:
    """Capacity report of the served rotation on the evaluation queries, with the online-CUS baseline.

    The baseline is the share of evaluation queries whose top-1 under the served
    ``auto`` policy (stage 1 at m0, the default action pair and ρ, the same
    :func:`adawidth.funnel.resolve` the gateway runs) equals the exact full-width
    top-1: the value the gateway's online label-free CUS should reproduce on
    traffic like the evaluation queries (``adawidth_online_cus_baseline_ratio``).
    """
    from adawidth.capacity import CapacityOptions, capacity_report
    from adawidth.funnel import resolve

    q_rot = np.ascontiguousarray(test.emb @ R.T, dtype=np.float32)
    cap_opts = CapacityOptions(**{"r_floor": opts.m0, "seed": opts.seed, **opts.capacity_options})
    report = capacity_report(q_rot, X_rot, test.judgments, doc_ids, test.ids, cap_opts)
    report["meta"] = {"collection": name, "rotation": opts.rotation, "split": opts.eval_split,
                      "dataset": str(opts.dataset)}
    pair = tuple(opts.default_pair)
    if pair in routers:
        fit = routers[pair]
        thr = threshold_for_rate(fit.oof_predictions, opts.default_rho)
        rows, scores = funnel.stage1(q_rot)
        full_top1 = np.argmax(X_rot @ q_rot.T, axis=0)
        agree = []
        for i in range(q_rot.shape[0]):
            res = resolve(q_rot[i], funnel.docs, funnel.doc_sqnorm_m0, rows[i], scores[i], m0=opts.m0, k=1,
                          width=None, action_pair=pair, threshold=thr,
                          predict_gain=lambda f: float(fit.booster.predict(f[None, :])[0]))
            agree.append(int(res.rows[0]) == int(full_top1[i]))
        report["online_cus_baseline"] = {"agreement": float(np.mean(agree)), "queries": len(agree),
                                         "policy": f"auto {pair[0]}/{pair[1]} rho={opts.default_rho}"}
    return report


def _capacity_summary(report: dict | None) -> dict | None:
    if report is None:
        return None
    from trainer.capacity_report import summary

    return summary(report)


def build_index(opts: BuildOptions, settings, encoder) -> tuple[Path, dict]:
    """Build (and optionally publish) a version; returns its directory and the manifest.

    Args:
        opts: :class:`BuildOptions`.
        settings: resolved :class:`trainer.config.TrainerSettings`.
        encoder: a :class:`engine.encoder.OnnxEncoder`.

    Raises:
        engine.io.beir.DatasetFormatError: on malformed input files.
        ValueError: on inconsistent options (e.g. an action pair below m0).
    """
    import faiss

    from trainer.adapter import AdapterConfig, train_adapter
    from trainer.embed_cache import EmbeddingCache, encode_with_cache
    from trainer.router_fit import fit_router

    if opts.rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {opts.rotation!r}")
    for low, high in opts.action_pairs:
        if not opts.m0 <= low < high <= encoder.dimension:
            raise ValueError(f"action pair ({low}, {high}) must satisfy m0={opts.m0} <= l < h <= {encoder.dimension}")
    if tuple(opts.default_pair) not in {tuple(p) for p in opts.action_pairs}:
        raise ValueError(f"default pair {opts.default_pair} is not among the action pairs")
    timer = _Timer()
    rng_seed = opts.seed
    ds_fingerprint = dataset_fingerprint(opts.dataset)  # before reading: a change while building is seen next poll
    splits = available_splits(opts.dataset)
    eval_split = opts.eval_split if opts.eval_split in splits else None
    train_split = opts.train_split if opts.train_split in splits else None
    if train_split is None and (opts.rotation.startswith("adapter") or opts.stage1_policy):
        what = f"rotation {opts.rotation!r}" if opts.rotation.startswith("adapter") else "the stage-1 policy"
        raise ValueError(f"{what} needs training qrels ({opts.train_split!r} split not found in {opts.dataset}; "
                         f"it has {splits or 'no'} splits)")
    if opts.tiers and train_split is None:
        raise ValueError(f"the difficulty head (--tiers) needs training qrels ({opts.train_split!r} split not found)")
    if opts.tiers:  # fail before encoding, not after
        from engine.scorers import CrossEncoderNotFoundError

        ce_dir = opts.cross_encoder or settings.home / "models" / "minilm-cross-encoder"
        if not (Path(ce_dir) / "cross_encoder.json").is_file():
            raise CrossEncoderNotFoundError(f"--tiers needs a cross-encoder export at {ce_dir} "
                                            "(python -m trainer.dart.cross_encoder --dataset ...)")
    col = load_collection(opts.dataset, eval_split or (splits[0] if splits else "test"))
    name = opts.collection or col.name
    doc_ids = [d.doc_id for d in col.corpus]
    row_of = {d: i for i, d in enumerate(doc_ids)}
    train_qrels = load_qrels(opts.dataset, train_split) if train_split else {}
    eval_qrels = col.qrels if eval_split else {}

    cache = EmbeddingCache(settings.embedding_cache, encoder.dimension)
    with timer("encode corpus"):
        if opts.embeddings is not None:  # shards of the Ray Data encoding job (trainer/ray_encode.py)
            from trainer.ray_encode import read_shards

            X, n_encoded = read_shards(opts.embeddings, doc_ids), 0
        else:
            X, n_encoded = encode_with_cache(encoder, [d.encoder_text() for d in col.corpus], cache,
                                             batch_size=settings.encode_batch_size, desc=f"encoding {name} corpus")
    qids = sorted(set(train_qrels) | set(eval_qrels))
    qids = [q for q in qids if q in col.queries]
    with timer("encode queries"):
        QE, _ = encode_with_cache(encoder, [col.queries[q] for q in qids], cache, desc=f"encoding {name} queries")
    cache.close()
    emb_of = dict(zip(qids, QE))
    train = _query_set(col, train_qrels, emb_of) if train_qrels else None
    test = _query_set(col, eval_qrels, emb_of) if eval_qrels else None

    tiers_meta, tier_head = None, None
    if opts.tiers:
        if train is None or not train.ids:
            raise ValueError("the difficulty head (--tiers) needs training queries (a train split)")
        with timer("difficulty head"):
            tier_head, tiers_meta = _fit_tier_head(opts, settings, encoder, X, col, train, rng_seed)

    cars_meta, cars_writers = None, {}
    if opts.cars is not None:
        from trainer.cars import apply_cars

        with timer("cars"):  # maps the corpus and every query set into the selected adapter's space
            X, train, test, cars_writers, cars_meta = apply_cars(opts.cars, X, train, test, row_of, rng_seed)

    D = encoder.dimension
    rotations = {"identity": np.eye(D)}
    with timer("pca rotation"):
        rotations["pca"] = pca_rotation(X)
    adapter_report = None
    positives = None
    if opts.rotation.startswith("adapter"):
        if train is None or not train.ids:
            raise ValueError(f"rotation {opts.rotation!r} needs training qrels ({opts.train_split!r} split not found)")
        base = rotations["pca"] if opts.rotation == "adapter_on_pca" else rotations["identity"]
        cfg = AdapterConfig(seed=rng_seed, **opts.adapter)
        positives = [np.array([row_of[d] for d, g in j.items() if g > 0 and d in row_of]) for j in train.judgments]
        with timer("adapter training"):
            R_learned, adapter_report = train_adapter(train.emb @ base.T, X @ base.T, positives, cfg)
        rotations[opts.rotation] = R_learned @ base
        adapter_report["config"] = cfg.as_manifest()
        adapter_report["loss_history"] = cfg.history
    R = rotations[opts.rotation]
    if orthogonality_error(R) > 1e-4:
        raise RuntimeError(f"served rotation is not orthogonal (error {orthogonality_error(R):.2e})")
    X_rot = np.ascontiguousarray(X @ R.T, dtype=np.float32)
    funnel = Funnel.build(X_rot, doc_ids, opts.m0, opts.shortlist)

    routers, router_meta = {}, {}
    if train is not None and train.ids:
        crossfit = opts.rotation.startswith("adapter") and opts.router_crossfit_folds >= 2
        with timer("router training data" + (f" ({opts.router_crossfit_folds}-fold cross-fitted adapters)" if crossfit else "")):
            s1_scores, gains_by_pair, parts = _router_training_data(
                opts, train, X, doc_ids, R, rotations, positives if crossfit else None, rng_seed)
        for pair in opts.action_pairs:
            with timer(f"router {pair}"):
                fit = fit_router(s1_scores, gains_by_pair[pair], pair, seed=rng_seed)
            routers[pair] = fit
            gains = gains_by_pair[pair]
            router_meta[f"{pair[0]}_{pair[1]}"] = {
                "file": f"router_{pair[0]}_{pair[1]}.txt",
                "action_pair": list(pair),
                "calibration_predictions": sorted(float(v) for v in fit.oof_predictions),
                "calibration": "5-fold out-of-fold router predictions on the training queries"
                               + (", whose features come from adapters that did not see them (cross-fitted)" if crossfit else ""),
                "train_queries": len(gains),
                "share_gain_positive": float(np.mean(gains > 0)),
                "share_gain_negative": float(np.mean(gains < 0)),
            }

    policy = None
    if opts.stage1_policy:
        if train is None or not train.ids:
            raise ValueError("the stage-1 policy needs training queries (a train split)")
        from trainer.stage1_policy_fit import fit_stage1_policy, policy_training_data

        grid = stage1_policy.default_grid()
        with timer("stage-1 policy"):
            feats, agree = policy_training_data(X, train.emb, parts, grid)
            policy = fit_stage1_policy(feats, agree, grid, X.shape[0], D, seed=rng_seed)

    evaluation = None
    if test is not None and test.ids:
        with timer("evaluation"):
            evaluation = _evaluate(opts, rotations, X, doc_ids, test, train_qrels, funnel, R, routers)
            if policy is not None:
                evaluation["stage1_policy"] = _evaluate_policy(opts, policy, X_rot, R, doc_ids, test, train_qrels)

    capacity = None
    if opts.capacity and test is not None and test.ids:
        with timer("capacity report"):
            capacity = capacity_for_version(opts, test, X_rot, R, doc_ids, funnel, routers, name)

    fingerprint = corpus_fingerprint(col)
    version = store.new_version_id(hashlib.sha256(
        (fingerprint + encoder.info.onnx_sha256 + R.astype(np.float32).tobytes().hex()[:4096]).encode()).hexdigest())
    index = faiss.IndexFlatIP(opts.m0)
    index.add(prefix_normalize(X_rot, opts.m0))
    writers = {
        "rotation.npy": lambda p: np.save(p, R.astype(np.float32)),
        "docs.npy": lambda p: np.save(p, X_rot),
        "doc_sqnorm_m0.npy": lambda p: np.save(p, funnel.doc_sqnorm_m0.astype(np.float32)),
        "doc_ids.json": lambda p: p.write_text(json.dumps(doc_ids), encoding="utf-8"),
        "stage1.faiss": lambda p: faiss.write_index(index, str(p)),
    }
    for pair, fit in routers.items():
        writers[f"router_{pair[0]}_{pair[1]}.txt"] = (lambda b: (lambda p: b.save_model(str(p))))(fit.booster)
    writers.update(cars_writers)
    texts = [d.encoder_text() for d in col.corpus]  # the rerank tiers (MaxSim, cross-encoder) read these
    writers["encoder_text.json"] = lambda p: p.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
    if tier_head is not None:
        writers["difficulty_head.npy"] = lambda p: np.save(p, tier_head.astype(np.float32))
    lexical_meta = None
    if opts.lexical:
        from engine.lexical import lexical_writers

        with timer("lexical index"):
            lex_writers, lexical_meta = lexical_writers([d.encoder_text() for d in col.corpus],
                                                        [d.fields for d in col.corpus])
        writers.update(lex_writers)
    if policy is not None:
        writers["stage1_policy.txt"] = lambda p: policy.booster.save_model(str(p))
    if capacity is not None:
        from trainer.capacity_report import file_writers

        writers.update(file_writers(capacity, f"{name} ({opts.rotation} rotation, {eval_split} split)"))
    manifest = {
        "collection": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "encoder": encoder.info.as_manifest(),
        "dimension": D,
        "m0": opts.m0,
        "shortlist": opts.shortlist,
        "stage1": {"kind": "faiss.IndexFlatIP", "metric": "inner product of L2-normalised m0-prefixes"},
        "theta": 0.05,
        "adapter": {"kind": opts.rotation, "sha256": hashlib.sha256(R.astype(np.float32).tobytes()).hexdigest(),
                    "training": adapter_report},
        "router": {"feature_names": list(__import__("adawidth.router", fromlist=["FEATURE_NAMES"]).FEATURE_NAMES),
                   "model": "lightgbm regression of g(q) = NDCG@10_h - NDCG@10_l (Eq. 12 of 001)",
                   "default_pair": list(opts.default_pair) if routers else None,
                   "default_rho": opts.default_rho,
                   "pairs": router_meta},
        "corpus": {"fingerprint": fingerprint, "documents": len(doc_ids), "dataset": str(opts.dataset),
                   "dataset_fingerprint": ds_fingerprint,
                   "encoded_now": n_encoded, "train_split": train_split, "eval_split": eval_split},
        "stage1_policy": None if policy is None else {
            "file": "stage1_policy.txt", "block": stage1_policy.BLOCK, "tau": opts.stage1_policy_tau,
            "grid": [vars(c) for c in policy.grid], "feature_names": list(stage1_policy.EVIDENCE_NAMES + stage1_policy.CONFIG_NAMES),
            "model": "lightgbm regression of the top-10 agreement with exhaustive full-width search",
            "train_queries": policy.train_queries,
            "mean_agreement_by_config": [float(v) for v in policy.mean_agreement]},
        "evaluation": evaluation,
        "lexical": lexical_meta,
        "cars": cars_meta,
        "rerank": {"text_file": "encoder_text.json", "depth": RERANK_DEPTH,
                   "text": "title + ' ' + text, as encoded; tiers 'maxsim' and 'cross_encoder' rerank on it"},
        "tiers": tiers_meta,
        "capacity": _capacity_summary(capacity),
        "build_seconds": timer.t,
    }
    coll_dir = Path(settings.index_root) / name
    path = store.write_version(coll_dir, version, writers, manifest)
    from trainer.milvus_stage1 import write_for_settings

    write_for_settings(settings, path)  # stage 1 on Milvus: the version's collection exists before it is published
    live = False
    if opts.publish or opts.promote:
        from engine.registry import open_registry

        registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root)
        try:
            state = registry.publish(name, version, actor="trainer build")
            if opts.promote or state.live is None:
                registry.promote(name, version, actor="trainer build")
                live = True
        finally:
            registry.close()
    log.info("wrote %s%s", path, " (live)" if live else " (candidate)" if opts.publish else "")
    return path, store.read_manifest(path)


def _fit_tier_head(opts: BuildOptions, settings, encoder, X: np.ndarray, col: Collection, train: QuerySet,
                   seed: int) -> tuple[np.ndarray, dict]:
    """The difficulty head of ``--tiers`` (:mod:`trainer.dart.tier_head`): labels on the training queries the
    cross-encoder did not train on, then the post-hoc head on their frozen embeddings.

    Raises:
        engine.scorers.CrossEncoderNotFoundError: no cross-encoder export.
        ValueError: no training query left to label.
    """
    from engine.scorers import CrossEncoderScorer
    from trainer.dart.tier_head import fit_head, tier_quality

    ce_dir = opts.cross_encoder or settings.home / "models" / "minilm-cross-encoder"
    ce = CrossEncoderScorer(ce_dir, threads=settings.encoder_threads)
    trained_on = set(ce.meta.get("train_query_ids") or [])
    pick = [i for i, q in enumerate(train.ids) if q not in trained_on]
    if not pick:
        raise ValueError(f"every training query was used to train the cross-encoder at {ce_dir}; "
                         "train it with --holdout-queries > 0")
    if opts.tier_head_queries is not None and len(pick) > opts.tier_head_queries:
        pick = sorted(np.random.default_rng(seed).choice(pick, opts.tier_head_queries, replace=False).tolist())
    doc_ids = [d.doc_id for d in col.corpus]
    quality = tier_quality(encoder, ce, X, [d.encoder_text() for d in col.corpus], doc_ids,
                           [col.queries[train.ids[i]] for i in pick], train.emb[pick],
                           [train.judgments[i] for i in pick])
    W, report = fit_head(train.emb[pick], quality["ndcg10"], seed=seed)
    report.update(split=opts.train_split, cross_encoder_held_out=True,
                  labels={"query_ids": [train.ids[i] for i in pick],
                          "ndcg10": [[round(float(v), 4) for v in row] for row in quality["ndcg10"]]})
    return W, {"head": {"file": "difficulty_head.npy", **report},
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
        from adawidth.router import router_feature_matrix

        feats = router_feature_matrix(list(s1[1]))
        for pair, fit in routers.items():
            pred = fit.booster.predict(feats)
            thresholds = {rho: threshold_for_rate(fit.oof_predictions, rho) for rho in REPORT_RHOS}
            routed[f"{pair[0]}_{pair[1]}"] = {
                s: routed_policy_report(funnel, q_rot, test, s1, pair, pred, thresholds, subset=m)
                for s, m in subsets.items()}
    return {"split": opts.eval_split, "queries": len(test.ids), "unseen_queries": int(unseen.sum()),
            "static": rows, "routed": routed,
            "note": "exact/<rotation>/<w>: exhaustive search at width w; funnel/<rotation>/<w>: stage 1 at m0 over "
                    "the corpus, shortlist rescored at w (the served path). 'unseen': test queries none of whose "
                    "relevant documents is cited by a training query."}


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
    from trainer.adapter import AdapterConfig, train_adapter
    from trainer.router_fit import escalation_gains

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
    from adawidth.blocked import BlockedCorpus
    from adawidth.metrics import ndcg_at_k

    bc = BlockedCorpus(X_rot, stage1_policy.BLOCK)
    cited = {d for j in train_qrels.values() for d, g in j.items() if g > 0}
    nd, work, unseen = [], [], []
    for q, judg in zip(test.emb, test.judgments):
        res, _ = stage1_policy.resolve_adaptive(bc, (R @ q).astype(np.float32), policy.booster.predict, policy.grid,
                                               opts.stage1_policy_tau, 10)
        nd.append(ndcg_at_k([doc_ids[r] for r in res.rows], judg, 10))
        work.append(res.coordinates_scored)
        unseen.append(not any(d in cited for d, g in judg.items() if g > 0))
    nd, unseen = np.array(nd), np.array(unseen)
    full = X_rot.shape[0] * X_rot.shape[1]
    return {"tau": opts.stage1_policy_tau, "ndcg@10": float(nd.mean()),
            "ndcg@10_unseen": float(nd[unseen].mean()) if unseen.any() else None,
            "mean_work": float(np.mean(work)), "work_ratio_to_full": float(np.mean(work) / full)}
