"""The router core's clock-driven work (:class:`CoreTiming`, a base of
:class:`~sessionroute.router.core.RoutingCore`): the periodic timers it starts (health-check
rounds, session sweeps) and :meth:`CoreTiming.on_timer`, which runs every timer due
(:mod:`sessionroute.router.actions`) and tells the driver what to do now."""

from __future__ import annotations

from sessionroute.router.actions import (
    CIRCUIT,
    DEADLINE,
    HEALTH,
    RECHECK,
    SICK_RECHECK,
    SWEEP,
    CheckHealth,
    SweepSessions,
)
from sessionroute.router.admission import Ticket
from sessionroute.router.coreparts import CoreParts

__all__ = ["CoreTiming", "TimerAction"]


TimerAction = CheckHealth | SweepSessions
"""What :meth:`CoreTiming.on_timer` asks of a driver."""


class CoreTiming(CoreParts):
    """The core's timers (module docstring); the core's attributes it reads are set by
    :class:`~sessionroute.router.core.RoutingCore`."""

    def start(self, now: float, *, checked: bool = False) -> None:
        """The router starts at ``now``: set the periodic timers (a health-check round at
        once, then every ``health_check_interval_s``; a session sweep every
        ``sweep_interval_s``). ``checked``: the driver has run the first round itself (serve
        does, before it listens), so the next is one interval later."""
        first = now + self.config.health_check_interval_s if checked else now
        self.timers.push(first, HEALTH)
        sweep_s = self.config.sweep_interval_s
        if sweep_s is not None:
            self.timers.push(now + sweep_s, SWEEP)

    def next_deadline(self) -> float | None:
        """The clock time of the core's earliest timer, or None: a driver keeps one timer
        armed for it and calls :meth:`on_timer` when it fires (early is harmless)."""
        return self.timers.next_due()

    def on_timer(self, now: float) -> list[TimerAction]:
        """Run every timer due at ``now`` (the core's clock): open circuits turn half-open,
        admission tickets past their deadline are placed or refused (their ``on_ready``),
        waiting tickets are re-checked; returns what the driver must do now (health checks to
        probe, a sweep to run), in order."""
        out: list[TimerAction] = []
        timers = self.timers
        c = self.config
        while (item := timers.pop_due(now)) is not None:
            kind, subject = item
            if kind == CIRCUIT:
                self.refresh(subject)
            elif kind == DEADLINE:
                self._deadline(subject)
            elif kind == RECHECK:
                self._recheck_set = False
                self.recheck()
                if self.admission.waiting:
                    self._set_recheck(now)
            elif kind == HEALTH:
                out.append(CheckHealth(self.cluster.workers(), True))
                timers.push(now + c.health_check_interval_s, HEALTH)
            elif kind == SICK_RECHECK:
                self._sick_set = False
                sick = self._sick()
                if sick:
                    out.append(CheckHealth(sick, False))
                    self._set_sick_recheck(now)
            elif kind == SWEEP:
                out.append(SweepSessions(now))
                if c.sweep_interval_s is not None:
                    timers.push(now + c.sweep_interval_s, SWEEP)
        return out

    def _deadline(self, ticket: Ticket) -> None:
        """A ticket's deadline timer: placed now (``on_ready`` called by :meth:`_leave`) or
        refused (``on_ready`` called with ``ticket.error`` set); nothing if it left already."""
        refused = self.withdraw(ticket)
        if refused is not None:
            ticket.error = refused
            ticket.on_ready(ticket)
