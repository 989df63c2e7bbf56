"""Injected clocks.

Pure packages (``router``, ``replica``, ``sim``, ``workloads``) never read the wall clock; they
receive a :class:`Clock`. The live router passes :class:`MonotonicClock`, the simulator passes
its virtual clock, tests pass :class:`ManualClock`.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of the current time in seconds (any epoch, monotonic)."""

    def now(self) -> float:
        """Return the current time in seconds."""
        ...


class MonotonicClock:
    """Wall-clock time from :func:`time.monotonic`, in seconds. Used by the live router only."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to (tests and virtual time).

    Args:
        start: initial time in seconds.
    """

    __slots__ = ("_t",)

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        """Move to absolute time ``t`` seconds.

        Raises:
            ValueError: if ``t`` is earlier than the current time.
        """
        if t < self._t:
            raise ValueError(f"clock cannot go backwards: {t} < {self._t}")
        self._t = float(t)

    def advance(self, dt: float) -> None:
        """Move forward by ``dt`` seconds (``dt >= 0``, else ValueError)."""
        if dt < 0:
            raise ValueError(f"cannot advance by a negative duration: {dt}")
        self._t += dt
