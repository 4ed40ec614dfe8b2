"""The Plan: every value check of a search request, once, with one code each (engine.plan)."""

from __future__ import annotations

import math

import pytest

from engine.plan import PLAN_CODES, Capabilities, PlanDefaults, PlanError, SearchSpec, resolve_plan
from service.errors import STATUS_OF_CODE

FULL = Capabilities(dimension=384, policies=frozenset({"recall", "router", "funnel"}), default_policy="recall",
                    router_pairs=frozenset({(64, 128), (64, 256)}), default_pair=(64, 128), default_rho=0.2,
                    filter_fields=frozenset({"topic"}), tiers=frozenset({"mips", "maxsim"}))
OLD = Capabilities(dimension=384, policies=frozenset({"router"}), default_policy="router",
                   router_pairs=frozenset({(64, 128)}), default_pair=(64, 128), default_rho=0.3)
D = PlanDefaults()


def plan(caps=FULL, defaults=D, **fields):
    return resolve_plan(SearchSpec(**{"query": "statins and heart disease", **fields}), defaults, caps)


def code_of(caps=FULL, defaults=D, **fields) -> str:
    with pytest.raises(PlanError) as info:
        plan(caps, defaults, **fields)
    return info.value.code


def test_every_plan_code_has_an_http_status():
    assert set(PLAN_CODES) <= set(STATUS_OF_CODE)
    with pytest.raises(ValueError):
        PlanError("no_such_code", "x")


def test_defaults_resolve_once():
    p = plan()
    assert (p.k, p.depth, p.policy, p.recall_target, p.rho, p.pair, p.mode, p.tier) == \
        (10, 10, "recall", 0.99, None, None, "dense", "mips")
    assert p.defaulted >= {"k", "policy", "recall_target", "rho"}
    assert plan(width="full").policy == "exact" and plan(width="full").width == 384
    f = plan(width=96)
    assert (f.policy, f.width) == ("fixed", 96)
    r = plan(policy="router")
    assert (r.policy, r.pair, r.rho) == ("router", (64, 128), 0.2)  # the version's pair and rho
    assert plan(policy="router", rho=0.5).rho == 0.5 and "rho" not in plan(policy="router", rho=0.5).defaulted
    assert plan(defaults=PlanDefaults(default_rho=0.1), policy="router").rho == 0.1
    assert plan(recall_target=0.95).recall_target == 0.95 and plan(recall_target=1).recall_target == 1.0


def test_a_version_without_the_default_policy_serves_its_own():
    assert plan(OLD).policy == "router" and plan(OLD).rho == 0.3  # built before levels: the router, as before
    assert code_of(OLD, policy="recall") == "policy_unavailable"
    assert code_of(OLD, policy="funnel") == "policy_unavailable"
    none = Capabilities(dimension=384)
    assert code_of(none) == "policy_unavailable"  # no 'auto' policy at all
    assert plan(none, width="full").policy == "exact"  # width 'full' always works


def test_depth_covers_the_later_stages():
    assert plan(tier="maxsim").depth == 50 and plan(tier="maxsim", k=80).depth == 80
    assert plan(mode="hybrid").depth == 100  # hybrid_depth
    assert plan(mode="lexical").policy is None


@pytest.mark.parametrize("fields, code", [
    ({"query": "   \u200b\t"}, "blank_query"),
    ({"query": "x" * 20_001}, "query_too_long"),
    ({"query": "a\ud800"}, "invalid_unicode"),
    ({"k": 0}, "k_out_of_range"), ({"k": 1001}, "k_out_of_range"), ({"k": True}, "k_out_of_range"),
    ({"width": 0}, "width_out_of_range"), ({"width": 385}, "width_out_of_range"),
    ({"width": "wide"}, "unknown_width"), ({"width": True}, "unknown_width"),
    ({"policy": "magic"}, "unknown_policy"),
    ({"policy": "router", "width": "full"}, "policy_conflict"),
    ({"policy": "recall", "width": 64}, "policy_conflict"),
    ({"rho": 0.2}, "policy_conflict"),  # rho never switches the policy
    ({"policy": "funnel", "recall_target": 0.9}, "policy_conflict"),
    ({"mode": "lexical", "rho": 0.2}, "policy_conflict"),
    ({"recall_target": 0.0}, "recall_target_out_of_range"), ({"recall_target": 1.01}, "recall_target_out_of_range"),
    ({"recall_target": math.nan}, "recall_target_out_of_range"),
    ({"recall_target": math.inf}, "recall_target_out_of_range"),
    ({"policy": "router", "rho": -0.1}, "rho_out_of_range"), ({"policy": "router", "rho": math.nan}, "rho_out_of_range"),
    ({"alpha": 2}, "alpha_out_of_range"),
    ({"alpha": 0.5}, "policy_conflict"), ({"fusion": "rrf"}, "policy_conflict"),  # fusion is hybrid's alone
    ({"mode": "lexical", "fusion": "convex", "alpha": 0.3}, "policy_conflict"),
    ({"mode": "sparse"}, "unknown_mode"), ({"mode": "hybrid", "fusion": "max"}, "unknown_fusion"),
    ({"filter": {"colour": "red"}}, "unknown_filter_field"),
    ({"tier": "oracle"}, "unknown_tier"), ({"tier": "cross_encoder"}, "tier_unavailable"),
    ({"tier": "auto"}, "tier_unavailable"),
])
def test_each_problem_has_one_code(fields, code):
    assert code_of(**fields) == code


def test_lexical_side_needed_for_lexical_modes_filters_and_phrases():
    assert code_of(OLD, mode="lexical") == "lexical_unavailable"
    assert code_of(OLD, query='"exact phrase" rest') == "lexical_unavailable"
    assert code_of(OLD, filter={"topic": "x"}) == "lexical_unavailable"
    p = plan(query='"heart disease" statins', filter={"topic": ["a", "b"]})
    assert p.phrases == ("heart disease",) and p.restricted and '"' not in p.text


def test_router_without_a_router_for_the_pair():
    assert code_of(defaults=PlanDefaults(action_pair=(128, 256)), policy="router") == "policy_unavailable"
