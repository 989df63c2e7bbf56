"""The simulated clients' requests through the router core, in virtual time.

:class:`Dispatcher` does for the simulator what ``serve``'s proxy does over HTTP, and decides
nothing itself: the policy's request comes from ``core.requests.from_turn``, placement and
admission from ``core.place``, the router's retries from ``core.retry`` and
``core.retarget``, worker availability from ``core.record_failure`` /
``core.record_unreachable``. It owns only time: the admission deadline, the retry backoffs,
and the client's own retries when the router gives up (502) or has no worker (503), after the
OpenAI SDK's backoff (``RouterSection.client_retry_*``), so that no turn is lost.
"""

from __future__ import annotations

from collections.abc import Callable

from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.sim.events import PRIO_ARRIVAL, PRIO_TIMER, EventQueue
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
        self._recheck_pending = False

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
        if isinstance(placed, Ticket):
            placed.context = req
            req.ticket = placed
            req.state = ADMISSION
            deadline = self.queue.now() + core.admission_max_wait_s()
            self.queue.push(deadline, PRIO_TIMER, self._admission_deadline, placed)
            self._schedule_recheck()
            return
        self._send(req, placed)

    def attempt_failed(self, req: InFlight, *, refused: bool) -> None:
        """The attempt's replica refused the connection (``refused``) or broke mid-request:
        the router's retry decision, as the live proxy takes it."""
        core = self.core
        res = req.res
        if res is None:  # pragma: no cover - an attempt always has a reservation
            raise RuntimeError(f"attempt {req.rid} failed without a reservation")
        url = res.worker
        if refused:
            reopen_s = core.record_unreachable(url, "connection refused (replica down)")
        else:
            reopen_s = core.record_failure(url)
        if reopen_s is not None:  # its circuit opened: look again when it turns half-open
            self.queue.push(self.queue.now() + reopen_s, PRIO_TIMER, self._refresh, url)
        wait_s = core.retry.after_failure(req.attempt, core.cluster.is_healthy(url))
        if wait_s is None:  # the router gives up (502): the client sends the turn again
            core.complete(res)
            self._client_retry(req)
            return
        self.counts["requests_retried"] += 1
        req.state = BACKOFF
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

    def _schedule_recheck(self) -> None:
        """While tickets wait, re-ask the policy every ``core.admission_recheck_s`` of
        virtual time (a verdict that changes with time alone: a maximum pause)."""
        every = self.core.admission_recheck_s
        if every is None or self._recheck_pending:
            return
        self._recheck_pending = True
        self.queue.push(self.queue.now() + every, PRIO_TIMER, self._recheck, None)

    def _recheck(self, _: object) -> None:
        self._recheck_pending = False
        self.core.recheck()
        if self.core.admission.waiting:
            self._schedule_recheck()

    def _admission_deadline(self, ticket: Ticket) -> None:
        if self.core.withdraw(ticket) is not None:
            req: InFlight = ticket.context
            if req.state == ADMISSION:
                self._refused(req)

    def _refresh(self, url: str) -> None:
        """A worker's open circuit turned half-open: push its availability to the router
        (and look again a millisecond after it is due if rounding left it open)."""
        core = self.core
        core.refresh(url)
        remaining = core.reopens_in(url)
        if remaining is not None:
            self.queue.push(self.queue.now() + remaining + 1e-3, PRIO_TIMER, self._refresh, url)

    def _retry(self, req: InFlight) -> None:
        """The router's next attempt: the same worker while available, else placed again."""
        if req.state != BACKOFF or req.res is None:
            return
        try:
            res = self.core.retarget(req.res)
        except NoWorkerAvailable:
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
