"""Waiting for workers at start-up, and for a worker added at run time: when to check again
and what the end of the wait means. Pure; the driver runs the checks and the timer.

vllm-router 0.1.17 (``--worker-startup-timeout-secs``, 600 s, and
``--worker-startup-check-interval``, 30 s, in ``shared/ROUTER.md``) checks each worker every
interval until it answers, and exits with status 1 when one has not by the timeout. Here the
end of the wait is :meth:`StartupWait.outcome`: ``"ready"`` when every worker passed a check,
``"partial"`` when some did (route to those; the others stay in the regular health checks),
``"fatal"`` only when none did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["StartupOutcome", "StartupWait"]

StartupOutcome = Literal["ready", "partial", "fatal"]


@dataclass(frozen=True, slots=True)
class StartupWait:
    """One wait for workers to pass a health check.

    Attributes:
        since: when the wait began (seconds on the driver's clock).
        timeout_s: how long it may last (``RouterConfig.worker_startup_timeout_s``).
        interval_s: seconds between checks (``RouterConfig.worker_startup_check_interval_s``).
    """

    since: float
    timeout_s: float
    interval_s: float

    def next_check_in(self, now: float) -> float | None:
        """Seconds to wait before the next check, or None when the wait is over."""
        left = self.since + self.timeout_s - now
        return None if left <= 0 else min(self.interval_s, left)

    @staticmethod
    def outcome(pending: int, workers: int) -> StartupOutcome:
        """What the end of the wait means with ``pending`` of ``workers`` never checked
        healthy: ``ready`` (none pending), ``partial`` (some passed), ``fatal`` (none did)."""
        if pending == 0:
            return "ready"
        return "partial" if pending < workers else "fatal"
