"""Worker availability in the router core: health-check verdicts, circuit breakers, and what
they change (:class:`WorkerAvailability`, a base of
:class:`~sessionroute.router.core.RoutingCore`).

A worker is available to the policy when its health checks pass and its circuit is not open
(:mod:`sessionroute.router.health`). Failures that open a circuit set a timer of the core's for
the moment it turns half-open; a worker that turns unhealthy is re-checked every
``health_recheck_interval_s`` and lost (:class:`~sessionroute.router.actions.WorkerLost`).
"""

from __future__ import annotations

from sessionroute.router.actions import CIRCUIT, SICK_RECHECK, WorkerLost
from sessionroute.router.coreparts import CoreParts
from sessionroute.router.health import CircuitBreaker, WorkerHealth

__all__ = ["WorkerAvailability"]


class WorkerAvailability(CoreParts):
    """Availability of the workers (module docstring); the core's attributes it reads are
    set by :class:`~sessionroute.router.core.RoutingCore`."""

    def start_unchecked(self) -> None:
        """Count every worker unavailable until a health check of it passes (a live router,
        which does not know yet whether its workers are up; the simulator's replicas start
        up)."""
        for url, wh in self.health.items():
            wh.start_unchecked()
            self.refresh(url)

    def ready(self) -> bool:
        """Whether the router can route: at least one worker is available (``serve``'s
        ``/readiness``: 200, else 503)."""
        return bool(self.cluster.healthy())

    def unavailable_workers(self) -> list[str]:
        """The workers not available now, in the order they were added (``serve``'s
        ``/health`` is healthy only when there are none: vllm-router's meaning)."""
        cluster = self.cluster
        return [url for url in cluster.workers() if not cluster.is_healthy(url)]

    def set_health(self, url: str, healthy: bool) -> bool:
        """Mark a worker available or not; True if it changed (WorkerError if unknown)."""
        changed = self.cluster.set_healthy(url, healthy)
        if changed:
            self.policy.on_health_change(url, healthy, self.cluster)
            if healthy:
                self.pump()
        return changed

    def refresh(self, url: str) -> bool:
        """Push ``url``'s availability (checks pass, circuit not open) to the cluster and the
        policy; True if it changed."""
        wh = self.health.get(url)
        if wh is None or url not in self.cluster:
            return False
        return self.set_health(url, wh.available)

    def record_success(self, url: str) -> bool:
        """An upstream answer below 500 from ``url``; True if its availability changed."""
        wh = self.health.get(url)
        if wh is None or wh.breaker.settled:  # the common case: nothing to record
            return False
        if not wh.breaker.record_success():
            return False
        if self.on_circuit is not None:  # the circuit closed
            self.on_circuit(url, False)
        return self.refresh(url)

    def record_failure(self, url: str) -> float | None:
        """An upstream failure (5xx, reset, timeout) from ``url``.

        By default the circuit opens at the threshold whatever the rest of the fleet does
        (vllm-router's breaker). With ``RouterConfig.cb_keep_half_available`` (sessionroute's
        safer rule) a circuit opens only while at least half of the workers (rounded up) would
        stay available: failures that no worker can avoid (a request every worker answers with
        a 5xx, repeated by a client) would otherwise open every circuit in turn and refuse all
        traffic for ``cb_timeout_s``, or leave one worker carrying the fleet's load. Envoy
        bounds its outlier ejections the same way (``max_ejection_percent``; routing to every
        host below its 50 % panic threshold). A worker whose circuit may not open keeps its
        failures counted and opens at the next one once enough others are available. A
        worker that really went away is still marked unavailable by a refused connection
        (:meth:`record_unreachable`) and by its health checks.

        Returns:
            When this opened its circuit, the seconds after which it turns half-open (a timer
            of the core's then pushes its availability again); None otherwise.
        """
        wh = self.health.get(url)
        if wh is None:
            return None
        may_open = True
        if self.config.cb_keep_half_available:
            cluster = self.cluster
            workers = cluster.workers()
            others = sum(1 for u in workers if u != url and cluster.is_healthy(u))
            may_open = others >= -(-len(workers) // 2)
        if not wh.breaker.record_failure(may_open=may_open):
            return None
        self.refresh(url)
        self.timers.push(wh.breaker.reopen_at, CIRCUIT, url)
        if self.on_circuit is not None:
            self.on_circuit(url, True)
        return wh.breaker.timeout_s

    def reopens_in(self, url: str) -> float | None:
        """Seconds until ``url``'s open circuit turns half-open (0 when due); None when it is
        not open."""
        wh = self.health.get(url)
        return None if wh is None else wh.breaker.reopens_in()

    def record_unreachable(self, url: str, reason: str) -> float | None:
        """``url`` refused a connection: unavailable at once, until its health checks pass
        again (and its circuit, if this failure opened it, is no longer open).

        Returns:
            As :meth:`record_failure`: when this opened its circuit, the seconds after which
            the driver should call :meth:`refresh`; None otherwise.
        """
        wh = self.health.get(url)
        if wh is None:
            return None
        was_available = wh.available
        opened = wh.breaker.record_failure()
        wh.mark_unreachable(reason)
        self.refresh(url)
        self._set_sick_recheck(self.clock.now())
        if was_available and self.on_unreachable is not None:
            self.on_unreachable(url, reason)
        if not opened:
            return None
        self.timers.push(wh.breaker.reopen_at, CIRCUIT, url)
        if self.on_circuit is not None:
            self.on_circuit(url, True)
        return wh.breaker.timeout_s

    def observe_check(self, url: str, ok: bool, reason: str = "") -> tuple[bool, WorkerLost | None]:
        """Fold one health-check result of ``url`` in (``health_failure_threshold``
        consecutive failures make it unhealthy, ``health_success_threshold`` passes healthy
        again; with ``RouterConfig.cb_half_open_on_recovery``, turning healthy again makes
        an open circuit half-open) and push its availability.

        Returns:
            Whether its health verdict changed, and when it turned unhealthy, the
            :class:`WorkerLost` for the driver to act on its requests in flight.
        """
        wh = self.health.get(url)
        if wh is None:
            return False, None
        if not ok and reason:
            wh.last_error = reason
        c = self.config
        changed = wh.observe_check(ok, c.health_failure_threshold, c.health_success_threshold)
        if not wh.health_ok:  # unhealthy (or never yet checked healthy): re-checked soon
            self._set_sick_recheck(self.clock.now())
        if not changed:
            return False, None
        if ok and c.cb_half_open_on_recovery:
            wh.breaker.half_open()  # real requests probe it now
        self.refresh(url)
        if ok:
            return True, None
        return True, WorkerLost(
            url,
            f"failed {c.health_failure_threshold} health check(s)",
            c.health_check_timeout_s,
        )

    def _sick(self) -> tuple[str, ...]:
        return tuple(u for u, wh in self.health.items() if not wh.health_ok)

    def _set_sick_recheck(self, now: float) -> None:
        """While a worker fails its checks, check it every ``health_recheck_interval_s``
        between rounds (so it is back soon after it comes up)."""
        c = self.config
        every = min(c.health_recheck_interval_s, c.health_check_interval_s)
        if not self._sick_set and every < c.health_check_interval_s:
            self._sick_set = True
            self.timers.push(now + every, SICK_RECHECK)

    def _new_health(self, url: str) -> WorkerHealth:
        c = self.config
        breaker = CircuitBreaker(
            c.cb_failure_threshold,
            c.cb_success_threshold,
            c.cb_timeout_s,
            self.clock,
            enabled=c.circuit_breaker,
        )
        return WorkerHealth(url, breaker)
