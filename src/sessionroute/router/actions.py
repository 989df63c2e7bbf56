"""What the router core tells a driver to do, and the core's timers.

The core is sans-I/O, the way ``h11`` is: a driver feeds it events (a request arrived, an
attempt failed or was answered, a health check came back, time passed) and the core answers
with what to do. A driver only interprets the answers, with its own I/O and its own clock
(``serve``: sockets and asyncio timers; the simulator: replicas and its event queue):

* a :class:`~sessionroute.router.core.Reservation`: send the request to its ``worker``;
* a :class:`~sessionroute.router.admission.Ticket`: hold it; the ticket's ``on_ready`` is
  called once, later, placed or refused;
* :class:`Retry`: wait ``after_s`` seconds, then ask
  :meth:`~sessionroute.router.core.RoutingCore.next_attempt`;
* :class:`Refuse`: answer the client with ``status`` (the reservation is already released);
* :class:`CheckHealth`: probe these workers now and feed each result to
  :meth:`~sessionroute.router.core.RoutingCore.observe_check`;
* :class:`SweepSessions`: expire idle sessions now (a driver on an event loop in chunks);
* :class:`WorkerLost`: a worker turned unhealthy: act on each request in flight there as
  :meth:`~sessionroute.router.core.RoutingCore.on_worker_lost` says.

The core's own timers (:class:`Timers`) hold what is due later: circuits turning half-open,
admission deadlines and re-checks, health-check rounds and session sweeps. A driver keeps one
timer armed at :meth:`~sessionroute.router.core.RoutingCore.next_deadline` and calls
:meth:`~sessionroute.router.core.RoutingCore.on_timer` when it fires.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from sessionroute.router.core import Reservation

__all__ = [
    "CIRCUIT",
    "DEADLINE",
    "HEALTH",
    "RECHECK",
    "SICK_RECHECK",
    "SWEEP",
    "WORK_KINDS",
    "CheckHealth",
    "Refuse",
    "Retry",
    "SweepSessions",
    "Timers",
    "WorkerLost",
]


@dataclass(frozen=True, slots=True)
class Retry:
    """Try the request again after ``after_s`` seconds (then call
    :meth:`~sessionroute.router.core.RoutingCore.next_attempt` with ``reservation``)."""

    reservation: Reservation
    after_s: float


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the client with a JSON error: ``status``, ``code`` and ``message`` (OpenAI's
    error shape). The request's reservation, if it had one, is already released."""

    status: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class CheckHealth:
    """Probe ``urls`` now (every worker at a round, the unhealthy ones between rounds)."""

    urls: tuple[str, ...]
    round: bool


@dataclass(frozen=True, slots=True)
class SweepSessions:
    """Expire the sessions idle at ``now`` (the router's periodic sweep)."""

    now: float


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """``url`` turned unhealthy (``reason``): each request in flight there is re-placed if
    nothing of its answer reached the client, or watched and ended after ``quiet_s`` seconds
    without a byte (:meth:`~sessionroute.router.core.RoutingCore.on_worker_lost`)."""

    url: str
    reason: str
    quiet_s: float


CIRCUIT: Final = 0
"""Timer kind: a worker's open circuit turns half-open (subject: the url)."""
DEADLINE: Final = 1
"""Timer kind: an admission ticket's deadline (subject: the ticket)."""
RECHECK: Final = 2
"""Timer kind: re-ask the policy about waiting tickets (subject: None)."""
HEALTH: Final = 3
"""Timer kind: a health-check round of every worker (subject: None)."""
SICK_RECHECK: Final = 4
"""Timer kind: an extra check of the unhealthy workers between rounds (subject: None)."""
SWEEP: Final = 5
"""Timer kind: the periodic sweep of idle sessions (subject: None)."""


WORK_KINDS: Final = frozenset({CIRCUIT, DEADLINE, RECHECK})
"""Timer kinds that stand for pending work (a request waits on them, or a worker's
availability changes); the others (health rounds, sweeps) recur for as long as the router
runs, so a simulation that has only those left is over."""


class Timers:
    """The core's timers: a heap of ``(due, seq, kind, subject)``, cancelled lazily (the
    handler of a kind checks that its subject still needs it).

    Attributes:
        on_push: called with ``(due, kind)`` after each push, or None; a driver re-arms its
            one timer when ``due`` is earlier than the one armed.
        work: timers of :data:`WORK_KINDS` set now.
    """

    __slots__ = ("_heap", "_seq", "on_push", "work")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.on_push: Callable[[float, int], None] | None = None
        self.work = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due: float, kind: int, subject: Any = None) -> None:
        """Add a timer at time ``due`` (the core's clock, seconds)."""
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, kind, subject))
        if kind in WORK_KINDS:
            self.work += 1
        if self.on_push is not None:
            self.on_push(due, kind)

    def next_due(self) -> float | None:
        """The earliest due time, or None when no timer is set."""
        heap = self._heap
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> tuple[int, Any] | None:
        """Remove and return ``(kind, subject)`` of the earliest timer due at ``now``, or None."""
        heap = self._heap
        if not heap or heap[0][0] > now:
            return None
        _, _, kind, subject = heapq.heappop(heap)
        if kind in WORK_KINDS:
            self.work -= 1
        return kind, subject
