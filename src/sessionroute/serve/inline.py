"""The entry of a proxied request, and its common case driven from protocol callbacks.

:class:`InlineProxy` answers a proxied request: it checks what can be checked from the head
(413 by ``Content-Length``, 415), and its common case runs with no task and no future:

1. the client's body completes (:meth:`InlineProxy.ready`, from the listener's parser
   callback): the body is validated and the request built (one parse,
   :meth:`~sessionroute.router.requests.RequestBuilder.from_http`: 400 before anything is
   pinned), placed (``core.place``) and written to an idle pooled worker connection;
2. the worker's answer arrives (:meth:`InlineProxy._answer`, the exchange's ``inline``
   callback, told once the read that brought the answer is parsed): a complete, final
   response of a known length up to :data:`~sessionroute.serve.messages.BUFFER_LIMIT` is
   relayed in one write, the exchange and the reservation are released, and the listener
   goes on to the next request.

A request that must wait is handed to the connection's task
(:meth:`~sessionroute.serve.http1.Connection.hand_over`) at the point it got to, and
:mod:`sessionroute.serve.proxy`'s coroutines do the rest exactly as for any request: a shared
session table (``--state-url``), an admission ticket, a stream with a first-byte timeout, no
idle connection to the worker (connecting), and, once sent, anything but a complete simple
answer (a head without its body yet, a streamed or large body, a retryable status, an error,
a worker given up as hung: retries and relays are theirs). A deadline that passes while the
exchange is driven by callbacks is answered here with the coroutine's 504, and a client that
goes away releases the reservation here (counted as 499). Both paths write their answers
with :mod:`sessionroute.serve.messages`.

Why callbacks: the two task wake-ups a coroutine costs per request (the connection's task
for the request, the exchange's future for the answer) and the coroutine frames around them
are a large share of the router's CPU on a small request.
"""

from __future__ import annotations

import time

from sessionroute.errors import AdmissionRefused, MalformedRequest, NoWorkerAvailable
from sessionroute.router.actions import Refuse
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.retry import AttemptFailure
from sessionroute.router.validate import InvalidJSON, UnsupportedMediaType, check_media_type
from sessionroute.serve.exchange import Exchange
from sessionroute.serve.http1 import Connection, Inline, Request
from sessionroute.serve.messages import (
    error,
    refusal,
    refuse,
    relay_whole,
    relayed_whole,
    timed_out,
    too_large,
    upstream_request,
)
from sessionroute.serve.proxy import forward_placed, place_and_forward, wake_ticket
from sessionroute.serve.router import Router
from sessionroute.serve.upstream import UpstreamError

__all__ = ["InlineProxy"]


