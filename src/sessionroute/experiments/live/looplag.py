"""How late the live client's event loop ran: a client starved of CPU stamps late.

The live client stamps a request's first token when its event loop gets to the line, so a loop
that does not run for a while (the process waits for a core, or blocking work holds it) adds
that wait to the TTFT it records. :class:`LoopLag` sleeps a short interval again and again in
the client's loop and records how much later than asked each sleep ended; :func:`summarise`
sums the stalls. It also reads how long the loop's thread waited for a core over the run (the
kernel's run-queue wait, ``/proc/thread-self/schedstat``, Linux; proc(5)): a stall with no
such wait is the client's own work holding the loop (or another of its threads holding the
GIL), not a starved client. On the 2-core CPU
tier, with the client and router in scheduler autogroups of their own beside the uncapped
servers', the client's loop stalled 50-660 ms at a time, 3-5 s per 10-s arm run, while using
0-13 ms of CPU in each stall (docs/simulator.md, "Each server its own share of the host").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

__all__ = ["STALL_S", "LoopLag", "cpu_wait_s", "summarise"]

STALL_S = 0.02
"""A sleep that ended more than this late (seconds) counts as a stall."""


def cpu_wait_s() -> float | None:
    """Seconds the calling thread has waited on a run queue for a core so far (the second
    field of ``/proc/thread-self/schedstat``), or None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def summarise(lags_s: Sequence[float], wall_s: float, stall_s: float = STALL_S) -> dict[str, Any]:
    """Stalls among ``lags_s`` (how late each sleep ended, seconds) over ``wall_s`` seconds.

    Returns:
        ``{"samples", "wall_s", "stalls" (count over ``stall_s``), "stalled_s" (their summed
        lateness), "max_lag_s", "p99_lag_s"}``; zeros for no samples.
    """
    over = [x for x in lags_s if x > stall_s]
    ordered = sorted(lags_s)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
    return {
        "samples": len(lags_s),
        "wall_s": wall_s,
        "stalls": len(over),
        "stalled_s": sum(over),
        "max_lag_s": ordered[-1] if ordered else 0.0,
        "p99_lag_s": p99,
    }


class LoopLag:
    """Measures the running event loop's lateness until cancelled (module docstring).

    Args:
        interval_s: how long each sleep asks for (seconds, > 0).
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.lags_s: list[float] = []
        self._t0: float | None = None
        self._t1: float | None = None
        self._wait: list[float | None] = [None, None]

    async def run(self) -> None:
        """Sleep ``interval_s`` and record the lateness, until cancelled."""
        loop = asyncio.get_running_loop()
        self._t0 = self._t1 = loop.time()
        self._wait[0] = cpu_wait_s()
        try:
            while True:
                t = loop.time()
                await asyncio.sleep(self.interval_s)
                self._t1 = loop.time()
                self.lags_s.append(max(0.0, self._t1 - t - self.interval_s))
        finally:
            self._t1 = loop.time()
            self._wait[1] = cpu_wait_s()

    def summary(self) -> dict[str, Any]:
        """:func:`summarise` of what was recorded, with ``cpu_wait_s``: how long the loop's
        thread waited for a core meanwhile (None where not known)."""
        wall = 0.0 if self._t0 is None or self._t1 is None else self._t1 - self._t0
        a, b = self._wait
        waited = None if a is None or b is None else b - a
        return {**summarise(self.lags_s, wall), "cpu_wait_s": waited}
