"""The engines' own queueing delay, as a router sees it: Little's law per worker.

A request waiting in an engine's queue leaves it when it starts running; in steady state
requests start as fast as they finish. So the mean time a request now waits in worker ``w``'s
queue is (Little's law, L = lambda W; Little, Operations Research 9(3), 1961)::

    delay(w) = waiting(w) / rate(w)

``waiting(w)`` is the scraped ``vllm:num_requests_waiting`` and ``rate(w)`` the requests this
router saw finish on ``w`` per second, averaged over an exponentially weighted window of
``window_s`` seconds (the completions and the seconds both decay by ``exp(-dt / window_s)``,
so a rate is available from the first interval on, unbiased). Over the fleet the queues are one
queue: ``sum(waiting) / sum(rate)``. Without a finished request yet (no rate) a worker with a
queue has an unknown, infinite delay; one with nothing waiting has none (0).

``adaptive_hold`` bounds the time a turn waits at the router by it (rule 6,
:mod:`~sessionroute.router.policies.adaptive_hold`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sessionroute.errors import ConfigError
from sessionroute.router.state.cluster import ClusterView

__all__ = ["QueueDelay"]


class QueueDelay:
    """Per-worker completion rates and the queueing delay they imply (module docstring).

    Args:
        window_s: the time constant of the rate's exponential average, seconds (> 0).

    Raises:
        ConfigError: for ``window_s <= 0``.
    """

    __slots__ = ("_at", "_count", "_den", "_num", "window_s")

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ConfigError(f"wait_rate_window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._count: dict[str, int] = {}  # worker -> completions since its last observation
        self._at: dict[str, float] = {}  # worker -> time of its last observation
        self._num: dict[str, float] = {}  # worker -> decayed completions
        self._den: dict[str, float] = {}  # worker -> decayed seconds

    def done(self, worker: str) -> None:
        """A request finished on ``worker``."""
        self._count[worker] = self._count.get(worker, 0) + 1

    def observe(self, worker: str, now: float) -> None:
        """Fold the completions since the last observation of ``worker`` into its rate (the
        first observation only starts the clock)."""
        at = self._at.get(worker)
        self._at[worker] = now
        if at is None:
            self._count[worker] = 0
            return
        dt = now - at
        if dt <= 0:
            return
        keep = math.exp(-dt / self.window_s)
        self._num[worker] = self._num.get(worker, 0.0) * keep + self._count.get(worker, 0)
        self._den[worker] = self._den.get(worker, 0.0) * keep + dt
        self._count[worker] = 0

    def rate(self, worker: str) -> float | None:
        """Requests finished per second on ``worker`` (None before two observations)."""
        den = self._den.get(worker)
        return None if not den else self._num[worker] / den

    def delay(self, worker: str, cluster: ClusterView) -> float:
        """Seconds a request now waits in ``worker``'s queue: 0 with nothing waiting (or no
        gauges), ``inf`` with a queue and no rate yet."""
        return self.fleet_delay((worker,), cluster)

    def fleet_delay(self, workers: Iterable[str], cluster: ClusterView) -> float:
        """The same over ``workers`` taken as one queue: their waiting requests over their
        summed rates (workers without gauges count neither)."""
        waiting = 0
        rate = 0.0
        for w in workers:
            g = cluster.gauges(w)
            if g is not None:
                waiting += g.waiting
                rate += self.rate(w) or 0.0
        if waiting == 0:
            return 0.0
        return math.inf if rate <= 0 else waiting / rate

    def forget(self, worker: str) -> None:
        """``worker`` left: drop what was kept of it."""
        for d in (self._count, self._at, self._num, self._den):
            d.pop(worker, None)
