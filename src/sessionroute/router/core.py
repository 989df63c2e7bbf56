"""The routing core: the one implementation of every router decision, for both drivers.

:class:`RoutingCore` holds a policy, the cluster (workers, their availability and router-side
load), and the router's decision helpers. ``serve`` drives it over HTTP in real time, the
simulator drives it in virtual time; neither makes a routing decision, keeps a timer or holds
a default of its own. Each event a driver feeds in is answered with an action
(:mod:`sessionroute.router.actions`: send, hold, retry after s, refuse with a status, probe,
sweep), and the core's timers are run by :meth:`RoutingCore.on_timer` at
:meth:`RoutingCore.next_deadline`:

* :attr:`RoutingCore.requests` builds the policy's request (session id, size estimate,
  content keys; :mod:`sessionroute.router.requests`);
* :meth:`RoutingCore.place` admits (:mod:`sessionroute.router.admission`), selects and
  reserves in one synchronous step: a :class:`Reservation` (send) or a
  :class:`~sessionroute.router.admission.Ticket` (hold, placed or refused later by the core's
  timers); :meth:`RoutingCore.complete` releases exactly once;
* :meth:`~RoutingCore.attempt_failed`, :meth:`~RoutingCore.attempt_answered` and
  :meth:`~RoutingCore.next_attempt` decide retries and re-placement
  (:mod:`sessionroute.router.failures`, :mod:`sessionroute.router.retry`);
* :meth:`RoutingCore.record_success`, :meth:`~RoutingCore.record_failure`,
  :meth:`~RoutingCore.record_unreachable` and :meth:`~RoutingCore.observe_check` keep each
  worker's availability (:mod:`sessionroute.router.availability`,
  :mod:`sessionroute.router.health`);
* :meth:`RoutingCore.finish_session`, :meth:`RoutingCore.sweep` and
  :meth:`RoutingCore.sweep_chunks` end sessions.

Build one with :func:`sessionroute.router.build.build_router`.

Every decision is counted by kind and, when :attr:`RoutingCore.log` is a list, appended to it
as ``(session_id, worker, kind)``: the parity test compares the logs of both drivers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sessionroute.clock import Clock
from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.actions import (
    CIRCUIT,
    DEADLINE,
    HEALTH,
    RECHECK,
    SICK_RECHECK,
    SWEEP,
    CheckHealth,
    SweepSessions,
    Timers,
)
from sessionroute.router.admission import AdmissionQueue, Ticket
from sessionroute.router.availability import WorkerAvailability
from sessionroute.router.config import RouterConfig
from sessionroute.router.failures import AttemptOutcomes
from sessionroute.router.health import WorkerHealth
from sessionroute.router.kv.content import KvContent
from sessionroute.router.policies.base import Policy
from sessionroute.router.ratelimit import TokenBucket
from sessionroute.router.requests import RequestBuilder
from sessionroute.router.retry import RetryPolicy
from sessionroute.router.state.cluster import Cluster
from sessionroute.types import DecisionKind, EngineGauges, RouteRequest

__all__ = ["SWEEP_CHUNK", "Reservation", "RoutingCore", "TimerAction"]

SWEEP_CHUNK = 500
"""Sessions expired per chunk of :meth:`RoutingCore.sweep_chunks` (about a millisecond of
work; ``sessionroute bench stall``)."""


TimerAction = CheckHealth | SweepSessions
"""What :meth:`RoutingCore.on_timer` asks of a driver."""


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


class RoutingCore(WorkerAvailability, AttemptOutcomes):
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
        sweep_chunk: most sessions a sweep inside a routing call expires
            (:meth:`~sessionroute.router.policies.Policy.bound_sweeps`, set here for both
            drivers).
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
        sweep_chunk: int = SWEEP_CHUNK,
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
        self.timers = Timers()
        """The core's timers (:mod:`sessionroute.router.actions`); a driver sets
        ``timers.on_push`` to re-arm its one timer at :meth:`next_deadline`."""
        self._recheck_set = False
        self._sick_set = False
        # no routing call expires a whole table at once, in either driver (the periodic
        # sweep expires in chunks, :meth:`sweep_chunks`)
        policy.bound_sweeps(sweep_chunk)
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
            :class:`Ticket` (hold), whose ``on_ready`` is called once, later, when it was
            placed, failed or refused at its deadline (:meth:`admission_max_wait_s`, a timer
            of the core's: ``ticket.error`` is then the :class:`AdmissionRefused`).

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
        now = self.clock.now()
        ticket = Ticket(request, on_ready, since=now)
        self.admission.push(ticket)
        self.timers.push(now + self.admission_max_wait_s(), DEADLINE, ticket)
        self._set_recheck(now)
        return ticket

    def admission_max_wait_s(self) -> float:
        """Seconds a held request may wait: the policy's own maximum
        (:meth:`~sessionroute.router.policies.Policy.admission_max_wait_s`) when it has one,
        else ``RouterConfig.admission_max_wait_s``. Each ticket's deadline is a timer of the
        core's."""
        own = self.policy.admission_max_wait_s()
        return self.config.admission_max_wait_s if own is None else own

    def withdraw(self, ticket: Ticket) -> AdmissionRefused | None:
        """A ticket's deadline (:meth:`admission_max_wait_s`) passed: take it out of the queue
        (the core's deadline timer calls this; so may a test).

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
        the clock, e.g. a maximum pause). A timer of the core's runs this every
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

    def _set_recheck(self, now: float) -> None:
        every = self.admission_recheck_s
        if every is not None and not self._recheck_set:
            self._recheck_set = True
            self.timers.push(now + every, RECHECK)

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
        """Release a session (idempotent), and forget where its id came from; True if the
        policy knew it."""
        self.requests.origins.pop(session_id, None)
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

    # -- time -------------------------------------------------------------------------------
    def start(self, now: float, *, checked: bool = False) -> None:
        """The router starts at ``now``: set the periodic timers (a health-check round at
        once, then every ``health_check_interval_s``; a session sweep every
        ``sweep_interval_s``). ``checked``: the driver has run the first round itself (serve
        does, before it listens), so the next is one interval later."""
        first = now + self.config.health_check_interval_s if checked else now
        self.timers.push(first, HEALTH)
        sweep_s = self.config.sweep_interval_s
        if sweep_s is not None:
            self.timers.push(now + sweep_s, SWEEP)

    def next_deadline(self) -> float | None:
        """The clock time of the core's earliest timer, or None: a driver keeps one timer
        armed for it and calls :meth:`on_timer` when it fires (early is harmless)."""
        return self.timers.next_due()

    def on_timer(self, now: float) -> list[TimerAction]:
        """Run every timer due at ``now`` (the core's clock): open circuits turn half-open,
        admission tickets past their deadline are placed or refused (their ``on_ready``),
        waiting tickets are re-checked; returns what the driver must do now (health checks to
        probe, a sweep to run), in order."""
        out: list[TimerAction] = []
        timers = self.timers
        c = self.config
        while (item := timers.pop_due(now)) is not None:
            kind, subject = item
            if kind == CIRCUIT:
                self.refresh(subject)
            elif kind == DEADLINE:
                self._deadline(subject)
            elif kind == RECHECK:
                self._recheck_set = False
                self.recheck()
                if self.admission.waiting:
                    self._set_recheck(now)
            elif kind == HEALTH:
                out.append(CheckHealth(self.cluster.workers(), True))
                timers.push(now + c.health_check_interval_s, HEALTH)
            elif kind == SICK_RECHECK:
                self._sick_set = False
                sick = self._sick()
                if sick:
                    out.append(CheckHealth(sick, False))
                    self._set_sick_recheck(now)
            elif kind == SWEEP:
                out.append(SweepSessions(now))
                if c.sweep_interval_s is not None:
                    timers.push(now + c.sweep_interval_s, SWEEP)
        return out

    def _deadline(self, ticket: Ticket) -> None:
        """A ticket's deadline timer: placed now (``on_ready`` called by :meth:`_leave`) or
        refused (``on_ready`` called with ``ticket.error`` set); nothing if it left already."""
        refused = self.withdraw(ticket)
        if refused is not None:
            ticket.error = refused
            ticket.on_ready(ticket)
