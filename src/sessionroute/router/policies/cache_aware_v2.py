"""``cache_aware_v2``: SGLang model gateway (SMG) cache-aware routing with engine-pressure exits.

Source: SMG ``cache_aware`` as revised in smg-project/smg PRs #1621, #2117, #2161, #2213, #2341
(summary in ``shared/POLICIES.md``). ``cache_aware`` (v1) plus what SMG added. For each
request, over the healthy workers:

1. **leave affinity on engine pressure**: when the hottest worker's scraped KV usage is at least
   ``kv_overload_threshold`` (0.9), or the spread of KV usage (max - min) exceeds
   ``kv_spread_threshold``, or v1's in-flight imbalance holds (``max - min >
   balance_abs_threshold`` and ``max > min * balance_rel_threshold``), go to the least-loaded
   worker (in-flight requests);
2. **decayed cache score**: a worker's score is its matched fraction of the prompt divided by
   ``1 + waiting / decay_tokens``, where ``waiting`` is the uncached prefill tokens in flight
   there: a hot prefix on a busy worker counts for less;
3. **prefix holders, least loaded**: when the best score exceeds ``cache_threshold`` (0.3), the
   candidates are every worker whose score does; the least loaded of them wins (hot prefixes
   spread). Otherwise the worker with the smallest tree (most spare cache as the router sees
   it);
4. **per-request spill**: if the chosen worker has more than ``spill_rel`` (1.5) times the mean
   in-flight load and more than mean + ``spill_abs`` (64), the least-loaded worker takes the
   request instead.

The prompt is recorded in the chosen worker's tree in every case. Reproduced: the triggers, the
0.9 KV threshold and the 1.5x / +64 spill gate, least-loaded choice among holders. Guessed: the
KV-spread threshold (0.3; SMG's default is not in its public description), the decay form
``1 / (1 + waiting / decay_tokens)`` and its scale (8,192 tokens), and "waiting prefill" taken
from the router's own in-flight uncached tokens (SMG reads the engines'). Prefix matches come
from the router's approximate radix trees, in content blocks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._prefix import (
    ApproxPrefixIndex,
    InflightPrefill,
    prompt_blocks,
    uncached_tokens,
)
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.policies.least_loaded import LeastRecentlyChosen
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["CacheAwareV2Config", "CacheAwareV2Policy"]


@dataclass(frozen=True, slots=True)
class CacheAwareV2Config:
    """Options of ``cache_aware_v2``.

    Attributes:
        cache_threshold: minimum decayed cache score, in [0, 1], to route by prefix.
        kv_overload_threshold: hottest worker's KV usage, in [0, 1], that leaves affinity.
        kv_spread_threshold: KV-usage spread (max - min), in [0, 1], that leaves affinity.
        balance_abs_threshold: in-flight requests; v1's imbalance needs ``max - min`` above it.
        balance_rel_threshold: v1's imbalance also needs ``max > min * balance_rel_threshold``.
        spill_rel: per-request spill when the chosen worker is over this times the mean load...
        spill_abs: ...and over the mean plus this many requests.
        decay_tokens: waiting uncached prefill tokens that halve a worker's cache score (> 0).
        max_tree_blocks: per-worker bound of the prefix index, in content blocks.

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    cache_threshold: float = 0.3
    kv_overload_threshold: float = 0.9
    kv_spread_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    spill_rel: float = 1.5
    spill_abs: float = 64.0
    decay_tokens: float = 8192.0
    max_tree_blocks: int = 1 << 24

    def __post_init__(self) -> None:
        for name in ("cache_threshold", "kv_overload_threshold", "kv_spread_threshold"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
        for name in ("balance_abs_threshold", "balance_rel_threshold", "spill_rel", "spill_abs"):
            v = getattr(self, name)
            if not v >= 0:
                raise ConfigError(f"{name} must be >= 0, got {v!r}")
        if not self.decay_tokens > 0:
            raise ConfigError(f"decay_tokens must be > 0, got {self.decay_tokens!r}")
        if self.max_tree_blocks < 1:
            raise ConfigError(f"max_tree_blocks must be >= 1, got {self.max_tree_blocks!r}")


class CacheAwareV2Policy(Policy):
    """Cache affinity that yields to engine KV pressure and to per-request overload.

    Attributes:
        index: per-worker approximate prefix index.
        prefill: uncached prefill tokens in flight per worker.
        decisions: requests by path: ``"kv_overload"``, ``"kv_spread"``, ``"imbalance"``,
            ``"cache_hit"``, ``"smallest_tree"`` and ``"spill"`` (the spill gate overrode one
            of the two cache paths).
    """

    name: ClassVar[str] = "cache_aware_v2"
    Config: ClassVar[type[Any] | None] = CacheAwareV2Config
    needs_content: ClassVar[bool] = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: CacheAwareV2Config = self.config
        self.index = ApproxPrefixIndex(cfg.max_tree_blocks)
        self.prefill = InflightPrefill()
        self._picker = LeastRecentlyChosen()
        self.decisions: dict[str, int] = dict.fromkeys(
            ("kv_overload", "kv_spread", "imbalance", "cache_hit", "smallest_tree", "spill"), 0
        )

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        blocks = prompt_blocks(request)
        in_flight = cluster.in_flight
        loads = [in_flight(w) for w in healthy]
        path = self._pressure(healthy, loads, cluster)
        if path is not None:
            worker = self._picker.pick(healthy, cluster)
            matched = self.index.match(worker, blocks)
        else:
            path, worker, matched = self._by_cache(blocks, healthy, cluster)
            if self._spills(in_flight(worker), loads):
                path = "spill"
                worker = self._picker.pick(healthy, cluster)
                matched = self.index.match(worker, blocks)
        self.decisions[path] += 1
        self.prefill.add(
            request, worker, uncached_tokens(request.prompt_tokens, len(blocks), matched)
        )
        self.index.record(worker, blocks)
        return Decision(worker, DecisionKind.STATELESS)

    def _pressure(
        self, healthy: tuple[str, ...], loads: list[int], cluster: ClusterView
    ) -> str | None:
        """Which trigger sends the request to the least-loaded worker, or None."""
        cfg: CacheAwareV2Config = self.config
        gauges = cluster.gauges
        kv = [g.kv_usage for w in healthy if (g := gauges(w)) is not None]
        if kv:
            hot = max(kv)
            if hot >= cfg.kv_overload_threshold:
                return "kv_overload"
            if len(kv) == len(healthy) and hot - min(kv) > cfg.kv_spread_threshold:
                return "kv_spread"
        hi, lo = max(loads), min(loads)
        if hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold:
            return "imbalance"
        return None

    def _by_cache(
        self, blocks: tuple[int, ...], healthy: tuple[str, ...], cluster: ClusterView
    ) -> tuple[str, str, int]:
        cfg: CacheAwareV2Config = self.config
        n = len(blocks)
        index = self.index
        if n:
            matched = index.match_all(healthy, blocks)
            threshold = cfg.cache_threshold
            need = threshold * n  # the decayed score is at most the matched fraction
            if max(matched) > need:
                pending = self.prefill.totals
                scale = cfg.decay_tokens
                holders: list[str] = []
                for w, m in zip(healthy, matched, strict=True):
                    if m > need and m / n / (1.0 + pending.get(w, 0) / scale) > threshold:
                        holders.append(w)
                if holders:
                    worker = self._picker.pick(holders, cluster)
                    return "cache_hit", worker, matched[healthy.index(worker)]
        sizes = [index.size(w) for w in healthy]
        smallest = min(sizes)
        tied = [w for w, s in zip(healthy, sizes, strict=True) if s == smallest]
        worker = self._picker.pick(tied, cluster)
        return "smallest_tree", worker, index.match(worker, blocks)

    def _spills(self, load: int, loads: list[int]) -> bool:
        cfg: CacheAwareV2Config = self.config
        mean = sum(loads) / len(loads)
        return load > cfg.spill_rel * mean and load > mean + cfg.spill_abs

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        self.prefill.done(request)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.index.forget(worker)
        self.prefill.forget(worker)
