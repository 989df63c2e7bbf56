"""One keep-alive connection to a worker: an :class:`asyncio.Protocol` on the ``httptools``
(``llhttp``) response parser.

The parser frames each response (``Content-Length``, chunked, read-until-close) and validates
it; the connection collects the response head (status, keep-alive, the header lines to relay,
the framing) and tells the one :class:`ResponseHandler` using it what arrived. That protocol is
the whole interface between a connection and an
:class:`~sessionroute.serve.exchange.Exchange`: the connection calls only its methods, and the
exchange calls only the connection's public ones (:meth:`WorkerConnection.send`,
:meth:`~WorkerConnection.release`, :meth:`~WorkerConnection.pause_reading`,
:meth:`~WorkerConnection.resume_reading`, :meth:`~WorkerConnection.close`).

The worker's reason phrase is not read: the client gets the standard phrase of the status (as
from vllm-router, whose HTTP library writes the canonical one).

Also here: what a worker's response may and may not carry through the router
(:data:`HOP_BY_HOP`, :data:`RESPONSE_DROP`, :data:`MAX_RESPONSE_HEAD_BYTES`) and the errors of
an exchange.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

import httptools

__all__ = [
    "HOP_BY_HOP",
    "MAX_RESPONSE_HEAD_BYTES",
    "RESPONSE_DROP",
    "ResponseHandler",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamHung",
    "WorkerConnection",
]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers never forwarded in either direction (RFC 9110 section 7.6.1)."""

RESPONSE_DROP = frozenset(
    n.encode() for n in (*HOP_BY_HOP, "content-length", "x-request-id", "date", "server")
)
"""Lower-case response header names never relayed to the client (the router writes its own
framing, ``Date`` and ``x-request-id``)."""

MAX_RESPONSE_HEAD_BYTES = 65536
"""Most bytes a worker may send before its response head is complete (the listener's limit on
request heads too): a worker streaming endless headers is cut off with a 502 instead of
filling the router's memory."""


class UpstreamError(Exception):
    """The worker connection broke, or its response was malformed."""


class UpstreamConnectError(UpstreamError):
    """The worker refused the connection, or did not accept it within the connect timeout."""


class UpstreamHung(UpstreamError):
    """The router gave the worker up before it answered (failed health checks, or no response
    head within the first-byte timeout); the connection is closed."""


class ResponseHandler(Protocol):
    """What a :class:`WorkerConnection` tells the one request using it, in this order:
    :meth:`response_head`, :meth:`response_body` per piece, :meth:`response_complete`; after
    each read from the worker, :meth:`read_done`. :meth:`request_sent`, :meth:`fail` and
    :meth:`connection_closed` may come at any point."""

    def request_sent(self) -> None:
        """Every byte of the request has been handed to the kernel."""

    def response_head(
        self, status: int, keep_alive: bool, framed: bool, length: int | None, lines: list[bytes]
    ) -> None:
        """The final (not 1xx) response head arrived.

        Args:
            status: the status code.
            keep_alive: neither side asked to close the connection after this response.
            framed: the head has a ``Content-Length`` or ``Transfer-Encoding`` (the body is
                not delimited by the connection's close).
            length: the ``Content-Length``, None without one.
            lines: the header lines to relay, as pieces to join (name, ``b": "``, value,
                ``b"\\r\\n"`` for each header as received, except :data:`RESPONSE_DROP`).
        """

    def response_body(self, piece: bytes) -> None:
        """A piece of the response body (a chunk's data, not its framing)."""

    def response_complete(self) -> None:
        """The response ended (the body, if any, is complete)."""

    def read_done(self) -> None:
        """The bytes of one read from the worker have all been parsed."""

    def fail(self, error: UpstreamError) -> None:
        """The response is malformed or the connection is being given up (a response that
        completed before stands)."""

    def connection_closed(self, exc: BaseException | None) -> None:
        """The connection closed (``exc``: the error, None for a clean close)."""


