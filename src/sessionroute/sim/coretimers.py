"""The router core's timers on the simulator's event queue.

The core keeps its own timers (circuits turning half-open, admission deadlines and re-checks,
health-check rounds, session sweeps: :mod:`sessionroute.router.actions`); a driver keeps one
timer armed at :meth:`~sessionroute.router.RoutingCore.next_deadline`. Here that timer is one
event in the queue: pending work (a circuit, a ticket) at ``PRIO_TIMER``, only recurring
timers at ``PRIO_SAMPLE``, so a run whose work is done ends as before. When it fires,
:class:`CoreTimers` runs :meth:`~sessionroute.router.RoutingCore.on_timer` and interprets what
comes back: a :class:`~sessionroute.router.actions.CheckHealth` probes the simulated replicas
(``probe``), a :class:`~sessionroute.router.actions.SweepSessions` sweeps at once.
"""

from __future__ import annotations

from collections.abc import Callable

from sessionroute.router.actions import CheckHealth
from sessionroute.router.core import RoutingCore
from sessionroute.sim.events import PRIO_SAMPLE, PRIO_TIMER, EventQueue

__all__ = ["CoreTimers"]


class CoreTimers:
    """Interprets the core's timers in virtual time.

    Args:
        queue: the simulation's event queue (its clock is the core's).
        core: the router core.
        probe: checks the health of one worker now (the simulation folds the verdict in,
            at once or after the check's timeout).
    """

    def __init__(self, queue: EventQueue, core: RoutingCore, probe: Callable[[str], None]) -> None:
        self.queue = queue
        self.core = core
        self._probe = probe
        self._token = 0
        self._armed_t = float("inf")
        self._armed_work = False
        core.timers.on_push = self._pushed

    def start(self) -> None:
        """Start the core's periodic timers now (a health-check round, the sweeps)."""
        self.core.start(self.queue.now())

    def _pushed(self, due: float, kind: int) -> None:
        work = self.core.timers.work > 0
        if due < self._armed_t or (work and not self._armed_work):
            self._arm(min(due, self._armed_t))

    def _arm(self, due: float) -> None:
        self._token += 1
        self._armed_t = due
        work = self.core.timers.work > 0
        self._armed_work = work
        now = self.queue.now()
        self.queue.push(
            due if due > now else now, PRIO_TIMER if work else PRIO_SAMPLE, self._fire, self._token
        )

    def _fire(self, token: int) -> None:
        if token != self._token:
            return  # superseded by an earlier (or more urgent) arming
        self._armed_t = float("inf")
        self._armed_work = False
        core = self.core
        now = self.queue.now()
        for action in core.on_timer(now):
            if isinstance(action, CheckHealth):
                for url in action.urls:
                    self._probe(url)
            else:
                core.sweep(action.now)
        due = core.next_deadline()
        if due is not None and due < self._armed_t:
            self._arm(due)
