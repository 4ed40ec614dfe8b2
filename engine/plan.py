"""The ``Plan`` of one search: every choice and every validation of a request, made once.

A request (the gateway's JSON body, a batch item, or an offline evaluation query) is a :class:`SearchSpec`.
:func:`resolve_plan` turns it into a :class:`Plan` with the gateway's defaults (:class:`PlanDefaults`) and
what the index version can serve (:class:`Capabilities`); it is the only place a field is checked, and each
problem has one machine-readable code (raised as :class:`PlanError`; the gateway maps the code to an HTTP
status in ``service/errors.py``).  Every later stage trusts the plan.

Policies of the dense lane (``Plan.policy``):

==========  ========================================================================================
``exact``   ``width: "full"``: the exhaustive full-width top-k (the frozen encoder's ranking), served by
            certified level pruning where the version has levels (:mod:`adawidth.levels`).
``recall``  ``width: "auto"`` (the default): a declared recall@k against exhaustive search
            (``recall_target``), per-query confidence of the level pruning.
``router``  ``width: "auto", policy: "router"``: the paper's width router over an action pair at an
            escalation fraction ρ (§3.2 and Algorithm 3 of 001_63bafbdb24f0770e.txt).
``funnel``  ``width: "auto", policy: "funnel"``: the per-query funnel policy (stage-1 width, shortlist,
            rescoring width; :mod:`adawidth.stage1_policy`).
``fixed``   an integer width: stage 1 on the m0-prefix, the shortlist rescored at that width.
==========  ========================================================================================
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, StrictBool, StrictInt, StringConstraints

from adawidth import hybrid
from adawidth.tiers import RERANK_DEPTH

FilterScalar = Annotated[str, StringConstraints(strict=True, max_length=256)] | StrictInt | StrictBool
MAX_FILTER_VALUES = 100
"""Most values one filter field's list may hold (any of them matches)."""
FilterValues = Annotated[
    dict[Annotated[str, StringConstraints(min_length=1, max_length=64)],
         FilterScalar | Annotated[list[FilterScalar], Field(min_length=1, max_length=MAX_FILTER_VALUES)]],
    Field(max_length=16)]
"""Request filter: at most 16 fields (1..64 characters), each a keyword (string of at most 256 characters,
integer or boolean) or a list of 1..100 keywords (any of them matches)."""

POLICIES = ("exact", "recall", "router", "funnel", "fixed")
AUTO_POLICIES = ("recall", "router", "funnel")
MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("rrf", "convex")
TIER_CHOICES = ("auto", "mips", "maxsim", "cross_encoder")

PLAN_CODES = ("blank_query", "query_too_long", "invalid_unicode", "k_out_of_range", "width_out_of_range",
              "unknown_width", "rho_out_of_range", "alpha_out_of_range", "recall_target_out_of_range",
              "unknown_policy", "policy_conflict", "policy_unavailable", "unknown_mode", "unknown_fusion",
              "unknown_tier", "tier_unavailable", "lexical_unavailable", "unknown_filter_field", "invalid_filter")
"""Every code :func:`resolve_plan` raises (each a key of ``service.errors.STATUS_OF_CODE``)."""


class PlanError(ValueError):
    """A request the plan cannot serve.

    Attributes:
        code: machine-readable, one of :data:`PLAN_CODES`.
        message: human-readable; never echoes the query.
        field: the request field at fault, or None.
    """

    def __init__(self, code: str, message: str, field: str | None = None):
        if code not in PLAN_CODES:
            raise ValueError(f"unknown plan error code {code!r}")
        super().__init__(message)
        self.code, self.message, self.field = code, message, field


@dataclass(slots=True)
class SearchSpec:
    """What a client asked for (types already checked by the API model; values checked by :func:`resolve_plan`).

    ``None`` means "the default" for every optional field.  Treated as immutable (never assigned to); not a frozen
    dataclass only because a frozen one's ``__init__`` costs about a microsecond more per request.
    """

    query: str
    k: int | None = None
    width: str | int = "auto"
    policy: str | None = None
    recall_target: float | None = None
    rho: float | None = None
    mode: str = "dense"
    filter: Mapping[str, object] | None = None
    fusion: str | None = None
    alpha: float | None = None
    tier: str | None = None