class WorkerConnection(asyncio.Protocol):
    """One connection to a worker, carrying one request at a time (see the module docstring).

    Attributes:
        transport: the transport (None before the connection is made).
        lost: the connection is closed.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._handler: ResponseHandler | None = None
        """The request using the connection (None while idle: a response then is a
        protocol error and closes the connection)."""
        self._parser = httptools.HttpResponseParser(self)
        self._draining = False  # written bytes wait in the transport's buffer
        self._responded = False  # the handler's final response is complete
        # the response head being parsed
        self._in_head = False
        self._head_bytes = 0  # bytes received while the head is incomplete
        self._interim = False  # a 1xx response: the final one follows
        self._framed = False
        self._length: int | None = None
        self._lines: list[bytes] = []

    # -- used by the exchange -------------------------------------------------------------
    def send(self, handler: ResponseHandler, parts: Iterable[bytes]) -> bool:
        """Write a request whose response goes to ``handler``; returns whether every byte of
        it was handed to the kernel at once (else ``handler.request_sent()`` says when).

        Raises:
            UpstreamError: the connection is closed.
        """
        transport = self.transport
        if transport is None or self.lost:
            raise UpstreamError("the worker closed the connection")
        self._handler = handler
        self._responded = False
        self._in_head = True
        self._head_bytes = 0
        transport.writelines(parts)
        return not self._draining

    def release(self) -> None:
        """The request is over: nothing more goes to its handler."""
        self._handler = None

    def pause_reading(self) -> bool:
        """Stop reading from the worker (the client's buffer is full); False when closed."""
        if self.transport is None or self.lost:
            return False
        self.transport.pause_reading()
        return True

    def resume_reading(self) -> None:
        """Read from the worker again after :meth:`pause_reading`."""
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # told whenever written bytes wait in the buffer and when they are all handed to the
        # kernel: whether a request was fully written decides whether it may be retried
        transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self._draining = True

    def resume_writing(self) -> None:
        self._draining = False
        if self._handler is not None:
            self._handler.request_sent()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if self._handler is not None:
            self._handler.connection_closed(exc)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # (the callbacks raise nothing else; an upgrade is a 101, refused below)
            if self._handler is not None:
                self._handler.fail(UpstreamError(f"malformed response: {exc.__context__ or exc}"))
            self.close()
        handler = self._handler
        if handler is None:
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_RESPONSE_HEAD_BYTES:
                handler.fail(
                    UpstreamError(
                        f"response head over {MAX_RESPONSE_HEAD_BYTES} bytes "
                        f"({self._head_bytes} received without its end)"
                    )
                )
                self.close()
        handler.read_done()

    # -- parser callbacks (an exception here makes feed_data raise HttpParserError) --------
    def on_message_begin(self) -> None:
        if self._handler is None or self._responded:  # a second response to one request
            raise RuntimeError("unsolicited response")
        self._head_bytes = 0
        self._framed = False
        self._length = None
        self._lines = []

    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        if low not in RESPONSE_DROP:
            self._lines += (name, b": ", value, b"\r\n")
        elif low == b"content-length":
            self._length = int(value)  # (llhttp checked it is a number)
            self._framed = True
        elif low == b"transfer-encoding":
            self._framed = True

    def on_headers_complete(self) -> None:
        handler = self._handler
        if handler is None:  # pragma: no cover - on_message_begin refused the response
            return
        status = self._parser.get_status_code()
        if status == 101:  # the router asked for no upgrade: nothing valid can follow
            handler.fail(UpstreamError("unexpected 101 Switching Protocols"))
            return
        if 100 <= status < 200:
            self._interim = True
            return
        self._in_head = False
        handler.response_head(
            status, self._parser.should_keep_alive(), self._framed, self._length, self._lines
        )

    def on_body(self, body: bytes) -> None:
        if self._handler is not None:
            self._handler.response_body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._responded = True
        if self._handler is not None:
            self._handler.response_complete()
