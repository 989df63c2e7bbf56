"""Admission in the router core: placing a request now or holding it in the admission queue
(:class:`AdmissionControl`, a base of :class:`~sessionroute.router.core.RoutingCore`; the
queue and its tickets are :mod:`sessionroute.router.admission`'s, the rate limit
:mod:`sessionroute.router.ratelimit`'s).

A held request's ticket is placed when the policy admits it (:meth:`AdmissionControl.pump`,
run whenever a verdict may have changed), or at its deadline placed or refused
(:meth:`AdmissionControl.withdraw`); both the deadline and the periodic re-check while tickets
wait are timers of the core's (:mod:`sessionroute.router.actions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.actions import DEADLINE, RECHECK
from sessionroute.router.admission import Ticket
from sessionroute.router.coreparts import CoreParts
from sessionroute.types import RouteRequest

if TYPE_CHECKING:
    from sessionroute.router.core import Reservation


__all__ = ["AdmissionControl"]


class AdmissionControl(CoreParts):
    """Placement through admission (module docstring); the core's attributes it reads are
    set by :class:`~sessionroute.router.core.RoutingCore`."""

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

        With the queue full, a request held back is refused, unless the policy places at its
        maximum wait (:attr:`~sessionroute.router.policies.Policy.places_at_max_wait`): then
        its holds end in a placement anyway, and the longest-waiting request is placed now to
        make room (in an open-loop overload the wait is then bounded by the time the queue
        takes to fill, not by the maximum wait alone).

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
        if not self.admission.has_room() and limiter is None and policy.places_at_max_wait:
            queue = self.admission
            oldest = queue.head()  # its hold ends in a placement: now, not later
            if oldest is None:  # none may wait: placed at once, as if after a wait of 0 s
                reservation = self.route(request)
                queue.admitted_after_wait += 1
                queue.placed_when_full += 1
                return reservation
            queue.take(oldest)
            self._leave(oldest)
            if oldest.reservation is not None:
                queue.placed_when_full += 1
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
        policy's ``admission_recheck_s``; None: no verdict depends on the clock).

        The rate limit's refill is not waited for: a request queued for a token is served by
        one a completing request gives back (:meth:`complete`), or at the next arrival (oldest
        first), else refused at its deadline (408), as vllm-router's queue behaves (its
        integration test ``test_rate_limit_queue_and_timeout``: C=1, R=1/s, one 2 s request
        in flight, the queued one gets 408 at ``--queue-timeout-secs`` 1)."""
        return self.policy.admission_recheck_s

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
