"""``cache_aware``: route to the worker most likely to hold the prompt's prefix in its cache.

The sglang router / vllm-router ``cache_aware`` policy (``src/policies/cache_aware.rs``): one
approximate radix tree per worker (:class:`~sessionroute.router.policies._radix.ApproxRadixTree`)
of the content routed there. The content is the request's chained content-block keys
(:attr:`~sessionroute.types.RouteRequest.blocks`, one per ``content_block_tokens`` tokens), the
same form in the live router and in the simulator; vllm-router matches characters instead, so
ours matches in whole blocks (a deviation, like the ones below), plus, live, a last key of the
prompt's partial last block (``content_tail``): a prompt shorter than a block, or repeated
exactly, matches all of its content, so it stays on one worker as with vllm-router.

For each request, over the healthy workers:

1. if the in-flight loads are imbalanced, ``max - min > balance_abs_threshold`` and
   ``max > min * balance_rel_threshold``, go to the least-loaded worker;
2. otherwise, if the best prefix match covers more than ``cache_threshold`` of the content, go
   to the best-matching worker;
3. otherwise go to the worker with the smallest tree (most spare cache, as the router sees it).

Ties (equal match, equal tree size, equal load) go to the fewest in-flight requests, then to
the least recently chosen worker. The content is inserted into the chosen worker's tree in all
three cases, and the tree is trimmed to ``max_tree_size`` by evicting least recently used
leaves. Deviations (documented): loads are taken over healthy workers only; eviction runs after
each insert instead of from a background thread; session ids are ignored.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._prefix import TidiesInSweeps
from sessionroute.router.policies._radix import ApproxRadixTree, Content, RetiredTrees
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.policies.least_loaded import LeastRecentlyChosen
from sessionroute.router.policies.options import knob
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["CacheAwareConfig", "CacheAwarePolicy", "request_content"]


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    """Options of ``cache_aware`` (names and meaning as vllm-router's ``--cache-threshold``,
    ``--balance-abs-threshold``, ``--balance-rel-threshold``).

    Attributes:
        cache_threshold: minimum matched fraction of the content, in [0, 1], for routing to the
            best-matching worker.
        balance_abs_threshold: in-flight requests; imbalance needs ``max - min`` above this.
        balance_rel_threshold: imbalance also needs ``max > min * balance_rel_threshold``.
        max_tree_size: per-worker tree bound in characters or ids (sglang default 2**24).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    cache_threshold: float = knob(0.3, 0.0, 1.0)
    balance_abs_threshold: int = knob(64, 1, 256, log=True)
    balance_rel_threshold: float = knob(1.5, 1.0, 4.0)
    max_tree_size: int = 1 << 24

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ConfigError(f"cache_threshold must be in [0, 1], got {self.cache_threshold!r}")
        if self.balance_abs_threshold < 0:
            raise ConfigError(
                f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold!r}"
            )
        if not self.balance_rel_threshold >= 0:
            raise ConfigError(
                f"balance_rel_threshold must be >= 0, got {self.balance_rel_threshold!r}"
            )
        if self.max_tree_size < 1:
            raise ConfigError(f"max_tree_size must be >= 1, got {self.max_tree_size!r}")


def request_content(request: RouteRequest) -> Content:
    """The content a prefix-aware policy matches: the request's content-block keys as a tuple
    (empty when it has none)."""
    return () if request.blocks is None else tuple(request.blocks)


class CacheAwarePolicy(TidiesInSweeps, Policy):
    """Prefix-affinity routing over per-worker approximate radix trees, with load balancing.

    Attributes:
        decisions: how many requests took each path: ``"cache_hit"`` (match above threshold),
            ``"smallest_tree"`` and ``"load_balance"``.
    """

    name: ClassVar[str] = "cache_aware"
    Config: ClassVar[type[Any] | None] = CacheAwareConfig
    needs_content = True
    content_tail: ClassVar[bool] = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: CacheAwareConfig = self.config
        self._threshold = cfg.cache_threshold
        self._abs = cfg.balance_abs_threshold
        self._rel = cfg.balance_rel_threshold
        self._max_size = cfg.max_tree_size
        self._trees: dict[str, ApproxRadixTree] = {}
        self._retired = RetiredTrees()
        self.tidied_index = self._retired  # (TidiesInSweeps)
        self._picker = LeastRecentlyChosen()
        self.decisions: dict[str, int] = {"cache_hit": 0, "smallest_tree": 0, "load_balance": 0}

    def tree(self, worker: str) -> ApproxRadixTree:
        """The tree of ``worker`` (created empty on first use)."""
        t = self._trees.get(worker)
        if t is None:
            t = self._trees[worker] = ApproxRadixTree()
        return t

    def tree_sizes(self) -> dict[str, int]:
        """Worker -> stored characters or ids, for workers that have a tree."""
        return {w: t.size for w, t in self._trees.items()}

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        content = request_content(request)
        if self._imbalanced(healthy, cluster):
            path = "load_balance"
            candidates: Sequence[str] = healthy
        else:
            path, candidates = self._by_cache(content, healthy)
        worker = self._picker.pick(candidates, cluster)
        self.decisions[path] += 1
        if content:
            tree = self.tree(worker)
            tree.insert(content)
            if tree.size > self._max_size:
                tree.evict(self._max_size)
        return Decision(worker, DecisionKind.STATELESS)

    def _imbalanced(self, healthy: Sequence[str], cluster: ClusterView) -> bool:
        loads = [cluster.in_flight(w) for w in healthy]
        hi, lo = max(loads), min(loads)
        return hi - lo > self._abs and hi > lo * self._rel

    def _by_cache(self, content: Content, healthy: Sequence[str]) -> tuple[str, list[str]]:
        n = len(content)
        if n:
            best_len = 0
            best: list[str] = []
            for w in healthy:
                t = self._trees.get(w)
                m = t.match(content) if t is not None else 0
                if m > best_len:
                    best_len, best = m, [w]
                elif m == best_len:
                    best.append(w)
            if best_len / n > self._threshold:
                return "cache_hit", best
        sizes = [(self._trees[w].size if w in self._trees else 0) for w in healthy]
        smallest = min(sizes)
        return "smallest_tree", [w for w, s in zip(healthy, sizes, strict=True) if s == smallest]

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        tree = self._trees.pop(worker, None)
        if tree is not None:
            self._retired.retire(tree)
