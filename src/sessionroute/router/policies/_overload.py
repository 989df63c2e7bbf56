"""Rule 8 of ``adaptive_hold``: a fleet past its capacity for good gives one worker up.

Under open-loop arrivals (a serving replay: turns come when their users send them, whatever
the fleet does) a fleet past its capacity cannot shed load. Placed evenly, the excess queues
on every worker, and every worker's turns miss the TTFT SLO together: on the Mooncake replay
SLO goodput falls from 0.34 at 3.125x its recorded arrival rate to 0.08 at 3.2x while
``consistent_hash``, whose placement happens to be uneven, keeps 0.16 (docs/policies.md,
"adaptive_hold: measurements"). Concentrating the excess on one worker, the *sacrifice*, costs
little (its turns would have missed the SLO anyway) and keeps the others inside it.

A transient burst must not trigger that: the sacrifice's queue then outlives the burst and
becomes the fleet's TTFT tail. What tells the two apart is whether the queues drain. So the
signal is the fleet's *smallest* engine queue (each worker's scraped waiting requests),
averaged exponentially with time constant ``window_s``: a burst leaves some worker's queue
short or empty within the window, a fleet past its capacity keeps every queue long.

:class:`Overload` is latched: when the average reaches ``level`` the worker with the most
requests waiting becomes the sacrifice; from then on a new session's first turn bound for
another worker whose queueing delay is at least ``spill_s`` goes to the sacrifice instead
(:meth:`Overload.divert`), so the other workers are fed while their queues are short. A
sacrifice is let go of once its queue has stayed empty for ``window_s`` (the fleet caught up
with its excess) or it leaves; the episode ends with the last, and the average then starts
again from 0. Never every healthy worker is a sacrifice, and a lone worker starts no episode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.router.policies._hold_config import AdaptiveHoldConfig
from sessionroute.router.state.cluster import ClusterView

__all__ = ["Overload", "waiting"]


def waiting(cluster: ClusterView) -> dict[str, int]:
    """Healthy worker -> the requests waiting in its engine's queue (its latest scrape;
    workers without one left out)."""
    return {w: g.waiting for w in cluster.healthy() if (g := cluster.gauges(w)) is not None}


class Overload:
    """The overload latch and the sacrifices (module docstring).

    Args:
        window_s: time constant of the average smallest queue, seconds (> 0).
        level: the average, in requests waiting, at which the fleet is past its capacity
            (> 0).
        spill_s: while it is, a first turn bound for a worker (not a sacrifice) whose
            queueing delay is at least this goes to a sacrifice, seconds (>= 0).
        max_delay_s: a sacrifice whose queueing delay is at least this takes no more; the
            next turn to divert gives up another worker (never the last one), seconds (> 0).

    Attributes:
        sacrifices: the workers given up on, in the order they were (empty while the fleet
            is not past its capacity).
        average: the average smallest queue, requests.
        episodes: times the fleet was found past its capacity.
        diverted: first turns sent to a sacrifice instead of their worker.

    Raises:
        ConfigError: for a window, level or bound that is not > 0, or a negative ``spill_s``.
    """

    __slots__ = ("_at", "_empty", "average", "diverted", "episodes", "level", "max_delay_s",
                 "sacrifices", "spill_s", "window_s")  # fmt: skip

    def __init__(self, window_s: float, level: float, spill_s: float, max_delay_s: float) -> None:
        for name, v in (
            ("overload_window_s", window_s),
            ("overload_waiting", level),
            ("sacrifice_max_delay_s", max_delay_s),
        ):
            if not v > 0:
                raise ConfigError(f"{name} must be > 0, got {v!r}")
        if not spill_s >= 0:
            raise ConfigError(f"spill_delay_s must be >= 0, got {spill_s!r}")
        self.window_s = window_s
        self.level = level
        self.spill_s = spill_s
        self.max_delay_s = max_delay_s
        self.sacrifices: list[str] = []
        self.average = 0.0
        self._at: float | None = None  # time of the last observation folded into the average
        self._empty: dict[str, float] = {}  # sacrifice -> since when its queue has been empty
        self.episodes = 0
        self.diverted = 0

    @classmethod
    def of(cls, c: AdaptiveHoldConfig) -> Overload | None:
        """Rule 8 with ``c``'s options, or None when it is off (``overload_window_s`` 0, or
        ``hold`` false: ``adaptive_sticky``)."""
        if not (c.hold and c.overload_window_s > 0):
            return None
        return cls(
            c.overload_window_s, c.overload_waiting, c.spill_delay_s, c.sacrifice_max_delay_s
        )

    def observe(self, now: float, waiting: Mapping[str, int]) -> None:
        """Fold the healthy workers' scraped ``waiting`` requests at ``now`` into the average
        (their smallest), or, during an episode, let go of each sacrifice whose queue has
        been empty at every observation for ``window_s`` or that is no longer in
        ``waiting`` (not healthy, or not scraped), and the latest given up while every worker
        in ``waiting`` is one; the episode ends with the last. A new episode (two or more
        workers in ``waiting``) gives up the worker with the most requests waiting (ties: the
        first by name). After ``window_s`` or more without an observation (sessions long for
        a while, a lone worker, no routing) the average starts again from 0: one snapshot of
        a burst after a lull is not a queue that stayed long."""
        if self.sacrifices:
            kept = []
            empty = self._empty
            for w in self.sacrifices:
                if w not in waiting:
                    continue
                if waiting[w] > 0:
                    empty.pop(w, None)
                elif now - empty.setdefault(w, now) >= self.window_s:
                    continue
                kept.append(w)
            while kept and len(kept) >= len(waiting):  # never every healthy worker
                kept.pop()
            for w in self.sacrifices:
                if w not in kept:
                    empty.pop(w, None)  # given up again later: its empty time starts anew
            self.sacrifices = kept
            if not kept:
                self.end()
            return
        if len(waiting) < 2:  # a lone worker is never given up
            return
        x = min(waiting.values())
        at = self._at
        if at is not None and now - at > self.window_s:  # nothing seen for a window: start anew
            self.average, at = 0.0, None
        if at is not None and now > at:
            keep = math.exp(-(now - at) / self.window_s)
            self.average = self.average * keep + (1.0 - keep) * x
        if at is None or now > at:
            self._at = now
        if self.average >= self.level:
            self.sacrifices.append(max(sorted(waiting), key=lambda w: waiting[w]))
            self.episodes += 1

    def divert(self, worker: str, delays: Mapping[str, float]) -> str:
        """Where a new session's first turn bound for ``worker`` goes, given the healthy
        workers' queueing ``delays`` (seconds): ``worker`` itself outside an episode, if it
        is a sacrifice, or if its delay is under ``spill_s``; else the first sacrifice whose
        delay is under ``max_delay_s``; else, if two or more workers are not sacrifices, the
        one of them with the longest delay, given up from then on; else ``worker``."""
        sacrifices = self.sacrifices
        if not sacrifices or worker in sacrifices or delays.get(worker, 0.0) < self.spill_s:
            return worker
        for s in sacrifices:
            if delays.get(s, math.inf) < self.max_delay_s:
                self.diverted += 1
                return s
        rest = sorted(w for w in delays if w not in sacrifices)
        if len(rest) < 2:
            return worker
        target = max(rest, key=lambda w: delays[w])
        sacrifices.append(target)
        self.diverted += 1
        return target

    def end(self) -> None:
        """End the episode; the average starts again from 0."""
        self.sacrifices = []
        self._empty.clear()
        self.average = 0.0
        self._at = None

    def forget(self, worker: str) -> None:
        """``worker`` left: it is a sacrifice no more (the last one gone ends the episode)."""
        self._empty.pop(worker, None)
        if worker in self.sacrifices:
            self.sacrifices.remove(worker)
            if not self.sacrifices:
                self.end()

    def counters(self) -> dict[str, Any]:
        """Episodes, first turns diverted, and the sacrifices now."""
        return {
            "overload_episodes": self.episodes,
            "overload_diverted": self.diverted,
            "overload_sacrifices": list(self.sacrifices),
        }
