"""Overload protection for the search work: bounded concurrency, a bounded queue, a per-request deadline.

A search is *admitted* when fewer than ``max_concurrent + max_queued`` are
admitted already, else it is refused at once with 429 ``overloaded`` (and
``Retry-After``).  Admitted work runs on a dedicated pool of
``max_concurrent`` threads.  The request waits for it at most until its
deadline and then answers 503 ``deadline_exceeded``; the work itself cannot be
interrupted mid-call, so it keeps its slot until it returns, which keeps the
number of threads doing search work, and the memory they hold, bounded even
when clients give up.  Work that starts after its deadline, or finishes its
encoding past it, stops there.

The counters are read by tests and exported as gauges; ``admitted`` is only
touched on the event loop, ``running`` under a lock by the workers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.errors import ApiError

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """Raised inside the work when its deadline has passed (the work stops early)."""


def check_deadline(deadline: float) -> None:
    """Raise :class:`DeadlineExceeded` if ``time.monotonic()`` has reached ``deadline``."""
    if time.monotonic() >= deadline:
        raise DeadlineExceeded


class SearchLimiter:
    """Admission, a worker pool and deadlines for search work.

    Args:
        max_concurrent: worker threads (searches executing at once), >= 1.
        max_queued: admitted searches allowed to wait for a worker, >= 0.
        retry_after_s: value of the ``Retry-After`` header of a 429, in seconds.
        name: the worker threads' name prefix (``search``, ``rerank``).
    """

    def __init__(self, max_concurrent: int, max_queued: int, retry_after_s: int = 1, name: str = "search"):
        if max_concurrent < 1 or max_queued < 0:
            raise ValueError("max_concurrent must be >= 1 and max_queued >= 0")
        self.max_concurrent, self.max_queued, self.retry_after_s = max_concurrent, max_queued, retry_after_s
        self.name = name
        self.admitted = 0
        self._running = 0
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def running(self) -> int:
        """Searches executing on a worker now."""
        with self._lock:
            return self._running

    @property
    def queued(self) -> int:
        """Admitted searches not yet on a worker."""
        return max(self.admitted - self.running, 0)

    async def run(self, fn: Callable[[float], T], deadline: float) -> T:
        """Run ``fn(deadline)`` on a worker and return its result.

        Args:
            fn: the work; it may call :func:`check_deadline` between steps.
            deadline: absolute ``time.monotonic()`` time the caller waits until.

        Raises:
            ApiError: ``overloaded`` (429) when the queue is full;
                ``deadline_exceeded`` (503) when the deadline passes first.
            Whatever ``fn`` raises otherwise.
        """
        if self.admitted >= self.max_concurrent + self.max_queued:
            raise ApiError("overloaded", "too many searches in progress; retry later",
                           headers={"Retry-After": str(self.retry_after_s)})

        def work() -> T:
            with self._lock:
                self._running += 1
            try:
                check_deadline(deadline)  # it waited in the queue past its deadline: do nothing
                return fn(deadline)
            finally:
                with self._lock:
                    self._running -= 1

        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_concurrent, thread_name_prefix=self.name)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, work)
        self.admitted += 1
        future.add_done_callback(self._finished)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout=max(deadline - time.monotonic(), 0.0))
        except (asyncio.TimeoutError, DeadlineExceeded):
            raise ApiError("deadline_exceeded", "the search did not finish before its deadline",
                           headers={"Retry-After": str(self.retry_after_s)}) from None

    def _finished(self, future: asyncio.Future) -> None:
        self.admitted -= 1
        if not future.cancelled():
            future.exception()  # retrieved: an abandoned search's error is not logged as "never retrieved"

    def close(self) -> None:
        """Release the worker threads (queued work is cancelled, running work finishes in the background).

        A later :meth:`run` starts a fresh pool, so an app may be started again.
        """
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
