"""The one candidate type passed between the stages of a search (:mod:`engine.pipeline`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


_NO_ROWS = np.empty(0, np.int64)
_NO_ROWS.flags.writeable = False
_NO_SCORES = np.empty(0, np.float64)
_NO_SCORES.flags.writeable = False


@dataclass
class Candidates:
    """Where one query stands after a stage.

    Attributes:
        rows: (c,) int64 index rows (positions in the version's ``doc_ids``), best first; ties broken by the
            lower row first wherever a stage ranks (:func:`adawidth.prefix.top_k`).
        scores: (c,) float64, higher is better: prefix cosines at ``width`` (policies ``fixed``, ``router``,
            ``funnel``), exact full-width inner products (``exact``, ``recall``), BM25 (mode ``lexical``), the
            fused score (``hybrid``) or the reranker's score (tiers ``maxsim``, ``cross_encoder``).
        width: coordinates the scores cover (0 for a lexical list).
        work: multiply-adds spent so far, by stage name (``stage1``, ``rescore``), ints.
        timings: seconds spent so far, by stage name (the Prometheus ``stage`` label), floats.
        trace: fields for the response's trace, filled by the stages (policy, escalated, router_score,
            stage1_width, shortlist, confidence, certified, alive_per_level, tier, ...).
        state: a stage's private continuation for the next one (a stage-1 shortlist with its partial sums, a
            level-scan state); None once the ranking is final.
    """

    rows: np.ndarray
    scores: np.ndarray
    width: int = 0
    work: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    state: Any = None

    @classmethod
    def empty(cls) -> "Candidates":
        """No candidates yet (before stage 1)."""
        return cls(_NO_ROWS, _NO_SCORES)

    def ranked(self, rows: np.ndarray, scores: np.ndarray, width: int | None = None) -> "Candidates":
        """A copy holding a new ranking (work, timings and trace carried over, no state)."""
        return Candidates(np.asarray(rows, np.int64), np.asarray(scores, np.float64),
                          self.width if width is None else int(width), dict(self.work), dict(self.timings),
                          dict(self.trace), None)

    @property
    def coordinates_scored(self) -> int:
        """All multiply-adds of the query so far (every stage)."""
        return int(sum(self.work.values()))
