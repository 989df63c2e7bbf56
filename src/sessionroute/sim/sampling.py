"""Periodic observation of a running simulation: time series and engine gauge scrapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sessionroute.sim.events import PRIO_SAMPLE
from sessionroute.sim.simulation import Simulation
from sessionroute.types import EngineGauges

__all__ = ["Sampler", "Scraper"]


class Sampler:
    """Samples every replica every ``interval_s`` simulated seconds.

    Each row: ``t`` (end of the interval), ``replica`` (index), ``url``, ``busy_fraction``
    (engine busy seconds over the interval), ``running``, ``waiting``, ``kv_usage`` (gauges at
    ``t``), ``hit_rate`` (prefix-cache hits / queries over the interval, None without
    queries), ``prefix_cache_queries`` (tokens queried over the interval), ``interval_s`` (its
    length), ``preemptions`` (over the interval), ``active_sessions`` (pinned by the policy).

    Args:
        sim: the simulation.
        interval_s: sampling period in simulated seconds.
        progress: called with the workload's fraction done at each sample.
        fraction_done: the workload's progress.
    """

    def __init__(
        self,
        sim: Simulation,
        interval_s: float,
        progress: Callable[[float], None] | None,
        fraction_done: Callable[[], float],
    ) -> None:
        self.sim = sim
        self.interval_s = interval_s
        self.rows: list[dict[str, Any]] = []
        self._prev: dict[int, dict[str, float]] = {}
        self._last_t = sim.now()
        self._progress = progress
        self._done = fraction_done

    def start(self) -> None:
        """Schedule the first sample."""
        self.sim.queue.push(self.sim.now() + self.interval_s, PRIO_SAMPLE, self._tick)

    def _tick(self, _: object) -> None:
        self.sample()
        self.sim.queue.push(self.sim.now() + self.interval_s, PRIO_SAMPLE, self._tick)
        if self._progress is not None:
            self._progress(min(1.0, self._done()))

    def sample(self) -> None:
        """Take one row per replica now (after running every replica to now)."""
        sim = self.sim
        sim.sync_all()
        t = sim.now()
        dt = t - self._last_t
        if dt <= 0:
            return
        self._last_t = t
        sessions = sim.core.policy.session_counts()
        for rep in sim.replicas:
            c = rep.counters()
            p = self._prev.get(rep.index) or dict.fromkeys(c, 0.0)
            self._prev[rep.index] = c
            running, waiting, kv = rep.gauges()
            dq = c["prefix_cache_queries"] - p["prefix_cache_queries"]
            dh = c["prefix_cache_hits"] - p["prefix_cache_hits"]
            rep.samples += 1
            rep.running_sum += running
            rep.waiting_sum += waiting
            rep.kv_sum += kv
            self.rows.append(
                {
                    "t": t,
                    "replica": rep.index,
                    "url": rep.url,
                    # exact up to float rounding (busy time is counted up to now only), which
                    # can leave a saturated interval at 1 + 1e-12: the cap removes that alone
                    "busy_fraction": min(1.0, (c["busy_time_s"] - p["busy_time_s"]) / dt),
                    "running": running,
                    "waiting": waiting,
                    "kv_usage": kv,
                    "hit_rate": dh / dq if dq > 0 else None,
                    "prefix_cache_queries": dq,
                    "interval_s": dt,
                    "preemptions": int(c["num_preemptions"] - p["num_preemptions"]),
                    "active_sessions": int(sessions.get(rep.url, 0)),
                }
            )


class Scraper:
    """Refreshes the router's engine gauges every ``interval_s`` (a live router's scrape).

    A replica with no request in its engine reads all zeros (KV usage counts blocks in use
    only), so it is not run to now for that.
    """

    _IDLE = EngineGauges(0, 0, 0.0)

    def __init__(self, sim: Simulation, interval_s: float) -> None:
        self.sim = sim
        self.interval_s = interval_s
        self._last: dict[str, EngineGauges] = {}

    def start(self) -> None:
        """Scrape now and schedule the next scrape."""
        self._tick(None)

    def _tick(self, _: object) -> None:
        sim = self.sim
        cluster = sim.core.cluster
        last = self._last
        for rep in sim.replicas:
            if rep.url not in cluster:
                continue
            if rep.inflight:
                sim.sync(rep)
            if rep.inflight:
                running, waiting, kv = rep.gauges()
                g = EngineGauges(running, waiting, kv)
            else:
                g = self._IDLE
            if g != last.get(rep.url) or cluster.gauges(rep.url) is None:
                last[rep.url] = g
                sim.core.observe_gauges(rep.url, g)
        sim.queue.push(sim.now() + self.interval_s, PRIO_SAMPLE, self._tick)
