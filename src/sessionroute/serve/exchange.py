"""One exchange with a worker on a pooled connection (see :mod:`sessionroute.serve.upstream`).

An exchange sends one request on a pooled connection (a
:class:`~sessionroute.serve.worker_connection.WorkerConnection`, whose parser callbacks fill
the exchange in), waits for the response head, then collects the body (:meth:`Exchange.read`)
or relays it to the client as it arrives (:meth:`Exchange.relay`), pausing the worker
connection while the client's buffer is full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sessionroute.serve.worker_connection import UpstreamError, UpstreamHung, WorkerConnection

if TYPE_CHECKING:
    from sessionroute.serve.upstream import UpstreamPool
    from sessionroute.serve.wire import ResponseWriter

__all__ = ["Exchange"]


class Exchange:
    """One request/response exchange with a worker.

    Creating it registers its deadline (now plus the pool's ``timeout_s``) with the pool's
    watchdog, which cancels ``task`` when it passes (see :meth:`is_timeout`). Always
    :meth:`close` it (``try/finally``).

    Args:
        pool: the pool the connection comes from.
        worker: the worker base URL.
        task: the task that awaits the exchange (the request handler's); None for one
            driven by callbacks (``inline``) until :meth:`attach`.
        inline: called once, instead of waking a task, when the response is complete or
            only its head arrived (after the read that brought it), when the exchange
            failed, or when its deadline passed (:attr:`timed_out`); the callback ends the
            exchange or hands it to a task (:meth:`attach`).

    Attributes:
        worker: the worker base URL.
        deadline: ``time.monotonic()`` by which the exchange must end (seconds).
        timed_out: True once the watchdog cancelled the owning task for this exchange.
        status: the response status (0 before :meth:`send` returned).
        framed: the response head has a ``Content-Length`` or ``Transfer-Encoding`` (its
            body is not delimited by the connection's close).
        relay_lines: the header lines to relay to the client, as pieces to join (name, ``b": "``,
            value, ``b"\\r\\n"`` for each header as received except
            :data:`~sessionroute.serve.worker_connection.RESPONSE_DROP`).
        length: the response's ``Content-Length`` (None when it has none).
        complete: the whole response body has arrived.
    """

    __slots__ = (
        "_cancelling",
        "_conn",
        "_error",
        "_info",
        "_inline",
        "_parts",
        "_pool",
        "_sink",
        "_task",
        "_uncancelled",
        "_up_paused",
        "_waiter",
        "chunks",
        "complete",
        "deadline",
        "framed",
        "keep_alive",
        "length",
        "relay_lines",
        "sent_all",
        "sent_at",
        "status",
        "timed_out",
        "worker",
    )

    def __init__(
        self,
        pool: UpstreamPool,
        worker: str,
        task: asyncio.Task[Any] | None,
        inline: Callable[[Exchange], None] | None = None,
    ) -> None:
        self._pool = pool
        self._task = task
        self._inline = inline
        self._cancelling = task.cancelling() if task is not None else 0
        self._uncancelled = False
        self._conn: WorkerConnection | None = None
        self._error: UpstreamError | None = None
        self._info = False
        self._parts: list[bytes] = []
        self._sink: ResponseWriter | None = None
        self._up_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.worker = worker
        self.deadline = time.monotonic() + pool.timeout_s
        self.timed_out = False
        self.status = 0
        self.framed = False
        self.relay_lines: list[bytes] = []
        self.length: int | None = None
        self.keep_alive = False
        self.complete = False
        self.sent_all = False
        self.sent_at = 0.0
        self.chunks = 0
        pool._inflight[self] = None

    async def send(self, parts: Iterable[bytes]) -> int:
        """Send the request (``parts``: head and body) and wait for the response headers.

        Informational (1xx) responses are skipped. Returns the status; the body is then
        read with :meth:`read` or :meth:`relay`.

        Raises:
            UpstreamConnectError: no connection could be made (nothing was sent).
            UpstreamError: the connection broke or the response was malformed.
            asyncio.CancelledError: the owning task was cancelled (see :attr:`timed_out`).
        """
        if not self.send_idle(parts):
            conn = await self._pool._connect(self._pool._target(self.worker))
            self._write(conn, parts)
        return await self.head()

    def send_idle(self, parts: Iterable[bytes]) -> bool:
        """Send the request on an idle pooled connection, without waiting; False (nothing
        sent) when there is none. The response head then comes with :meth:`head`, or to
        the ``inline`` callback.

        Raises:
            UpstreamError: the connection broke (as :meth:`send`).
        """
        # the most recently used idle connection (closed or stale ones are dropped)
        pool = self._pool
        idle = (pool._targets.get(self.worker) or pool._target(self.worker)).idle
        # idle since before `stale` (the keep-alive ago): the worker may be closing it now
        stale = self.deadline - pool.timeout_s - pool.keepalive_s
        while idle:
            conn, since = idle.pop()
            if not conn.lost and since > stale:
                self._write(conn, parts)
                return True
            conn.close()
        return False

    async def head(self) -> int:
        """Wait for the response head of the request sent; returns its status.

        Raises:
            UpstreamError: the connection broke or the response was malformed.
            asyncio.CancelledError: as :meth:`send`.
        """
        while not self.status:
            if self._error is not None:
                raise self._error
            self._waiter = waiter = self._loop().create_future()
            await waiter
        return self.status

    def _write(self, conn: WorkerConnection, parts: Iterable[bytes]) -> None:
        self._conn = conn
        conn.exchange = self
        transport = conn.transport
        if self._error is not None:  # given up while connecting: send nothing
            raise self._error
        if transport is None or conn.lost:
            raise UpstreamError("the worker closed the connection")
        self.sent_at = time.perf_counter()
        transport.writelines(parts)
        self.sent_all = not conn.draining

    def _loop(self) -> asyncio.AbstractEventLoop:
        if self._task is None:
            raise RuntimeError("an inline exchange has no task to wait on (attach one)")
        return self._task.get_loop()

    def attach(self, task: asyncio.Task[Any]) -> None:
        """Continue an exchange started by callbacks (``inline``) on ``task``: it is awaited
        from now on. A deadline that passed in between cancels ``task`` now."""
        self._inline = None
        self._task = task
        self._cancelling = task.cancelling()
        if self.timed_out:
            task.cancel()

    async def read(self) -> bytes:
        """The whole response body.

        Raises:
            UpstreamError: the connection broke before the body ended.
            asyncio.CancelledError: as :meth:`send`.
        """
        while not self.complete:
            if self._error is not None:
                raise self._error
            self._waiter = waiter = self._loop().create_future()
            await waiter
        return self.body()

    def body(self) -> bytes:
        """The body received so far (all of it once :attr:`complete`)."""
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def relay(self, sink: ResponseWriter) -> None:
        """Write the response body to ``sink`` as it arrives, until it ends.

        Reading from the worker pauses while ``sink`` is paused (its buffer is full).

        Raises:
            UpstreamError: the connection broke before the body ended.
            asyncio.CancelledError: as :meth:`send`.
        """
        for part in self._parts:
            sink.write(part)
        self._parts = []
        self._sink = sink
        if sink.paused:
            self._pause_upstream()
        while not self.complete:
            if self._error is not None:
                raise self._error
            self._waiter = waiter = self._loop().create_future()
            await waiter

    # -- from the connection -------------------------------------------------------------
    def _wake(self) -> None:
        inline = self._inline
        if inline is not None:  # driven by callbacks: tell it once (it takes over or ends)
            self._inline = None
            inline(self)
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _on_lost(self, exc: BaseException | None) -> None:
        if self.complete:
            return
        if self.status and not self.framed and exc is None:
            self.complete = True  # a body delimited by the close
            self.keep_alive = False
        else:
            what = f"{type(exc).__name__}: {exc}" if exc is not None else "closed"
            self._error = UpstreamError(f"the worker closed the connection ({what})")
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = error
            self._wake()

    def _pause_upstream(self) -> None:
        conn = self._conn
        sink = self._sink
        if conn is None or conn.transport is None or sink is None:
            return
        self._up_paused = True
        conn.transport.pause_reading()
        sink.on_resume = self._resume_upstream

    def _resume_upstream(self) -> None:
        conn = self._conn
        if self._up_paused and conn is not None and conn.transport is not None and not conn.lost:
            self._up_paused = False
            conn.transport.resume_reading()

    def hang(self, reason: str) -> bool:
        """Give the worker up before anything reached the client: the waiting
        :meth:`send` or :meth:`read` raises :class:`UpstreamHung` (the caller places the
        request again). Returns False, doing nothing, once the body is being relayed to the
        client or the response is complete."""
        if self._sink is not None or self.complete:
            return False
        self._fail(UpstreamHung(reason))
        return True

    def cut(self, reason: str) -> None:
        """End a relayed response that stopped arriving: :meth:`relay` raises."""
        self._fail(UpstreamError(reason))

    @property
    def relaying(self) -> bool:
        """The body is being written to the client (:meth:`relay` has started)."""
        return self._sink is not None

    # -- timeouts and release ------------------------------------------------------------
    def expire(self) -> None:
        """Called by the watchdog when the deadline passed: cancel the owning task."""
        if not self.timed_out:
            self.timed_out = True
            if self._inline is not None:
                self._wake()  # the callback answers the timeout
            elif self._task is not None:
                self._task.cancel()  # (without a task yet, attach() cancels it)

    def is_timeout(self) -> bool:
        """Call in ``except asyncio.CancelledError``: True when the cancellation is this
        exchange's timeout and nothing else (the task is then un-cancelled and may go on);
        False when it must propagate (the client went away, or the task is being stopped).

        The same rule as ``asyncio.timeout``.
        """
        if not self.timed_out or self._task is None:
            return False
        if not self._uncancelled:
            self._uncancelled = True
            return self._task.uncancel() <= self._cancelling
        return self._task.cancelling() <= self._cancelling

    def close(self) -> None:
        """End the exchange: keep the connection if the response was read to the end.

        Anything else (an error, a timeout, a body not read to the end) closes it.
        Idempotent.
        """
        self._pool._inflight.pop(self, None)
        self._sink = None
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.exchange = None
        if self.timed_out or not self.complete or not self.keep_alive or conn.lost:
            conn.close()
            return
        if self._up_paused and conn.transport is not None:
            conn.transport.resume_reading()
        target = self._pool._targets.get(self.worker)
        if target is None or len(target.idle) >= self._pool._max_idle:
            conn.close()  # a removed worker, or more idle connections than kept
        else:
            target.idle.append((conn, time.monotonic()))
