"""The fast path's log of applied engine steps: when each ended and the longest step since any
given one, so a lazy decoder's token times and inter-token latencies can be brought up to date
in O(log n) (:meth:`~sessionroute.replica.lazy.LazyDecoders.materialize`)."""

from __future__ import annotations

from sessionroute.replica.intbisect import bisect_left

__all__ = ["StepLog"]


class StepLog:
    """End times of the applied steps from step ``base`` on, and their suffix maxima.

    Attributes:
        g: index of the next step to apply (steps ``0 .. g - 1`` are applied).
        base: index of the oldest step kept (``ends[0]``).
        ends: end time of each kept step, seconds: step ``i`` ends at ``ends[i - base]``.
        mx_step: steps (ascending) whose duration is longer than every later step's.
        mx_dur: their durations, seconds (strictly decreasing): the longest step in
            ``[i, g)`` lasts ``mx_dur[bisect_left(mx_step, i)]``.
    """

    __slots__ = ("base", "ends", "g", "mx_dur", "mx_step")

    def __init__(self) -> None:
        self.g = 0
        self.base = 0
        self.ends: list[float] = []
        self.mx_step: list[int] = []
        self.mx_dur: list[float] = []

    def push_dur(self, g: int, dur: float) -> None:
        """Record that step ``g`` lasted ``dur`` seconds in the suffix maxima (``ends`` and
        ``g`` are the caller's to update)."""
        steps = self.mx_step
        durs = self.mx_dur
        while durs and durs[-1] <= dur:
            durs.pop()
            steps.pop()
        steps.append(g)
        durs.append(dur)

    def step_ended(self, start: float, end: float) -> int:
        """Log step ``g``, which ran from ``start`` to ``end`` (seconds); returns its index."""
        g = self.g
        self.ends.append(end)
        self.push_dur(g, end - start)
        self.g = g + 1
        return g

    def longest_since(self, i: int) -> float:
        """Duration of the longest step in ``[i, g)``, seconds (``base <= i < g``)."""
        return self.mx_dur[bisect_left(self.mx_step, i)]

    def trim(self, lo: int) -> None:
        """Forget steps before ``lo`` once they are more than half of the log."""
        cut = lo - self.base
        if cut > len(self.ends) // 2:
            del self.ends[:cut]
            self.base = lo
            j = bisect_left(self.mx_step, lo)
            del self.mx_step[:j]
            del self.mx_dur[:j]
