"""Stage ``route``: read stage 1's early evidence and decide how much more work the query gets.

- ``router``: the 18 order statistics of the stage-1 cosines (§3.2.2 of 001) -> the LightGBM gain regressor
  -> escalate to the high width of the action pair when the predicted gain clears the threshold that
  escalates a fraction ρ of calibration queries (Algorithm 3 of 001).
- ``funnel``: predict every configuration's top-10 agreement and take the cheapest that clears τ
  (:func:`adawidth.stage1_policy.choose_threshold`).
- ``recall`` on an ANN version: nothing (stage 1 chose the effort before searching).
- ``recall``: record the level-pruning confidence the version's recall policy picked for the recall target
  (inside stage 1's compiled call, :func:`adawidth.levels.fused_search`).
- ``exact``, ``fixed``: nothing to decide.
"""

from __future__ import annotations

import numpy as np

from adawidth import stage1_policy
from adawidth.router import router_features
from engine.candidates import Candidates
from engine.plan import Plan


def route(plan: Plan, version, c: Candidates) -> Candidates:
    """Decide the rescoring of ``c`` (recorded in ``c.trace`` and ``c.state``); returns ``c``."""
    if plan.policy == "router":
        low, high = plan.pair
        if c.state is None:  # nothing allowed: nothing to route
            c.trace.update(escalated=False, router_score=None, width=low)
            return c
        router = version.routers[plan.pair]
        score = float(router.predict(router_features(c.state.cosines, version.theta)))
        escalated = score >= router.threshold(plan.rho)
        c.trace.update(escalated=bool(escalated), router_score=score, width=high if escalated else low)
    elif plan.policy == "funnel":
        fp = version.funnel_policy
        feats, state = c.state
        N, D = fp.corpus.N, fp.corpus.D
        pred = np.asarray(fp.predict(stage1_policy.design(feats[None, :], fp.grid, N, float(N * D))),
                          dtype=np.float64)
        j = int(stage1_policy.choose_threshold(pred[None, :], fp.work, fp.tau)[0])
        cfg = fp.grid[j]
        c.state = (cfg, state)
        c.trace.update(router_score=float(pred[j]), stage1_width=cfg.m1, width=cfg.rescore_width,
                       shortlist=min(max(cfg.shortlist, plan.depth), N))
    elif plan.policy == "recall" and getattr(version, "ann", None) is not None:
        pass  # the ANN's effort was chosen in stage 1, before its search
    elif plan.policy in ("exact", "recall") and c.state is not None:
        # the confidence was chosen inside stage 1's compiled call (adawidth.levels.fused_search)
        c.trace.update(bound=c.state.bound, confidence=c.state.z)
    return c
