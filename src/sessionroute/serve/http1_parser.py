"""The parsing half of a client connection (:class:`RequestParsing`, a base of
:class:`~sessionroute.serve.http1.Connection`): reads fed to the ``httptools`` parser and its
callbacks, which build each :class:`~sessionroute.serve.request.Request` and hand it on once
its headers are complete.

The callbacks run once per header: ``on_header`` enters the header in the case-folded lookup
dict (the first value of a name wins) and appends its line to the forwarded or the dropped
ones, so the head is read in one pass. A head over :data:`MAX_HEAD_BYTES` or
:data:`MAX_HEADERS` is a 431, a malformed request a 400 (the connection's ``_bad_request``);
a body over the listener's limit is reported on the request and discarded.
"""

from __future__ import annotations

import asyncio
import http
from collections import deque
from typing import TYPE_CHECKING

import httptools

from sessionroute.serve.request import MAX_HEAD_BYTES, MAX_HEADERS, HeadTooLarge, Inline, Request

if TYPE_CHECKING:
    from sessionroute.serve.listener import Listener

__all__ = ["RequestParsing", "parse_target"]

_METHODS = {m.value.encode(): m.value for m in http.HTTPMethod}
"""The common request methods' names as the parser gives them -> as :attr:`Request.method`."""


def parse_target(target: bytes) -> tuple[bytes, str, str]:
    """A request target (as sent) -> its origin form (``b"/path?query"``), its path (decoded
    as UTF-8 with surrogate escapes) and its query ("" when none), fragments left out.

    Raises:
        ValueError: an absolute-form target that is not a URL.
    """
    if target[:1] != b"/":  # absolute-form (or "*"): keep the path and query
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError as exc:
            raise ValueError(f"invalid request target {target!r}") from exc
        target = (url.path or b"/") + (b"?" + url.query if url.query else b"")
    path, question, query = target.partition(b"?")
    return (
        target,
        path.partition(b"#")[0].decode("utf-8", "surrogateescape"),
        query.partition(b"#")[0].decode("utf-8", "surrogateescape") if question else "",
    )


