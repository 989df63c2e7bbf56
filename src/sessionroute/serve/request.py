"""A parsed HTTP/1.1 request of the router's listener, and the callback-driven handler type.

Split from :mod:`sessionroute.serve.http1` (which re-exports everything here): the request
object the parser fills, the head limits, and :class:`Inline`, the interface of a handler
that answers from protocol callbacks instead of a coroutine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["MAX_HEADERS", "MAX_HEAD_BYTES", "HeadTooLarge", "Inline", "Request"]

MAX_HEAD_BYTES = 65536
"""Largest request line plus headers, bytes (a larger head is a 431, as is a head of more
than :data:`MAX_HEADERS` headers)."""

MAX_HEADERS = 256
"""Most header fields in one request."""


class HeadTooLarge(ValueError):
    """The request head is over :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` (HTTP 431)."""


class Inline:
    """A request answered from callbacks rather than by a coroutine (no task wake-up).

    A handler returns one when it can answer from protocol callbacks alone (the proxy's
    common case: the body arrives, the request goes out on a pooled connection, the answer
    comes back in one read). The connection calls :meth:`waiting` when the read that
    completed the head is parsed and the body is not all there, :meth:`ready` once the body
    is complete (or will never be: over the size limit, broken framing), and
    :meth:`client_lost` if the client goes away before the answer ended. When the answer is
    written later, the handler ends the request with :meth:`Connection.finish`; when
    it needs to wait after all, it continues on the connection's task with
    :meth:`Connection.hand_over`.
    """

    __slots__ = ()

    def ready(self) -> bool:
        """The body arrived: returns False when the request was answered now, True while the
        answer is under way."""
        raise NotImplementedError

    def waiting(self) -> bool:
        """The head arrived and the read that brought it is parsed, but not all the body:
        returns False when the request was answered now (without its body: the rest is read
        and dropped), True to wait for :meth:`ready`."""
        raise NotImplementedError

    def client_lost(self) -> None:
        """The client connection closed before the answer ended: release what is held."""
        raise NotImplementedError


class Request:
    """One parsed request; the body arrives into :attr:`parts` while the handler runs.

    Attributes:
        method: ``"GET"``, ``"POST"``, ...
        target: the request target as sent (``b"/path?query"``).
        path: its path, decoded as UTF-8 (surrogate escapes).
        query: its query string, not decoded ("" when none).
        lower: lower-case header name -> the first value with that name.
        forward: the header lines a proxy forwards, as pieces to join (name, ``b": "``,
            value, ``b"\\r\\n"`` for each header as received, trailers included, except the
            names in the listener's ``forward_drop``), built while the head is parsed.
        dropped: the other header lines (those named in ``forward_drop``), as pieces like
            :attr:`forward`'s; with it, every header received (see :attr:`headers`).
        connection_header: a header named ``Connection`` came (it may name more headers
            that are not forwarded, RFC 9110 7.6.1: :attr:`forward` does not know them).
        content_length: the Content-Length (None when absent: chunked or no body).
        keep_alive: whether the client lets the connection be reused.
        http10: HTTP/1.0 request.
        parts: the body pieces received so far (no copies).
        size: their total length, bytes.
        complete: the whole body has arrived.
        too_large: the body is over the listener's limit (its pieces are dropped).
        arrived: ``time.perf_counter()`` when a streamed generation request was complete at
            the proxy (the start of its time to first token); 0.0 for any other request.
    """

    __slots__ = (
        "_ready",
        "_waiter",
        "arrived",
        "complete",
        "connection_header",
        "content_length",
        "discard",
        "dropped",
        "forward",
        "http10",
        "keep_alive",
        "lower",
        "method",
        "parts",
        "path",
        "query",
        "size",
        "target",
        "too_large",
        "trusted",
    )

    def __init__(self) -> None:
        self.method = ""
        self.target = b""
        self.path = ""
        self.query = ""
        self.lower: dict[bytes, bytes] = {}
        self.forward: list[bytes] = []
        self.dropped: list[bytes] = []
        self.connection_header = False
        self.content_length: int | None = None
        self.keep_alive = True
        self.http10 = False
        self.parts: list[bytes] = []
        self.size = 0
        self.complete = False
        self.too_large = False
        self.discard = False
        self.arrived = 0.0
        self.trusted = False
        """Set by the handler: the client may see details (``/health``)."""
        self._waiter: asyncio.Future[None] | None = None
        self._ready: Callable[[], None] | None = None

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The header (name, value) pairs: those of :attr:`forward`, in the order received,
        then those of :attr:`dropped` (the lines are kept as pieces to forward rather than
        as pairs, which only this rare reader needs)."""
        pieces = self.forward + self.dropped
        return list(zip(pieces[0::4], pieces[2::4], strict=True))

    async def body(self) -> list[bytes] | None:
        """Wait for the whole body: its pieces, or None when it is over the size limit or its
        framing broke (the connection already answered it)."""
        if not self.complete and not self.too_large:
            self._waiter = waiter = asyncio.get_running_loop().create_future()
            await waiter
        return self.parts if self.complete and not self.too_large else None

    def _wake(self) -> None:
        ready = self._ready
        if ready is not None:  # an Inline handler waits for the body
            self._ready = None
            ready()
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
