"""The event core of one simulation: a virtual clock and a heap of timed callbacks.

Events are ordered by ``(time, priority, sequence number)``: at equal times a lower priority
runs first, and events of equal time and priority run in the order they were scheduled, so the
same inputs always give the same order (no dependence on object ids or hash order).

The queue is a :class:`~sessionroute.minheap.MinHeap` of :class:`Event` records ``(t, key, fn,
arg)``; keys are unique, so the order of events does not depend on the heap's layout.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final, cast

from sessionroute.minheap import HeapEntry, MinHeap

__all__ = [
    "PRIO_ARRIVAL",
    "PRIO_FAULT",
    "PRIO_SAMPLE",
    "PRIO_TIMER",
    "PRIO_WAKE",
    "SEQ_BITS",
    "Event",
    "EventQueue",
    "VirtualClock",
]

PRIO_FAULT: Final = 0
"""Replica faults run before anything else scheduled at the same time."""
PRIO_WAKE: Final = 1
"""Replica wake-ups (request completions) run before new arrivals at the same time."""
PRIO_ARRIVAL: Final = 2
"""A request reaching a replica."""
PRIO_TIMER: Final = 3
"""Workload timers and responses delivered to the workload."""
PRIO_SAMPLE: Final = 4
"""Metric samples see every other event of their time already applied."""


SEQ_BITS: Final = 48
"""An event's sort key below its time is ``priority << SEQ_BITS | sequence number``."""


class Event(HeapEntry):
    """One scheduled callback: ``fn(arg)`` at simulated time ``t`` seconds; ``key`` is
    ``priority << SEQ_BITS | sequence number`` (unique within a queue). Sorted by ``(t, key)``.
    """

    __slots__ = ("arg", "fn")

    def __init__(self, t: float, key: int, fn: Callable[[Any], None], arg: Any) -> None:
        super().__init__(t, key)
        self.fn = fn
        self.arg = arg


class VirtualClock:
    """Simulated time in seconds; implements :class:`sessionroute.clock.Clock`.

    Only the owning :class:`EventQueue` moves it (forward only).
    """

    __slots__ = ("_t",)

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        """The current simulated time in seconds."""
        return self._t


class EventQueue:
    """A heap of :class:`Event` records owned by one simulation (``fn(arg)`` at a time, with a
    priority).

    Far-future timers (:meth:`push_late`, e.g. rollout timeouts, all an hour ahead, most of
    them firing as no-ops) wait in a FIFO lane instead of the heap: an event goes there
    when it does not sort before the lane's last one (by time, then priority), so the lane
    stays sorted, and only the lane's first event is in the heap. Every event keeps the
    sequence number of its push, so the order of events is exactly the order a single heap
    would give; the heap just stays small (a push or pop costs ``log`` of the heap's size).

    Args:
        clock: the virtual clock this queue advances as it pops events.
    """

    __slots__ = (
        "_heap",
        "_lane",
        "_seq",
        "_work",
        "clock",
        "events_run",
        "stopped",
        "t_end",
    )

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        self._heap = MinHeap()
        self._lane: deque[Event] = deque()  # sorted; its first event is also in the heap
        self._seq = 0
        self._work = 0  # scheduled events with priority < PRIO_SAMPLE (not periodic samplers)
        self.events_run = 0
        self.stopped = False
        self.t_end = float("inf")  # the limit of the run in progress (seconds)

    def __len__(self) -> int:
        lane = len(self._lane)
        return len(self._heap) + (lane - 1 if lane else 0)

    def now(self) -> float:
        """The current simulated time in seconds."""
        return self.clock._t

    def push(self, t: float, prio: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Schedule ``fn(arg)`` at simulated time ``t`` seconds.

        Raises:
            ValueError: if ``t`` is earlier than the current time (events never go back).
        """
        if t < self.clock._t:
            raise ValueError(f"event scheduled in the past: {t!r} < now {self.clock._t!r}")
        seq = self._seq + 1
        self._seq = seq
        if prio < PRIO_SAMPLE:
            self._work += 1
        self._heap.push(Event(t, (prio << SEQ_BITS) | seq, fn, arg))

    def push_late(self, t: float, prio: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """:meth:`push` for a timer far ahead: same order of events, a smaller heap.

        Raises:
            ValueError: if ``t`` is earlier than the current time.
        """
        lane = self._lane
        if lane:
            last = lane[-1]
            if t < last.t or (t == last.t and prio < last.key >> SEQ_BITS):
                self.push(t, prio, fn, arg)
                return
        if t < self.clock._t:
            raise ValueError(f"event scheduled in the past: {t!r} < now {self.clock._t!r}")
        seq = self._seq + 1
        self._seq = seq
        if prio < PRIO_SAMPLE:
            self._work += 1
        key = (prio << SEQ_BITS) | seq
        ev = Event(t, key, fn, arg)
        lane.append(ev)
        if len(lane) == 1:
            self._heap.push(Event(t, key, self._fire_lane, ev))

    def _fire_lane(self, ev: Event) -> None:
        lane = self._lane
        lane.popleft()
        if lane:
            nxt = lane[0]
            self._heap.push(Event(nxt.t, nxt.key, self._fire_lane, nxt))
        ev.fn(ev.arg)

    def first(self) -> Event | None:
        """The next event to run (not removed), or None when the queue is empty."""
        return cast("Event | None", self._heap.first())

    def peek_time(self) -> float | None:
        """Time of the next event, or None when the queue is empty."""
        first = self._heap.first()
        return None if first is None else first.t

    def stop(self) -> None:
        """Make :meth:`run_until` return after the event now running."""
        self.stopped = True

    def run_until(self, t_end: float) -> None:
        """Pop and run events in order while their time is <= ``t_end`` and not stopped.

        The run also ends when only sampling events (priority ``PRIO_SAMPLE``, which
        reschedule themselves) are left: nothing can happen any more. The clock is left at the
        time of the last event run (it never moves past ``t_end``).
        """
        heap = self._heap
        items = heap.items
        clock = self.clock
        self.t_end = t_end
        sample_key = PRIO_SAMPLE << SEQ_BITS
        while items and not self.stopped and self._work:
            if items[0].t > t_end:
                break
            ev = cast(Event, heap.pop())
            clock._t = ev.t
            if ev.key < sample_key:
                self._work -= 1
            self.events_run += 1
            ev.fn(ev.arg)
