"""The router's TCP listener: accepts :class:`~sessionroute.serve.http1.Connection` s, closes
idle keep-alive connections, and shuts down gracefully (see :mod:`sessionroute.serve.http1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sessionroute.serve.http1 import Connection, Handler
from sessionroute.serve.wire import HeadCache

__all__ = ["READ_BUFFER_BYTES", "Listener"]

READ_BUFFER_BYTES = 256 * 1024
"""Most bytes read from a client at once (uvloop's own read size)."""


class Listener:
    """A TCP listener serving :class:`Connection` s with one handler.

    Args:
        handler: see :data:`Handler`.
        max_body: largest request body, bytes (larger ones are flagged ``too_large``).
        keepalive_s: idle keep-alive connections are closed after about this many seconds,
            and so is a connection whose client stopped sending the body of the request being
            handled (no byte for that long; the handler's task is cancelled).
        access_log: where to log one line per request (none when None).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int,
        keepalive_s: float = 75.0,
        access_log: logging.Logger | None = None,
    ) -> None:
        self.handler = handler
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop it listens on (set by :meth:`start`)."""
        self.access_log = access_log
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.heads = HeadCache()
        self.read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        """What the event loop reads client bytes into, for every connection of this listener
        (each read is parsed, and what the parser keeps copied out, before the next)."""
        self.connections: set[Connection] = set()
        self.closing = False
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._empty: asyncio.Event | None = None

    async def start(self, host: str, port: int, *, backlog: int = 1024) -> int:
        """Listen on ``host:port``; returns the bound port (useful with port 0).

        Raises:
            OSError: the address is not available.
        """
        self.loop = loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), host, port, backlog=backlog, reuse_address=True
        )
        self._sweeper = loop.create_task(self._sweep(), name="sessionroute-idle-sweep")
        for sock in self._server.sockets:
            return int(sock.getsockname()[1])
        raise RuntimeError("the listener has no socket")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive_s / 2)
            for conn in list(self.connections):
                if conn._current is None and conn.count == conn.seen_count:
                    conn.close_when_idle()
                elif conn.awaiting_body() and conn.received == conn.seen_received:
                    conn.abort()  # sent a head, then no byte of its body for a whole sweep
                conn.seen_count = conn.count
                conn.seen_received = conn.received

    def _forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._empty is not None:
            self._empty.set()

    async def shutdown(self, timeout_s: float) -> None:
        """Stop accepting, close idle connections, give in-flight requests ``timeout_s``
        seconds to finish, then cancel what is left (releasing its reservations)."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        self._empty = asyncio.Event()
        for conn in list(self.connections):
            conn.close_when_idle()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout_s)
        tasks = [c._task for c in self.connections if c._task is not None]
        for conn in list(self.connections):
            conn.abort()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
