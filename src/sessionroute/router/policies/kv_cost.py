"""``kv_cost``: NVIDIA Dynamo's KV router cost: blocks to prefill, weighted, plus decode load.

Source: the Dynamo KV router (ai-dynamo docs, "KV cache routing"; summary in
``shared/POLICIES.md``). Each request goes to the healthy worker with the lowest

    cost(w) = overlap_weight * prefill_blocks(w) + decode_blocks(w)

where ``prefill_blocks(w)`` is the request's content blocks that ``w`` does not hold (its
prompt minus the longest cached prefix there) and ``decode_blocks(w)`` the blocks of the
requests in flight on ``w``. With ``temperature`` > 0 the worker is sampled instead, with
probability proportional to ``exp(-cost / (temperature * max cost))`` (Dynamo's softmax over
normalised costs), from the injected rng. Workers whose scraped KV usage is at least
``busy_kv_threshold`` are left out; when every worker is busy the request is held in the
router's admission queue (Dynamo answers HTTP 529 there instead).

Reproduced: the cost, ``overlap_weight`` 1.0, lowest cost or temperature sampling, the busy
threshold. Approximated: the overlap comes from the router's approximate radix trees in both
drivers (:class:`~sessionroute.router.policies._prefix.ApproxPrefixIndex`), not from the
replicas' exact cache state (Dynamo reads KV events; an exact index, issue 21, plugs in behind
:class:`~sessionroute.router.policies._prefix.PrefixIndex`); the decode load is the router's
in-flight prompt tokens converted to blocks at this request's tokens per block (Dynamo counts
the worker's active blocks, generated tokens included). Ties go to the least recently chosen.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._pick import LowestScore
from sessionroute.router.policies._prefix import ApproxPrefixIndex, PrefixIndex, prompt_blocks
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
        overlap_weight: weight of the blocks still to prefill (Dynamo's
            ``--kv-overlap-score-weight``, default 1.0).
        temperature: 0 picks the lowest cost; above 0 samples by softmax (Dynamo's
            ``--router-temperature``).
        busy_kv_threshold: KV usage, in (0, 1], at which a worker takes no new request (None:
            never busy).
        max_tree_blocks: per-worker bound of the prefix index, in content blocks.

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    overlap_weight: float = 1.0
    temperature: float = 0.0
    busy_kv_threshold: float | None = None
    max_tree_blocks: int = 1 << 24

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


class KvCostPolicy(Policy):
    """Lowest ``overlap_weight * prefill blocks + decode blocks`` (or softmax sampling)."""

    name: ClassVar[str] = "kv_cost"
    Config: ClassVar[type[Any] | None] = KvCostConfig
    needs_content: ClassVar[bool] = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: KvCostConfig = self.config
        self.index: PrefixIndex = ApproxPrefixIndex(cfg.max_tree_blocks)
        self._picker = LowestScore()

    def _free(self, cluster: ClusterView) -> list[str]:
        """Healthy workers below the busy threshold."""
        busy = self.config.busy_kv_threshold
        healthy = cluster.healthy()
        if busy is None:
            return list(healthy)
        return [w for w in healthy if (g := cluster.gauges(w)) is None or g.kv_usage < busy]

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        return self.config.busy_kv_threshold is None or bool(self._free(cluster))

    def costs(
        self, request: RouteRequest, candidates: list[str], cluster: ClusterView
    ) -> list[float]:
        """The cost of each candidate, in blocks."""
        weight = self.config.overlap_weight
        blocks = prompt_blocks(request)
        n = len(blocks)
        per_block = (
            request.prompt_tokens / n if n and request.prompt_tokens else _DEFAULT_BLOCK_TOKENS
        )
        matched = self.index.match_all(candidates, blocks)
        in_tokens = cluster.in_flight_tokens
        return [
            weight * (n - m) + in_tokens(w) / per_block
            for w, m in zip(candidates, matched, strict=True)
        ]

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        require_healthy(cluster)
        candidates = self._free(cluster) or list(cluster.healthy())
        costs = self.costs(request, candidates, cluster)
        t = self.config.temperature
        if t > 0 and len(candidates) > 1:
            worker = self._sample(candidates, costs, t)
        else:
            worker = self._picker.pick(candidates, costs)
        self.index.record(worker, prompt_blocks(request))
        return Decision(worker, DecisionKind.STATELESS)

    def _sample(self, candidates: list[str], costs: list[float], temperature: float) -> str:
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

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.index.forget(worker)
        self._picker.forget(worker)
