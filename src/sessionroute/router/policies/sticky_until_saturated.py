"""``sticky_until_saturated``: llm-d's prefix affinity, broken by a TTFT gate, then least prefill.

Source: llm-d's "sticky until saturated" routing (llm-d PR #2071; llm-d-router PRs #1024, #1547,
#1639; summary in ``shared/POLICIES.md``). For each request, over the healthy workers:

1. **prefix-affinity filter**: keep the workers whose prefix score (matched fraction of the
   prompt's content blocks) is at least ``affinity_threshold`` (0.80); a fraction
   ``explore_fraction`` (1 %) of requests skip the filter, drawn from the injected rng, so a
   hot prefix can spread. With no worker above the threshold every worker stays.
2. **TTFT gate**: a worker's estimated TTFT is (uncached prefill tokens in flight there + this
   request's uncached tokens there) / ``prefill_tokens_per_s``. When the best kept worker's
   estimate exceeds the best other worker's by more than ``ttft_margin_s`` (18 s, llm-d's
   margin for its throughput-based estimate), stickiness breaks and every worker is a
   candidate again.
3. **choice**: the candidate with the fewest uncached prefill tokens in flight; ties to the
   least recently chosen.

Reproduced: the three stages, the 0.80 threshold, 1 % exploration and the 18 s margin.
Approximated: the prefix score comes from the router's own index of what it sent
(:class:`~sessionroute.router.policies._prefix.ApproxPrefixIndex`), not llm-d's KV-block
index; in-flight uncached prefill counts a request until it completes, not until its first
token; the prefill rate is one configured number for every replica (llm-d measures it), and the
learned TTFT predictor (5 s margin) is not reproduced. Stickiness is by prefix, as in llm-d:
session ids are not read.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._pick import LowestScore
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

__all__ = ["StickyUntilSaturatedConfig", "StickyUntilSaturatedPolicy"]


@dataclass(frozen=True, slots=True)
class StickyUntilSaturatedConfig:
    """Options of ``sticky_until_saturated``.

    Attributes:
        affinity_threshold: minimum prefix score, in [0, 1], to stay in the affinity filter.
        explore_fraction: fraction of requests, in [0, 1], that skip the filter.
        ttft_margin_s: seconds by which the best sticky worker's estimated TTFT may exceed
            the best other's before stickiness breaks.
        prefill_tokens_per_s: a replica's prefill rate for the TTFT estimate (tokens/s; a
            guess for an 8xH200 replica, set it to your replica's measured rate).
        max_tree_blocks: per-worker bound of the prefix index, in content blocks.

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    affinity_threshold: float = 0.80
    explore_fraction: float = 0.01
    ttft_margin_s: float = 18.0
    prefill_tokens_per_s: float = 20_000.0
    max_tree_blocks: int = 1 << 24

    def __post_init__(self) -> None:
        for name in ("affinity_threshold", "explore_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
        if not self.ttft_margin_s >= 0:
            raise ConfigError(f"ttft_margin_s must be >= 0, got {self.ttft_margin_s!r}")
        if not self.prefill_tokens_per_s > 0:
            raise ConfigError(
                f"prefill_tokens_per_s must be > 0, got {self.prefill_tokens_per_s!r}"
            )
        if self.max_tree_blocks < 1:
            raise ConfigError(f"max_tree_blocks must be >= 1, got {self.max_tree_blocks!r}")


class StickyUntilSaturatedPolicy(TidiesInSweeps, Policy):
    """Prefix affinity at 0.80, broken by a TTFT gate, then fewest uncached prefill tokens.

    Attributes:
        index: the prefix index (the router's approximate one unless replaced).
        prefill: uncached prefill tokens in flight per worker.
        decisions: requests by path: ``"sticky"`` (chosen among the affinity set),
            ``"explore"``, ``"no_affinity"`` (nobody above the threshold) and ``"saturated"``
            (the TTFT gate broke stickiness).
    """

    name: ClassVar[str] = "sticky_until_saturated"
    Config: ClassVar[type[Any] | None] = StickyUntilSaturatedConfig
    needs_content = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: StickyUntilSaturatedConfig = self.config
        self.index = ApproxPrefixIndex(cfg.max_tree_blocks)
        self.tidied_index = self.index  # (TidiesInSweeps)
        self.prefill = InflightPrefill()
        self._picker = LowestScore()
        self.decisions: dict[str, int] = dict.fromkeys(
            ("sticky", "explore", "no_affinity", "saturated"), 0
        )

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        cfg: StickyUntilSaturatedConfig = self.config
        healthy = require_healthy(cluster)
        blocks = prompt_blocks(request)
        n = len(blocks)
        tokens = request.prompt_tokens
        pending = self.prefill.totals
        candidates: Sequence[str] = healthy
        if cfg.explore_fraction > 0 and self.rng.random() < cfg.explore_fraction:
            path = "explore"
        elif not n:
            path = "no_affinity"
        else:
            # m >= threshold * n  <=>  m >= ceil(threshold * n) for whole blocks m: the
            # workers listed on the node covering that depth of the prompt's path
            k = math.ceil(cfg.affinity_threshold * n)
            sticky = list(healthy) if k <= 0 else self.index.holding(healthy, blocks, k)
            if not sticky:
                path = "no_affinity"
            elif len(sticky) == len(healthy):
                path = "sticky"
            else:
                # queued uncached tokens (in flight + this request's) per worker; m <= n, so
                # this is uncached_tokens() inlined
                matched = self.index.match_all(healthy, blocks)
                queued = {
                    w: pending.get(w, 0) + tokens - tokens * m // n
                    for w, m in zip(healthy, matched, strict=True)
                }
                best_sticky = min(queued[w] for w in sticky)
                kept = set(sticky)
                best_other = min(q for w, q in queued.items() if w not in kept)
                if (best_sticky - best_other) / cfg.prefill_tokens_per_s > cfg.ttft_margin_s:
                    path = "saturated"
                else:
                    path = "sticky"
                    candidates = sticky
        worker = self._picker.pick(candidates, [pending.get(w, 0) for w in candidates])
        self.decisions[path] += 1
        self.prefill.add(
            request, worker, uncached_tokens(tokens, n, self.index.match(worker, blocks))
        )
        self.index.record(worker, blocks)
        return Decision(worker, DecisionKind.STATELESS)

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        self.prefill.done(request)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.index.forget(worker)
        self.prefill.forget(worker)
        self._picker.forget(worker)
