"""HTTP/1.1 response bytes for the router's listener (:mod:`sessionroute.serve.http1`).

Responses are written as byte strings: the status line and the ``Date`` header (formatted
once a second) come from :class:`HeadCache`, a handler's headers come pre-serialized, and a
response head is one ``%`` format. Nothing here builds a header object per response.
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

__all__ = ["STATUS_LINES", "HeadCache", "Response", "ResponseWriter", "json_response"]

STATUS_LINES: dict[int, bytes] = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("ascii")) for s in HTTPStatus
}
"""``HTTP/1.1 <status> <reason>\\r\\n`` for each standard status (RFC 9110 reason phrases)."""


class HeadCache:
    """The first lines of every response head: the status line and the ``Date`` header,
    whose text changes once a second (kept for that second); one per listener."""

    __slots__ = ("_date_line", "_date_second")

    def __init__(self) -> None:
        self._date_second = -1
        self._date_line = b""

    def start(self, status: int) -> bytes:
        """``HTTP/1.1 <status> <reason>\\r\\nDate: <IMF-fixdate>\\r\\n`` (the standard reason
        phrase, ``Unknown`` for a non-standard status)."""
        now = int(time.time())
        if now != self._date_second:
            self._date_second = now
            self._date_line = b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
        line = STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status
        return line + self._date_line


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
        heads: the listener's status lines and ``Date`` header.
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
        self.respond_raw(resp.status, resp.header_bytes(), resp.body, keep_alive=keep_alive)

    def respond_raw(
        self, status: int, headers: bytes, body: bytes, *, keep_alive: bool = True
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
        head = b"%s%sContent-Length: %d\r\n%s\r\n" % (
            self._heads.start(status),
            headers,
            len(body),
            self._connection_header(),
        )
        if self._head_only or not body:
            transport.write(head)
        else:
            transport.writelines((head, body))

    def start_response(self, status: int, headers: bytes, length: int | None) -> None:
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
                % (self._heads.start(status), headers, framing, self._connection_header())
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
