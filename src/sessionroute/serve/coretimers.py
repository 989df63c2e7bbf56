"""The router core's timers on the event loop (``serve``'s half of
:mod:`sessionroute.router.actions`; the simulator's is :mod:`sessionroute.sim.coretimers`).

The core keeps its own timers (circuits turning half-open, admission deadlines and re-checks,
health-check rounds, session sweeps); :class:`CoreTimers` keeps one asyncio timer armed at
:meth:`~sessionroute.router.RoutingCore.next_deadline`, runs
:meth:`~sessionroute.router.RoutingCore.on_timer` when it fires, and runs what comes back as
tasks of its own: a :class:`~sessionroute.router.actions.CheckHealth` probes the workers, a
:class:`~sessionroute.router.actions.SweepSessions` sweeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from sessionroute.clock import Clock
from sessionroute.router.actions import CheckHealth
from sessionroute.router.core import RoutingCore
from sessionroute.serve.tasks import cancel_and_wait

__all__ = ["CoreTimers"]


class CoreTimers:
    """Interprets the core's timers in real time.

    Args:
        core: the router core.
        clock: the core's clock.
        check: probes the given workers (None: every worker, a round) and feeds the results
            to the core.
        sweep: expires the sessions idle at the given time.

    Attributes:
        due: the clock time the timer is armed at (infinity when none is armed).
    """

    def __init__(
        self,
        core: RoutingCore,
        clock: Clock,
        check: Callable[[tuple[str, ...] | None], Coroutine[Any, Any, Any]],
        sweep: Callable[[float], Coroutine[Any, Any, None]],
    ) -> None:
        self.core = core
        self.clock = clock
        self._check = check
        self._sweep = sweep
        self.timer: asyncio.TimerHandle | None = None
        """The one timer, armed at the core's next deadline."""
        self.due = float("inf")
        self._jobs: set[asyncio.Task[None]] = set()
        """Health checks and sweeps the core's timers asked for, still running."""

    def start(self) -> None:
        """Follow the core's timers from now on (each push re-arms the timer if earlier)."""
        self.core.timers.on_push = self.arm

    async def close(self) -> None:
        """Stop following the core's timers; cancel the timer and the running jobs."""
        self.core.timers.on_push = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        await cancel_and_wait(list(self._jobs))
        self._jobs.clear()

    def arm(self, due: float, kind: int = 0) -> None:
        """Keep the one timer armed at the core's earliest deadline (``timers.on_push``)."""
        if self.timer is not None:
            if self.due <= due:
                return
            self.timer.cancel()
        self.due = due
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(max(0.0, due - self.clock.now()), self.fire)

    def fire(self) -> None:
        """The timer fired (perhaps a little early: the core then runs nothing yet): do what
        the core's due timers ask and re-arm at its next deadline."""
        self.timer = None
        self.due = float("inf")
        for action in self.core.on_timer(self.clock.now()):
            if isinstance(action, CheckHealth):
                self._job(self._check(None if action.round else action.urls))
            else:
                self._job(self._sweep(action.now))
        due = self.core.next_deadline()
        if due is not None:
            self.arm(due)

    def _job(self, coro: Coroutine[Any, Any, Any]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
