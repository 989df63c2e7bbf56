"""Replica wake-ups: the lazy driving of the simulated replicas' engines.

A replica's engine only runs when the simulator asks it to: on an arrival (see
:class:`~sessionroute.sim.simulation.Simulation`), at a wake-up event at the engine's
``next_event_time()``, and before its gauges or counters are read. A wake-up runs the engine to
its time, hands every finished request to :meth:`ReplicaWakeups._finish` and schedules the next
wake-up; one whose time did not change is not scheduled again, and an older one left in the
queue is stale (its token no longer matches) and does nothing. When the next wake-up would be
the queue's very next event, it runs in the same callback (same order, still counted in
``events``) instead of going through the heap.
"""

from __future__ import annotations

from sessionroute.replica import RequestResult
from sessionroute.sim.events import PRIO_WAKE, SEQ_BITS, EventQueue
from sessionroute.sim.replicas import SimReplica

__all__ = ["ReplicaWakeups"]


class ReplicaWakeups:
    """Wake-up scheduling over ``queue`` for ``replicas`` (a base of the simulation).

    Attributes:
        queue: the simulation's event queue.
        replicas: every replica slot, up or down.
    """

    def __init__(self, queue: EventQueue, replicas: list[SimReplica]) -> None:
        self.queue = queue
        self.replicas = replicas
        self._hosting = False
        self._host_dirty = False

    # -- replicas sharing a host ----------------------------------------------------------------
    def host_changed(self) -> None:
        """A replica turned busy (its first request in the engine) or idle (its last one
        finished, or it went down, hung or joined): set every replica's host factor for the
        others busy now (a replica is busy while a request is in its running engine)
        (``StepTimeProfile.host_factor``; a no-op for profiles whose replicas share nothing).
        Running a replica to now may finish requests and turn it idle in turn; those changes
        are settled here, one pass after another, not by a nested call."""
        if self._hosting:
            self._host_dirty = True
            return
        self._hosting = True
        try:
            self._host_dirty = True
            while self._host_dirty:
                self._host_dirty = False
                busy = sum(1 for r in self.replicas if r.inflight and r.engine is not None)
                now = self.queue.clock._t
                for rep in self.replicas:
                    engine = rep.engine
                    mine = 1 if rep.inflight and engine is not None else 0
                    factor = rep.config.profile.host_factor(busy - mine)
                    if engine is None:  # down or hung: its next engine starts with it
                        rep.host_factor = factor
                    elif factor != rep.host_factor:
                        self._sync(rep)
                        rep.set_host_factor(factor, now)
                        self._reschedule(rep)
        finally:
            self._hosting = False

    def _finish(self, rep: SimReplica, r: RequestResult) -> None:
        """Handle a request ``rep`` finished (the simulation's request lifecycle)."""
        raise NotImplementedError

    def _sync(self, rep: SimReplica) -> None:
        """Run ``rep``'s engine to now and handle the requests that finished."""
        engine = rep.engine
        if engine is None:
            return
        for result in engine.advance(self.queue.clock._t):
            self._finish(rep, result)

    # -- replica wake-ups -----------------------------------------------------------------------
    def _reschedule(self, rep: SimReplica) -> None:
        engine = rep.engine
        if engine is None:
            return
        self._schedule_wake(rep, engine.next_event_time())

    def _schedule_wake(self, rep: SimReplica, t: float | None) -> None:
        """Wake ``rep`` at its engine's next event time ``t`` (None: idle, no wake-up); a
        wake-up already due then stays, an earlier one is superseded (its token goes stale)."""
        if t is None:
            rep.wake_t = None
            return
        if t == rep.wake_t:
            return
        queue = self.queue
        now = queue.clock._t
        if t < now:
            t = now
        token = rep.wake_token + 1
        rep.wake_token = token
        rep.wake_t = t
        queue.push(t, PRIO_WAKE, self._wake, (rep, token))

    def _wake(self, arg: tuple[SimReplica, int]) -> None:
        rep, token = arg
        if token != rep.wake_token:
            return
        rep.wake_t = None
        engine = rep.engine
        if engine is None:
            return
        queue = self.queue
        clock = queue.clock
        t_end = queue.t_end
        after_wake = (PRIO_WAKE + 1) << SEQ_BITS  # keys of events sorting after a wake-up
        while True:
            # The replica's next wake-up runs in this callback when it would be the queue's
            # next event: before the heap's head (a later sequence number, so an equal head
            # must have a higher priority), within the run's limit, the run not stopped.
            # Wake-ups that finish nothing are run inside the engine (Replica.wake).
            head = queue.first()
            if queue.stopped:
                until, inclusive = float("-inf"), False
            elif head is not None and head.t <= t_end:
                until, inclusive = head.t, head.key >= after_wake
            else:
                until, inclusive = t_end, True
            results, t, moves = engine.wake(clock._t, until, inclusive)
            if moves:
                clock._t = engine.time
                queue.events_run += moves
                rep.wake_token += moves
            for result in results:
                self._finish(rep, result)
            if t is None:
                return
            now = clock._t
            if t < now:
                t = now
            head = queue.first()
            if (
                (head is None or t < head.t or (t == head.t and head.key >= after_wake))
                and t <= queue.t_end
                and not queue.stopped
            ):
                clock._t = t
                queue.events_run += 1
                rep.wake_token += 1
                continue
            token = rep.wake_token + 1
            rep.wake_token = token
            rep.wake_t = t
            queue.push(t, PRIO_WAKE, self._wake, (rep, token))
            return

    def sync(self, rep: SimReplica) -> None:
        """Run ``rep`` to now, handle its completions and reschedule its wake-up."""
        self._sync(rep)
        self._reschedule(rep)

    # -- observation ----------------------------------------------------------------------------
    def sync_all(self) -> None:
        """Run every live replica to now (before reading counters or gauges)."""
        for rep in self.replicas:
            if rep.engine is not None:
                self.sync(rep)