class RequestParsing:
    """The parser callbacks of a connection (module docstring); the attributes it reads are
    set by :class:`~sessionroute.serve.http1.Connection`, which also handles each request
    (``_begin``, ``finish``) and answers the broken ones (``_bad_request``)."""

    transport: asyncio.Transport | None
    received: int
    head_sweep: int
    _listener: Listener
    _max_body: int
    _parser: httptools.HttpRequestParser
    _parsing: Request | None
    _current: Request | None
    _queue: deque[Request]
    _inline: Inline | None
    _early: Request | None
    _feeding: bool
    _head_bytes: int
    _in_head: bool
    _last_read: int
    _lower: dict[bytes, bytes]
    _forward: list[bytes]
    _dropped: list[bytes]
    _drop: frozenset[bytes]
    _bad: bool
    _lingering: Request | None
    _linger_timer: asyncio.TimerHandle | None

    if TYPE_CHECKING:

        def _begin(self, req: Request) -> bool: ...

        def finish(self) -> None: ...

        def _bad_request(self, reason: str, status: int = 400) -> None: ...

        def _pause_reading(self) -> None: ...

        def close_when_idle(self) -> None: ...

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._listener.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._bad:
            return
        self._last_read = nbytes
        self.received += nbytes
        if self._in_head:  # a head spanning reads: bound what the parser accumulates
            self._head_bytes += nbytes
        self._feeding = True
        try:
            self._parser.feed_data(self._listener.read_buffer[:nbytes])
        except httptools.HttpParserUpgrade:
            # An Upgrade request (h2c, websocket) is served as plain HTTP/1.1; the bytes after
            # it belong to another protocol, so the connection ends after the response.
            req = self._parsing
            if req is not None and not req.complete:
                self.on_message_complete()
            self._pause_reading()
            self.close_when_idle()
        except httptools.HttpParserError as exc:
            cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
            status = 431 if isinstance(cause, HeadTooLarge) else 400
            self._bad_request(str(cause or exc) or type(exc).__name__, status)
        else:
            if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
                self._bad_request("request line and headers over 64 KiB", 431)
        self._feeding = False
        early = self._early
        if early is not None:  # an Inline request whose head came in this read
            self._early = None
            inline = self._inline
            if (
                inline is not None
                and early is self._current
                and early._ready is not None
                and not inline.waiting()
            ):
                early._ready = None
                self.finish()

    # -- parser callbacks (kept minimal: they run once per header) -------------------------
    def on_message_begin(self) -> None:
        self._parsing = req = Request()
        self._lower = req.lower
        self._forward = req.forward
        self._dropped = req.dropped
        self._in_head = True
        self._head_bytes = 0
        self.head_sweep = self._listener.sweeps

    def on_url(self, url: bytes) -> None:
        # a piece of the request target (one split across reads comes in several)
        if self._parsing is not None:
            self._parsing.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        self._lower.setdefault(low, value)  # the first value of a name wins
        # the forwarded lines as they come (one pass over the headers, not a second one)
        if low not in self._drop:
            self._forward += (name, b": ", value, b"\r\n")
        else:
            self._dropped += (name, b": ", value, b"\r\n")
            if low == b"connection" and self._parsing is not None:
                self._parsing.connection_header = True

    def on_headers_complete(self) -> None:
        req = self._parsing
        if req is None:
            return
        self._in_head = False
        self._lower = {}  # trailers of a chunked body (on_header again) are not looked up
        target = req.target  # as sent; replaced by its origin form below
        forward = req.forward
        dropped = req.dropped
        if len(forward) + len(dropped) > 4 * MAX_HEADERS:  # four pieces a header
            raise HeadTooLarge(f"more than {MAX_HEADERS} headers")
        if self._head_bytes or self._last_read > MAX_HEAD_BYTES:  # else it is smaller
            # a line's pieces are its name, value and 4 bytes (": ", CRLF)
            size = len(target) + sum(map(len, forward)) + sum(map(len, dropped))
            if size > MAX_HEAD_BYTES:
                raise HeadTooLarge("request line and headers over 64 KiB")
        parser = self._parser
        method = parser.get_method()
        req.method = _METHODS.get(method) or method.decode("ascii", "replace")
        req.keep_alive = keep_alive = parser.should_keep_alive()
        # llhttp keeps an HTTP/1.0 connection alive only when a Connection (or
        # Proxy-Connection) header says keep-alive, so a kept-alive request without one is
        # HTTP/1.1: the version (a string formatted per call) is asked only when it can be 1.0
        lower = req.lower
        req.http10 = (
            not keep_alive or b"connection" in lower or b"proxy-connection" in lower
        ) and parser.get_http_version() == "1.0"
        req.target, req.path, req.query = self._listener.parse_target(target)
        length = lower.get(b"content-length")
        if length is not None:
            req.content_length = content_length = int(length)  # llhttp checked it is a number
            if content_length > self._max_body:
                req.too_large = req.discard = True
        if self._current is None and not self._queue:
            if not self._begin(req):
                self.finish()
        else:
            self._queue.append(req)
            if len(self._queue) >= 8:
                self._pause_reading()

    def on_body(self, body: bytes) -> None:
        req = self._parsing
        if req is None or req.discard:
            return
        req.size += len(body)
        if req.size > self._max_body:
            req.too_large = req.discard = True
            req.parts = []
            req._wake()
            return
        req.parts.append(body)

    def on_message_complete(self) -> None:
        req = self._parsing
        if req is None:
            return
        self._parsing = None
        req.complete = True
        ready = req._ready
        if ready is not None:  # an Inline handler waits for the body (Request._wake's case)
            req._ready = None
            ready()
        else:
            req._wake()
        if req is self._lingering:
            self._lingering = None
            if self._linger_timer is not None:
                self._linger_timer.cancel()
            if self.transport is not None:
                self.transport.close()
