"""``least_token_load``: SGLang model gateway (SMG) ``least_load``: least token work, KV barrier.

Source: SMG ``least_load`` (smg-project/smg PRs #1647, #2154, #2193, ``policies/least_load.rs``;
summary in ``shared/POLICIES.md``). Each request goes to the healthy worker with the lowest
expected wait (:mod:`~sessionroute.router.policies._expected_wait`)::

    wait(w) = (queued(w) + since_poll(w)) / tokens_per_s + kv_penalty_s * k / (1 - k)

``queued(w)``: the worker's waiting uncached prefill tokens at its last poll; ``since_poll(w)``:
the prompt tokens this router sent it since that poll (the since-poll credit against herding
between polls); ``k``: its scraped KV usage, clamped to ``max_kv``. Ties go to the least
recently chosen (SMG: the first). With ``max_waiting`` set, a request is held in the router's
admission queue while every healthy worker reports at least that many waiting requests (SMG's
optional per-worker waiting cap with a router-side queue).

Reproduced: the score, its defaults (0.15 s KV weight, 2,000 tok/s fallback throughput, KV
clamp 0.999, 1,024 mean prefill tokens for a worker without a snapshot), the credit and its
reset at each poll, the join-shortest-queue fallback when no worker reports, the waiting cap.
Approximated: see :mod:`~sessionroute.router.policies._expected_wait` (waiting requests times
the mean in-flight prompt instead of the engine's waiting uncached tokens; one throughput for
every worker; a poll is a change of the scraped gauges; the router's scrape period, 1 s by
default, instead of SMG's 10 s poll).

On multi-turn agent RL this policy keeps no affinity at all: a session's next turn goes to the
least-loaded worker whatever holds its context, so with N replicas about (N - 1) / N of the
turns re-prefill their whole context elsewhere. It balances load well and loses the prefix
cache; on the default swe-rl workload it lands with ``least_loaded`` (docs/policies.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._expected_wait import ExpectedWait
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["LeastTokenLoadConfig", "LeastTokenLoadPolicy"]


@dataclass(frozen=True, slots=True)
class LeastTokenLoadConfig:
    """Options of ``least_token_load``.

    Attributes:
        tokens_per_s: a worker's throughput (tokens/s) that turns token work into seconds
            (SMG's ``default_throughput``, used when a worker reports no generation rate).
        kv_penalty_s: seconds of the KV barrier ``kv_penalty_s * k / (1 - k)`` (SMG's
            ``kv_pressure_weight``).
        max_kv: KV usage is clamped to at most this, in (0, 1), before the barrier.
        mean_prefill_tokens: tokens an in-flight request is worth on a worker without gauges.
        max_waiting: hold requests while every worker reports at least this many waiting
            requests (None: never hold; SMG's ``max_waiting_requests`` 0).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    tokens_per_s: float = 2000.0
    kv_penalty_s: float = 0.15
    max_kv: float = 0.999
    mean_prefill_tokens: int = 1024
    max_waiting: int | None = None

    def __post_init__(self) -> None:
        ExpectedWait(self.tokens_per_s, self.kv_penalty_s, self.max_kv, self.mean_prefill_tokens)
        if self.max_waiting is not None and self.max_waiting < 1:
            raise ConfigError(f"max_waiting must be >= 1 or None, got {self.max_waiting!r}")


class LeastTokenLoadPolicy(Policy):
    """Lowest (queued + since-poll tokens) / throughput + KV barrier.

    Attributes:
        wait: the expected-wait scorer (its scores are the policy's costs, in seconds).
    """

    name: ClassVar[str] = "least_token_load"
    Config: ClassVar[type[Any] | None] = LeastTokenLoadConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: LeastTokenLoadConfig = self.config
        self.wait = ExpectedWait(
            cfg.tokens_per_s, cfg.kv_penalty_s, cfg.max_kv, cfg.mean_prefill_tokens
        )

    def cost(self, worker: str, cluster: ClusterView) -> float:
        """The worker's score among the healthy workers (seconds when any has gauges, else
        in-flight requests; folds in new polls)."""
        healthy = cluster.healthy()
        return self.wait.scores(healthy, cluster)[healthy.index(worker)]

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
        worker = self.wait.pick(healthy, cluster, request.prompt_tokens)
        return Decision(worker, DecisionKind.STATELESS)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.wait.forget(worker)
