"""The routing core: the one implementation of every router decision, for both drivers.

:class:`RoutingCore` holds a policy, the cluster (workers, their availability and router-side
load), and the router's decision helpers. ``serve`` drives it over HTTP in real time, the
simulator drives it in virtual time; neither makes a routing decision of its own:

* :attr:`RoutingCore.requests` builds the policy's request (session id, size estimate,
  content keys; :mod:`sessionroute.router.requests`);
* :meth:`RoutingCore.place` admits (:mod:`sessionroute.router.admission`), selects and
  reserves in one synchronous step; :meth:`RoutingCore.complete` releases exactly once;
* :attr:`RoutingCore.retry` and :meth:`RoutingCore.retarget` decide retries and re-placement
  (:mod:`sessionroute.router.retry`);
* :meth:`RoutingCore.record_success`, :meth:`~RoutingCore.record_failure`,
  :meth:`~RoutingCore.record_unreachable` and :meth:`~RoutingCore.observe_check` keep each
  worker's availability (:mod:`sessionroute.router.health`);
* :meth:`RoutingCore.finish_session`, :meth:`RoutingCore.sweep` and
  :meth:`RoutingCore.sweep_chunks` end sessions.

Every decision is counted by kind and, when :attr:`RoutingCore.log` is a list, appended to it
as ``(session_id, worker, kind)``: the parity test compares the logs of both drivers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sessionroute.clock import Clock
from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.admission import AdmissionQueue, Ticket
from sessionroute.router.config import RouterConfig
from sessionroute.router.health import CircuitBreaker, WorkerHealth
from sessionroute.router.kv.content import KvContent
from sessionroute.router.policies.base import Policy
from sessionroute.router.ratelimit import TokenBucket
from sessionroute.router.requests import RequestBuilder
from sessionroute.router.retry import RetryPolicy
from sessionroute.router.state.cluster import Cluster
from sessionroute.types import DecisionKind, EngineGauges, RouteRequest

__all__ = ["SWEEP_CHUNK", "Reservation", "RoutingCore"]

SWEEP_CHUNK = 500
"""Sessions expired per chunk of :meth:`RoutingCore.sweep_chunks` (about a millisecond of
work; ``sessionroute bench stall``)."""


@dataclass(eq=False, slots=True)
class Reservation:
    """One routed request; pass it back to :meth:`RoutingCore.complete` exactly once.

    Attributes:
        request: what was routed.
        worker: the chosen worker.
        kind: how it was chosen.
        generation: the worker's add-order index when reserved (-1 if it was unknown); a
            worker removed and added again is a new generation, so completing an old
            reservation never takes load off the new one.
        done: True once completed (a second complete is ignored).
        token: True while it holds a token of the rate limit (:attr:`RoutingCore.limiter`),
            given back when it completes.
        waited_s: seconds it waited in the admission queue before it was placed (0 when it
            was placed at once).
    """

    request: RouteRequest
    worker: str
    kind: DecisionKind
    generation: int
    done: bool = False
    token: bool = False
    waited_s: float = 0.0


class RoutingCore:
    """Select + reserve in one synchronous step, release exactly once, and the router's other
    decisions (module docstring).

    Args:
        policy: the routing policy.
        cluster: workers, availability and in-flight load (its workers get a health record).
        config: router settings (defaults: :class:`RouterConfig`'s).
        rng: random generator for retry jitter (``random.Random(0)`` when omitted).
        log: when a list, every decision is appended as ``(session_id, worker, kind)``.
        clock: time source of the circuit breakers (the policy's clock when omitted).
        kv_content: the servers' tokenizer and block-hash scheme for live requests' content
            (:class:`~sessionroute.router.requests.RequestBuilder`), or None.
    """

    def __init__(
        self,
        policy: Policy,
        cluster: Cluster,
        config: RouterConfig | None = None,
        *,
        rng: random.Random | None = None,
        log: list[tuple[str | None, str, str]] | None = None,
        clock: Clock | None = None,
        kv_content: KvContent | None = None,
    ) -> None:
        self.policy = policy
        self.cluster = cluster
        self.config = config if config is not None else RouterConfig()
        self.clock = clock if clock is not None else policy.clock
        self.log = log
        self.on_decision: Callable[[Reservation], None] | None = None
        """Called with every new reservation (``serve``'s route receipts), or None."""
        self.requests = RequestBuilder(
            self.config,
            needs_content=policy.needs_content,
            kv_content=kv_content,
            content_tail=policy.content_tail,
        )
        self.retry = RetryPolicy(self.config, rng if rng is not None else random.Random(0))
        self.admission = AdmissionQueue(self.config.admission_max_waiting)
        self.limiter: TokenBucket | None = None
        """vllm-router's rate limit (``RouterConfig.rate_limit_capacity``), or None."""
        if self.config.rate_limit_capacity is not None:
            cap = self.config.rate_limit_capacity
            rate = self.config.rate_limit_per_s or float(cap)
            self.limiter = TokenBucket(cap, rate, self.clock.now())
        self.health: dict[str, WorkerHealth] = {w: self._new_health(w) for w in cluster.workers()}
        self.decisions: dict[DecisionKind, int] = dict.fromkeys(DecisionKind, 0)
        """Count of decisions by kind."""
        # the default hooks admit everything and keep nothing per request: not asked then
        kind = type(policy)
        self._admits_all = kind.admit is Policy.admit
        self._keeps_requests = kind.on_complete is not Policy.on_complete

    # -- placement ------------------------------------------------------------------------
    def route(self, request: RouteRequest) -> Reservation:
        """Choose a worker and reserve load on it (no admission check).

        Raises:
            NoWorkerAvailable: when no worker is available.
        """
        d = self.policy.select(request, self.cluster)
        generation = self.cluster.reserve(d.worker, request.prompt_tokens)
        self.decisions[d.kind] += 1
        if self.log is not None:
            self.log.append((request.session_id, d.worker, d.kind.value))
        if self.on_decision is not None:
            reservation = Reservation(request, d.worker, d.kind, generation)
            self.on_decision(reservation)
            return reservation
        return Reservation(request, d.worker, d.kind, generation)

    def place(
        self, request: RouteRequest, on_ready: Callable[[Ticket], None]
    ) -> Reservation | Ticket:
        """Admit and route ``request``, or queue it for admission.

        Requests already waiting are placed first when the policy now admits them (its
        verdict may change without a completion: time, gauges), so a new request never
        overtakes one the policy would place; it passes only those the policy still holds. A
        request exempt from admission
        (:meth:`~sessionroute.router.policies.Policy.admission_applies`) is routed at once,
        even while others wait.

        Returns:
            The reservation when the policy admits the request now; otherwise a waiting
            :class:`Ticket`, whose ``on_ready`` is called once, later, when it was placed or
            failed. Withdraw a ticket that still waits at its deadline
            (:meth:`admission_max_wait_s`) with :meth:`withdraw`.

        Raises:
            NoWorkerAvailable: when no worker is available.
            AdmissionRefused: held back with the admission queue full.
        """
        policy = self.policy
        if self.admission.waiting:
            self.pump()
        limiter = self.limiter
        if (
            self._admits_all
            or not policy.admission_applies(request)
            or policy.admit(request, self.cluster)
        ) and (limiter is None or self._take_token()):  # (waiting tickets were offered first)
            if limiter is None:
                return self.route(request)
            return self._route_with_token(request)
        if not self.admission.has_room():
            self.admission.refused_full += 1
            if limiter is not None:
                raise AdmissionRefused(
                    "too many requests: the rate limit (--max-concurrent-requests, "
                    "--rate-limit-tokens-per-second) has no token and the queue is full "
                    f"({len(self.admission)} of {self.admission.max_waiting} waiting)",
                    "queue_full",
                    status=429,
                    retry_after_s=1,
                )
            raise AdmissionRefused(
                "the policy holds the request back and the admission queue is full "
                f"({len(self.admission)} of {self.admission.max_waiting} waiting)",
                "queue_full",
            )
        ticket = Ticket(request, on_ready, since=self.clock.now())
        self.admission.push(ticket)
        return ticket

    def admission_max_wait_s(self) -> float:
        """Seconds a held request may wait: the policy's own maximum
        (:meth:`~sessionroute.router.policies.Policy.admission_max_wait_s`) when it has one,
        else ``RouterConfig.admission_max_wait_s``. The drivers set each ticket's deadline
        from it."""
        own = self.policy.admission_max_wait_s()
        return self.config.admission_max_wait_s if own is None else own

    def withdraw(self, ticket: Ticket) -> AdmissionRefused | None:
        """A ticket's deadline (:meth:`admission_max_wait_s`) passed: take it out of the queue.

        When the policy places at the maximum wait
        (:attr:`~sessionroute.router.policies.Policy.places_at_max_wait`) it is routed now and
        its ``on_ready`` called, as when admitted; otherwise it is refused.

        Returns:
            The error to answer with when refused; None when it was placed now or had already
            left the queue (placed or failed).
        """
        queue = self.admission
        if not queue.withdraw(ticket):
            return None
        if self.policy.places_at_max_wait:
            queue.placed_at_deadline += 1
            self._leave(ticket)
            return None
        queue.refused_timeout += 1
        if self.limiter is not None:
            return AdmissionRefused(
                f"the request waited {self.admission_max_wait_s()} s in the queue "
                "(--queue-timeout-secs)",
                "timeout",
                status=408,
            )
        return AdmissionRefused(
            f"no worker could take the request within {self.admission_max_wait_s()} s",
            "timeout",
        )

    def cancel_ticket(self, ticket: Ticket) -> None:
        """The client of a queued request went away: drop its ticket, or release what it was
        given if it had just been placed."""
        if not self.admission.withdraw(ticket) and ticket.reservation is not None:
            self.complete(ticket.reservation)

    def pump(self) -> None:
        """Place every waiting ticket the policy admits now, oldest first.

        A ticket the policy holds stays and does not block later ones (a held session's turn
        never holds up other sessions); each placement updates the load the next verdict sees.
        Drivers call this after anything that may change a verdict without passing through
        the core: a scrape of engine gauges (:meth:`observe_gauges`) and the passing of time
        (:meth:`recheck`).
        """
        queue = self.admission
        if not queue.waiting:
            return
        first_admitted = self.policy.first_admitted
        cluster = self.cluster
        pending = queue.tickets()
        while pending:
            if cluster.healthy():
                i = first_admitted([t.request for t in pending], cluster)
                if i is None:
                    return
            else:
                i = 0  # no healthy worker: the ticket fails at placement (NoWorkerAvailable)
            ticket = pending[i]
            token = self.limiter is not None
            if token and not self._take_token():
                return  # no token: the rest wait (refill: recheck; a completion: complete)
            queue.take(ticket)
            self._leave(ticket, token=token)
            # those before it stay held; skip tickets withdrawn by an on_ready callback
            pending = [t for t in pending[i + 1 :] if t.waiting]

    def _leave(self, ticket: Ticket, *, token: bool = False) -> None:
        """Route a ticket that left the queue and tell its driver (``on_ready``); ``token``:
        it took a token of the rate limit (given back if it cannot be placed)."""
        try:
            if token:
                ticket.reservation = self._route_with_token(ticket.request)
            else:
                ticket.reservation = self.route(ticket.request)
            queue = self.admission
            queue.admitted_after_wait += 1
            waited = self.clock.now() - ticket.since
            queue.wait_s_total += waited
            ticket.reservation.waited_s = waited
        except NoWorkerAvailable as exc:
            ticket.error = exc
        ticket.on_ready(ticket)

    def recheck(self) -> None:
        """Time passed: re-ask the policy about waiting tickets (its verdict may depend on
        the clock, e.g. a maximum pause). Drivers call this every
        :attr:`admission_recheck_s` while tickets wait; a no-op on an empty queue."""
        self.pump()

    @property
    def admission_recheck_s(self) -> float | None:
        """Seconds between the driver's :meth:`recheck` calls while tickets wait (the
        policy's ``admission_recheck_s``, and with a rate limit the time its bucket takes to
        refill a token; None: no verdict depends on the clock)."""
        every = self.policy.admission_recheck_s
        limiter = self.limiter
        if limiter is None:
            return every
        refill = max(limiter.wait_s(self.clock.now()), 0.001)
        return refill if every is None else min(every, refill)

    def _take_token(self) -> bool:
        limiter = self.limiter
        return limiter is not None and limiter.take(self.clock.now())

    def _route_with_token(self, request: RouteRequest) -> Reservation:
        """:meth:`route` for a request that took a token (given back if it is not placed)."""
        try:
            reservation = self.route(request)
        except BaseException:
            if self.limiter is not None:
                self.limiter.give_back()
            raise
        reservation.token = True
        return reservation

    def observe_gauges(self, url: str, gauges: EngineGauges) -> None:
        """Record scraped engine gauges of ``url`` (ignored for an unknown worker) and pump
        the admission queue, whose verdicts may read them."""
        self.cluster.set_gauges(url, gauges)
        if self.admission.waiting:
            self.pump()

    def complete(self, reservation: Reservation) -> bool:
        """Release what :meth:`route` reserved; returns False if already completed."""
        if reservation.done:
            return False
        reservation.done = True
        if reservation.token and self.limiter is not None:
            reservation.token = False
            self.limiter.give_back()
        self.cluster.release(
            reservation.worker, reservation.request.prompt_tokens, reservation.generation
        )
        if self._keeps_requests:
            self.policy.on_complete(reservation.request, reservation.worker)
        if self.admission.waiting:
            self.pump()
        return True

    def retract(self, reservation: Reservation) -> None:
        """Take back a placement that a shared session table refused (another router changed
        the table since the decision; :mod:`sessionroute.router.state.shared`): release it and
        uncount its decision. The caller withdraws the pin and decides again."""
        if self.complete(reservation):
            self.decisions[reservation.kind] -= 1

    def retarget(self, reservation: Reservation) -> Reservation:
        """The reservation for the next attempt: the same one while its worker is available,
        otherwise it is completed and the request placed again (a session moves).

        Raises:
            NoWorkerAvailable: when it must move and no worker is available.
        """
        if self.cluster.is_healthy(reservation.worker):
            return reservation
        token, reservation.token = reservation.token, False  # the request keeps its token
        self.complete(reservation)
        try:
            moved = self.route(reservation.request)
        except BaseException:
            if token and self.limiter is not None:
                self.limiter.give_back()
            raise
        moved.token = token
        return moved

    # -- sessions -------------------------------------------------------------------------
    def finish_session(self, session_id: str) -> bool:
        """Release a session (idempotent); True if the policy knew it."""
        known = self.policy.release_session(session_id)
        if known and self.admission.waiting:
            self.pump()
        return known

    def sweep(self, now: float) -> int:
        """Expire every idle session in one call (the simulator's sweep); returns how many.
        The same work as :meth:`sweep_chunks` with no chunk limit."""
        return sum(self.sweep_chunks(now, None))

    def sweep_chunks(self, now: float, chunk: int | None = SWEEP_CHUNK) -> Iterator[int]:
        """Expire idle sessions at most ``chunk`` at a time, the oldest first; yields how
        many each chunk expired, the last one yielded being less than ``chunk``.

        A driver on an event loop (``serve``) lets other work run between chunks, so 100,000
        sessions expiring at once never block it for more than one chunk (about a
        millisecond, ``sessionroute bench stall``). Expiry may free capacity for waiting
        requests, so the admission queue is pumped after each chunk that expired any.

        Args:
            now: the clock time (seconds) the whole sweep expires against.
            chunk: sessions per chunk (>= 1); None: all in one chunk.
        """
        policy = self.policy
        while True:
            expired = policy.sweep(now, chunk)
            if expired and self.admission.waiting:
                self.pump()
            yield expired
            if chunk is None or (expired < chunk and not policy.sweep_pending()):
                return

    # -- workers --------------------------------------------------------------------------
    def add_worker(self, url: str) -> None:
        """Add an available worker (WorkerError if present)."""
        self.cluster.add(url)
        self.health[url] = self._new_health(url)
        self.policy.on_worker_added(url, self.cluster)
        self.pump()

    def remove_worker(self, url: str) -> None:
        """Remove a worker (WorkerError if unknown); its sessions re-place on their next turn.

        O(1) in the number of sessions for the session-keeping policies
        (:meth:`~sessionroute.router.state.SessionTable.displace`: their pins go stale and
        are dropped lazily), so a large worker leaves without stalling the event loop."""
        self.cluster.remove(url)
        self.health.pop(url, None)
        self.policy.on_worker_removed(url, self.cluster)

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
        return wh.breaker.record_success() and self.refresh(url)

    def record_failure(self, url: str) -> float | None:
        """An upstream failure (5xx, reset, timeout) from ``url``.

        By default the circuit opens at the threshold whatever the rest of the fleet does
        (vllm-router's breaker). With ``RouterConfig.cb_keep_half_available`` (sessionroute's
        safer rule) a circuit opens only while at least half of the workers (rounded up) would
        stay available: failures that no worker can avoid (a request every worker answers with a
        5xx, repeated by a client) would otherwise open every circuit in turn and refuse all
        traffic for ``cb_timeout_s``, or leave one worker carrying the fleet's load. Envoy
        bounds its outlier ejections the same way (``max_ejection_percent``; routing to every
        host below its 50 % panic threshold). A worker whose circuit may not open keeps its
        failures counted and opens at the next one once enough others are available. A
        worker that really went away is still marked unavailable by a refused connection
        (:meth:`record_unreachable`) and by its health checks.

        Returns:
            When this opened its circuit, the seconds after which the driver should call
            :meth:`refresh` (the circuit turns half-open); None otherwise.
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
        return wh.breaker.timeout_s

    def reopens_in(self, url: str) -> float | None:
        """Seconds until ``url``'s open circuit turns half-open (0 when due); None when it is
        not open. A driver whose timer fired before that (an event loop's timers may fire a
        millisecond early) calls :meth:`refresh` again after this long."""
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
        opened = wh.breaker.record_failure()
        wh.mark_unreachable(reason)
        self.refresh(url)
        return wh.breaker.timeout_s if opened else None

    def observe_check(self, url: str, ok: bool, fail_n: int, pass_n: int) -> bool:
        """Fold one health-check result of ``url`` in (``fail_n`` consecutive failures make it
        unhealthy, ``pass_n`` passes healthy again) and push its availability; True if its
        health verdict changed."""
        wh = self.health.get(url)
        if wh is None or not wh.observe_check(ok, fail_n, pass_n):
            return False
        self.refresh(url)
        return True

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
