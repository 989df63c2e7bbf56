"""Proxying one generation request: route, forward, retry, relay, release.

Every routing decision is the router core's (:class:`~sessionroute.router.RoutingCore`): the
policy's request is built by ``core.requests`` (session id, size estimate, content keys),
placed by ``core.place`` (admission, select + reserve); each attempt's outcome goes to the
core (``attempt_failed``, ``attempt_answered``, ``answer_broke``), which says retry after a
wait (then ``next_attempt``), relay, or refuse with a status, and gives the first-byte
deadline (``first_byte_timeout_s``). This module does the I/O around them for requests that
wait (for a
connection, an admission ticket, a shared session table, a streamed or large answer, a
retry); the common case runs from protocol callbacks in :mod:`sessionroute.serve.inline`,
which hands over to the coroutines here where it must wait. The body is read once (as the pieces
it arrived in), parsed and checked before placement under every policy
(:mod:`sessionroute.router.validate`: 415, 400, nothing pinned), and forwarded as received,
never re-serialized. Each attempt is an :class:`~sessionroute.serve.exchange.Exchange` on a
connection of the :class:`~sessionroute.serve.upstream.UpstreamPool`, with the client's
headers forwarded as the raw bytes it sent. Responses with a known length up to
:data:`~sessionroute.serve.messages.BUFFER_LIMIT` bytes are relayed in one write; everything
else (server-sent event streams in particular) is relayed chunk by chunk as it arrives,
written straight to the client connection (:class:`~sessionroute.serve.http1.Connection`)
with its flow control. The bytes written either way, and the router's own error answers,
come from :mod:`sessionroute.serve.messages` (shared with the inline path).
Retries happen only before the first byte of a response is sent to the client.
The policy's reservation is released exactly once on every path (``try/finally``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.actions import Refuse, Retry
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.retry import AttemptFailure
from sessionroute.serve.exchange import Exchange
from sessionroute.serve.http1 import Connection, Request
from sessionroute.serve.messages import (
    refusal,
    refuse,
    relay_headers,
    relay_whole,
    relayed_whole,
    timed_out,
    upstream_request,
)
from sessionroute.serve.metrics_admission import wait_line
from sessionroute.serve.router import Router
from sessionroute.serve.upstream import UpstreamConnectError, UpstreamError, UpstreamHung
from sessionroute.types import RouteRequest

__all__ = ["forward_placed", "place_and_forward", "wake_ticket"]

log = logging.getLogger("sessionroute.serve")


async def place_and_forward(
    conn: Connection,
    req: Request,
    router: Router,
    route_req: RouteRequest,
    raw_rid: bytes,
    placed: Reservation | Ticket | None = None,
) -> None:
    """Place a validated request (or wait for the admission ticket ``placed``), forward it
    and release it: the part of :class:`sessionroute.serve.inline.InlineProxy` that waits.

    Answers 503 when no worker is available and 429/503 when admission refuses it (see
    :func:`sessionroute.serve.errors.error_for_exception`).
    """
    core = router.core
    t0 = time.perf_counter()
    state = router.state
    try:
        if placed is None:
            if state is not None:
                await state.load(route_req)
            placed = core.place(route_req, wake_ticket)
        if isinstance(placed, Ticket):
            ticket = placed
            try:
                placed = await _admitted(core, ticket)
            finally:
                router.metrics.admission.observe(ticket, core.clock.now())
        if state is not None:
            placed = await state.commit(placed)
    except (NoWorkerAvailable, AdmissionRefused) as exc:
        refuse(conn, exc, raw_rid)
        return
    router.metrics.observe_routing(t0, time.perf_counter())
    await forward_placed(conn, req, router, placed, raw_rid)


async def forward_placed(
    conn: Connection,
    req: Request,
    router: Router,
    reservation: Reservation,
    raw_rid: bytes,
    first: Exchange | None = None,
) -> None:
    """Forward a placed request, with retries, relay its answer and release it (exactly
    once). ``first``: an exchange already sent by the inline path, continued here."""
    holder = [reservation]
    try:
        await _forward(conn, req, router, holder, raw_rid, first)
    finally:
        router.core.complete(holder[0])


def wake_ticket(ticket: Ticket) -> None:
    """A ticket left the admission queue: wake the request waiting on it (if it waits yet)."""
    fut: asyncio.Future[None] | None = ticket.context
    if fut is not None and not fut.done():
        fut.set_result(None)


async def _admitted(core: RoutingCore, ticket: Ticket) -> Reservation:
    """Wait for a held request to leave the admission queue: placed, or refused at its
    deadline (the core's timers decide when).

    Raises:
        AdmissionRefused: it waited too long. NoWorkerAvailable: admitted with no worker.
    """
    if ticket.waiting:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket.context = fut
        try:
            await fut
        except asyncio.CancelledError:
            core.cancel_ticket(ticket)
            raise
    if ticket.error is not None:
        raise ticket.error
    if ticket.reservation is None:  # pragma: no cover - a ticket leaves placed or failed
        raise RuntimeError("admission ticket left the queue without a result")
    return ticket.reservation


async def _forward(
    conn: Connection,
    req: Request,
    router: Router,
    holder: list[Reservation],
    rid: bytes,
    first: Exchange | None,
) -> None:
    """Send attempts until one is answered or the core refuses: every failure and answer goes
    to the core (``attempt_failed`` / ``attempt_answered``), which says retry after a wait or
    refuse with a status; this function only does the I/O and the waiting."""
    core = router.core
    metrics = router.metrics
    pool = router.upstream
    first_byte_s = core.first_byte_timeout_s(holder[0].request)  # None: no such deadline
    task = conn.task  # not asyncio.current_task(): it costs a getpid() syscall
    if task is None:
        raise RuntimeError("a proxied request must run on its connection's task")
    if first is not None:
        first.attach(task)
    attempt = 0
    while True:
        attempt += 1
        res = holder[0]
        worker = res.worker
        timer = None
        if first is not None:  # sent by the inline path: wait for its answer here
            ex = first
            first = None
        else:
            ex = Exchange(pool, worker, task)
        if first_byte_s is not None and not ex.status:  # a hung worker sends no head
            timer = task.get_loop().call_later(
                first_byte_s, ex.hang, f"no response head within {first_byte_s:g} s"
            )
        action: Retry | Refuse | None
        answered = False  # a retried answer's body is drained to keep its connection
        try:
            try:
                if ex.sent_at:
                    status = await ex.head()
                else:
                    status = await ex.send(upstream_request(router, req, worker))
            except UpstreamConnectError as exc:
                last_error = f"{worker}: {type(exc).__name__}: {exc}"
                action = core.attempt_failed(res, AttemptFailure.CONNECT, attempt, last_error)
            except UpstreamHung as exc:  # given up: unavailable now, so the retry re-places
                last_error = f"{worker}: {exc}"
                action = core.attempt_failed(res, AttemptFailure.HUNG, attempt, last_error)
            except UpstreamError as exc:  # reset, disconnect, malformed response
                last_error = f"{worker}: {type(exc).__name__}: {exc}"
                failure = AttemptFailure.SENT if ex.sent_all else AttemptFailure.UNSENT
                action = core.attempt_failed(res, failure, attempt, last_error)
            except asyncio.CancelledError:
                if not ex.is_timeout():
                    metrics.count_request(worker, 499)  # the client went away (or shutdown)
                    raise
                last_error = timed_out(router, worker)
                action = core.attempt_failed(res, AttemptFailure.TIMEOUT, attempt, last_error)
            else:
                metrics.observe_upstream(worker, ex.sent_at, time.perf_counter())
                action = core.attempt_answered(res, status, attempt)
                answered = True
                last_error = f"{worker}: status {status}"
            finally:
                if timer is not None:
                    timer.cancel()
            if action is None:  # relay this answer
                if res.waited_s:  # it waited in the admission queue: say how long
                    ex.relay_lines.append(wait_line(res.waited_s))
                if await _relay(conn, router, ex, res, rid, req.arrived):
                    return
                last_error = f"{worker}: given up as hung while its answer was arriving"
                action = core.attempt_failed(res, AttemptFailure.HUNG, attempt, last_error)
            elif answered and not await _drain(ex):
                last_error = timed_out(router, worker, reading=True)
                action = core.attempt_failed(res, AttemptFailure.TIMEOUT, attempt, last_error)
        finally:
            ex.close()
        if isinstance(action, Refuse):
            metrics.count_request(worker, action.status)
            refusal(conn, action, rid)
            return
        metrics.count_retry(worker)
        if action.after_s:
            await asyncio.sleep(action.after_s)
        placed = core.next_attempt(res, last_error)
        if isinstance(placed, Refuse):
            refusal(conn, placed, rid)
            return
        holder[0] = placed
        if router.state is not None:  # a moved session: tell the shared table
            holder[0] = await router.state.commit(placed)


_DRAIN_MAX_BYTES = 65536
"""Largest retried error body (bytes) read to keep its connection; a larger one, or one whose
length is not given, closes the connection instead."""


async def _drain(ex: Exchange) -> bool:
    """Read a retried error body so the connection can be reused; False on timeout.

    Only a body known to be small is read (see ``_DRAIN_MAX_BYTES``): a large, chunked or
    close-delimited one is left unread and :meth:`Exchange.close` closes its connection, so a
    worker streaming an endless error body cannot hold the retry back.
    """
    # the declared Content-Length (the parser took it from the head; llhttp refuses a
    # malformed or repeated one)
    if not ex.complete and (ex.length is None or ex.length > _DRAIN_MAX_BYTES):
        return True
    try:
        await ex.read()
    except UpstreamError:
        pass
    except asyncio.CancelledError:
        if not ex.is_timeout():
            raise
        return False
    return True


async def _relay(
    conn: Connection, router: Router, ex: Exchange, res: Reservation, rid: bytes, arrived: float
) -> bool:
    """Relay the answer; False when the worker was given up as hung before any byte of it
    reached the client (the caller places the request again). An answer that breaks after
    its head goes to the core (``answer_broke``): its error is written when nothing was yet,
    else the client's stream is cut. ``arrived``: when a streamed request was complete at the
    router (0.0: not streamed), for its time to first token."""
    status = ex.status
    worker = ex.worker
    metrics = router.metrics
    core = router.core
    try:
        if relayed_whole(ex):
            try:
                data = ex.body() if ex.complete else await ex.read()
            except UpstreamHung:
                return False
            except UpstreamError as exc:
                action = core.answer_broke(res, AttemptFailure.SENT, str(exc))
            except asyncio.CancelledError:
                if not ex.is_timeout():
                    raise
                detail = timed_out(router, worker, reading=True)
                action = core.answer_broke(res, AttemptFailure.TIMEOUT, detail)
            else:
                metrics.count_request(worker, status)
                relay_whole(conn, router, ex, rid, data)
                return True
            metrics.count_request(worker, action.status)
            refusal(conn, action, rid)
            return True
        conn.start_response(status, relay_headers(router, ex, rid), ex.length)
        if arrived:
            ex.timing = metrics.stream.timer(worker, arrived)
        try:
            await ex.relay(conn)  # written piece by piece as it arrives
        except (UpstreamError, asyncio.CancelledError) as exc:
            if isinstance(exc, UpstreamError):
                failure, detail = AttemptFailure.SENT, str(exc)
            elif ex.is_timeout():
                failure, detail = AttemptFailure.TIMEOUT, timed_out(router, worker, reading=True)
            else:
                raise
            action = core.answer_broke(res, failure, detail, started=True)
            log.warning("upstream %s failed mid-response: %r", worker, exc)
            metrics.count_request(worker, action.status)
            conn.abort()  # no terminating chunk: the client sees truncation
            return True
        conn.end_response()
        metrics.count_request(worker, status)
        return True
    except asyncio.CancelledError:
        metrics.count_request(worker, 499)
        raise
