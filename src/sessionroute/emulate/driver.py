"""Driving the pure replica model in real time.

One asyncio task per replica keeps the engine's clock at ``sim_now = (monotonic() - t0) *
time_scale`` simulated seconds: it advances the engine to ``sim_now``, hands finished requests to
their waiters, and sleeps until the engine's next event (or a new arrival). A request is added
at the current ``sim_now``, so it joins the first engine step that starts after it arrived.

Streaming: while a streaming request is live the task also wakes every ``stream_interval_s``
wall seconds and reads how many tokens each streaming request has produced so far
(:func:`tokens_generated`), so tokens reach the client at most one interval (plus event-loop
latency) after the modelled step that produced them. Non-streaming requests only wait for their
finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from sessionroute.emulate.protocol import EmulatorRequestError
from sessionroute.replica import EngineRequest, Replica, RequestResult

__all__ = ["RealTimeEngine", "Ticket", "tokens_generated"]

log = logging.getLogger("sessionroute.emulate")

_MIN_SLEEP_S = 0.0002
"""Shortest wall sleep between engine advances, seconds (bounds the loop's CPU use)."""


def tokens_generated(replica: Replica, request_id: str) -> int | None:
    """Tokens a live request has generated so far at the engine's clock (``replica.time``).

    The public engine API only reports finished requests, so this reads the engine's per-request
    state after reading :attr:`Replica.num_running` (which brings the fast path's jumped-over
    decode steps up to ``replica.time``): ``num_output`` of the request, plus, for a fast-path
    *lazy decoder*, the steps applied since its counters were last synced
    (``core.g - req.sync``). Kept in this one function so an engine change breaks one place
    (``tests/test_emulator_driver.py`` checks it against the reference engine).

    Returns:
        The count, or None when the request is not live (finished, aborted, unknown) or the
        engine does not expose its state (then streamed tokens arrive at the finish).
    """
    _ = replica.num_running  # syncs the fast path's run in flight to replica.time
    core = getattr(replica, "_core", None)
    reqs = getattr(core, "reqs", None)
    if not isinstance(reqs, dict):
        return None
    state = reqs.get(request_id)
    n = getattr(state, "num_output", None)
    if not isinstance(n, int):
        return None
    if getattr(state, "lazy", False) is True:
        g = getattr(core, "g", None)
        sync = getattr(state, "sync", None)
        if not (isinstance(g, int) and isinstance(sync, int)):
            return None
        n += g - sync
    return n


class Ticket:
    """A request submitted to a :class:`RealTimeEngine`: its progress and, at the end, its result.

    Attributes:
        request_id: the engine request id.
        stream: whether progress (``produced``) is tracked token by token.
        produced: tokens known to be generated so far (streaming only; ``output_len`` once
            finished).
        result: the engine's result once finished, else None.
        error: set when the driver stopped or failed before the request finished.
    """

    __slots__ = ("_changed", "error", "output_len", "produced", "request_id", "result", "stream")

    def __init__(self, request_id: str, output_len: int, stream: bool) -> None:
        self.request_id = request_id
        self.output_len = output_len
        self.stream = stream
        self.produced = 0
        self.result: RequestResult | None = None
        self.error: BaseException | None = None
        self._changed = asyncio.Event()

    @property
    def done(self) -> bool:
        """Finished or failed."""
        return self.result is not None or self.error is not None

    def _notify(self) -> None:
        self._changed.set()

    async def changed(self) -> None:
        """Wait until ``produced``, ``result`` or ``error`` changed since the last call.

        Raises:
            BaseException: the driver's error, if it stopped before the request finished.
        """
        await self._changed.wait()
        self._changed.clear()
        if self.error is not None and self.result is None:
            raise self.error

    async def wait(self) -> RequestResult:
        """Wait for the result.

        Raises:
            BaseException: the driver's error, if it stopped before the request finished.
        """
        while self.result is None:
            await self.changed()
        return self.result


class RealTimeEngine:
    """Runs one :class:`Replica` in real time (see the module docstring).

    Args:
        replica: the engine (owned by the driver from now on).
        time_scale: simulated seconds per wall second, > 0 (10: ten times faster than the
            modelled GPU).
        stream_interval_s: wall seconds between progress reads while streaming requests are
            live, > 0.
        clock: wall clock in seconds (monotonic).
        on_finish: called with every finished request's result (metrics).

    Raises:
        ValueError: on a non-positive ``time_scale`` or ``stream_interval_s``.
    """

    def __init__(
        self,
        replica: Replica,
        time_scale: float,
        *,
        stream_interval_s: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
        on_finish: Callable[[RequestResult], None] | None = None,
    ) -> None:
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise ValueError(f"time_scale must be a positive number, got {time_scale!r}")
        if not stream_interval_s > 0:
            raise ValueError(f"stream_interval_s must be > 0, got {stream_interval_s!r}")
        self.replica = replica
        self.time_scale = float(time_scale)
        self.stream_interval_s = float(stream_interval_s)
        self._clock = clock
        self._on_finish = on_finish
        self._t0: float | None = None
        self._tickets: dict[str, Ticket] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the driving task in the running event loop; simulated time starts at 0."""
        if self._task is not None:
            raise RuntimeError("driver already started")
        self._t0 = self._clock()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="sessionroute-emulator-driver")

    async def stop(self) -> None:
        """Stop the task; requests still live fail with a 503 :class:`EmulatorRequestError`."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all(EmulatorRequestError(503, "the emulated replica is shutting down"))
        self._failure = self._failure or EmulatorRequestError(503, "the emulated replica stopped")

    @property
    def sim_now(self) -> float:
        """Simulated seconds since :meth:`start` (0 before)."""
        if self._t0 is None:
            return 0.0
        return (self._clock() - self._t0) * self.time_scale

    @property
    def live(self) -> int:
        """Requests submitted and neither finished nor aborted."""
        return len(self._tickets)

    # ------------------------------------------------------------------ requests

    def submit(self, req: EngineRequest, *, stream: bool) -> Ticket:
        """Add ``req`` to the engine at the current simulated time.

        Raises:
            EngineRequestError: the engine refuses the request (lengths, duplicate id).
            EmulatorRequestError: 503 when the driver is not running.
        """
        if self._task is None or self._failure is not None:
            raise self._failure or EmulatorRequestError(503, "the emulated replica is not running")
        now = self.poll()
        self.replica.add_request(req, now)
        ticket = Ticket(req.request_id, req.output_len, stream)
        self._tickets[req.request_id] = ticket
        if self._wake is not None:
            self._wake.set()
        return ticket

    def abort(self, request_id: str) -> bool:
        """Abort a live request (client gone); True if it was live in the engine."""
        ticket = self._tickets.pop(request_id, None)
        if ticket is None:
            return False
        live = self.replica.abort(request_id, self.sim_now)
        if self._wake is not None:
            self._wake.set()
        return live

    def set_slowdown(self, factor: float) -> None:
        """Multiply every engine step starting from now by ``factor`` (1.0: full speed);
        requests in flight stay and finish at the new pace.

        Raises:
            ConfigError: if ``factor`` is not > 0.
        """
        self.replica.set_slowdown(factor, self.poll())
        if self._wake is not None:
            self._wake.set()

    def poll(self) -> float:
        """Advance the engine to the current simulated time and deliver finished requests.

        Returns:
            The simulated time advanced to, seconds.
        """
        now = self.sim_now
        if now < self.replica.time:
            now = self.replica.time
        for res in self.replica.advance(now):
            ticket = self._tickets.pop(res.request_id, None)
            if self._on_finish is not None:
                self._on_finish(res)
            if ticket is not None:
                ticket.result = res
                ticket.produced = res.output_tokens
                ticket._notify()
        return now

    # ------------------------------------------------------------------ the task

    def _fail_all(self, exc: BaseException) -> None:
        tickets, self._tickets = self._tickets, {}
        for ticket in tickets.values():
            ticket.error = exc
            ticket._notify()

    def _update_streams(self) -> bool:
        """Refresh ``produced`` of live streaming tickets; True if any is live."""
        any_stream = False
        for rid, ticket in self._tickets.items():
            if not ticket.stream:
                continue
            any_stream = True
            n = tokens_generated(self.replica, rid)
            if n is not None and n > ticket.produced:
                ticket.produced = n
                ticket._notify()
        return any_stream

    async def _run(self) -> None:
        wake = self._wake
        if wake is None:  # pragma: no cover - start() sets it
            raise RuntimeError("driver not started")
        try:
            while True:
                now = self.poll()
                streaming = self._update_streams()
                nxt = self.replica.next_event_time()
                delay = None if nxt is None else max((nxt - now) / self.time_scale, _MIN_SLEEP_S)
                if streaming:
                    delay = (
                        self.stream_interval_s
                        if delay is None
                        else min(delay, self.stream_interval_s)
                    )
                wake.clear()
                if delay is None:
                    await wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await wake.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("emulated replica failed")
            self._failure = EmulatorRequestError(500, f"emulated replica failed: {exc!r}")
            self._fail_all(self._failure)
