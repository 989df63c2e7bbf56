"""The simulated clients' requests through the router core, in virtual time.

:class:`Dispatcher` does for the simulator what ``serve``'s proxy does over HTTP, and decides
nothing itself: the policy's request comes from ``core.requests.from_turn``, placement and
admission from ``core.place`` (a held ticket is placed or refused by the core's own timers),
and every failed attempt goes to ``core.attempt_failed``, which says retry after a wait
(:class:`~sessionroute.router.actions.Retry`) or refuse
(:class:`~sessionroute.router.actions.Refuse`), exactly as for the live proxy. It interprets
those answers on the event queue, and plays the client: its own retries when the router
refuses (502, 503), after the OpenAI SDK's backoff (``RouterSection.client_retry_*``), so
that no turn is lost.
"""

from __future__ import annotations

from collections.abc import Callable

from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.actions import Refuse
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.retry import AttemptFailure
from sessionroute.sim.events import PRIO_ARRIVAL, EventQueue
from sessionroute.sim.inflight import ADMISSION, BACKOFF, ROUTED, InFlight
from sessionroute.sim.spec import RouterSection

__all__ = ["Dispatcher"]


class Dispatcher:
    """Places, retries and re-sends simulated requests through ``core``.

    Args:
        queue: the simulation's event queue (its clock is the policy's).
        core: the router core.
        router: router and client settings.
        counts: the recorder's counters (``requests_retried``, ``no_worker_available``).
        send: sends a placed attempt to its replica (the simulation's, which also counts
            session moves and schedules the arrival).
        block_size: tokens per KV block of the turns' keys.
    """

    def __init__(
        self,
        queue: EventQueue,
        core: RoutingCore,
        router: RouterSection,
        counts: dict[str, int],
        send: Callable[[InFlight, Reservation], None],
        block_size: int,
    ) -> None:
        self.queue = queue
        self.core = core
        self.router = router
        self.counts = counts
        self._send = send
        self._block_size = block_size
        self._send_header = router.send_session_header

    def route(self, req: InFlight) -> None:
        """The client sends the turn: the router builds its request and places it."""
        turn = req.turn
        req.attempt = 1
        req.tries += 1
        rid = f"{req.handle}.{req.tries}"
        core = self.core
        rr = core.requests.from_turn(
            turn.session_id if self._send_header else None,
            turn.prompt_len,
            req.keys,
            self._block_size,
            rid,
            turn.cache_salt,
        )
        req.rid = rid
        try:
            placed = core.place(rr, self._ticket_ready)
        except (NoWorkerAvailable, AdmissionRefused):
            self._refused(req)
            return
        if isinstance(placed, Ticket):  # held: the core places or refuses it later
            placed.context = req
            req.ticket = placed
            req.state = ADMISSION
            return
        self._send(req, placed)

    def attempt_failed(self, req: InFlight, failure: AttemptFailure, detail: str) -> None:
        """The attempt failed before its answer reached the client (its replica refused the
        connection, broke mid-request, or was given up as hung): the router core decides."""
        res = req.res
        if res is None:  # pragma: no cover - an attempt always has a reservation
            raise RuntimeError(f"attempt {req.rid} failed without a reservation")
        action = self.core.attempt_failed(res, failure, req.attempt, detail)
        if isinstance(action, Refuse):  # the router answers 502: the client sends it again
            self._client_retry(req)
            return
        self.counts["requests_retried"] += 1
        req.state = BACKOFF
        wait_s = action.after_s
        if wait_s > 0:
            self.queue.push(self.queue.now() + wait_s, PRIO_ARRIVAL, self._retry, req)
        else:
            self._retry(req)

    def cancel(self, req: InFlight) -> None:
        """The workload cancelled ``req`` while it waited at the router (placed and
        travelling, backing off, or queued for admission): release what it holds."""
        if req.state in (ROUTED, BACKOFF) and req.res is not None:
            self.core.complete(req.res)
        elif req.state == ADMISSION and req.ticket is not None:
            self.core.cancel_ticket(req.ticket)

    # -- events -----------------------------------------------------------------------------
    def _ticket_ready(self, ticket: Ticket) -> None:
        self.queue.push(self.queue.now(), PRIO_ARRIVAL, self._admitted, ticket)

    def _admitted(self, ticket: Ticket) -> None:
        req: InFlight = ticket.context
        req.ticket = None
        res = ticket.reservation
        if req.state != ADMISSION:  # cancelled while it waited
            if res is not None:
                self.core.complete(res)
            return
        if res is None:
            self._refused(req)
        else:
            self._send(req, res)

    def _retry(self, req: InFlight) -> None:
        """The router's next attempt: the same worker while available, else placed again."""
        if req.state != BACKOFF or req.res is None:
            return
        res = self.core.next_attempt(req.res, "")
        if isinstance(res, Refuse):
            self._refused(req)
            return
        req.attempt += 1
        req.tries += 1
        req.rid = f"{req.handle}.{req.tries}"
        self._send(req, res)

    def _refused(self, req: InFlight) -> None:
        """The router answered 503 (no worker available, or admission refused)."""
        self.counts["no_worker_available"] += 1
        self._client_retry(req)

    def _client_retry(self, req: InFlight) -> None:
        """The client sends the turn again after the OpenAI SDK's backoff."""
        r = self.router
        req.client_tries += 1
        wait = min(
            r.client_retry_max_backoff_s,
            r.client_retry_backoff_s * 2.0 ** (req.client_tries - 1),
        )
        req.res = None
        req.state = BACKOFF
        self.queue.push(self.queue.now() + wait, PRIO_ARRIVAL, self._resend, req)

    def _resend(self, req: InFlight) -> None:
        if req.state == BACKOFF and req.res is None:
            self.counts["requests_retried"] += 1
            self.route(req)
