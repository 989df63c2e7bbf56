"""The router's HTTP/1.1 listener: an :class:`asyncio.Protocol` on the ``httptools`` parser.

Why not aiohttp's server: per proxied request, its server layer (``web.Server`` and
``RequestHandler``: request objects, a task and a ``StreamReader`` per request, response
serialization) cost about as much CPU as vllm-router (Rust) spends on a whole request, and
the router must stay cheaper than vllm-router (``sessionroute bench proxy``). So the proxied
path uses protocols of ours on both sides (the worker side is
:mod:`sessionroute.serve.worker_connection`); aiohttp stays the client of health checks and
admin calls. The parser is ``httptools`` (the ``llhttp`` C parser with callbacks; uvicorn's);
its callbacks are :class:`~sessionroute.serve.http1_parser.RequestParsing`'s, a base of
:class:`Connection`.

Per connection, one :class:`Connection` parses requests and hands each to the listener's
handler when its headers are complete (the body keeps arriving into :class:`Request`). The
handler either answers at once (:meth:`Connection.respond`) and returns None, or returns a
coroutine that writes the response itself (:meth:`Connection.respond`, or
:meth:`Connection.start_response`, :meth:`Connection.write` and
:meth:`Connection.end_response`), or an :class:`~sessionroute.serve.request.Inline` that
answers from callbacks (the proxy's common case: no task wake-up) and may hand the request
to a coroutine later (:meth:`Connection.hand_over`). The connection runs those coroutines one
after the other on one task of its own, so requests are handled in arrival order (pipelined
ones wait). :class:`Request` and :class:`Inline` live in :mod:`sessionroute.serve.request`.
Keep-alive follows HTTP/1.1 and HTTP/1.0 rules (``httptools.should_keep_alive``). A malformed
request gets a 400 JSON error and the connection is closed; a body over the limit is reported
on the :class:`Request` and discarded. When the client goes away, the connection's task is
cancelled. Writes respect the transport's flow control (a relay pauses its source while the
client's buffer is full). The listener (:mod:`sessionroute.serve.listener`) closes idle
keep-alive connections and shuts down gracefully.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import httptools

from sessionroute.serve.errors import error_response
from sessionroute.serve.http1_parser import RequestParsing, parse_target
from sessionroute.serve.request import MAX_HEAD_BYTES, MAX_HEADERS, HeadTooLarge, Inline, Request
from sessionroute.serve.wire import ResponseWriter

if TYPE_CHECKING:
    from sessionroute.serve.listener import Listener

__all__ = [
    "LINGER_S",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "Connection",
    "Handler",
    "HeadTooLarge",
    "Inline",
    "Request",
    "parse_target",
]

log = logging.getLogger("sessionroute.serve")

Handler = Callable[["Connection", "Request"], Coroutine[Any, Any, None] | Inline | None]
"""Called once a request's headers are complete: answers it (returns None), returns the
coroutine that will (run as a task), or an :class:`Inline` that will from callbacks."""

LINGER_S = 10.0
"""After an early answer that closes the connection (a 413, say), seconds the rest of the
request body is still read and dropped before the connection is closed."""


class Connection(ResponseWriter, RequestParsing, asyncio.BufferedProtocol):
    """One client connection (see the module docstring).

    A buffered protocol: the event loop reads into the listener's buffer
    (:attr:`Listener.read_buffer`, shared by its connections: a read is parsed before the
    next one starts) and the parser copies out what it keeps, so a request body is copied
    once on its way through the router, not twice (the loop's own read buffer, then the
    parser's body pieces).

    Args:
        listener: the listener that accepted it.
    """

    def __init__(self, listener: Listener) -> None:
        super().__init__(listener.heads)
        self._listener = listener
        self._max_body = listener.max_body
        self._parser = httptools.HttpRequestParser(self)
        self._parsing: Request | None = None
        self._current: Request | None = None
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._pending: Coroutine[Any, Any, None] | None = None
        self._inline: Inline | None = None
        self._early: Request | None = None
        self._feeding = False
        self._wakeup: asyncio.Future[None] | None = None
        loop = listener.loop  # not get_running_loop() per request: it costs a getpid() call
        if loop is None:
            raise RuntimeError("the listener is not started")
        self._loop = loop
        self._head_bytes = 0
        self._in_head = False
        self._last_read = 0
        self._lower: dict[bytes, bytes] = {}
        self._forward: list[bytes] = []
        self._dropped: list[bytes] = []
        self._drop = listener.forward_drop
        self._read_paused = False
        self._bad = False
        self._lingering: Request | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self.count = 0
        """Requests started on this connection (the idle sweep compares it)."""
        self.seen_count = -1
        self.received = 0
        """Bytes received on this connection (the sweep finds stalled bodies with it)."""
        self.seen_received = -1
        self.quiet_sweeps = 0
        """Listener sweeps in a row without a byte or a request (the idle and body limits)."""
        self.head_sweep = listener.sweeps
        """The listener sweep in which the current request head began (the header limit)."""

    @property
    def in_head(self) -> bool:
        """A request head is partly received."""
        return self._in_head

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        listener = self._listener
        cap = listener.max_connections
        if cap is not None and len(listener.connections) >= cap:
            listener.closed("connection_limit")
            self._bad = True  # read nothing; close at once (a FIN: nothing was read yet)
            transport.close()
            return
        listener.connections.add(self)
        if self._listener.closing:
            self._closing = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._listener._forget(self)
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        inline = self._inline
        if inline is not None:
            self._inline = None
            inline.client_lost()
        if self._pending is not None:  # never started: close it (no "never awaited" warning)
            self._pending.close()
            self._pending = None

    # -- handling ---------------------------------------------------------------------------
    def _begin(self, req: Request) -> bool:
        """Hand ``req`` to the handler; False when it was answered at once (then call
        :meth:`finish`), True when its coroutine is scheduled on the connection's task."""
        self._current = req
        self.count += 1
        self._started = False
        self._keep = req.keep_alive and not self._closing
        self._head_only = req.method == "HEAD"
        self._http10 = req.http10
        try:
            coro = self._listener.handler(self, req)
        except Exception:
            log.exception("unhandled error on %s %s", req.method, req.path)
            coro = None
            self._internal_error()
        if coro is None:
            return False
        if isinstance(coro, Inline):
            self._inline = coro
            if not req.complete and not req.too_large and not req.discard:
                req._ready = self._inline_ready  # ready() once the body arrived
                if self._feeding:  # waiting() once the rest of this read is parsed
                    self._early = req
                    return True
                if coro.waiting():
                    return True
                req._ready = None
                self._inline = None
                return False
            if coro.ready():
                return True
            self._inline = None
            return False
        self._schedule(coro)
        return True

    def _schedule(self, coro: Coroutine[Any, Any, None]) -> None:
        self._pending = coro
        if self._task is None:
            self._task = self._loop.create_task(self._serve())
        else:
            waiter = self._wakeup
            if waiter is not None:
                self._wakeup = None
                waiter.set_result(None)

    def _inline_ready(self) -> None:
        inline = self._inline
        if inline is not None and not inline.ready() and self._inline is inline:
            self.finish()

    def hand_over(self, coro: Coroutine[Any, Any, None]) -> None:
        """Continue the request of an :class:`Inline` handler with ``coro`` on this
        connection's task (as if the handler had returned it)."""
        self._inline = None
        self._schedule(coro)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running this connection's handler coroutines (None before the first)."""
        return self._task

    async def _serve(self) -> None:
        """Run the handler coroutines of this connection's requests, one after the other.

        One task per connection, woken by a future for each request, rather than a task per
        request: creating a task (context copy, registration in a ``WeakSet``, first step)
        cost more than the rest of the listener's work on a request.
        """
        loop = self._loop
        while True:
            coro = self._pending
            if coro is None:
                self._wakeup = waiter = loop.create_future()
                await waiter
                continue
            self._pending = None
            try:
                await coro
            except asyncio.CancelledError:  # the client went away, or shutdown
                self.abort()
                raise
            except Exception as exc:
                if not isinstance(exc, ConnectionError):
                    log.error("unhandled error in a request handler", exc_info=exc)
                self._internal_error()
            self.finish()  # may start the next (pipelined) request: _pending is then set

    def _internal_error(self) -> None:
        if self._started:
            self.abort()
        else:
            self.respond(
                error_response(500, "internal router error", "internal_error"), keep_alive=False
            )

    def finish(self) -> None:
        """End the current request (answered at once, by its coroutine, or by an
        :class:`Inline` handler) and start the queued (pipelined) ones, looping over those
        answered at once (no recursion: a client may pipeline thousands of them)."""
        self._inline = None
        while True:
            req = self._current
            self._current = None
            access = self._listener.access_log
            if access is not None and req is not None:
                access.info('"%s %s" %d', req.method, req.target.decode("latin-1"), self._status)
            if self._lost:
                return
            transport = self.transport
            if transport is None:
                return
            if req is not None and not req.complete:
                req.discard = True  # answered early (401, 413, ...): the rest is dropped
                req.parts = []
                if not self._keep or self._closing:
                    # Closing with unread data would reset the connection before the client
                    # reads the answer: linger until the body ends, for LINGER_S at most.
                    self._lingering = req
                    if self._linger_timer is not None:
                        self._linger_timer.cancel()
                    self._linger_timer = self._loop.call_later(LINGER_S, self.abort)
                    return
            if not self._keep or self._closing:
                transport.close()
                return
            queue = self._queue
            if not queue:
                return
            nxt = queue.popleft()
            if self._read_paused and len(queue) < 4 and not self._bad:
                self._read_paused = False
                transport.resume_reading()
            if self._begin(nxt):
                return

    def _pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def _bad_request(self, reason: str, status: int = 400) -> None:
        self._bad = True
        self._queue.clear()
        current = self._current
        if self._lingering is not None:  # already answered; dropping the rest of the body
            if self.transport is not None:
                self.transport.close()
        elif current is not None and not current.complete and self._started:
            self.abort()  # the body in progress is broken, and so is the answer under way
        elif current is None or not current.complete:
            # No answer under way: a 400 (431 for an oversize head), then a lingering close.
            # A handler waiting for the broken body is woken with no body (and answers
            # nothing more: this answer is the request's).
            self._started = False
            self._keep = False
            self._head_only = False
            message = "request header fields too large" if status == 431 else "malformed"
            code = "header_too_large" if status == 431 else "bad_request"
            self.respond(error_response(status, f"{message} HTTP request: {reason}", code))
            if current is not None:
                current.discard = True
                current._wake()
            self._linger_close()
        else:
            self._pause_reading()
            self._closing = True  # the response in progress is the last one

    def _linger_close(self) -> None:
        """Close after an error answer without resetting the connection: send FIN after the
        answer, read and drop what the client still sends until it closes, for
        :data:`LINGER_S` at most (nginx's ``lingering_close``). Closing at once with unread
        client bytes makes the kernel send a reset, and the client may never read the answer
        (a 1 MB header got a reset before the 431)."""
        transport = self.transport
        if transport is None or self._lost:
            return
        if not transport.can_write_eof():  # pragma: no cover - TCP transports can
            transport.close()
            return
        transport.write_eof()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self._linger_timer = self._loop.call_later(LINGER_S, self.abort)

    def peer_is_loopback(self) -> bool:
        """Whether the client connects from a loopback address (127.0.0.0/8, ::1)."""
        if self.transport is None:
            return False
        peer = self.transport.get_extra_info("peername")
        if not peer:
            return False
        try:
            return ipaddress.ip_address(peer[0]).is_loopback
        except ValueError:
            return False

    def awaiting_body(self) -> bool:
        """Whether the request being handled is still receiving its body from the client."""
        req = self._current
        return req is not None and req is self._parsing and not self._read_paused

    def close_when_idle(self) -> None:
        """No more requests on this connection: close it now if idle, else after the
        response in progress."""
        self._closing = True
        if self._current is None and self.transport is not None:
            self.transport.close()
