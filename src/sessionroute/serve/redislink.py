"""One pipelined connection to Redis for the router's hot path.

redis-py's client checks a connection out of its pool and waits for each reply before the
connection serves the next command: about 190-280 us of router CPU per call on the reference
machine (``docs/router.md``). A router sends one command per request, many concurrently, and
needs no transactions, so :class:`RedisLink` keeps a single redis-py
:class:`~redis.asyncio.connection.Connection` and pipelines on it: every call writes its
command at once and queues a future; one reader task takes the replies in order (RESP
replies come back in command order) and resolves the futures. Concurrent requests therefore
share round trips and system calls instead of each paying for its own.

A Redis that stops answering is noticed by :meth:`RedisLink.check` (called periodically):
when the oldest call has waited longer than ``timeout_s`` the connection is dropped and every
waiting call fails with :class:`~redis.exceptions.TimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RedisLink"]


class RedisLink:
    """A pipelined connection (module docstring).

    Args:
        url: Redis URL (``redis://HOST:PORT/DB``, ``rediss://``, ``unix://``; credentials and
            database as redis-py reads them).
        timeout_s: longest wait for a reply (and for connecting) before the link is dropped.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._pool = ConnectionPool.from_url(
            url,
            decode_responses=True,
            socket_timeout=None,  # replies are awaited by futures; see check()
            socket_connect_timeout=timeout_s,
        )
        self._conn: AbstractConnection | None = None
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    async def connect(self) -> None:
        """Open the connection (a no-op when open).

        Raises:
            redis.exceptions.ConnectionError, TimeoutError, OSError: Redis unreachable.
        """
        async with self._connecting:
            if self._conn is not None:
                return
            conn: AbstractConnection = self._pool.make_connection()  # type: ignore[no-untyped-call]
            await asyncio.wait_for(conn.connect(), self.timeout_s)  # type: ignore[no-untyped-call]
            self._conn = conn
            self._reader = asyncio.create_task(self._read(conn), name="sessionroute-redis-read")

    async def call(self, *args: str | int) -> Any:
        """Send one command and wait for its reply.

        Raises:
            redis.exceptions.ResponseError: the command failed on the server (e.g. NOSCRIPT).
            redis.exceptions.ConnectionError, TimeoutError: the link is down or was dropped.
        """
        conn = self._conn
        if conn is None:
            raise RedisConnectionError("not connected to the shared state")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((fut, time.monotonic()))
        try:
            await conn.send_packed_command(conn.pack_command(*args), check_health=False)
        except Exception as exc:
            self._drop(conn, exc)
        return await fut

    def check(self) -> None:
        """Drop the link when its oldest call has waited longer than ``timeout_s``."""
        pending = self._pending
        if pending and self._conn is not None and time.monotonic() - pending[0][1] > self.timeout_s:
            self._drop(self._conn, RedisTimeoutError(f"no reply from Redis in {self.timeout_s} s"))

    def reset(self) -> None:
        """Drop the connection (waiting calls fail); the next :meth:`connect` opens a new one."""
        if self._conn is not None:
            self._drop(self._conn, RedisConnectionError("link reset"))

    async def close(self) -> None:
        """Close the connection; waiting calls fail."""
        if self._conn is not None:
            self._drop(self._conn, RedisConnectionError("link closed"))
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        await self._pool.disconnect()

    async def _read(self, conn: AbstractConnection) -> None:
        pending = self._pending
        try:
            while True:
                try:
                    reply = await conn.read_response()
                except ResponseError as exc:
                    if pending:
                        fut = pending.popleft()[0]
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                if pending:
                    fut = pending.popleft()[0]
                    if not fut.done():
                        fut.set_result(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._drop(conn, exc)

    def _drop(self, conn: AbstractConnection, exc: BaseException) -> None:
        """Forget ``conn`` (if still current) and fail every waiting call."""
        if self._conn is not conn:
            return
        self._conn = None
        if not isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
            exc = RedisConnectionError(f"{type(exc).__name__}: {exc}")
        while self._pending:
            fut = self._pending.popleft()[0]
            if not fut.done():
                fut.set_exception(exc)
        reader = self._reader
        self._reader = None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        task = asyncio.ensure_future(conn.disconnect(nowait=True))
        task.add_done_callback(_ignore)


def _ignore(task: asyncio.Future[Any]) -> None:
    """Retrieve a background task's exception so it is never reported as unretrieved."""
    if not task.cancelled():
        task.exception()
