"""How fast this host's cores run right now: the CPU time of a fixed loop, sampled throughout.

A CPU test-bed's step times are its cores' speed, and a virtual machine's cores do not keep
one speed: on the 2-core development machine (2026-12-07) :func:`loop_ms` took 1.3 or 2.3 ms
of its own thread's CPU time, idle, from one second to the next, and 1.3 to 2.9 ms from one
run to the next (a core shared with work outside the machine: another tenant on its
hyperthread sibling, or a host quota; nothing inside the machine shows it, not even
``/proc/stat``'s steal). A profile
calibrated minutes before an arm runs is then off by however much the speed moved between
the two, whatever the model.

:class:`HostSpeed` runs a child process that times :data:`LOOP_ITERATIONS` iterations of a
loop every :data:`INTERVAL_S` by its thread's CPU clock (``time.thread_time``: time on a core,
not time waiting for one, so the servers' own load does not count, only how fast a core runs
while it has the loop) and writes each sample to a file; :meth:`HostSpeed.median_ms` gives the
median over any interval. Under 1 % of a core. Linux's ``CLOCK_MONOTONIC`` is system-wide, so
the child's timestamps and the parent's ``time.monotonic()`` compare.

Run as ``python -m sessionroute.experiments.live.hostspeed [INTERVAL_S]`` it prints one
``monotonic_s loop_ms`` line per sample until stopped.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from types import TracebackType

from sessionroute.experiments.live.procs import StartedProcess

__all__ = ["INTERVAL_S", "LOOP_ITERATIONS", "HostSpeed", "loop_ms"]

LOOP_ITERATIONS = 50_000
"""Iterations of the timed loop (1.3-2.9 ms of CPU on the development machine)."""

INTERVAL_S = 0.5
"""Seconds between two samples."""


def loop_ms(iterations: int = LOOP_ITERATIONS) -> float:
    """CPU milliseconds this thread spends on ``iterations`` additions (higher: slower core)."""
    t0 = time.thread_time()
    total = 0
    for i in range(iterations):
        total += i
    return (time.thread_time() - t0) * 1e3


class HostSpeed:
    """A child process sampling :func:`loop_ms` every ``interval_s`` into ``path``, one
    ``monotonic_s loop_ms`` line each (a context manager: the child is started on entry and
    stopped, by its process group, on exit:
    :class:`~sessionroute.experiments.live.procs.StartedProcess`).
    """

    def __init__(self, path: Path, interval_s: float = INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self._proc: StartedProcess | None = None

    def __enter__(self) -> HostSpeed:
        self._proc = StartedProcess(
            "host speed",
            # -W ignore: the package's import-time warnings are the parent's to print
            [sys.executable, "-W", "ignore", "-m", __name__, str(self.interval_s)],
            os.environ,
            self.path,
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.stop(grace_s=5.0)

    @property
    def samples(self) -> list[tuple[float, float]]:
        """``(monotonic_s, loop_ms)`` pairs written so far, in order (a line still being
        written is left out)."""
        try:
            text = self.path.read_text()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    out.append((float(parts[0]), float(parts[1])))
                except ValueError:
                    continue
        return out

    def median_ms(self, start_s: float, end_s: float) -> float | None:
        """Median :func:`loop_ms` of the samples taken between two ``time.monotonic()``
        readings, or None where none was."""
        got = [ms for t, ms in self.samples if start_s <= t <= end_s]
        return round(statistics.median(got), 2) if got else None


def _main(argv: list[str]) -> None:
    interval = float(argv[0]) if argv else INTERVAL_S
    try:
        while True:
            ms = loop_ms()
            print(f"{time.monotonic():.4f} {ms:.3f}", flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    _main(sys.argv[1:])
