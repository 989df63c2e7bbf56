"""``least_token_load``: SGLang model gateway (SMG) ``least_load``: least token work, KV penalty.

Source: SMG ``least_load`` (smg-project/smg PRs #1647, #2154, #2193; summary in
``shared/POLICIES.md``). Each request goes to the healthy worker with the lowest

    cost(w) = (queued(w) + since_poll(w)) / tokens_per_s + kv_penalty_s * k / (1 - k)

where ``queued(w)`` is the worker's queued prompt tokens at its last metrics poll,
``since_poll(w)`` the prompt tokens this router dispatched to it since that poll (the
since-poll credit: without it every request between two polls would herd onto the same
worker), and ``k`` its scraped KV-cache usage (clamped below 1). Ties go to the least recently
chosen. With ``max_waiting`` set, a request is held in the router's admission queue while every
healthy worker reports at least that many waiting requests (SMG's optional per-worker waiting
cap with a router-side queue).

Reproduced: the cost, the 0.15 s KV penalty, the since-poll credit and the waiting cap.
Approximated: the engines here report waiting *requests*, not queued tokens, so ``queued(w)``
is the waiting count times the mean prompt tokens of the requests this router has in flight
there, taken at the poll; a poll is a change of the worker's scraped gauges (a scrape that
reads the same gauges keeps the credit); the throughput is one configured number for every
worker (SMG reads each worker's). Without gauges (scraping off, or before the first scrape) the
cost is the router's own in-flight prompt tokens over the throughput.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._pick import LowestScore
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, EngineGauges, RouteRequest

__all__ = ["LeastTokenLoadConfig", "LeastTokenLoadPolicy"]


@dataclass(frozen=True, slots=True)
class LeastTokenLoadConfig:
    """Options of ``least_token_load``.

    Attributes:
        tokens_per_s: a worker's prompt throughput (tokens/s) that turns token work into
            seconds (a guess for an 8xH200 replica).
        kv_penalty_s: seconds of the KV-fill penalty ``kv_penalty_s * k / (1 - k)``.
        max_kv: KV usage is clamped to at most this, in (0, 1), before the penalty.
        max_waiting: hold requests while every worker reports at least this many waiting
            requests (None: never hold).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    tokens_per_s: float = 20_000.0
    kv_penalty_s: float = 0.15
    max_kv: float = 0.99
    max_waiting: int | None = None

    def __post_init__(self) -> None:
        if not self.tokens_per_s > 0:
            raise ConfigError(f"tokens_per_s must be > 0, got {self.tokens_per_s!r}")
        if not self.kv_penalty_s >= 0:
            raise ConfigError(f"kv_penalty_s must be >= 0, got {self.kv_penalty_s!r}")
        if not 0.0 < self.max_kv < 1.0:
            raise ConfigError(f"max_kv must be in (0, 1), got {self.max_kv!r}")
        if self.max_waiting is not None and self.max_waiting < 1:
            raise ConfigError(f"max_waiting must be >= 1 or None, got {self.max_waiting!r}")


class LeastTokenLoadPolicy(Policy):
    """Lowest (queued + since-poll tokens) / throughput + KV penalty."""

    name: ClassVar[str] = "least_token_load"
    Config: ClassVar[type[Any] | None] = LeastTokenLoadConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self._polled: dict[str, EngineGauges] = {}  # worker -> the gauges of its last poll
        self._queued: dict[str, float] = {}  # worker -> queued tokens at that poll
        self._since: dict[str, int] = {}  # worker -> tokens dispatched since that poll
        self._picker = LowestScore()

    def cost(self, worker: str, cluster: ClusterView) -> float:
        """The worker's cost in seconds (folds in a new poll of its gauges first)."""
        cfg: LeastTokenLoadConfig = self.config
        g = cluster.gauges(worker)
        if g is None:
            return cluster.in_flight_tokens(worker) / cfg.tokens_per_s
        if self._polled.get(worker) is not g:
            self._polled[worker] = g
            n = cluster.in_flight(worker)
            self._queued[worker] = g.waiting * cluster.in_flight_tokens(worker) / n if n else 0.0
            self._since[worker] = 0
        k = min(g.kv_usage, cfg.max_kv)
        work = self._queued[worker] + self._since[worker]
        return work / cfg.tokens_per_s + cfg.kv_penalty_s * k / (1.0 - k)

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        cap = self.config.max_waiting
        if cap is None:
            return True
        for w in cluster.healthy():
            g = cluster.gauges(w)
            if g is None or g.waiting < cap:
                return True
        return False

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        cfg: LeastTokenLoadConfig = self.config
        tps, penalty, max_kv = cfg.tokens_per_s, cfg.kv_penalty_s, cfg.max_kv
        gauges = cluster.gauges
        in_tokens = cluster.in_flight_tokens
        polled, queued, since = self._polled, self._queued, self._since
        costs: list[float] = []
        for w in healthy:  # :meth:`cost`, inlined for the common cases
            g = gauges(w)
            if g is None:
                costs.append(in_tokens(w) / tps)
            elif polled.get(w) is not g:
                costs.append(self.cost(w, cluster))
            else:
                k = g.kv_usage if g.kv_usage < max_kv else max_kv
                costs.append((queued[w] + since[w]) / tps + penalty * k / (1.0 - k))
        worker = self._picker.pick(healthy, costs)
        if worker in polled:
            self._since[worker] += request.prompt_tokens
        return Decision(worker, DecisionKind.STATELESS)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        for d in (self._polled, self._queued, self._since):
            d.pop(worker, None)
        self._picker.forget(worker)