class InlineProxy(Inline):
    """One POST to a generation route (headers complete; the body may be arriving), while
    protocol callbacks drive it (module docstring).

    Without waiting for the body (once the read that brought the head is parsed, as
    vllm-router): 413 for a ``Content-Length`` over ``--max-payload-size``, 415 without a
    JSON ``Content-Type``. Once the body is complete: 413 for a body over the limit, 400 for
    a body or session id that fails :mod:`sessionroute.router.validate` (checked for every
    policy, before placement), 503 when no worker is available, 502 when every attempt
    failed, 504 on upstream timeout; upstream error responses pass through.

    Args:
        conn: the client connection.
        req: the request (headers complete).
        router: the router.
    """

    __slots__ = ("_checked", "_conn", "_ex", "_raw_rid", "_req", "_res", "_rid", "_router")

    def __init__(self, conn: Connection, req: Request, router: Router) -> None:
        self._conn = conn
        self._req = req
        self._router = router
        lower = req.lower
        for name in router.request_id_names:
            raw_rid = lower.get(name)
            if raw_rid:
                rid = raw_rid.decode("utf-8", "replace")  # policies hash it: no lone surrogates
                break
        else:
            rid = router.new_request_id(req.path)
            raw_rid = rid.encode()
        self._rid = rid
        self._raw_rid = raw_rid
        self._res: Reservation | None = None
        self._ex: Exchange | None = None
        # a head that needs no answer (the common case) is checked now; any other is
        # answered by waiting(), once the read that brought it is parsed
        self._checked = not req.too_large and lower.get(b"content-type") == b"application/json"

    def waiting(self) -> bool:
        """The checks of the head alone: 413 by ``Content-Length``, 415."""
        if self._checked:
            return True
        self._checked = True
        conn = self._conn
        req = self._req
        if req.too_large:  # a Content-Length over the limit: 413 first, as vllm-router
            too_large(conn, req, self._router.settings.max_payload_size, self._raw_rid)
            return False
        ctype = req.lower.get(b"content-type")
        if ctype != b"application/json":
            try:
                check_media_type(ctype)
            except UnsupportedMediaType as exc:
                keep = req.complete
                error(conn, 415, str(exc), "unsupported_media_type", self._raw_rid, keep=keep)
                return False
        return True

    def ready(self) -> bool:
        """The body is complete (or over the limit, or broken): validate, place, send."""
        conn = self._conn
        req = self._req
        router = self._router
        raw_rid = self._raw_rid
        if not self._checked and not self.waiting():
            return False
        if not req.complete or req.too_large:  # (a broken body was answered by the listener)
            too_large(conn, req, router.settings.max_payload_size, raw_rid)
            return False
        core = router.core
        parts = req.parts
        try:
            route_req = core.requests.from_http(req.lower, parts, req.size, self._rid, req.path)
        except MalformedRequest as exc:
            code = "malformed_json" if isinstance(exc, InvalidJSON) else "invalid_request"
            error(conn, 400, str(exc), code, raw_rid)
            return False
        t0 = time.perf_counter()
        if route_req.stream:
            req.arrived = t0  # its time to first token starts here (serve/metrics_stream.py)
        if router.state is not None or core.first_byte_timeout_s(route_req) is not None:
            conn.hand_over(place_and_forward(conn, req, router, route_req, raw_rid))
            return True
        try:
            placed = core.place(route_req, wake_ticket)
        except (NoWorkerAvailable, AdmissionRefused) as exc:
            refuse(conn, exc, raw_rid)
            return False
        if isinstance(placed, Ticket):
            conn.hand_over(place_and_forward(conn, req, router, route_req, raw_rid, placed))
            return True
        router.metrics.observe_routing(t0, time.perf_counter())
        worker = placed.worker
        ex = Exchange(router.upstream, worker, None, self._answer)
        try:
            sent = ex.send_idle(upstream_request(router, req, worker))
        except UpstreamError:  # (an idle connection is checked first: not expected)
            sent = False
        if not sent:  # connecting waits: the coroutine does it all
            ex.close()
            conn.hand_over(forward_placed(conn, req, router, placed, raw_rid))
            return True
        self._res = placed
        self._ex = ex
        return True

    def _answer(self, ex: Exchange) -> None:
        """The exchange's one callback: relay a complete simple answer, else hand over."""
        router = self._router
        core = router.core
        worker = ex.worker
        res = self._res
        if res is None:  # pragma: no cover - an exchange exists only once placed
            raise RuntimeError("an inline exchange without a reservation")
        if ex.timed_out:  # (no head: a complete answer would have come first)
            action = core.attempt_failed(res, AttemptFailure.TIMEOUT, 1, timed_out(router, worker))
            if not isinstance(action, Refuse):  # pragma: no cover - never retried
                raise RuntimeError("the core retried a timed-out attempt")
            router.metrics.count_request(worker, action.status)
            refusal(self._conn, action, self._raw_rid)
            self._end()
            return
        status = ex.status
        if (
            ex.complete and relayed_whole(ex) and not core.retries_answer(status, 1)
        ):  # as the coroutine answers it after the head and the body came
            router.metrics.observe_upstream(worker, ex.sent_at, time.perf_counter(), status)
            core.attempt_answered(res, status, 1)  # recorded; relayed (not retried)
            relay_whole(self._conn, router, ex, self._raw_rid, ex.body())
            self._end()
            return
        self._ex = self._res = None  # the coroutine owns both now
        self._conn.hand_over(
            forward_placed(self._conn, self._req, router, res, self._raw_rid, first=ex)
        )

    def _end(self) -> None:
        ex = self._ex
        if ex is not None:
            self._ex = None
            ex.close()
        res = self._res
        if res is not None:
            self._res = None
            self._router.core.complete(res)
        self._conn.finish()

    def client_lost(self) -> None:
        """The client went away: close the exchange (the worker sees it) and release."""
        ex = self._ex
        if ex is not None:
            self._ex = None
            self._router.metrics.count_request(ex.worker, 499)
            ex.close()
        res = self._res
        if res is not None:
            self._res = None
            self._router.core.complete(res)
