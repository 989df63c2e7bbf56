"""The router's TCP listener: accepts :class:`~sessionroute.serve.http1.Connection` s up to a
cap, closes idle and slow ones, and shuts down gracefully (see :mod:`sessionroute.serve.http1`).

Limits, nginx's in spirit (``worker_connections``, ``client_header_timeout``,
``client_body_timeout``, ``keepalive_timeout``): a connection over ``max_connections`` is
closed at once; a request head must be complete within ``header_timeout_s`` of its first byte
(a new connection's within that of its accept), however slowly it trickles in; a request body
may pause at most ``header_timeout_s``; an idle keep-alive connection is closed after
``keepalive_s``. One sweep task checks every connection each ``tick`` (a quarter of the
shortest limit), counting sweeps rather than reading a clock per read, so each limit holds
within one tick. Each close is reported to ``on_closed`` with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from sessionroute.serve.http1 import Connection, Handler, parse_target
from sessionroute.serve.wire import HeadCache

__all__ = ["READ_BUFFER_BYTES", "TARGETS_KEPT", "TARGET_KEPT_BYTES", "Listener"]

READ_BUFFER_BYTES = 256 * 1024
"""Most bytes read from a client at once (uvloop's own read size)."""

TARGETS_KEPT = 1024
"""Most request targets in :attr:`Listener.targets` (it is emptied when full)."""

TARGET_KEPT_BYTES = 1024
"""Longest request target entered in :attr:`Listener.targets`, bytes."""


class Listener:
    """A TCP listener serving :class:`Connection` s with one handler.

    Args:
        handler: see :data:`Handler`.
        max_body: largest request body, bytes (larger ones are flagged ``too_large``).
        keepalive_s: idle keep-alive connections are closed after about this many seconds.
        header_timeout_s: a request head must arrive whole within this many seconds, and a
            body may pause no longer (the handler's task is then cancelled); half of
            ``keepalive_s`` when None.
        max_connections: most connections at once (no cap when None).
        on_closed: called with the reason of each connection the listener closes
            (``connection_limit``, ``header_timeout``, ``body_timeout``, ``idle_timeout``).
        access_log: where to log one line per request (none when None).
        forward_drop: see :attr:`forward_drop` (none left out by default).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int,
        keepalive_s: float = 75.0,
        header_timeout_s: float | None = None,
        max_connections: int | None = None,
        on_closed: Callable[[str], None] | None = None,
        access_log: logging.Logger | None = None,
        forward_drop: frozenset[bytes] = frozenset(),
    ) -> None:
        self.handler = handler
        self.forward_drop = forward_drop
        """Lower-case names of the request headers left out of
        :attr:`~sessionroute.serve.request.Request.forward` (a proxy's hop-by-hop set)."""
        self.header_timeout_s = keepalive_s / 2 if header_timeout_s is None else header_timeout_s
        self.max_connections = max_connections
        self.on_closed = on_closed
        self.tick = min(keepalive_s, self.header_timeout_s) / 4
        self.sweeps = 0
        """Sweeps so far (connections note the sweep their head began in)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop it listens on (set by :meth:`start`)."""
        self.access_log = access_log
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.heads = HeadCache()
        self.read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        """What the event loop reads client bytes into, for every connection of this listener
        (each read is parsed, and what the parser keeps copied out, before the next)."""
        self.targets: dict[bytes, tuple[bytes, str, str]] = {}
        """Request target -> :func:`~sessionroute.serve.http1.parse_target`'s answer, for
        the targets seen lately (a router serves a few paths: each is parsed once)."""
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

    def parse_target(self, target: bytes) -> tuple[bytes, str, str]:
        """:func:`~sessionroute.serve.http1.parse_target`, memoized in :attr:`targets` (for
        targets of at most :data:`TARGET_KEPT_BYTES`; :data:`TARGETS_KEPT` at most).

        Raises:
            ValueError: an absolute-form target that is not a URL.
        """
        parsed = self.targets.get(target)
        if parsed is not None:
            return parsed
        parsed = parse_target(target)
        if len(target) <= TARGET_KEPT_BYTES:
            if len(self.targets) >= TARGETS_KEPT:
                self.targets.clear()
            self.targets[target] = parsed
        return parsed

    def closed(self, reason: str) -> None:
        """Report one connection closed for ``reason``."""
        if self.on_closed is not None:
            self.on_closed(reason)

    async def _sweep(self) -> None:
        tick = self.tick
        while True:
            await asyncio.sleep(tick)
            self.sweeps = sweeps = self.sweeps + 1
            for conn in list(self.connections):
                self._check(conn, sweeps, tick)

    def _check(self, conn: Connection, sweeps: int, tick: float) -> None:
        if conn._bad and conn._linger_timer is not None:
            return  # lingering after a 400/431 (its own timer ends it): a reset now could
            # destroy the answer before the client reads it
        progressed = conn.count != conn.seen_count or conn.received != conn.seen_received
        conn.seen_count = conn.count
        conn.seen_received = conn.received
        conn.quiet_sweeps = 0 if progressed else conn.quiet_sweeps + 1
        if conn._current is None:
            if conn.in_head or not conn.count:  # a head under way, or none yet
                if (sweeps - conn.head_sweep) * tick >= self.header_timeout_s:
                    self.closed("header_timeout")
                    conn.abort()
            elif conn.quiet_sweeps * tick >= self.keepalive_s:
                self.closed("idle_timeout")
                conn.close_when_idle()
        elif conn.awaiting_body() and conn.quiet_sweeps * tick >= self.header_timeout_s:
            self.closed("body_timeout")
            conn.abort()  # sent a head, then no byte of its body for that long

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
