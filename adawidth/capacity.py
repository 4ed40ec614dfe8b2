"""Capacity diagnostics of a (rotated) embedding index: density regime, dimension cliff, CUS, prefix sufficiency.

Sources (``../shared/seeds/``): ``000_113656fbc6e06895.txt`` ("000") §2, §3,
§5.5, §6 and ``001_63bafbdb24f0770e.txt`` ("001") §4, §5.1.  Pure numpy; the
trainer (``trainer/capacity_report.py``) does the I/O, the Markdown and the plots.

What is computed, and the choices the sources leave open
---------------------------------------------------------
* **Density** δ = |E|/n (000 §2, §6): |E| is the number of judged relevant
  (label > 0) query–document pairs of the analysed split whose document is in
  the corpus, n the number of documents.
* **Warren's lower bound** d* ≥ Ω(δ log n / log δ) (000 §2).  The Ω constant is
  unknown and taken as 1 (the ratio of logarithms does not depend on the base);
  the expression is only positive for δ > 1, so d* = 1 for δ ≤ 1 (000 §2 gives
  d* = 1 for LIMIT, δ = 0.04); it diverges as δ → 1⁺, so it is clamped to
  [1, min(m, n)] (the sign rank of an m × n matrix is at most min(m, n)).
* **Regime** (000 §3, §6): ``vacuous`` for δ <= 0.1 ("δ ≪ 1"), ``moderate`` for
  δ >= 1 ("δ ≳ 1"), ``intermediate`` in between (the source names no regime
  there; Warren's bound is 1, as in the vacuous regime).
* **Exact search** everywhere: the prefix cosine s_m of Eq. (1) of 001 over the
  whole corpus (no shortlist), on the version's rotated embeddings.  At width D
  this is the frozen encoder's ranking (the rotation is orthogonal).
* **CUS** (Definition 2.2 of 000).  r = ⌈rank±(2A − 1)⌉ is not computable; the
  only estimate the source gives is Warren's d*.  In the moderate regime
  r* = min(D, d*); elsewhere Warren's bound is 1 (vacuous: CUS at width 1 says
  nothing), and r* = min(D, r_floor), the served stage-1 width m0.  Labelled CUS(Q', r) = Recall@1 at r / Recall@1 at D
  (means over Q'); per query the same ratio where Recall@1 at D > 0.  Label-free
  CUS of a query is 1 when its top-1 at width r equals its top-1 at width D,
  else 0; aggregated it is the mean (the agreement rate).  Both are also given at
  every width of the cliff grid.
* **Continuous label-free CUS** ("top-1 stability"): the share of the cliff
  widths w < D at which the top-1 equals the full-width top-1.  It does not
  depend on r and ranks queries finely enough for a ROC curve.
* **Failure prediction** (000 §5.5): AUC of (1 − score) against the failure
  label Recall@1 = 0 at full width (a query whose top-1 is not relevant), by the
  Mann–Whitney statistic with ties counted one half.  0.5 is chance; higher is
  better.
* **Dimension cliff** (000 §3): mean Recall@100 and NDCG@10 against width,
  overall and for the easiest and hardest deciles of queries.  Difficulty is
  label-free: queries are ordered by top-1 stability, ties broken by the
  full-width margin between the first and second scores (larger = easier).
* **Prefix sufficiency** (001 §4, §5.1): see :func:`competitor_counts`,
  :func:`first_sufficient_width`, :func:`positive_preserving_masks` and
  :func:`fit_log_scaling`.

Higher is better for every score here except widths (M_first, d*, r*) and δ,
which are descriptive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from adawidth.metrics import ranking_metric
from adawidth.prefix import EPS, prefix_normalize, top_k

VACUOUS_MAX_DELTA = 0.1
MODERATE_MIN_DELTA = 1.0
REGIMES = ("vacuous", "intermediate", "moderate")
"""Regime names in order of δ; :data:`REGIME_CODE` maps them to 0, 1, 2 (the trainer's gauge)."""
REGIME_CODE = {name: i for i, name in enumerate(REGIMES)}

CAVEATS = (
    "Warren's bound is a lower bound on the width needed for perfect top-1 recall under an optimal "
    "embedding (Theorem 2.1 of 000); trained encoders feel capacity pressure well above it (000 §2).",
    "The Omega constant of the bound is unknown and taken as 1; the expression is undefined for delta <= 1 "
    "(d* = 1 is reported, as 000 does for LIMIT) and diverges as delta -> 1+, so d* is clamped to min(m, n).",
    "Warren's bound is not tight for all matrix families (000 §8, limitation iii).",
    "delta counts the judged pairs of the analysed split only; unjudged relevant pairs make it an underestimate.",
    "The regime predicts whether capacity-aware *training* helps (000 §3, §6); it does not predict retrieval "
    "quality, which also depends on the encoder and the judgments.",
)


# ---------------------------------------------------------------------------
# density and Warren's bound (000 §2, §6)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Density:
    """Qrels statistics of the analysed split (000 §2).

    Attributes:
        pairs: |E|, judged relevant (label > 0) pairs whose document is in the corpus.
        documents: n, corpus size.
        queries: m, queries with at least one such pair.
        delta: δ = |E| / n, average document degree.
        warren_dstar: d* of :func:`warren_lower_bound`, in coordinates.
        regime: one of :data:`REGIMES`.
    """

    pairs: int
    documents: int
    queries: int
    delta: float
    warren_dstar: int
    regime: str


def warren_lower_bound(delta: float, n_docs: int, n_queries: int | None = None) -> int:
    """Warren's lower bound d* ≥ δ log n / log δ (000 §2), as an integer width.

    Args:
        delta: δ = |E|/n, > 0.
        n_docs: n >= 1.
        n_queries: m; when given, d* is clamped to min(m, n), else to n.

    Returns:
        ⌈δ ln n / ln δ⌉ clamped to [1, min(m, n)] for δ > 1; 1 for δ <= 1 (vacuous).

    Raises:
        ValueError: if ``delta <= 0`` or ``n_docs < 1``.
    """
    if delta <= 0 or n_docs < 1:
        raise ValueError(f"need delta > 0 and n_docs >= 1, got {delta}, {n_docs}")
    cap = n_docs if n_queries is None else max(1, min(n_docs, n_queries))
    if delta <= 1.0 or n_docs == 1:
        return 1
    return int(min(cap, max(1, math.ceil(delta * math.log(n_docs) / math.log(delta) - 1e-9))))


def density_regime(delta: float) -> str:
    """``vacuous`` (δ <= 0.1), ``intermediate`` or ``moderate`` (δ >= 1), after 000 §3 and §6."""
    if delta <= VACUOUS_MAX_DELTA:
        return "vacuous"
    if delta >= MODERATE_MIN_DELTA:
        return "moderate"
    return "intermediate"


def qrels_density(judgments: Sequence[Mapping[str, int]], doc_ids: Sequence[str]) -> Density:
    """δ, d* and regime from the judgments of the analysed queries.

    Args:
        judgments: one mapping document id -> label per query (labels <= 0 ignored).
        doc_ids: the corpus ids (n = len(doc_ids)); pairs naming other ids are ignored.

    Raises:
        ValueError: for an empty corpus or no relevant pair.
    """
    corpus = set(doc_ids)
    per_query = [sum(1 for d, g in j.items() if g > 0 and d in corpus) for j in judgments]
    pairs, n = int(sum(per_query)), len(corpus)
    if n == 0 or pairs == 0:
        raise ValueError("density needs a non-empty corpus and at least one relevant pair")
    m = sum(1 for c in per_query if c > 0)
    delta = pairs / n
    return Density(pairs, n, m, delta, warren_lower_bound(delta, n, m), density_regime(delta))


# ---------------------------------------------------------------------------
# exact prefix search and label-free agreement
# ---------------------------------------------------------------------------

def prefix_topk(queries: np.ndarray, docs: np.ndarray, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by the width-m prefix cosine (Eq. (1) of 001), vectorised over queries.

    Args:
        queries: rotated queries, (Q, D') float.
        docs: rotated documents, (N, D'') float.
        m: width, 1 <= m <= min(D', D'').
        k: results per query; min(k, N) are returned.

    Returns:
        (rows (Q, k') int64 best first, scores (Q, k') float32); ties broken by row number.

    Raises:
        ValueError: if m is out of range.
    """
    S = prefix_normalize(queries, m) @ prefix_normalize(docs, m).T
    rows = top_k(S, k)
    return rows, np.take_along_axis(S, rows, axis=1)


def top1_stability(top1_by_width: np.ndarray, top1_full: np.ndarray) -> np.ndarray:
    """Continuous label-free CUS: share of widths whose top-1 equals the full-width top-1.

    Args:
        top1_by_width: (G, Q) int, top-1 row per width (widths below D only).
        top1_full: (Q,) int, top-1 row at width D.

    Returns:
        (Q,) float64 in [0, 1]; higher means a more stable, easier query.
    """
    if top1_by_width.shape[0] == 0:
        return np.ones(top1_full.shape[0])
    return (top1_by_width == top1_full[None, :]).mean(axis=0)


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for the boolean labels ``positive``.

    Mann–Whitney U / (P · N) with ties counted one half; 0.5 is chance and
    higher is better.

    Args:
        scores: (n,) float, larger = more likely positive.
        positive: (n,) bool.

    Returns:
        AUC in [0, 1], or NaN when one class is empty.
    """
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, dtype=np.float64)
    sorted_scores = scores[order]
    # average ranks (1-based) over ties
    uniq, start = np.unique(sorted_scores, return_index=True)
    ends = np.r_[start[1:], scores.size]
    avg = (start + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - start)
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


# ---------------------------------------------------------------------------
# prefix sufficiency (001 §4, §5.1)
# ---------------------------------------------------------------------------

def default_scaling_widths(D: int) -> np.ndarray:
    """Width grid for M_first: every width to 32, every 2nd to 64, every 4th to D, and D. (G,) int64."""
    w = np.r_[np.arange(1, 32), np.arange(32, 64, 2), np.arange(64, D, 4), D]
    return np.unique(w[(w >= 1) & (w <= D)]).astype(np.int64)


def positive_preserving_masks(n_docs: int, sizes: Sequence[int], replicates: int,
                              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Corpus subsamples for the scaling study (001 §5.1).

    A subsample of size N' is a uniform draw of N' of the n documents, shared by
    all queries; it is *positive-preserving* because every query keeps all of its
    relevant documents whether drawn or not (its competitors are the drawn
    documents it does not judge relevant, :func:`competitor_counts`).  The full
    corpus (N' = n) is one deterministic "subsample" repeated ``replicates`` times.

    Args:
        n_docs: n.
        sizes: subsample sizes N', each in [1, n].
        replicates: subsamples per size (001 uses 3).
        rng: numpy Generator (seeded by the caller).

    Returns:
        (masks (R, n) bool, size_of (R,) int64), R = len(sizes) × replicates.

    Raises:
        ValueError: for a size outside [1, n].
    """
    masks, size_of = [], []
    for s in sizes:
        if not 1 <= s <= n_docs:
            raise ValueError(f"subsample size {s} outside [1, {n_docs}]")
        for _ in range(replicates):
            m = np.zeros(n_docs, dtype=bool)
            m[rng.choice(n_docs, int(s), replace=False) if s < n_docs else slice(None)] = True
            masks.append(m)
            size_of.append(int(s))
    return np.stack(masks), np.asarray(size_of, dtype=np.int64)


def competitor_counts(queries: np.ndarray, docs: np.ndarray, relevant_rows: Sequence[np.ndarray],
                      widths: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Overtaker counts Z_q(m) of Eq. (14) of 001 for every (query, relevant document) pair.

    For the pair (q, d+), a competitor is a document of the subsample that q does
    not judge relevant; it overtakes d+ at width m when the prefix margin of
    Eq. (13) is <= 0, i.e. s_m(q, d) >= s_m(q, d+) with s_m the prefix cosine of
    Eq. (1).  d+ is outside the top-k at width m exactly when Z >= k.

    Args:
        queries: rotated queries, (Q, D) float.
        docs: rotated documents, (N, D) float.
        relevant_rows: per query, int array of the index rows it judges relevant (may be empty).
        widths: (G,) increasing int widths in [1, D].
        masks: (R, N) bool subsamples from :func:`positive_preserving_masks`.

    Returns:
        (Z (R, P, G) int32, pair_query (P,) int64, pair_doc (P,) int64) with P the
        number of (query, relevant row) pairs, grouped by query.

    Raises:
        ValueError: if widths are not increasing within [1, D].
    """
    widths = np.asarray(widths, dtype=np.int64)
    D = docs.shape[1]
    if widths.size == 0 or widths[0] < 1 or widths[-1] > D or np.any(np.diff(widths) <= 0):
        raise ValueError(f"widths must increase within [1, {D}]")
    pair_query = np.concatenate([np.full(len(r), i, dtype=np.int64) for i, r in enumerate(relevant_rows)]
                                or [np.empty(0, np.int64)])
    pair_doc = np.concatenate([np.asarray(r, dtype=np.int64) for r in relevant_rows] or [np.empty(0, np.int64)])
    P, R, G = pair_query.size, masks.shape[0], widths.size
    Z = np.zeros((R, P, G), dtype=np.int32)
    if P == 0:
        return Z, pair_query, pair_doc
    # (pair, document) entries to exclude: the documents the pair's query judges relevant
    ex_p = np.concatenate([np.flatnonzero(pair_query == q).repeat(len(r)) for q, r in enumerate(relevant_rows)
                           if len(r)])
    ex_d = np.concatenate([np.tile(np.asarray(r, dtype=np.int64), len(r)) for r in relevant_rows if len(r)])
    used = np.unique(pair_query)
    Qs = np.asarray(queries[used], dtype=np.float64)
    local = np.searchsorted(used, pair_query)
    X = np.asarray(docs, dtype=np.float64)
    M = masks.astype(np.float32)
    dots = np.zeros((used.size, X.shape[0]))
    sq = np.zeros(X.shape[0])
    prev = 0
    for g, w in enumerate(widths):
        dots += Qs[:, prev:w] @ X[:, prev:w].T
        sq += np.einsum("ij,ij->i", X[:, prev:w], X[:, prev:w])
        prev = w
        cos = dots / np.sqrt(np.maximum(sq, EPS * EPS))[None, :]
        rows = cos[local]                                    # (P, N)
        beats = rows >= cos[local, pair_doc][:, None]
        beats[ex_p, ex_d] = False
        Z[:, :, g] = np.rint(M @ beats.T.astype(np.float32)).astype(np.int32)
    return Z, pair_query, pair_doc


def first_sufficient_width(Z: np.ndarray, pair_query: np.ndarray, n_queries: int, widths: np.ndarray,
                           k: int) -> np.ndarray:
    """M_first per query and subsample (001 §4.1).

    M_first(q) is the smallest width of the grid at which a relevant document
    enters the top-k and stays there at every larger width of the grid
    (Z < k from that width on); with several relevant documents it is the
    minimum over them.  When no relevant document is in the top-k at width D
    the value is +inf.

    Args:
        Z: (R, P, G) counts from :func:`competitor_counts`.
        pair_query: (P,) query of each pair.
        n_queries: Q.
        widths: (G,) the width grid (last = D).
        k: retrieval depth >= 1.

    Returns:
        (R, Q) float64 widths in coordinates (+inf where undefined); lower is better.
    """
    ok = Z < k
    stays = np.logical_and.accumulate(ok[..., ::-1], axis=-1)[..., ::-1]
    first = np.argmax(stays, axis=-1)
    per_pair = np.where(stays[..., -1], np.asarray(widths, dtype=np.float64)[first], np.inf)  # (R, P)
    out = np.full((Z.shape[0], n_queries), np.inf)
    for r in range(Z.shape[0]):
        np.minimum.at(out[r], pair_query, per_pair[r])
    return out


def fit_log_scaling(sizes: np.ndarray, ks: np.ndarray, q90: np.ndarray) -> dict:
    """OLS fit of Eq. (24) of 001, q90 = a + b ln N + c ln k, and R²_mean of Eq. (25).

    Fitted on the mean q90 of each (N, k) setting.  With the same number of
    replicates at every setting this gives the same coefficients as OLS on the
    individual replicates, and Eq. (25) evaluates the surface on those means.

    Args:
        sizes: (S,) corpus sizes N of the settings.
        ks: (S,) retrieval depths k.
        q90: (S,) mean q90[M_first] per setting, in coordinates.

    Returns:
        {"a", "b", "c", "r2_mean", "b_positive", "c_negative", "settings"}; coefficients
        in coordinates per natural-log unit; NaN when fewer than 4 settings or no
        variation to explain.
    """
    sizes, ks, y = (np.asarray(v, dtype=np.float64) for v in (sizes, ks, q90))
    nan = float("nan")
    out = {"a": nan, "b": nan, "c": nan, "r2_mean": nan, "b_positive": None, "c_negative": None,
           "settings": int(y.size)}
    if y.size < 4 or np.unique(sizes).size < 2 or np.unique(ks).size < 2:
        return out
    A = np.column_stack([np.ones_like(y), np.log(sizes), np.log(ks)])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    tot = float(((y - y.mean()) ** 2).sum())
    out.update(a=float(coef[0]), b=float(coef[1]), c=float(coef[2]),
               r2_mean=float(1.0 - (resid @ resid) / tot) if tot > 0 else nan,
               b_positive=bool(coef[1] > 0), c_negative=bool(coef[2] < 0))
    return out


# ---------------------------------------------------------------------------
# the whole report
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CapacityOptions:
    """Grids and seeds of :func:`capacity_report` (defaults follow 000 §3 and 001 §5.1).

    Attributes:
        cliff_widths: widths of the dimension cliff (D is always added); 000 §3 uses 8..384.
        r_floor: the CUS width r* outside the moderate regime (the served stage-1 width m0).
        scaling_fractions: subsample sizes as fractions of n (rounded; sizes < ``min_size`` dropped).
        scaling_ks: retrieval depths k; a setting (N', k) is kept when k * ``min_ratio`` <= N'.
        replicates: subsamples per size (3 in 001 §5.1).
        quantile: τ of q_τ[M_first] (0.9 in 001 §5.1).
        scaling_widths: M_first width grid (default :func:`default_scaling_widths`).
        workload_k: the scaling workload is the queries with a relevant document in the
            full-width top-``workload_k`` over the whole corpus; for them M_first is finite
            at every setting (subsampling only removes competitors, larger k only helps).
        seed: seed of the subsamples.
    """

    cliff_widths: tuple[int, ...] = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384)
    r_floor: int = 64
    scaling_fractions: tuple[float, ...] = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    scaling_ks: tuple[int, ...] = (1, 3, 10, 30)
    min_size: int = 8
    min_ratio: int = 4
    replicates: int = 3
    quantile: float = 0.9
    scaling_widths: tuple[int, ...] | None = None
    workload_k: int = 1
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _deciles(n: int) -> int:
    return max(1, int(round(n / 10)))


def capacity_report(queries: np.ndarray, docs: np.ndarray, judgments: Sequence[Mapping[str, int]],
                    doc_ids: Sequence[str], query_ids: Sequence[str] | None = None,
                    options: CapacityOptions = CapacityOptions()) -> dict:
    """Compute the full capacity report of one index version on labelled queries.

    Args:
        queries: rotated query embeddings, (Q, D) float32, unit norm.
        docs: rotated document embeddings, (N, D) float32, unit norm.
        judgments: (Q,) mappings document id -> label (labels <= 0 non-relevant).
        doc_ids: (N,) document ids in row order.
        query_ids: (Q,) query ids (default "0".."Q-1"), echoed in the per-query table.
        options: :class:`CapacityOptions`.

    Returns:
        JSON-serialisable dict with keys ``density``, ``caveats``, ``cliff``, ``cus``,
        ``failure_prediction``, ``scaling``, ``per_query`` and ``options``; see the
        module docstring for every definition.  Widths are in coordinates.

    Raises:
        ValueError: for mismatched shapes or no relevant pair.
    """
    Q, D = queries.shape
    N = docs.shape[0]
    if docs.shape[1] != D or len(judgments) != Q or len(doc_ids) != N:
        raise ValueError(f"shapes disagree: queries {queries.shape}, docs {docs.shape}, "
                         f"{len(judgments)} judgments, {len(doc_ids)} ids")
    qids = list(query_ids) if query_ids is not None else [str(i) for i in range(Q)]
    dens = qrels_density(judgments, doc_ids)
    widths = sorted({w for w in options.cliff_widths if 1 <= w < D} | {D})
    k_cut = min(100, N)

    # ---- exact search at every cliff width
    top1, rec100, ndcg10, rec1 = {}, {}, {}, {}
    full_scores = None
    for w in widths:
        rows, scores = prefix_topk(queries, docs, w, k_cut)
        ranked = [[doc_ids[j] for j in r] for r in rows]
        top1[w] = rows[:, 0]
        rec100[w] = ranking_metric(ranked, judgments, "recall", 100)
        ndcg10[w] = ranking_metric(ranked, judgments, "ndcg", 10)
        rec1[w] = ranking_metric(ranked, judgments, "recall", 1)
        if w == D:
            full_scores = scores
    below = [w for w in widths if w < D]
    stability = top1_stability(np.stack([top1[w] for w in below]) if below else np.empty((0, Q), np.int64), top1[D])
    margin = (full_scores[:, 0] - full_scores[:, 1]).astype(np.float64) if full_scores.shape[1] > 1 else np.zeros(Q)
    failure = rec1[D] == 0

    # ---- difficulty deciles (label-free): stability, then margin; easiest first
    order = np.lexsort((-margin, -stability))
    n_dec = _deciles(Q)
    easiest, hardest = order[:n_dec], order[-n_dec:]

    def curve(vals: dict, idx=None) -> list[float]:
        return [float(vals[w].mean() if idx is None else vals[w][idx].mean()) for w in widths]

    cliff = {"widths": widths, "queries_per_decile": n_dec,
             "recall@100": {"all": curve(rec100), "easiest_decile": curve(rec100, easiest),
                            "hardest_decile": curve(rec100, hardest)},
             "ndcg@10": {"all": curve(ndcg10), "easiest_decile": curve(ndcg10, easiest),
                         "hardest_decile": curve(ndcg10, hardest)},
             "difficulty": "label-free: top-1 stability, ties broken by the full-width top-1 margin"}
    full_ndcg = cliff["ndcg@10"]["all"][-1]
    w95 = next((w for w, v in zip(widths, cliff["ndcg@10"]["all"]) if v >= 0.95 * full_ndcg), D)
    cliff["width_95pct_ndcg@10"] = int(w95)
    cliff["recall@100_trivial"] = bool(N <= 100)

    # ---- CUS at r* and along the grid
    r_star = int(min(D, dens.warren_dstar if dens.regime == "moderate" else options.r_floor))
    if r_star not in top1:
        rows, _ = prefix_topk(queries, docs, r_star, 1)
        top1_r = rows[:, 0]
        rec1_r = ranking_metric(top1_r[:, None], judgments, "recall", 1, doc_ids)
    else:
        top1_r, rec1_r = top1[r_star], rec1[r_star]
    agree_r = top1_r == top1[D]
    mean_full = float(rec1[D].mean())

    def labelled(r1: np.ndarray) -> float:
        return float(r1.mean() / mean_full) if mean_full > 0 else float("nan")

    ok_full = rec1[D] > 0
    per_q_lab = np.full(Q, np.nan)
    per_q_lab[ok_full] = rec1_r[ok_full] / rec1[D][ok_full]
    cus = {
        "r_star": r_star,
        "r_rule": "r* = min(D, Warren d*) in the moderate regime, else min(D, r_floor) with r_floor the served "
                  "stage-1 width m0 (Warren's bound is 1 there)",
        "r_floor": options.r_floor,
        "labelled": labelled(rec1_r),
        "label_free": float(agree_r.mean()),
        "top1_stability_mean": float(stability.mean()),
        "recall@1_full": mean_full,
        "recall@1_at_r": float(rec1_r.mean()),
        "by_width": {"widths": widths, "labelled": [labelled(rec1[w]) for w in widths],
                     "label_free": [float((top1[w] == top1[D]).mean()) for w in widths],
                     "failure_auc_of_agreement": [roc_auc(1.0 - (top1[w] == top1[D]), failure) for w in widths]},
    }
    fail = {
        "label": "Recall@1 = 0 at full width (top-1 not relevant)",
        "failures": int(failure.sum()), "queries": Q,
        "auc_top1_stability": roc_auc(1.0 - stability, failure),
        "auc_label_free_at_r_star": roc_auc(1.0 - agree_r, failure),
        "auc_full_width_margin_reference": roc_auc(-margin, failure),
        "note": "AUC of (1 - score) against failure; 0.5 = chance. The margin row is a non-CUS reference signal.",
    }

    # ---- prefix sufficiency scaling (001 §5.1)
    scaling = _scaling(queries, docs, judgments, doc_ids, options)

    per_query = {"query_ids": qids, "failure": failure.tolist(), "top1_stability": stability.tolist(),
                 "label_free_cus_at_r_star": agree_r.astype(int).tolist(),
                 "labelled_cus_at_r_star": [None if np.isnan(v) else float(v) for v in per_q_lab],
                 "full_width_margin": margin.tolist(),
                 "m_first_full_corpus": scaling.pop("_per_query_m_first")}
    return {
        "density": asdict(dens),
        "caveats": list(CAVEATS),
        "cliff": cliff,
        "cus": cus,
        "failure_prediction": fail,
        "scaling": scaling,
        "per_query": per_query,
        "options": options.as_dict(),
        "search": "exact prefix-cosine search (Eq. (1) of 001) over the whole corpus on the version's rotated "
                  "embeddings; width D equals the frozen encoder",
    }


def _scaling(queries, docs, judgments, doc_ids, options: CapacityOptions) -> dict:
    Q, D = queries.shape
    N = docs.shape[0]
    row_of = {d: i for i, d in enumerate(doc_ids)}
    rel_rows = [np.array(sorted(row_of[d] for d, g in j.items() if g > 0 and d in row_of), dtype=np.int64)
                for j in judgments]
    widths = (np.asarray(options.scaling_widths, dtype=np.int64) if options.scaling_widths is not None
              else default_scaling_widths(D))
    if widths[-1] != D:
        widths = np.unique(np.r_[widths[widths < D], D])
    # workload: queries with a relevant document in the full-width top-workload_k of the whole corpus
    full_rows, _ = prefix_topk(queries, docs, D, options.workload_k)
    in_top = np.array([np.isin(full_rows[i], rel_rows[i]).any() for i in range(Q)])
    work = np.flatnonzero(in_top)
    sizes = sorted({int(round(N * f)) for f in options.scaling_fractions} - {0})
    sizes = [s for s in sizes if s >= min(options.min_size, N)]
    settings = [(s, k) for s in sizes for k in options.scaling_ks if k * options.min_ratio <= s]
    result = {"workload": f"queries with a relevant document in the full-width top-{options.workload_k} "
                          f"of the whole corpus", "workload_queries": int(work.size),
              "sizes": sizes, "ks": [int(k) for k in options.scaling_ks], "replicates": options.replicates,
              "quantile": options.quantile, "width_grid": {"count": int(widths.size), "min": int(widths[0]),
                                                           "max": int(widths[-1])},
              "subsampling": "per size, a uniform draw of N' documents shared by all queries; each query keeps "
                             "all its relevant documents (positive-preserving)",
              "points": [], "fit": fit_log_scaling(np.empty(0), np.empty(0), np.empty(0)),
              "_per_query_m_first": {}}
    if work.size < 10 or len(settings) < 4:
        result["skipped"] = f"{work.size} workload queries and {len(settings)} (N, k) settings; need 10 and 4"
        return result
    rng = np.random.default_rng(options.seed)
    masks, size_of = positive_preserving_masks(N, sizes, options.replicates, rng)
    Z, pair_q, _ = competitor_counts(queries[work], docs, [rel_rows[i] for i in work], widths, masks)
    points = []
    for s, k in settings:
        mf = first_sufficient_width(Z[size_of == s], pair_q, work.size, widths, k)  # (replicates, W)
        q = [float(np.quantile(r, options.quantile)) for r in mf]
        points.append({"N": s, "k": int(k), "q90_replicates": q, "q90_mean": float(np.mean(q)),
                       "median_m_first": float(np.median(mf))})
    result["points"] = points
    result["fit"] = fit_log_scaling(np.array([p["N"] for p in points]), np.array([p["k"] for p in points]),
                                    np.array([p["q90_mean"] for p in points]))
    full = size_of == N
    per_q = {}
    for k in options.scaling_ks:
        if k <= N:
            mf = first_sufficient_width(Z[full][:1], pair_q, work.size, widths, k)[0]
            per_q[str(k)] = {"queries": [int(i) for i in work],
                             "m_first": [None if not np.isfinite(v) else int(v) for v in mf]}
    result["_per_query_m_first"] = per_q
    return result
