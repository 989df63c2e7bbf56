"""One retry decision for both drivers: which failures are retried, how long to wait, and
whether the next attempt goes to the same worker or is placed again.

vllm-router's schedule (``shared/ROUTER.md``): at most ``retry_max_attempts`` attempts in all;
the wait before retry ``k`` (1-based) is ``min(backoff * multiplier**(k-1), max_backoff)``
times ``1 + jitter * U(-1, 1)``; retried statuses are 408, 429, 500, 502, 503 and 504, plus
connection errors. Ours differs on purpose in one place: a worker that is no longer available
(it refused the connection, failed its health checks or opened its circuit) is not waited for;
the request is placed again at once, so a dead worker's sessions move instead of failing.
Whether any byte already reached the client (no retry then) is the driver's to know.
"""

from __future__ import annotations

import random

from sessionroute.router.config import RouterConfig

__all__ = ["RETRY_STATUSES", "RetryPolicy"]

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Upstream statuses that are retried (vllm-router's list)."""


class RetryPolicy:
    """The retry schedule of :class:`~sessionroute.router.config.RouterConfig`.

    Args:
        config: the router configuration (``retry_*``).
        rng: the injected random generator for the jitter.
    """

    def __init__(self, config: RouterConfig, rng: random.Random) -> None:
        self.max_attempts = config.retry_max_attempts
        self._initial = config.retry_backoff_s
        self._multiplier = config.retry_backoff_multiplier
        self._max = config.retry_max_backoff_s
        self._jitter = config.retry_jitter_factor
        self._rng = rng

    @staticmethod
    def retryable(status: int) -> bool:
        """Whether an upstream answer with ``status`` is retried (:data:`RETRY_STATUSES`)."""
        return status in RETRY_STATUSES

    def backoff_s(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based), jitter included."""
        base = min(self._initial * self._multiplier ** (retry - 1), self._max)
        if self._jitter:
            base *= 1.0 + self._jitter * self._rng.uniform(-1.0, 1.0)
        return max(0.0, base)

    def after_failure(self, attempt: int, worker_available: bool) -> float | None:
        """Seconds to wait before the next attempt after attempt number ``attempt`` (1-based)
        failed, or None to give up. The next attempt then goes through
        :meth:`sessionroute.router.core.RoutingCore.retarget` (same worker while available,
        else placed again).

        Args:
            attempt: attempts made so far.
            worker_available: whether the attempt's worker is still available now (0 s when
                it is not: the request is placed again at once).
        """
        if attempt >= self.max_attempts:
            return None
        if not worker_available:
            return 0.0
        return self.backoff_s(attempt)
