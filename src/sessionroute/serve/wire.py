"""HTTP/1.1 response bytes for the router's listener (:mod:`sessionroute.serve.http1`).

Responses are written as pre-serialized byte strings: status lines are memoized by status
and reason, the ``Date`` header is formatted once per second, and a handler's headers are
joined once. Nothing here allocates a header object per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

__all__ = ["REASONS", "HeadCache", "Response", "ResponseWriter", "json_response"]

REASONS: dict[int, str] = {s.value: s.phrase for s in HTTPStatus}
"""Standard reason phrases by status (RFC 9110)."""


class HeadCache:
    """Memoized response-head pieces; one per listener (no module-level state)."""

    __slots__ = ("_date_line", "_date_second", "_starts")

    def __init__(self) -> None:
        self._starts: dict[tuple[int, bytes | None], bytes] = {}
        self._date_second = -1
        self._date_line = b""

    def status_line(self, status: int, reason: bytes | None = None) -> bytes:
        """``HTTP/1.1 <status> <reason>\\r\\n`` (``reason`` a caller's own phrase, the
        standard one when it is None or empty, ``Unknown`` for a non-standard status; CR/LF in
        a reason become spaces). Not memoized itself: :meth:`start` memoizes it with the
        ``Date`` line."""
        phrase = reason or REASONS.get(status, "Unknown").encode("latin-1", "replace")
        phrase = phrase.replace(b"\r", b" ").replace(b"\n", b" ")
        return b"HTTP/1.1 %d %s\r\n" % (status, phrase)

    def start(self, status: int, reason: bytes | None = None) -> bytes:
        """The :meth:`status_line` and ``Date: <IMF-fixdate>\\r\\n`` for the current second
        (formatted once a second; the pair memoized for that second)."""
        now = int(time.time())
        if now != self._date_second:
            self._date_second = now
            self._date_line = b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
            self._starts.clear()
        key = (status, reason)
        start = self._starts.get(key)
        if start is None:
            start = self.status_line(status, reason) + self._date_line
            if len(self._starts) < 1024:  # bounded, whatever reasons callers pass
                self._starts[key] = start
        return start


@dataclass(slots=True)
class Response:
    """A complete (not streamed) response of a non-proxied route.

    Attributes:
        status: HTTP status.
        body: the body bytes (``Content-Length`` is set from it).
        content_type: the ``Content-Type`` value (omitted when None).
        headers: extra headers as (name, value) pairs.
    """

    status: int
    body: bytes = b""
    content_type: str | None = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    def header_bytes(self) -> bytes:
        """The ``Content-Type`` and extra header lines (without Content-Length)."""
        lines = [f"Content-Type: {self.content_type}\r\n"] if self.content_type else []
        lines.extend(f"{k}: {v}\r\n" for k, v in self.headers)
        return "".join(lines).encode("utf-8", "surrogateescape")


def json_response(
    obj: Any, status: int = 200, headers: tuple[tuple[str, str], ...] = ()
) -> Response:
    """A JSON response (``application/json``) of ``obj``."""
    return Response(status, json.dumps(obj).encode(), "application/json", headers)


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ResponseWriter:
    """Writing one response at a time to a transport, with its flow control (the base of
    :class:`sessionroute.serve.http1.Connection`, which sets the per-request state).

    A response is either complete (:meth:`respond`, :meth:`respond_raw`) or streamed
    (:meth:`start_response`, :meth:`write`, :meth:`end_response`); a second response to the
    same request is ignored, as is anything written after the client went away.

    Args:
        heads: the listener's memo of status lines and the date.
    """

    def __init__(self, heads: HeadCache) -> None:
        self._heads = heads
        self.transport: asyncio.Transport | None = None
        self._lost = False
        self._closing = False
        self._paused = False
        self.on_resume: Callable[[], None] | None = None
        """Called once when the buffer next drains (set by a relay that paused its source)."""
        # the response in progress
        self._started = False
        self._status = 0
        self._keep = True
        self._chunked = False
        self._head_only = False
        self._http10 = False

    def pause_writing(self) -> None:
        """The transport's buffer is over its high-water mark (asyncio flow control)."""
        self._paused = True

    def resume_writing(self) -> None:
        """The transport's buffer drained below its low-water mark."""
        self._paused = False
        hook = self.on_resume
        if hook is not None:
            self.on_resume = None
            hook()

    def abort(self) -> None:
        """Drop the connection at once (the client sees a truncated response)."""
        self._closing = True
        if self.transport is not None and not self._lost:
            self.transport.abort()

    def respond(self, resp: Response, *, keep_alive: bool = True) -> None:
        """Write a complete response (``Content-Length`` from its body)."""
        self.respond_raw(resp.status, None, resp.header_bytes(), resp.body, keep_alive=keep_alive)

    def respond_raw(
        self,
        status: int,
        reason: bytes | None,
        headers: bytes,
        body: bytes,
        *,
        keep_alive: bool = True,
    ) -> None:
        """Write a complete response from pre-serialized header lines (``b"Name: v\\r\\n"``
        each, without Content-Length, Connection or Date)."""
        if self._lost or self._started:
            return
        self._started = True
        self._status = status
        if not keep_alive:
            self._keep = False
        transport = self.transport
        if transport is None:
            return
        # (a kept-alive HTTP/1.1 connection, the common case, needs no Connection header)
        connection = (
            b""
            if self._keep and not self._closing and not self._http10
            else self._connection_header()
        )
        head = b"%s%sContent-Length: %d\r\n%s\r\n" % (
            self._heads.start(status, reason),
            headers,
            len(body),
            connection,
        )
        if self._head_only or not body:
            transport.write(head)
        else:
            transport.writelines((head, body))

    def start_response(
        self, status: int, reason: bytes | None, headers: bytes, length: int | None
    ) -> None:
        """Write a response head; the body follows with :meth:`write` and
        :meth:`end_response` (chunked when ``length`` is None, close-delimited for
        HTTP/1.0 clients)."""
        if self._lost or self._started:
            return
        self._started = True
        self._status = status
        self._chunked = False
        if status in (204, 304):  # never a body, nor a framing header (RFC 9110 6.4.1)
            framing = b""
        elif length is not None:
            framing = b"Content-Length: %d\r\n" % length
        elif self._http10:
            framing = b""
            self._keep = False
        else:
            framing = b"Transfer-Encoding: chunked\r\n"
            self._chunked = not self._head_only
        transport = self.transport
        if transport is not None:
            transport.write(
                b"%s%s%s%s\r\n"
                % (self._heads.start(status, reason), headers, framing, self._connection_header())
            )

    def write(self, data: bytes) -> None:
        """Write a piece of the body started by :meth:`start_response`."""
        transport = self.transport
        if self._lost or transport is None or not data or self._head_only:
            return
        if self._chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)

    def end_response(self) -> None:
        """End the body started by :meth:`start_response`."""
        if self._chunked and not self._lost and self.transport is not None:
            self.transport.write(b"0\r\n\r\n")
        self._chunked = False

    @property
    def paused(self) -> bool:
        """The transport's write buffer is over its high-water mark (see :attr:`on_resume`)."""
        return self._paused

    def send_continue(self) -> None:
        """Write ``100 Continue`` (for ``Expect: 100-continue``)."""
        if self.transport is not None and not self._lost and not self._started:
            self.transport.write(_CONTINUE)

    def _connection_header(self) -> bytes:
        if not self._keep or self._closing:
            self._keep = False
            return b"Connection: close\r\n"
        return b"Connection: keep-alive\r\n" if self._http10 else b""
