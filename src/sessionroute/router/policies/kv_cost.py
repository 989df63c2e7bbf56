"""``kv_cost``: NVIDIA Dynamo's KV router cost: blocks to prefill, weighted, plus active blocks.

Source: the Dynamo KV router (ai-dynamo docs "KV cache routing", "Router design"; summary in
``shared/POLICIES.md``). Each request goes to the healthy worker with the lowest

    cost(w) = overlap_weight * prefill_blocks(w) + decode_blocks(w)

    prefill_blocks(w) = (prefill tokens in flight on w + this prompt's tokens not cached on w)
                        / tokens per block
    decode_blocks(w)  = (prompt tokens in flight on w + this prompt's tokens) / tokens per block

i.e. Dynamo's "potential prefill blocks" and "potential active blocks" if the request went to
``w``. What ``w`` caches is its longest cached prefix of the request's blocks, read from a
:class:`~sessionroute.router.kv.PrefixCacheView`: in the simulator the replica model's exact
prefix caches (:mod:`sessionroute.sim.kvview`, set by the runner through
:meth:`KvCostPolicy.use_prefix_cache`); live, :attr:`KvCostPolicy.index`, the
:class:`~sessionroute.router.kv.KvIndex` that ``serve --kv-events`` feeds from vLLM's KV events
(as ``kv_aware``'s), and without events the router's own approximate index of what it
sent (Dynamo's ``--no-kv-events`` mode predicts the cache from its routing decisions too).
With ``temperature`` > 0 the worker is sampled instead, with probability proportional to
``exp(-cost / (temperature * max cost))`` (softmax over normalised costs), from the injected
rng. Workers whose scraped KV usage is at least ``busy_kv_threshold`` are left out; when every
worker is busy the request is held in the router's admission queue (Dynamo answers HTTP 529).

Reproduced: the cost and its default ``overlap_weight`` 1.0, lowest cost or temperature
sampling, the busy threshold, overlap from the engines' reported caches. Approximated: a
request's uncached prefill counts until it completes (Dynamo drops it at the first token); its
active blocks are its prompt blocks (Dynamo adds the generated ones as they come and counts a
block shared by two active requests once); the no-events cache is LRU-bounded, not TTL'd (120 s
in Dynamo). Ties go to the least recently chosen.

On multi-turn agent RL the decode term is the whole story: a session's next turn saves its
context's blocks of prefill on its home worker, but every other in-flight context costs as
many blocks of decode, so the home worker loses the turn as soon as it holds about one context
more than another worker. Long-context sessions then move almost every turn and re-prefill
their context elsewhere (docs/policies.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.kv.index import KvIndex, PrefixCacheView
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

__all__ = ["KvCostConfig", "KvCostPolicy"]

_DEFAULT_BLOCK_TOKENS = 16.0
"""Tokens per block when a request carries no blocks (vLLM's default KV block)."""


@dataclass(frozen=True, slots=True)
class KvCostConfig:
    """Options of ``kv_cost``.

    Attributes:
        overlap_weight: weight of the blocks to prefill (Dynamo's
            ``--kv-overlap-score-weight``, default 1.0).
        temperature: 0 picks the lowest cost; above 0 samples by softmax (Dynamo's
            ``--router-temperature``).
        busy_kv_threshold: KV usage, in (0, 1], at which a worker takes no new request (None:
            never busy).
        max_tree_blocks: per-worker bound of the no-events prefix index, in content blocks.
        max_blocks_per_worker: bound of each worker's set in the KV-event index (blocks).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    overlap_weight: float = 1.0
    temperature: float = 0.0
    busy_kv_threshold: float | None = None
    max_tree_blocks: int = 1 << 24
    max_blocks_per_worker: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.overlap_weight >= 0:
            raise ConfigError(f"overlap_weight must be >= 0, got {self.overlap_weight!r}")
        if not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        b = self.busy_kv_threshold
        if b is not None and not 0.0 < b <= 1.0:
            raise ConfigError(f"busy_kv_threshold must be in (0, 1] or None, got {b!r}")
        if self.max_tree_blocks < 1:
            raise ConfigError(f"max_tree_blocks must be >= 1, got {self.max_tree_blocks!r}")
        if self.max_blocks_per_worker < 1:
            raise ConfigError(
                f"max_blocks_per_worker must be >= 1, got {self.max_blocks_per_worker!r}"
            )


class _ApproxView:
    """:class:`PrefixCacheView` over the router's own approximate index (no KV events)."""

    __slots__ = ("tree",)

    def __init__(self, tree: ApproxPrefixIndex) -> None:
        self.tree = tree

    def matched_blocks(
        self, hashes: Sequence[int], workers: Sequence[str], salt: str | None = None
    ) -> dict[str, int]:
        return self.tree.matched(workers, hashes)


class KvCostPolicy(TidiesInSweeps, Policy):
    """Lowest ``overlap_weight * prefill blocks + active blocks`` (or softmax sampling).

    Attributes:
        index: the KV-event index ``serve --kv-events`` feeds; asked once it tracks a worker.
        approx: the router's approximate index of what it sent, asked without KV events.
        prefill: uncached prompt tokens in flight per worker.
        cache: the view a driver set with :meth:`use_prefix_cache`, or None.
        decisions: requests sent to a worker caching part of their prompt (``"cache_hit"``)
            and the others (``"no_match"``).
    """

    name: ClassVar[str] = "kv_cost"
    Config: ClassVar[type[Any] | None] = KvCostConfig
    needs_content = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: KvCostConfig = self.config
        self.index = KvIndex(cfg.max_blocks_per_worker)
        self.approx = ApproxPrefixIndex(cfg.max_tree_blocks)
        self.tidied_index = self.approx  # (TidiesInSweeps)
        self._approx_view = _ApproxView(self.approx)
        self.prefill = InflightPrefill()
        self.cache: PrefixCacheView | None = None
        self.decisions: dict[str, int] = {"cache_hit": 0, "no_match": 0}
        self._picker = LowestScore()

    def use_prefix_cache(self, view: PrefixCacheView) -> None:
        """Ask ``view`` for cached prefixes (the simulator's replicas)."""
        self.cache = view

    def _view(self) -> PrefixCacheView:
        if self.cache is not None:
            return self.cache
        return self.index if self.index.workers() else self._approx_view

    def _free(self, cluster: ClusterView) -> tuple[str, ...] | list[str]:
        """Healthy workers below the busy threshold."""
        busy = self.config.busy_kv_threshold
        healthy = cluster.healthy()
        if busy is None:
            return healthy
        return [w for w in healthy if (g := cluster.gauges(w)) is None or g.kv_usage < busy]

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        return self.config.busy_kv_threshold is None or bool(self._free(cluster))

    def costs(
        self,
        request: RouteRequest,
        candidates: Sequence[str],
        cluster: ClusterView,
        held: dict[str, int] | None = None,
    ) -> list[float]:
        """The cost of each candidate, in blocks (``held``: cached leading blocks per worker,
        asked of the cache view when None)."""
        blocks = request.blocks or ()
        n = len(blocks)
        tokens = request.prompt_tokens
        per_block = tokens / n if n and tokens else _DEFAULT_BLOCK_TOKENS
        if held is None:
            held = self._view().matched_blocks(blocks, candidates, request.cache_salt) if n else {}
        weight = self.config.overlap_weight
        pending = self.prefill.totals
        in_tokens = cluster.in_flight_tokens
        pending_get = pending.get
        # every worker: weight * (pending + whole prompt) + active + prompt; a worker caching
        # m leading blocks prefills tokens * m // n fewer (uncached_tokens(), inlined)
        base = (weight + 1.0) * tokens
        work = [weight * pending_get(w, 0) + in_tokens(w) + base for w in candidates]
        if held:
            for i, w in enumerate(candidates):
                m = held.get(w)
                if m:
                    work[i] -= weight * (tokens * min(m, n) // n)
        costs = [x / per_block for x in work]
        return costs

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        require_healthy(cluster)
        candidates = self._free(cluster) or cluster.healthy()
        blocks = request.blocks or ()
        view = self._view()
        held = view.matched_blocks(blocks, candidates, request.cache_salt) if blocks else {}
        costs = self.costs(request, candidates, cluster, held)
        t = self.config.temperature
        if t > 0 and len(candidates) > 1:
            worker = self._sample(candidates, costs, t)
        else:
            worker = self._picker.pick(candidates, costs)
        m = held.get(worker, 0)
        self.decisions["cache_hit" if m else "no_match"] += 1
        self.prefill.add(request, worker, uncached_tokens(request.prompt_tokens, len(blocks), m))
        if view is self._approx_view and blocks:
            self.approx.record(worker, prompt_blocks(request))
        return Decision(worker, DecisionKind.STATELESS)

    def _sample(self, candidates: Sequence[str], costs: list[float], temperature: float) -> str:
        top = max(costs)
        scale = temperature * (top if top > 0 else 1.0)
        lo = min(costs)
        weights = [math.exp(-(c - lo) / scale) for c in costs]
        r = self.rng.random() * sum(weights)
        for w, x in zip(candidates, weights, strict=True):
            r -= x
            if r < 0:
                return w
        return candidates[-1]

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        self.prefill.done(request)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.index.remove_worker(worker)
        self.approx.forget(worker)
        self.prefill.forget(worker)
        self._picker.forget(worker)
