"""When and how long to wait before retrying: ``Retry-After`` honoured, jittered, bounded."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one call.

    A retryable failure is an answer whose status is in ``retry_statuses`` (429 ``overloaded``, 503
    ``not_ready`` / ``deadline_exceeded`` / ``stage1_unavailable`` / ``registry_unavailable``) or, for calls
    that are safe to repeat (searches, GETs), no answer at all (connection error, timeout) when
    ``retry_transport_errors``.  Any other status (400, 401, 404, 409, 413, 422, ...) is raised at once.

    The wait before retry n (n = 1, 2, ...) is the server's ``Retry-After`` when it sent one, else
    ``min(backoff_s * 2**(n-1), max_backoff_s)``; it is then stretched by a uniform random factor in
    [1, 1 + jitter] (never shortened: the server said "not before").  The call gives up, raising the last
    error, after ``max_attempts`` requests, or when the next wait would take the total waited past
    ``max_total_wait_s``.

    Attributes:
        max_attempts: requests per call, the first included (1 = no retry).
        max_total_wait_s: bound on the sum of the waits of one call, seconds.
        backoff_s: first wait when the server sends no ``Retry-After``, seconds.
        max_backoff_s: cap of that exponential wait, seconds (a ``Retry-After`` is not capped).
        jitter: relative stretch of every wait, >= 0 (0.2: up to 20 % longer).
        retry_statuses: HTTP statuses that are retried.
        retry_transport_errors: retry safe calls that got no answer.
    """

    max_attempts: int = 4
    max_total_wait_s: float = 30.0
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    jitter: float = 0.2
    retry_statuses: frozenset[int] = frozenset({429, 503})
    retry_transport_errors: bool = True

    def __post_init__(self):
        if self.max_attempts < 1 or self.max_total_wait_s < 0 or self.backoff_s < 0 or self.jitter < 0:
            raise ValueError("max_attempts >= 1 and non-negative waits and jitter required")

    def next_wait(self, attempt: int, waited_s: float, retry_after_s: float | None,
                  rng: random.Random) -> float | None:
        """Seconds to wait after failed request number ``attempt`` (1-based), or None to give up.

        Args:
            attempt: requests made so far in this call.
            waited_s: seconds already waited in this call.
            retry_after_s: the server's ``Retry-After`` in seconds, or None.
            rng: source of the jitter.
        """
        if attempt >= self.max_attempts:
            return None
        base = retry_after_s if retry_after_s is not None else min(self.backoff_s * 2 ** (attempt - 1),
                                                                   self.max_backoff_s)
        wait = base * (1.0 + self.jitter * rng.random())
        if waited_s + wait > self.max_total_wait_s:
            return None
        return wait


NO_RETRY = RetryPolicy(max_attempts=1)
"""One request per call (benchmarks that count what the gateway admits)."""
