"""``cache_aware_v2``: SGLang model gateway (SMG) cache-aware routing with engine-pressure exits.

Source: SMG ``cache_aware`` as revised in smg-project/smg PRs #1621, #2117, #2161, #2213, #2341
(``model_gateway/src/policies/cache_aware.rs``, approximate-tree mode; summary in
``shared/POLICIES.md``). For each request, over the healthy workers:

1. **fleet-wide exit on engine KV pressure**: when the hottest worker's scraped KV usage is
   above ``kv_overload_threshold``, or the KV-usage spread (max - min over the workers with
   gauges) is above ``kv_spread_threshold``, affinity is abandoned: the request goes to the
   lowest expected wait (below) among all healthy workers;
2. **affinity group**: otherwise the prompt is matched against the per-worker prefix trees; if
   the longest match covers more than ``cache_threshold`` of the prompt, the candidates are the
   workers holding that longest match (each scoring 1). With ``overlap_decay`` > 0 a
   candidate's score is divided by ``1 + overlap_decay * x``, ``x`` its waiting prefill in
   blocks beyond the least-backlogged candidate's, per block of this request; the group is
   the candidates with the best score;
3. **per-request spill gate**: a candidate whose in-flight requests are above
   ``balance_rel_threshold`` times the fleet mean *and* above the mean plus
   ``balance_abs_threshold`` is unsafe (SMG's option names; they once set v1's imbalance).
   The final worker is the lowest expected wait among the safe group members; when every
   member is unsafe, among the healthy workers that are not (all of them if none is), so a
   hot prefix gains a second home instead of queueing;
4. **miss**: a match at or below ``cache_threshold`` goes to the lowest expected wait among
   all healthy workers.

The expected wait is SMG ``least_load``'s score with its since-poll credit
(:mod:`~sessionroute.router.policies._expected_wait`), here fed the router's own uncached
prefill per worker. The prompt is recorded in the chosen worker's tree in every case.

Reproduced: the order of the steps; strict ``>`` comparisons; the defaults of SMG (cache
threshold 0.3, spill gate 1.5x and +64 requests, both KV triggers off at 1.0 and the decay
off at 0), except ``kv_overload_threshold``, set to the 0.9 that SMG's documentation suggests
as a safety valve (SMG ships it off; set 1.0 to match). Approximated: prefix matches come from
the router's index of what it sent, in content blocks (SMG's approximate token tree, in
tokens); a worker's waiting prefill is the waiting-request gauge times the mean uncached
prompt of the router's requests in flight there (SMG reads ``num_waiting_uncached_tokens``);
ties of the expected wait go to the least recently chosen. Not reproduced: SMG's
``selection_temperature`` (softmax over the affinity scores; 0 by default), its event-driven
and hash index modes.

On multi-turn agent RL the KV exits are what matter: a replica serving long agent contexts
sits at high KV usage by design (vLLM admits work until the cache is full), so an overload
threshold of 0.9 or a tight spread threshold fires on most requests and turns the policy into
a pure load balancer, losing the sessions' prefixes (docs/policies.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._expected_wait import ExpectedWait
from sessionroute.router.policies._prefix import (
    ApproxPrefixIndex,
    InflightPrefill,
    TidiesInSweeps,
    prompt_blocks,
    uncached_tokens,
)
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["CacheAwareV2Config", "CacheAwareV2Policy"]


@dataclass(frozen=True, slots=True)
class CacheAwareV2Config:
    """Options of ``cache_aware_v2``.

    Attributes:
        cache_threshold: the longest match must cover more than this fraction of the prompt,
            in [0, 1], to route by affinity.
        kv_overload_threshold: hottest worker's KV usage above which affinity is abandoned,
            in [0, 1] (1.0: never).
        kv_spread_threshold: KV-usage spread (max - min) above which affinity is abandoned,
            in [0, 1] (1.0: never).
        balance_rel_threshold: a candidate is unsafe above this times the mean in-flight load...
        balance_abs_threshold: ...and above the mean plus this many requests.
        overlap_decay: weight of the waiting-prefill decay of the affinity score (>= 0; 0: off).
        tokens_per_s: throughput of the expected-wait score (tokens/s).
        kv_penalty_s: KV barrier weight of the expected-wait score (seconds).
        max_tree_blocks: per-worker bound of the prefix index, in content blocks.

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    cache_threshold: float = 0.3
    kv_overload_threshold: float = 0.9
    kv_spread_threshold: float = 1.0
    balance_rel_threshold: float = 1.5
    balance_abs_threshold: float = 64.0
    overlap_decay: float = 0.0
    tokens_per_s: float = 2000.0
    kv_penalty_s: float = 0.15
    max_tree_blocks: int = 1 << 24

    def __post_init__(self) -> None:
        for name in ("cache_threshold", "kv_overload_threshold", "kv_spread_threshold"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
        for name in ("balance_rel_threshold", "balance_abs_threshold", "overlap_decay"):
            v = getattr(self, name)
            if not v >= 0:
                raise ConfigError(f"{name} must be >= 0, got {v!r}")
        ExpectedWait(self.tokens_per_s, self.kv_penalty_s, 0.999)
        if self.max_tree_blocks < 1:
            raise ConfigError(f"max_tree_blocks must be >= 1, got {self.max_tree_blocks!r}")


class CacheAwareV2Policy(TidiesInSweeps, Policy):
    """Cache affinity that yields to engine KV pressure and to per-request overload.

    Attributes:
        index: per-worker approximate prefix index.
        prefill: uncached prefill tokens in flight per worker.
        wait: the expected-wait scorer that makes every final choice.
        decisions: requests by path: ``"kv_overload"``, ``"kv_spread"`` (fleet-wide exits),
            ``"cache_hit"`` (a safe holder of the longest match), ``"spill"`` (every holder
            was unsafe) and ``"miss"`` (no match above the threshold).
    """

    name: ClassVar[str] = "cache_aware_v2"
    Config: ClassVar[type[Any] | None] = CacheAwareV2Config
    needs_content = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: CacheAwareV2Config = self.config
        self.index = ApproxPrefixIndex(cfg.max_tree_blocks)
        self.tidied_index = self.index  # (TidiesInSweeps)
        self.prefill = InflightPrefill()
        self.wait = ExpectedWait(cfg.tokens_per_s, cfg.kv_penalty_s, 0.999)
        self.decisions: dict[str, int] = dict.fromkeys(
            ("kv_overload", "kv_spread", "cache_hit", "spill", "miss"), 0
        )

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        blocks = prompt_blocks(request)
        worker = self.choose(request, cluster, blocks)
        self.record(request, worker, blocks)
        return Decision(worker, DecisionKind.STATELESS)

    def choose(self, request: RouteRequest, cluster: ClusterView, blocks: tuple[int, ...]) -> str:
        """The worker for ``request`` (``blocks``: its content blocks), counted in
        :attr:`decisions`; nothing is recorded (:meth:`record`).

        Raises:
            NoWorkerAvailable: when no worker is healthy.
        """
        healthy = require_healthy(cluster)
        path = self._kv_pressure(healthy, cluster)
        if path is None:
            path, candidates = self._affinity(blocks, request.prompt_tokens, healthy, cluster)
        else:
            candidates = healthy
        pending = self.prefill.totals
        worker = self.wait.pick(candidates, cluster, request.prompt_tokens, pending)
        self.decisions[path] += 1
        return worker

    def record(self, request: RouteRequest, worker: str, blocks: tuple[int, ...]) -> None:
        """``request`` (``blocks``: its content blocks) goes to ``worker``: its uncached
        tokens count in the worker's prefill in flight, its prompt in the worker's tree."""
        matched = self.index.match(worker, blocks)
        self.prefill.add(
            request, worker, uncached_tokens(request.prompt_tokens, len(blocks), matched)
        )
        self.index.record(worker, blocks)

    def _kv_pressure(self, healthy: tuple[str, ...], cluster: ClusterView) -> str | None:
        """Which fleet-wide KV trigger abandons affinity, or None."""
        cfg: CacheAwareV2Config = self.config
        gauges = cluster.gauges
        kv = [g.kv_usage for w in healthy if (g := gauges(w)) is not None]
        if not kv:
            return None
        hot = max(kv)
        if hot > cfg.kv_overload_threshold:
            return "kv_overload"
        if hot - min(kv) > cfg.kv_spread_threshold:
            return "kv_spread"
        return None

    def _affinity(
        self,
        blocks: tuple[int, ...],
        prompt_tokens: int,
        healthy: tuple[str, ...],
        cluster: ClusterView,
    ) -> tuple[str, tuple[str, ...] | list[str]]:
        """The path and the candidates of the final expected-wait choice."""
        cfg: CacheAwareV2Config = self.config
        n = len(blocks)
        if not n:
            return "miss", healthy
        matched = self.index.match_all(healthy, blocks)
        best = max(matched)
        if best <= cfg.cache_threshold * n:
            return "miss", healthy
        group = [w for w, m in zip(healthy, matched, strict=True) if m == best]
        if cfg.overlap_decay > 0 and len(group) > 1:
            group = self._decayed(group, max(prompt_tokens, n), cluster)
        in_flight = cluster.in_flight
        loads = [in_flight(w) for w in healthy]
        mean = sum(loads) / len(loads)
        limit = max(cfg.balance_rel_threshold * mean, mean + cfg.balance_abs_threshold)
        safe = [w for w in group if in_flight(w) <= limit]
        if safe:
            return "cache_hit", safe
        others = [w for w, load in zip(healthy, loads, strict=True) if load <= limit]
        return "spill", others or healthy

    def _decayed(self, group: list[str], prompt_tokens: int, cluster: ClusterView) -> list[str]:
        """The members of ``group`` with the best decayed score (all score 1 before decay;
        the excess backlog counts per token of this prompt, i.e. per block per block)."""
        cfg: CacheAwareV2Config = self.config
        self.wait.scores(group, cluster, self.prefill.totals)  # fold in new polls
        backlog = {w: q for w in group if (q := self.wait.queued(w)) is not None}
        if not backlog:
            return group
        floor = min(backlog.values())
        scores = [
            1.0 / (1.0 + cfg.overlap_decay * (backlog[w] - floor) / prompt_tokens)
            if w in backlog
            else 1.0
            for w in group
        ]
        top = max(scores)
        return [w for w, s in zip(group, scores, strict=True) if s == top]

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        self.prefill.done(request)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.index.forget(worker)
        self.prefill.forget(worker)
        self.wait.forget(worker)
