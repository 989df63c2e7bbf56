"""Router-side admission: a bounded FIFO wait queue in front of placement.

A policy may hold a request back (:meth:`sessionroute.router.policies.Policy.admit` returns
False, e.g. every replica is past its KV-cache knee). The request then waits here, in arrival
order, instead of being sent to a replica that would preempt; it is placed as soon as the
policy admits it, which the router core checks whenever the verdict may have changed (a request
completed, a session was released or expired, a worker came back, engine gauges were scraped,
any request arrived: :meth:`sessionroute.router.RoutingCore.pump`). The queue is scanned oldest
first and a ticket the policy still holds does not block a later one it admits (a policy that
holds one session's next turn lets other sessions' turns pass); for a policy whose verdict does
not depend on the request, that is strict arrival order. A request that finds
``admission_max_waiting`` requests already waiting is refused (HTTP 503 live); one that waits
longer than ``admission_max_wait_s`` is refused too, unless the policy says it is placed anyway
(:attr:`~sessionroute.router.policies.Policy.places_at_max_wait`); for such a policy a full
queue places its longest-waiting request to make room instead of refusing. A policy may also exempt
requests from admission altogether
(:meth:`~sessionroute.router.policies.Policy.admission_applies`): those are routed at once and
never wait behind held ones.

Pure and clock-free: the queue's deadlines and re-checks are timers of the router core's
(:mod:`sessionroute.router.admitting`), which the drivers run at their own clock; a driver
only waits for the ticket's ``on_ready`` callback (``serve`` on a future, the simulator on its
event queue).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sessionroute.types import RouteRequest

if TYPE_CHECKING:
    from sessionroute.router.core import Reservation

__all__ = ["AdmissionQueue", "Ticket"]


@dataclass(eq=False, slots=True)
class Ticket:
    """A request waiting for admission.

    Attributes:
        request: the request.
        on_ready: called once, synchronously, when the ticket leaves the queue (placed or
            failed); never called for a withdrawn ticket.
        reservation: set when the request was admitted and placed.
        error: set when it was admitted but could not be placed (no worker available).
        waiting: True while it is in the queue.
        context: the driver's own data.
        since: the router clock's time (seconds) when it started waiting.
    """

    request: RouteRequest
    on_ready: Callable[[Ticket], None]
    reservation: Reservation | None = None
    error: Exception | None = None
    waiting: bool = True
    context: Any = field(default=None)
    since: float = 0.0


class AdmissionQueue:
    """The FIFO of waiting tickets.

    Args:
        max_waiting: most tickets that may wait at once (0: none).
    """

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.waiting: deque[Ticket] = deque()
        """The waiting tickets, oldest first (read it, never change it: the methods below
        do). Its truth value says whether any wait without a Python call (the router core
        asks on every placement and release)."""
        self.admitted_after_wait = 0
        """Tickets that waited and were then placed (counted by the router core)."""
        self.refused_full = 0
        """Requests refused because the queue was full."""
        self.placed_when_full = 0
        """Tickets placed before their deadline to make room in a full queue, the oldest first,
        for a policy that places at its maximum wait (also counted in ``admitted_after_wait``;
        with ``max_waiting`` 0, requests placed at once, as after a wait of 0 s)."""
        self.refused_timeout = 0
        """Tickets withdrawn after their deadline."""
        self.placed_at_deadline = 0
        """Tickets placed anyway at their deadline (policies that place at the maximum wait;
        also counted in ``admitted_after_wait``)."""
        self.wait_s_total = 0.0
        """Seconds waited by every ticket that left the queue placed (the sum)."""

    def __len__(self) -> int:
        return len(self.waiting)

    def has_room(self) -> bool:
        """Whether one more ticket may wait."""
        return len(self.waiting) < self.max_waiting

    def push(self, ticket: Ticket) -> None:
        """Append ``ticket`` (the caller checked :meth:`has_room`)."""
        self.waiting.append(ticket)

    def tickets(self) -> list[Ticket]:
        """The waiting tickets, oldest first (a copy: safe to :meth:`take` from while
        iterating)."""
        return list(self.waiting)

    def take(self, ticket: Ticket) -> None:
        """Remove a waiting ``ticket`` that is being placed (ValueError if not waiting)."""
        self.waiting.remove(ticket)
        ticket.waiting = False

    def head(self) -> Ticket | None:
        """The longest-waiting ticket, or None."""
        return self.waiting[0] if self.waiting else None

    def pop(self) -> Ticket:
        """Remove and return the head (IndexError when empty)."""
        ticket = self.waiting.popleft()
        ticket.waiting = False
        return ticket

    def withdraw(self, ticket: Ticket) -> bool:
        """Remove a waiting ticket (deadline passed, or its client went away); False if it
        had already left the queue."""
        if not ticket.waiting:
            return False
        self.waiting.remove(ticket)
        ticket.waiting = False
        return True
