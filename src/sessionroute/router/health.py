"""Worker availability: per-worker health-check verdicts and circuit breakers (pure).

A worker is *available* to the policy when its health checks pass (``health_ok``) and its
circuit is not open. Health follows vllm-router: ``--health-failure-threshold`` consecutive
failed checks mark a worker unhealthy and ``--health-success-threshold`` consecutive passes
bring it back; a request whose connection the worker refused marks it unhealthy at once. The
breaker is the classic closed/open/half-open machine (Nygard, *Release It!*, 2007):
``cb_failure_threshold`` consecutive request failures open it for ``cb_timeout_s``, after which
it is half-open and ``cb_success_threshold`` successes close it (a failure re-opens it).

The checks themselves are I/O: ``serve`` probes workers over HTTP
(:class:`sessionroute.serve.health.HealthChecker`) and the simulator models replicas that are
down; both feed the results to :class:`~sessionroute.router.core.RoutingCore`, which keeps one
:class:`WorkerHealth` per worker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sessionroute.clock import Clock

__all__ = ["BreakerState", "CircuitBreaker", "WorkerHealth"]


class BreakerState(enum.IntEnum):
    """Circuit states (exported as the gauge value of ``circuit_state``)."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


_CLOSED = BreakerState.CLOSED
"""The closed state, for :meth:`CircuitBreaker.record_success` (on Python 3.11 an enum member
read through its class takes ``EnumType.__getattr__``'s slow path)."""


class CircuitBreaker:
    """One worker's circuit breaker.

    Args:
        failure_threshold: consecutive failures that open the circuit (>= 1).
        success_threshold: half-open successes that close it (>= 1).
        timeout_s: seconds the circuit stays open before turning half-open.
        clock: time source (seconds).
        enabled: when False the circuit never opens.

    Attributes:
        settled: True while the circuit is closed with no failure counted since the last
            success, so that :meth:`record_success` would change nothing (a caller recording
            every answer skips the call then).
    """

    __slots__ = (
        "_clock",
        "_failures",
        "_reopen_at",
        "_state",
        "_successes",
        "enabled",
        "failure_threshold",
        "settled",
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
        self._reopen_at = 0.0
        self.settled = True

    @property
    def state(self) -> BreakerState:
        """The current state (an open circuit turns half-open once its timeout has passed)."""
        if self._state is BreakerState.OPEN and self._clock.now() >= self._reopen_at:
            self._state = BreakerState.HALF_OPEN
            self._successes = 0
        return self._state

    def reopens_in(self) -> float | None:
        """Seconds until an open circuit turns half-open (0 when due); None when not open."""
        if self.state is not BreakerState.OPEN:
            return None
        return max(0.0, self._reopen_at - self._clock.now())

    @property
    def reopen_at(self) -> float:
        """The clock time at which the circuit opened last turns half-open: the opening time
        plus ``timeout_s``, compared as is with the clock (no difference rounded), so a timer
        set for it finds the circuit half-open."""
        return self._reopen_at

    def half_open(self) -> bool:
        """Turn an open circuit half-open now (before its timeout); True if it was open."""
        if self.state is not BreakerState.OPEN:
            return False
        self._state = BreakerState.HALF_OPEN
        self._successes = 0
        return True

    def allows(self) -> bool:
        """True unless the circuit is open."""
        return self.state is not BreakerState.OPEN

    def record_success(self) -> bool:
        """Count a successful request; returns True if the state changed."""
        self._failures = 0
        if self._state is _CLOSED:  # without the clock
            self.settled = True
            return False
        if self.state is BreakerState.HALF_OPEN:
            self._successes += 1
            if self._successes >= self.success_threshold:
                self._state = BreakerState.CLOSED
                self.settled = True
                return True
        return False

    def record_failure(self, *, may_open: bool = True) -> bool:
        """Count a failed request; returns True if the circuit opened.

        Args:
            may_open: False keeps the circuit closed (or half-open) even at the threshold; the
                failures stay counted, so the next failure with ``may_open`` opens it.
        """
        if not self.enabled:
            return False
        state = self.state
        self._failures += 1
        self.settled = False
        if not may_open:
            return False
        if state is BreakerState.HALF_OPEN or (
            state is BreakerState.CLOSED and self._failures >= self.failure_threshold
        ):
            self._state = BreakerState.OPEN
            self._reopen_at = self._clock.now() + self.timeout_s
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
        started: False until the worker passed a check, for a worker that starts unchecked
            (:meth:`start_unchecked`): its first passing check makes it healthy at once
            (vllm-router's startup wait needs one passing check, not
            ``--health-success-threshold``).
    """

    url: str
    breaker: CircuitBreaker
    health_ok: bool = True
    fails: int = 0
    passes: int = 0
    last_error: str = field(default="")
    started: bool = True

    def start_unchecked(self) -> None:
        """Count the worker unhealthy until its first passing check (``serve`` at startup: a
        worker counts healthy only after a check passed)."""
        self.started = False
        self.health_ok = False

    @property
    def available(self) -> bool:
        """True when checks pass and the circuit is not open."""
        return self.health_ok and self.breaker.allows()

    def observe_check(self, ok: bool, failure_threshold: int, success_threshold: int) -> bool:
        """Fold one check result into ``health_ok``; returns True if it changed."""
        if ok:
            self.fails = 0
            self.passes += 1
            if not self.started:
                self.started = self.health_ok = True
                return True
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
