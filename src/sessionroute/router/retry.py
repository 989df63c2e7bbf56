"""One retry decision for both drivers: which failures are retried, how long to wait, and
whether the next attempt goes to the same worker or is placed again.

vllm-router's schedule (``shared/ROUTER.md``): at most ``retry_max_attempts`` attempts in all;
the wait before retry ``k`` (1-based) is ``min(backoff * multiplier**(k-1), max_backoff)``
times ``1 + jitter * U(-1, 1)``; retried statuses are 408, 429, 500, 502, 503 and 504, plus
connection errors. Ours differs on purpose in one place: a worker that is no longer available
(it refused the connection, failed its health checks or opened its circuit) is not waited for;
the request is placed again at once, so a dead worker's sessions move instead of failing.
Whether any byte already reached the client (no retry then) is the driver's to know.

After the request was sent (issue 36): a connection that broke after the request was fully
written, before any byte of the answer reached the client, is retried like any other failure
(``retry_after_send``, on by default), as vllm-router does: its failed send becomes a 500, which
its retry loop retries. A worker that crashed mid-request took the generation with it, so the
client gets its answer from another worker instead of a 502. With ``retry_after_send`` off, only
a failed attempt that provably did not run on the worker is retried
(:meth:`RetryPolicy.may_retry`): no connection was made, the connection broke before the request
was fully written, or the router gave the worker up as hung and closed the connection before it
answered (vLLM aborts a request whose client went away). Requests in flight on a worker that
stopped answering follow :meth:`RetryPolicy.on_worker_lost`.
"""

from __future__ import annotations

import enum
import random

from sessionroute.router.config import RouterConfig

__all__ = ["RETRY_STATUSES", "AttemptFailure", "RetryPolicy", "WorkerLostAction"]

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Upstream statuses that are retried (vllm-router's list)."""


class AttemptFailure(enum.StrEnum):
    """How an upstream attempt failed, as far as the request's fate on the worker goes."""

    CONNECT = "connect"
    """No connection was made (refused, unreachable, connect timeout): nothing was sent."""
    UNSENT = "unsent"
    """The connection broke before the whole request was written: the worker cannot run it."""
    HUNG = "hung"
    """The router gave the worker up (failed health checks, or no response head within the
    first-byte timeout) before any byte reached the client, and closed the connection."""
    SENT = "sent"
    """The connection broke after the whole request was written: it may be running."""
    TIMEOUT = "timeout"
    """The worker did not answer (or finish a buffered answer) within the request timeout:
    never retried (a 504)."""


class WorkerLostAction(enum.StrEnum):
    """What happens to a request in flight on a worker that became unavailable."""

    REPLACE = "replace"
    """Nothing reached the client yet: cancel it there and place it again (a re-pin)."""
    WATCH = "watch"
    """Its answer is streaming to the client: keep it while bytes still arrive; if none arrive
    for a health-check timeout, end the client's stream (a truncated stream, never a hang)."""


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
        self.retry_after_send = config.retry_after_send
        self.retried_statuses: frozenset[int] = (
            RETRY_STATUSES if self.max_attempts > 1 else frozenset()
        )
        """Upstream statuses another attempt may follow (:meth:`retryable`; none when one
        attempt is all there is)."""

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

    def may_retry(self, failure: AttemptFailure) -> bool:
        """Whether an attempt that failed this way may be tried again (module docstring)."""
        if failure is AttemptFailure.TIMEOUT:
            return False
        return failure is not AttemptFailure.SENT or self.retry_after_send

    @staticmethod
    def on_worker_lost(client_started: bool) -> WorkerLostAction:
        """What to do with a request in flight on a worker that became unavailable, by
        whether its answer to the client has started."""
        return WorkerLostAction.WATCH if client_started else WorkerLostAction.REPLACE
