"""Worker health: active health checks and a per-worker circuit breaker.

A worker is *available* to the policy when its health checks pass (``health_ok``) and its
circuit is not open. Health follows vllm-router: ``--health-failure-threshold`` consecutive
failed checks of ``--health-check-endpoint`` mark a worker unhealthy and
``--health-success-threshold`` consecutive passes bring it back. The breaker is the classic
closed/open/half-open machine (Nygard, *Release It!*, 2007): ``--cb-failure-threshold``
consecutive request failures open it for ``--cb-timeout-duration-secs``, after which it is
half-open and ``--cb-success-threshold`` successes close it (a failure re-opens it).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import aiohttp

from sessionroute.clock import Clock

__all__ = ["BreakerState", "CircuitBreaker", "HealthChecker", "WorkerHealth"]

log = logging.getLogger("sessionroute.serve")


class BreakerState(enum.IntEnum):
    """Circuit states (exported as the gauge value of ``circuit_state``)."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class CircuitBreaker:
    """One worker's circuit breaker.

    Args:
        failure_threshold: consecutive failures that open the circuit (>= 1).
        success_threshold: half-open successes that close it (>= 1).
        timeout_s: seconds the circuit stays open before turning half-open.
        clock: time source (seconds).
        enabled: when False the circuit never opens.
    """

    __slots__ = (
        "_clock",
        "_failures",
        "_opened_at",
        "_state",
        "_successes",
        "enabled",
        "failure_threshold",
        "success_threshold",
        "timeout_s",
    )

    def __init__(
        self,
        failure_threshold: int,
        success_threshold: int,
        timeout_s: float,
        clock: Clock,
        *,
        enabled: bool = True,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.success_threshold = success_threshold
        self.timeout_s = timeout_s
        self.enabled = enabled
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._successes = 0
        self._opened_at = 0.0

    @property
    def state(self) -> BreakerState:
        """The current state (an open circuit turns half-open once its timeout has passed)."""
        if (
            self._state is BreakerState.OPEN
            and self._clock.now() - self._opened_at >= self.timeout_s
        ):
            self._state = BreakerState.HALF_OPEN
            self._successes = 0
        return self._state

    def allows(self) -> bool:
        """True unless the circuit is open."""
        return self.state is not BreakerState.OPEN

    def record_success(self) -> bool:
        """Count a successful request; returns True if the state changed."""
        self._failures = 0
        if self._state is BreakerState.CLOSED:  # the common case, without the clock
            return False
        if self.state is BreakerState.HALF_OPEN:
            self._successes += 1
            if self._successes >= self.success_threshold:
                self._state = BreakerState.CLOSED
                return True
        return False

    def record_failure(self) -> bool:
        """Count a failed request; returns True if the circuit opened."""
        if not self.enabled:
            return False
        state = self.state
        self._failures += 1
        if state is BreakerState.HALF_OPEN or (
            state is BreakerState.CLOSED and self._failures >= self.failure_threshold
        ):
            self._state = BreakerState.OPEN
            self._opened_at = self._clock.now()
            self._failures = 0
            return True
        return False


@dataclass(slots=True)
class WorkerHealth:
    """Health-check and breaker state of one worker.

    Attributes:
        url: the worker's base URL.
        breaker: its circuit breaker.
        health_ok: the health-check verdict (starts True).
        fails: consecutive failed checks.
        passes: consecutive passed checks.
        last_error: why the last check or request failed ("" if none did).
    """

    url: str
    breaker: CircuitBreaker
    health_ok: bool = True
    fails: int = 0
    passes: int = 0
    last_error: str = field(default="")

    @property
    def available(self) -> bool:
        """True when checks pass and the circuit is not open."""
        return self.health_ok and self.breaker.allows()

    def observe_check(self, ok: bool, failure_threshold: int, success_threshold: int) -> bool:
        """Fold one check result into ``health_ok``; returns True if it changed."""
        if ok:
            self.fails = 0
            self.passes += 1
            if not self.health_ok and self.passes >= success_threshold:
                self.health_ok = True
                return True
        else:
            self.passes = 0
            self.fails += 1
            if self.health_ok and self.fails >= failure_threshold:
                self.health_ok = False
                return True
        return False

    def mark_unreachable(self, reason: str) -> bool:
        """A request found the worker refusing connections: unhealthy until checks pass again.

        Returns True if it was healthy before.
        """
        self.last_error = reason
        self.passes = 0
        changed = self.health_ok
        self.health_ok = False
        return changed


async def probe(
    session: aiohttp.ClientSession, url: str, timeout_s: float, headers: dict[str, str]
) -> tuple[bool, str]:
    """GET ``url`` once; ``(True, "")`` on a 2xx answer within ``timeout_s`` seconds."""
    try:
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers
        ) as resp:
            await resp.read()
            if 200 <= resp.status < 300:
                return True, ""
            return False, f"status {resp.status}"
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