@dataclass(frozen=True)
class PlanDefaults:
    """The serving process's defaults and limits (the gateway builds it from its settings).

    Attributes:
        k_default, k_max: results when a request gives none, and the largest k accepted.
        max_query_chars: longest query accepted, in characters.
        default_policy: policy of ``width: "auto"`` when a request names none (``recall``); a version that
            cannot serve it falls back to its own default (``Capabilities.default_policy``).
        default_recall_target: recall@k target of the ``recall`` policy when a request gives none, in (0, 1].
        default_rho: escalation fraction of the router when a request gives none (None: the version's).
        action_pair: router action pair (None: the version's default).
        hybrid_fusion, hybrid_alpha, hybrid_depth: fusion defaults of mode ``hybrid``.
        default_tier: DART tier when a request gives none.
        tenant_field, acl_field: corpus fields of the access policy.
    """

    k_default: int = 10
    k_max: int = 1000
    max_query_chars: int = 20_000
    default_policy: str = "recall"
    default_recall_target: float = 0.99
    default_rho: float | None = None
    action_pair: tuple[int, int] | None = None
    hybrid_fusion: str = "rrf"
    hybrid_alpha: float = 0.5
    hybrid_depth: int = 100
    default_tier: str = "mips"
    tenant_field: str = "tenant"
    acl_field: str = "acl"


@dataclass(frozen=True)
class Capabilities:
    """What one index version (on this replica) can serve; :func:`capabilities` reads it off a version.

    Attributes:
        dimension: D, the widest prefix.
        policies: the ``width: "auto"`` policies the version serves (a subset of :data:`AUTO_POLICIES`).
        default_policy: the version's own default among them (None when it has none).
        router_pairs: action pairs with a router; default_pair, default_rho: the manifest's.
        filter_fields: keyword fields of the lexical side (None: the version has no lexical side).
        tiers: DART tiers this replica can serve for the version (``mips`` always).
    """

    dimension: int
    policies: frozenset[str] = frozenset()
    default_policy: str | None = None
    router_pairs: frozenset[tuple[int, int]] = frozenset()
    default_pair: tuple[int, int] | None = None
    default_rho: float = 0.2
    filter_fields: frozenset[str] | None = None
    tiers: frozenset[str] = frozenset({"mips"})


@dataclass(slots=True)
class Plan:
    """One search, fully resolved.  Stages read it and never re-validate, nor assign to it (a stage that runs a
    different plan derives one with ``dataclasses.replace``; not frozen only because a frozen dataclass's
    ``__init__`` costs about a microsecond more per request).

    Attributes:
        query: the request's text; text: what the dense and lexical lanes encode (quote marks dropped);
            phrases: the quoted phrases, exact-match constraints.
        k: results returned; depth: candidates the first stage keeps for the later stages (k, at least
            :data:`adawidth.tiers.RERANK_DEPTH` for a reranking tier, at least ``hybrid_depth`` for hybrid).
        policy: one of :data:`POLICIES` (``None`` in mode ``lexical``).
        width: the fixed width (policy ``fixed``) or D (``exact``), in coordinates; None otherwise.
        recall_target: recall@k target of policy ``recall``, in (0, 1]; rho, pair: the router's.
        mode, fusion, alpha: the lane and its fusion.
        tier: the requested DART tier (``auto``: the version's difficulty head picks).
        filter, principal, tenant_field, acl_field: the allowed set (applied before any top-k).
        defaulted: the request fields whose value came from a default (e.g. ``{"rho", "k"}``).
    """

    query: str
    text: str
    phrases: tuple[str, ...]
    k: int
    depth: int
    policy: str | None
    width: int | None = None
    recall_target: float | None = None
    rho: float | None = None
    pair: tuple[int, int] | None = None
    mode: str = "dense"
    fusion: str | None = None
    alpha: float = 0.5
    tier: str = "mips"
    filter: Mapping[str, object] | None = None
    principal: hybrid.Principal | None = None
    tenant_field: str = "tenant"
    acl_field: str = "acl"
    defaulted: frozenset[str] = frozenset()

    @property
    def restricted(self) -> bool:
        """True when a filter, an access policy or a phrase constraint restricts the allowed set."""
        return bool(self.filter) or self.principal is not None or bool(self.phrases)

    @property
    def dense(self) -> bool:
        """True when a dense lane runs (modes ``dense`` and ``hybrid``)."""
        return self.mode != "lexical"


