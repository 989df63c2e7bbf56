"""One keep-alive connection to a worker, as an :class:`asyncio.Protocol` on the ``httptools``
response parser (see :mod:`sessionroute.serve.upstream`).

The parser's callbacks fill in the :class:`~sessionroute.serve.exchange.Exchange` using the
connection (one Python call per callback, none per field); the exchange sends the request and
hands the answer on. There is no ``on_status`` callback: the worker's reason phrase is not read,
and the client gets the standard phrase of the status (as vllm-router, whose hyper writes the
canonical one), so httptools makes no call and no ``bytes`` for it per response.

Also here: what a worker's response may and may not carry through the router
(:data:`HOP_BY_HOP`, :data:`RESPONSE_DROP`, :data:`MAX_RESPONSE_HEAD_BYTES`) and the errors of
an exchange.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httptools

if TYPE_CHECKING:
    from sessionroute.serve.exchange import Exchange

__all__ = [
    "HOP_BY_HOP",
    "MAX_RESPONSE_HEAD_BYTES",
    "RESPONSE_DROP",
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
framing, ``Date`` and ``x-request-id``); :attr:`Exchange.relay_lines` leaves them out."""

MAX_RESPONSE_HEAD_BYTES = 65536
"""Most bytes a worker may send before its response head is complete (the listener's limit on
request heads too): a worker streaming endless headers is cut off with a 502 instead of
filling the router's memory."""


_RELAY, _DROP, _CONTENT_LENGTH, _TRANSFER_ENCODING = range(4)
"""What a response header is to the router, by its name: relayed, dropped, or one of the two
framing headers (dropped too; the router writes its own framing)."""

_HEADER_KINDS_KEPT = 256
"""Most names in a pool's memo of header kinds (``UpstreamPool.header_kinds``): the names come
from the workers, so a worker sending ever new ones does not grow it."""


def _header_kind(name: bytes, memo: dict[bytes, int]) -> int:
    """The kind (``_RELAY`` ...) of the response header ``name`` (any case), entered in
    ``memo`` (by the name as sent, so the next one needs no ``lower()``) while it has room."""
    low = name.lower()
    if low not in RESPONSE_DROP:
        kind = _RELAY
    elif low == b"content-length":
        kind = _CONTENT_LENGTH
    elif low == b"transfer-encoding":
        kind = _TRANSFER_ENCODING
    else:
        kind = _DROP
    if len(memo) < _HEADER_KINDS_KEPT:
        memo[name] = kind
    return kind


class UpstreamError(Exception):
    """The worker connection broke, or its response was malformed."""


class UpstreamConnectError(UpstreamError):
    """The worker refused the connection, or did not accept it within the connect timeout."""


class UpstreamHung(UpstreamError):
    """The router gave the worker up before it answered (failed health checks, or no response
    head within the first-byte timeout); the connection is closed."""


class WorkerConnection(asyncio.Protocol):
    """One connection to a worker; parser callbacks go to the :class:`Exchange` using it.

    Attributes:
        transport: the transport (None before the connection is made).
        exchange: the exchange using the connection (None while idle: a response then is
            a protocol error and closes the connection).
        lost: the connection is closed.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.lost = False
        self.draining = False
        """Bytes written are still in the transport's buffer (not yet handed to the kernel)."""
        self._parser = httptools.HttpResponseParser(self)
        self._head_bytes = 0  # bytes received while the current response head is incomplete

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # told whenever written bytes wait in the buffer and when they are all handed to the
        # kernel: whether a request was fully written decides whether it may be retried
        transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self.draining = True

    def resume_writing(self) -> None:
        self.draining = False
        ex = self.exchange
        if ex is not None:
            ex.sent_all = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        ex = self.exchange
        if ex is not None:
            ex._on_lost(exc)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # (the parser callbacks raise nothing else; an upgrade is a 101, refused below)
            ex = self.exchange
            if ex is not None:  # (a response complete before the error stands)
                ex._fail(UpstreamError(f"malformed response: {exc.__context__ or exc}"))
            self.close()
            if ex is None or ex._inline is None:
                return  # else the inline exchange is told of its complete response below
        ex = self.exchange
        if ex is None:
            return
        inline = ex._inline
        if inline is not None and (ex.complete or ex.status):
            ex._inline = None  # after the whole read (a small response is complete by now):
            inline(ex)  # told once, it takes the exchange over or ends it
        elif not ex.status:  # the head is still incomplete
            self._head_bytes += len(data)
            if self._head_bytes > MAX_RESPONSE_HEAD_BYTES:
                ex._fail(
                    UpstreamError(
                        f"response head over {MAX_RESPONSE_HEAD_BYTES} bytes "
                        f"({self._head_bytes} received without its end)"
                    )
                )
                self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    # -- parser callbacks (an AttributeError while idle is a protocol error) ---------------
    # They fill in the exchange directly (one Python call per callback, none per field).
    def on_message_begin(self) -> None:
        ex = self.exchange
        if ex is None or ex.complete:  # a second response to one request: desync
            raise RuntimeError("unsolicited response")
        self._head_bytes = 0
        ex.framed = False
        ex.relay_lines = []
        ex.length = None

    def on_header(self, name: bytes, value: bytes) -> None:
        ex: Exchange = self.exchange  # type: ignore[assignment]
        # the relayed lines as they come (one pass over the headers, not a second one)
        kinds = ex._pool.header_kinds
        kind = kinds.get(name)
        if kind is None:
            kind = _header_kind(name, kinds)
        if kind == _RELAY:
            ex.relay_lines += (name, b": ", value, b"\r\n")
        elif kind == _CONTENT_LENGTH:
            ex.length = int(value)  # (llhttp checked it is a number)
            ex.framed = True
        elif kind == _TRANSFER_ENCODING:
            ex.framed = True

    def on_headers_complete(self) -> None:
        ex: Exchange = self.exchange  # type: ignore[assignment]
        parser = self._parser
        status = parser.get_status_code()
        if status == 101:  # the router asked for no upgrade: nothing valid can follow
            ex._fail(UpstreamError("unexpected 101 Switching Protocols"))
            return
        if 100 <= status < 200:
            ex._info = True  # an interim response: the real one follows
            return
        ex.status = status
        ex.keep_alive = parser.should_keep_alive()
        if ex._inline is None:  # an inline one is told after the read (data_received)
            ex._wake()

    def on_body(self, body: bytes) -> None:
        ex: Exchange = self.exchange  # type: ignore[assignment]
        ex.chunks += 1
        sink = ex._sink
        if sink is None:
            ex._parts.append(body)
            return
        sink.write(body)
        if sink.paused and not ex._up_paused:
            ex._pause_upstream()

    def on_message_complete(self) -> None:
        ex: Exchange = self.exchange  # type: ignore[assignment]
        if ex._info:
            ex._info = False
            return
        ex.complete = True
        if ex._inline is None:  # an inline one is told after the read (data_received)
            ex._wake()
