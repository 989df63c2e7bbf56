"""One request/response exchange with a worker, on a connection of the
:class:`~sessionroute.serve.upstream.UpstreamPool`.

An exchange sends one request on a pooled
:class:`~sessionroute.serve.worker_connection.WorkerConnection` and is that connection's
:class:`~sessionroute.serve.worker_connection.ResponseHandler` until it closes: it waits for
the response head (:meth:`Exchange.send`, :meth:`Exchange.head`), then collects the body
(:meth:`Exchange.read`) or relays it to the client as it arrives (:meth:`Exchange.relay`),
pausing the worker connection while the client's buffer is full.

It is awaited by a task, or driven by one callback (``inline``) that is told once, after the
read that brought the answer, and then ends the exchange or hands it to a task
(:meth:`Exchange.attach`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from sessionroute.serve.metrics_stream import StreamTimer
from sessionroute.serve.upstream import UpstreamPool
from sessionroute.serve.wire import ResponseWriter
from sessionroute.serve.worker_connection import UpstreamError, UpstreamHung, WorkerConnection

__all__ = ["Exchange"]


class Exchange:
    """One request/response exchange with a worker.

    Creating it registers its deadline (now plus the pool's ``timeout_s``) with the pool's
    watchdog, which calls :meth:`expire` when it passes (see :meth:`is_timeout`). Always
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
        started: ``time.monotonic()`` when the exchange was created (seconds).
        deadline: ``time.monotonic()`` by which the exchange must end (seconds).
        timed_out: True once the deadline passed.
        status: the response status (0 before the head arrived).
        keep_alive: the connection may carry another request after this response.
        framed: the response head has a ``Content-Length`` or ``Transfer-Encoding`` (its
            body is not delimited by the connection's close).
        relay_lines: the response header lines to relay to the client, as pieces to join
            (see :meth:`~sessionroute.serve.worker_connection.ResponseHandler.response_head`).
        length: the response's ``Content-Length`` (None when it has none).
        complete: the whole response body has arrived.
        sent_at: ``time.perf_counter()`` when the request was written (0 before).
        sent_all: every byte of the request was handed to the kernel.
        chunks: body pieces received so far.
        timing: told of each piece :meth:`relay` writes to the client (a streamed answer's
            :class:`~sessionroute.serve.metrics_stream.StreamTimer`), or None.
    """

    __slots__ = (
        "_cancelling",
        "_conn",
        "_error",
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
        "started",
        "status",
        "timed_out",
        "timing",
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
        self._parts: list[bytes] = []
        self._sink: ResponseWriter | None = None
        self._up_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.worker = worker
        self.started = time.monotonic()
        self.deadline = self.started + pool.timeout_s
        self.timed_out = False
        self.status = 0
        self.keep_alive = False
        self.framed = False
        self.relay_lines: list[bytes] = []
        self.length: int | None = None
        self.complete = False
        self.sent_all = False
        self.sent_at = 0.0
        self.chunks = 0
        self.timing: StreamTimer | None = None
        pool.track(self)

    # -- sending and waiting --------------------------------------------------------------
    async def send(self, parts: Iterable[bytes]) -> int:
        """Send the request (``parts``: head and body) and wait for the response head.

        Informational (1xx) responses are skipped. Returns the status; the body is then
        read with :meth:`read` or :meth:`relay`.

        Raises:
            UpstreamConnectError: no connection could be made (nothing was sent).
            UpstreamError: the connection broke or the response was malformed.
            asyncio.CancelledError: the owning task was cancelled (see :attr:`timed_out`).
        """
        if not self.send_idle(parts):
            self._write(await self._pool.connect(self.worker), parts)
        return await self.head()

    def send_idle(self, parts: Iterable[bytes]) -> bool:
        """Send the request on an idle pooled connection, without waiting; False (nothing
        sent) when there is none. The response head then comes with :meth:`head`, or to
        the ``inline`` callback.

        Raises:
            UpstreamError: the connection broke (as :meth:`send`).
        """
        conn = self._pool.take_idle(self.worker, self.started)
        if conn is None:
            return False
        self._write(conn, parts)
        return True

    def _write(self, conn: WorkerConnection, parts: Iterable[bytes]) -> None:
        self._conn = conn  # (closed by close(), whatever happens next)
        if self._error is not None:  # given up while connecting: send nothing
            raise self._error
        self.sent_at = time.perf_counter()
        self.sent_all = conn.send(self, parts)

    async def head(self) -> int:
        """Wait for the response head of the request sent; returns its status.

        Raises:
            UpstreamError: the connection broke or the response was malformed.
            asyncio.CancelledError: as :meth:`send`.
        """
        while not self.status:
            await self._wait()
        return self.status

    async def read(self) -> bytes:
        """The whole response body.

        Raises:
            UpstreamError: the connection broke before the body ended.
            asyncio.CancelledError: as :meth:`send`.
        """
        while not self.complete:
            await self._wait()
        return self.body()

    def body(self) -> bytes:
        """The body received so far (all of it once :attr:`complete`)."""
        return b"".join(self._parts)

    async def relay(self, sink: ResponseWriter) -> None:
        """Write the response body to ``sink`` as it arrives, until it ends.

        Reading from the worker pauses while ``sink`` is paused (its buffer is full).

        Raises:
            UpstreamError: the connection broke before the body ended.
            asyncio.CancelledError: as :meth:`send`.
        """
        parts = self._parts
        for part in parts:
            sink.write(part)
        if parts and self.timing is not None:  # what came before the relay began: one piece
            self.timing.piece()
        self._parts = []
        self._sink = sink
        if sink.paused:
            self._pause_upstream()
        while not self.complete:
            await self._wait()

    async def _wait(self) -> None:
        """Wait for the next event from the connection (or raise the exchange's error)."""
        if self._error is not None:
            raise self._error
        if self._task is None:
            raise RuntimeError("an inline exchange has no task to wait on (attach one)")
        self._waiter = waiter = self._task.get_loop().create_future()
        await waiter

    def attach(self, task: asyncio.Task[Any]) -> None:
        """Continue an exchange started by callbacks (``inline``) on ``task``: it is awaited
        from now on. A deadline that passed in between cancels ``task`` now."""
        self._inline = None
        self._task = task
        self._cancelling = task.cancelling()
        if self.timed_out:
            task.cancel()

    @property
    def relaying(self) -> bool:
        """The body is being written to the client (:meth:`relay` has started)."""
        return self._sink is not None

    # -- ResponseHandler: what the connection tells ----------------------------------------
    def request_sent(self) -> None:
        self.sent_all = True

    def response_head(
        self, status: int, keep_alive: bool, framed: bool, length: int | None, lines: list[bytes]
    ) -> None:
        self.status = status
        self.keep_alive = keep_alive
        self.framed = framed
        self.length = length
        self.relay_lines = lines
        if self._inline is None:  # (an inline exchange is told after the read: read_done)
            self._wake()

    def response_body(self, piece: bytes) -> None:
        self.chunks += 1
        sink = self._sink
        if sink is None:
            self._parts.append(piece)
            return
        sink.write(piece)
        timing = self.timing
        if timing is not None:
            timing.piece()
        if sink.paused and not self._up_paused:
            self._pause_upstream()

    def response_complete(self) -> None:
        self.complete = True
        if self._inline is None:  # (as response_head)
            self._wake()

    def read_done(self) -> None:
        inline = self._inline
        if inline is not None and (self.complete or self.status):
            # told once the whole read is parsed (a small answer is complete by now)
            self._inline = None
            inline(self)

    def fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = error
            self._wake()

    def connection_closed(self, exc: BaseException | None) -> None:
        if self.complete:
            return
        if self.status and not self.framed and exc is None:
            self.complete = True  # a body delimited by the close
            self.keep_alive = False
            self._wake()
            return
        what = f"{type(exc).__name__}: {exc}" if exc is not None else "closed"
        self.fail(UpstreamError(f"the worker closed the connection ({what})"))

    def _wake(self) -> None:
        inline = self._inline
        if inline is not None:  # driven by a callback: tell it once (it takes over or ends)
            self._inline = None
            inline(self)
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _pause_upstream(self) -> None:
        conn = self._conn
        sink = self._sink
        if conn is None or sink is None or not conn.pause_reading():
            return
        self._up_paused = True
        sink.on_resume = self._resume_upstream

    def _resume_upstream(self) -> None:
        conn = self._conn
        if self._up_paused and conn is not None:
            self._up_paused = False
            conn.resume_reading()

    # -- giving up, timeouts and release --------------------------------------------------
    def hang(self, reason: str) -> bool:
        """Give the worker up before anything reached the client: the waiting
        :meth:`send` or :meth:`read` raises :class:`UpstreamHung` (the caller places the
        request again). Returns False, doing nothing, once the body is being relayed to the
        client or the response is complete."""
        if self._sink is not None or self.complete:
            return False
        self.fail(UpstreamHung(reason))
        return True

    def cut(self, reason: str) -> None:
        """End a relayed response that stopped arriving: :meth:`relay` raises."""
        self.fail(UpstreamError(reason))

    def expire(self) -> None:
        """Called by the pool's watchdog when the deadline passed: cancel the owning task
        (or tell the ``inline`` callback, which answers the timeout)."""
        if not self.timed_out:
            self.timed_out = True
            if self._inline is not None:
                self._wake()
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
        """End the exchange: the connection goes back to the pool if the response was read
        to the end and neither side asked to close it.

        Anything else (an error, a timeout, a body not read to the end) closes it, so the
        worker sees the close and can stop generating. Idempotent.
        """
        self._pool.untrack(self)
        self._sink = None
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.release()
        if self.timed_out or not self.complete or not self.keep_alive or conn.lost:
            conn.close()
            return
        if self._up_paused:
            conn.resume_reading()
        self._pool.give_back(self.worker, conn)