_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


def is_blank(text: str) -> bool:
    """True when ``text`` has no visible character (only whitespace, control and format characters)."""
    if text.isprintable() and text.strip(" "):
        # printable leaves letters, marks, numbers, punctuation, symbols and the ASCII space: a character other
        # than that space is visible (the common case, without a per-character category lookup)
        return False
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in text)


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a UTF-16 surrogate on its own (JSON ``"\\ud800"``), which is not text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _unit_interval(value, code: str, name: str, *, open_low: bool = False) -> float:
    v = float(value)
    low_ok = v > 0.0 if open_low else v >= 0.0
    if not (math.isfinite(v) and low_ok and v <= 1.0):
        raise PlanError(code, f"{name} must be in {'(0' if open_low else '[0'}, 1]", name)
    return v


def resolve_plan(spec: SearchSpec, defaults: PlanDefaults, caps: Capabilities,
                 principal: hybrid.Principal | None = None) -> Plan:
    """Validate a request once and resolve every default.

    Args:
        spec: the request.
        defaults: the serving process's defaults and limits.
        caps: what the version (on this replica) can serve.
        principal: the caller's tenant and groups under an access policy, or None.

    Returns:
        The :class:`Plan`.

    Raises:
        PlanError: with one of :data:`PLAN_CODES`: the query (``blank_query``, ``query_too_long``,
            ``invalid_unicode``), ``k_out_of_range``, the width (``unknown_width``, ``width_out_of_range``),
            the policy (``unknown_policy``; ``policy_conflict`` for a policy, ``rho`` or ``recall_target`` that
            does not apply to the width or policy asked; ``policy_unavailable`` when the version lacks it),
            ``recall_target_out_of_range``, ``rho_out_of_range``, ``alpha_out_of_range``, the lane
            (``unknown_mode``, ``unknown_fusion``, ``lexical_unavailable``), filters
            (``unknown_filter_field``), tiers (``unknown_tier``, ``tier_unavailable``).
    """
    query = spec.query
    if len(query) > defaults.max_query_chars:
        raise PlanError("query_too_long", f"query exceeds {defaults.max_query_chars} characters", "query")
    if has_lone_surrogate(query):
        raise PlanError("invalid_unicode", "query contains a lone UTF-16 surrogate (\\ud800-\\udfff)", "query")
    if is_blank(query):
        raise PlanError("blank_query", "query must contain a visible character", "query")
    k = defaults.k_default if spec.k is None else spec.k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= defaults.k_max:
        raise PlanError("k_out_of_range", f"k must be an integer between 1 and {defaults.k_max}", "k")
    mode = spec.mode
    if mode not in MODES:
        raise PlanError("unknown_mode", f"mode must be one of {', '.join(MODES)}", "mode")
    fusion = spec.fusion or defaults.hybrid_fusion
    if fusion not in FUSIONS:
        raise PlanError("unknown_fusion", f"fusion must be one of {', '.join(FUSIONS)}", "fusion")
    alpha = defaults.hybrid_alpha if spec.alpha is None else _unit_interval(spec.alpha, "alpha_out_of_range", "alpha")
    if mode != "hybrid" and (spec.fusion is not None or spec.alpha is not None):  # else silently ignored
        raise PlanError("policy_conflict", "fusion and alpha apply to mode 'hybrid' only (send \"mode\": "
                                           "\"hybrid\")", "fusion" if spec.fusion is not None else "alpha")
    parsed = hybrid.parse_query(query)

    width = spec.width
    policy = width_value = recall_target = rho = pair = None
    if mode != "lexical":
        if width == "full":
            policy, width_value = "exact", caps.dimension
        elif width == "auto":
            policy = spec.policy
        elif isinstance(width, int) and not isinstance(width, bool):
            if not 1 <= width <= caps.dimension:
                raise PlanError("width_out_of_range", f"width must be between 1 and {caps.dimension}", "width")
            policy, width_value = "fixed", int(width)
        else:
            raise PlanError("unknown_width", "width must be 'auto', 'full' or an integer number of coordinates",
                            "width")
        if spec.policy is not None:
            if spec.policy not in AUTO_POLICIES:
                raise PlanError("unknown_policy", f"policy must be one of {', '.join(AUTO_POLICIES)}", "policy")
            if width != "auto":
                raise PlanError("policy_conflict", "policy applies to width 'auto' only", "policy")
            if spec.policy not in caps.policies:
                raise PlanError("policy_unavailable", f"this index version cannot serve policy {spec.policy!r} "
                                                      f"(it serves {sorted(caps.policies) or 'none'}; rebuild it "
                                                      "with the current trainer)", "policy")
        if policy is None:  # width 'auto' without a named policy
            if defaults.default_policy in caps.policies:
                policy = defaults.default_policy
            elif caps.default_policy is not None:
                policy = caps.default_policy
            else:
                raise PlanError("policy_unavailable", "this index version serves no 'auto' policy; use width 'full' "
                                                      "or an integer", "width")
        if spec.rho is not None:
            if policy != "router":
                raise PlanError("policy_conflict", "rho applies to policy 'router' only (send \"policy\": "
                                                   "\"router\")", "rho")
            rho = _unit_interval(spec.rho, "rho_out_of_range", "rho")
        if spec.recall_target is not None:
            if policy != "recall":
                raise PlanError("policy_conflict", "recall_target applies to policy 'recall' only", "recall_target")
            recall_target = _unit_interval(spec.recall_target, "recall_target_out_of_range", "recall_target",
                                           open_low=True)
        if policy == "recall" and recall_target is None:
            recall_target = defaults.default_recall_target
        if policy == "router":
            pair = tuple(defaults.action_pair or caps.default_pair or ())
            if pair not in caps.router_pairs:
                raise PlanError("policy_unavailable", f"this index version has no router for action pair "
                                                      f"{pair or None}", "policy")
            if rho is None:
                rho = caps.default_rho if defaults.default_rho is None else defaults.default_rho
    elif spec.policy is not None or spec.rho is not None or spec.recall_target is not None:
        raise PlanError("policy_conflict", "policy, rho and recall_target apply to the dense lane only", "mode")

    needs_lexical = mode != "dense" or bool(spec.filter) or principal is not None or bool(parsed.phrases)
    if needs_lexical and caps.filter_fields is None:
        raise PlanError("lexical_unavailable", "this index version was built without the lexical side (BM25, "
                                               "texts, fields): lexical and hybrid modes, filters, access policy "
                                               "and quoted phrases need a version built by a current trainer",
                        "mode" if mode != "dense" else None)
    for name in spec.filter or {}:
        if name not in caps.filter_fields:
            raise PlanError("unknown_filter_field", "a filter names a field no document of this index has", "filter")

    tier = spec.tier or defaults.default_tier
    if tier not in TIER_CHOICES:
        raise PlanError("unknown_tier", f"tier must be one of {', '.join(TIER_CHOICES)}", "tier")
    if tier not in caps.tiers:
        raise PlanError("tier_unavailable", _tier_reason(tier), "tier")

    depth = k
    if tier != "mips":
        depth = max(depth, RERANK_DEPTH)
    if mode == "hybrid":
        depth = max(depth, defaults.hybrid_depth)
    defaulted = frozenset(name for name in ("k", "policy", "recall_target", "rho", "tier", "fusion", "alpha")
                          if getattr(spec, name) is None)
    return Plan(query=query, text=parsed.text, phrases=tuple(parsed.phrases), k=k, depth=depth, policy=policy,
                width=width_value, recall_target=recall_target, rho=rho, pair=pair, mode=mode,
                fusion=fusion if mode == "hybrid" else None, alpha=alpha, tier=tier, filter=spec.filter or None,
                principal=principal, tenant_field=defaults.tenant_field, acl_field=defaults.acl_field,
                defaulted=defaulted)


def _tier_reason(tier: str) -> str:
    if tier == "auto":
        return ("this index version has no difficulty head (build it with `trainer build --tiers`) or this replica "
                "cannot serve its tiers; use tier 'mips', 'maxsim' or 'cross_encoder'")
    if tier == "cross_encoder":
        return ("this replica has no cross-encoder export (python -m trainer.dart.cross_encoder) or the version "
                "holds no document texts; use tier 'mips'")
    return "this index version holds no document texts for reranking (built before issue 5); use tier 'mips'"