class HealthChecker:
    """Checks every worker every ``interval_s`` seconds until stopped.

    Args:
        session: the router's pooled client session.
        workers: the router's url -> :class:`WorkerHealth` map (read at each round).
        endpoint: path to GET on each worker.
        interval_s: seconds between rounds.
        recheck_s: seconds between extra checks of the unhealthy workers only (between
            rounds): a worker marked unhealthy (by checks, or at once when it refused a
            request's connection) is back after ``success_threshold`` passes, about
            ``success_threshold * recheck_s`` seconds after it comes up, instead of
            ``success_threshold * interval_s``.
        timeout_s: per-check timeout in seconds.
        failure_threshold: consecutive failures before a worker is unhealthy.
        success_threshold: consecutive passes before it is healthy again.
        on_change: called with the url whenever a worker's ``health_ok`` changes.
        headers: headers sent with each check (the worker API key, if any).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        workers: dict[str, WorkerHealth],
        *,
        endpoint: str,
        interval_s: float,
        recheck_s: float | None = None,
        timeout_s: float,
        failure_threshold: int,
        success_threshold: int,
        on_change: Callable[[str], None],
        headers: dict[str, str],
    ) -> None:
        self._session = session
        self._workers = workers
        self._endpoint = endpoint
        self._interval = interval_s
        self._recheck = interval_s if recheck_s is None else min(recheck_s, interval_s)
        self._timeout = timeout_s
        self._fail_n = failure_threshold
        self._pass_n = success_threshold
        self._on_change = on_change
        self._headers = headers
        self.rounds = 0
        self.round_done = asyncio.Event()

    async def check_once(self, urls: Iterable[str] | None = None) -> None:
        """Check every worker (or those of ``urls``) concurrently and apply the results; only
        a check of every worker counts as a round (:attr:`rounds`, :attr:`round_done`)."""
        full = urls is None
        if urls is None:
            items = list(self._workers.items())
        else:
            items = [(u, self._workers[u]) for u in urls if u in self._workers]
        results = await asyncio.gather(
            *(
                probe(self._session, url.rstrip("/") + self._endpoint, self._timeout, self._headers)
                for url, _ in items
            )
        )
        for (url, wh), (ok, reason) in zip(items, results, strict=True):
            if self._workers.get(url) is not wh:
                continue  # removed (or replaced) while the check ran
            if not ok:
                wh.last_error = reason
            if wh.observe_check(ok, self._fail_n, self._pass_n):
                log.warning("worker %s is now %s", url, "healthy" if ok else "unhealthy")
                self._on_change(url)
        if full:
            self.rounds += 1
            self.round_done.set()
            self.round_done = asyncio.Event()

    async def run(self) -> None:
        """Check every worker now and then every ``interval_s`` seconds, and the unhealthy
        ones every ``recheck_s`` seconds in between, forever (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        while True:
            await self.check_once()
            next_round = loop.time() + self._interval
            while (left := next_round - loop.time()) > 0:
                await asyncio.sleep(min(self._recheck, left))
                if next_round - loop.time() <= 0:
                    break
                sick = [u for u, wh in self._workers.items() if not wh.health_ok]
                if sick:
                    await self.check_once(sick)
