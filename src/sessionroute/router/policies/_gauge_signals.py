"""What ``adaptive_sticky`` reads from each worker's scraped gauges, once per new scrape.

``adaptive_sticky`` (:mod:`~sessionroute.router.policies.adaptive_sticky`) decides from three
per-worker signals, all derived from the engines' gauges (:class:`~sessionroute.types.EngineGauges`)
and re-evaluated only when a worker's gauges object changes (a new scrape):

* **hot** (rule 2's escape): set when ``kv_usage >= escape_kv`` and ``waiting >=
  escape_waiting``, cleared when ``kv_usage < cool_kv`` or ``waiting < cool_waiting``
  (hysteresis); a worker without gauges is not hot. :attr:`GaugeSignals.hot_episodes` counts
  the times one turned hot.
* **last thrash** (rule 3's gate, ``thrash_gate_s``): the router-clock time of the latest
  scrape showing ``waiting >= overflow_waiting`` or ``kv_usage >= escape_kv``.
* **KV capacity** in tokens (rule 3's knee, rule 2's overflow): a moving average (weight
  ``capacity_alpha``) of the router's in-flight tokens that are running, ``in_flight_tokens *
  running / (running + waiting)``, over ``kv_usage``; sampled on each new scrape, and on every
  look while a worker has no estimate yet; no sample below ``capacity_min_kv`` or with nothing
  in flight.
"""

from __future__ import annotations

import math

from sessionroute.clock import Clock
from sessionroute.router.policies._adaptive_config import AdaptiveStickyConfig
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import EngineGauges

__all__ = ["GaugeSignals"]


class GaugeSignals:
    """Per-worker hot flags, last thrash times and KV capacity estimates (module docstring).

    Args:
        cfg: the policy's options (the thresholds above). clock: its clock.

    Attributes:
        capacity: worker -> estimated KV capacity, tokens (absent before a sample).
        hot_episodes: times a worker turned hot.
    """

    __slots__ = ("_cfg", "_clock", "_hot", "_last_thrash", "_seen", "capacity", "hot_episodes")

    def __init__(self, cfg: AdaptiveStickyConfig, clock: Clock) -> None:
        self._cfg = cfg
        self._clock = clock
        self._hot: dict[str, bool] = {}
        self._seen: dict[str, EngineGauges | None] = {}  # worker -> gauges last evaluated
        self._last_thrash: dict[str, float] = {}  # worker -> last scrape showing thrash
        self.capacity: dict[str, float] = {}
        self.hot_episodes = 0

    def refresh(self, worker: str, cluster: ClusterView) -> EngineGauges | None:
        """``worker``'s gauges (None before a scrape); on a new scrape, re-evaluate its hot
        flag and last thrash and sample its capacity (also sampled while it has no estimate
        yet)."""
        g = cluster.gauges(worker)
        if g is self._seen.get(worker, None) and worker in self._seen:
            if g is not None and worker not in self.capacity:
                self._sample(worker, g, cluster)
            return g
        self._seen[worker] = g
        if g is None:
            self._hot[worker] = False
            return g
        self._sample(worker, g, cluster)
        c = self._cfg
        if g.waiting >= c.overflow_waiting or g.kv_usage >= c.escape_kv:
            self._last_thrash[worker] = self._clock.now()
        if self._hot.get(worker, False):
            if g.kv_usage < c.cool_kv or g.waiting < c.cool_waiting:
                self._hot[worker] = False
        elif g.kv_usage >= c.escape_kv and g.waiting >= c.escape_waiting:
            self._hot[worker] = True
            self.hot_episodes += 1
        return g

    def _sample(self, worker: str, g: EngineGauges, cluster: ClusterView) -> None:
        """Fold one capacity sample (running in-flight tokens over ``kv_usage``) into the
        worker's moving average; none below ``capacity_min_kv`` or with nothing in flight."""
        c = self._cfg
        busy = g.running + g.waiting
        if g.kv_usage >= c.capacity_min_kv and busy > 0:
            running_tokens = cluster.in_flight_tokens(worker) * g.running / busy
            if running_tokens > 0:
                sample = running_tokens / g.kv_usage
                old = self.capacity.get(worker)
                a = c.capacity_alpha
                self.capacity[worker] = sample if old is None else old + a * (sample - old)

    def hot(self, worker: str) -> bool:
        """Whether ``worker`` was hot at its last evaluated scrape (:meth:`refresh` first)."""
        return self._hot.get(worker, False)

    def last_thrash(self, worker: str) -> float:
        """When ``worker``'s scrapes last showed thrash (router clock, s; ``-inf``: never)."""
        return self._last_thrash.get(worker, -math.inf)

    def forget(self, worker: str) -> None:
        """``worker`` left: drop what was kept of it."""
        for d in (self._hot, self._seen, self.capacity, self._last_thrash):
            d.pop(worker, None)
