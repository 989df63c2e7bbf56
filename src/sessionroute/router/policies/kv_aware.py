"""``kv_aware``: route on what each replica's prefix cache actually holds, against its load.

Where ``cache_aware`` guesses each worker's cache from what the router sent it, ``kv_aware``
asks a :class:`~sessionroute.router.kv.PrefixCacheView` built from the replicas' own KV cache
events (vllm-router ``kv_aware``, PR #130; NVIDIA Dynamo's KV router): live, the
:class:`~sessionroute.router.kv.KvIndex` that ``serve``'s ZMQ subscribers feed with vLLM's
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``; in the simulator, the same index fed
with the same events by the simulated replicas (:mod:`sessionroute.sim.kvview`). The request's
content (:attr:`RouteRequest.blocks`) is its block hashes in the replicas' own scheme: vLLM's,
computed from the servers' tokenizer (``serve --kv-tokenizer``), or the simulated replicas'
block keys.

The rule (one cost per healthy worker, lowest wins; Dynamo's cost form, in tokens)::

    cost(w) = prompt_tokens * (1 - matched(w) / len(blocks))      # prefill still to do on w
            + load_tokens_per_request * in_flight(w)               # work already queued on w

``matched(w)`` is the number of the request's leading blocks ``w`` holds. The load term keeps
the longest match from taking everything: a worker holding the whole prefix loses the request
to an idle one once it has ``prompt_tokens * matched_fraction / load_tokens_per_request`` more
requests in flight -- long shared prefixes stay put longer than short ones, and with nothing to
reuse (no worker matches) the rule is plain least-loaded, so cache scoring costs nothing where
there is nothing to reuse (NVIDIA/aicr #1374). Equal costs go to the fewest in-flight requests,
then by rendezvous hash of the request's key (its session id, else its first block hash, else
its request id), so identical first turns spread and equal prefixes agree.

Session ids are optional: without one the cache state alone brings a conversation's turns back
to the worker holding them. With one, nothing extra is pinned (``keeps_sessions`` is False); the
id only keys the tie-break.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.kv.index import KvIndex, PrefixCacheView
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.policies.hashing import rendezvous_score
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["KvAwareConfig", "KvAwarePolicy"]


@dataclass(frozen=True, slots=True)
class KvAwareConfig:
    """Options of ``kv_aware``.

    Attributes:
        load_tokens_per_request: prefill tokens one in-flight request is worth in the cost
            (tokens, > 0). Smaller values follow the cache more, larger ones balance more.
            Default 1024: on the default swe-rl experiment without session ids (6 steps,
            seeds 0 and 1) 1024 gave 6,733 / 6,761 output tok/s, 512 gave 6,842 (seed 0),
            4096 gave 6,145 / 6,165 and 16384 gave 4,408 (seed 1).
        max_blocks_per_worker: bound of each worker's set in the live index (blocks, >= 1).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    load_tokens_per_request: float = 1024.0
    max_blocks_per_worker: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.load_tokens_per_request > 0:
            raise ConfigError(
                f"load_tokens_per_request must be > 0, got {self.load_tokens_per_request!r}"
            )
        if self.max_blocks_per_worker < 1:
            raise ConfigError(
                f"max_blocks_per_worker must be >= 1, got {self.max_blocks_per_worker!r}"
            )


class KvAwarePolicy(Policy):
    """Prefix-cache-aware, load-aware routing on the replicas' reported caches.

    Attributes:
        index: the live index, fed by ``serve`` from the replicas' KV events.
        cache: what :meth:`select` asks: ``index`` unless a driver gave another view
            (:meth:`use_prefix_cache`).
        decisions: how many requests went to a worker holding part of their prefix
            (``"cache_hit"``) and how many found no worker holding any (``"no_match"``).
        matched_blocks_total: leading blocks held by the chosen workers, summed.
    """

    name: ClassVar[str] = "kv_aware"
    Config: ClassVar[type[Any] | None] = KvAwareConfig
    needs_content = True
    reads_kv_events: ClassVar[bool] = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: KvAwareConfig = self.config
        self._lam = cfg.load_tokens_per_request
        self.index = KvIndex(cfg.max_blocks_per_worker)
        self.cache: PrefixCacheView = self.index
        self.decisions: dict[str, int] = {"cache_hit": 0, "no_match": 0}
        self.matched_blocks_total = 0

    def use_prefix_cache(self, view: PrefixCacheView) -> None:
        """Ask ``view`` instead of :attr:`index` (the simulator's salted view of the index)."""
        self.cache = view

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        blocks = request.blocks or ()
        n = len(blocks)
        held = self.cache.matched_blocks(blocks, healthy, request.cache_salt) if n else {}
        prompt = float(max(request.prompt_tokens, n))
        lam = self._lam
        in_flight = cluster.in_flight
        held_get = held.get
        per_block = prompt / n if n else 0.0
        best_cost = float("inf")
        best_load = 0
        tied: list[tuple[str, int]] = []
        for w in healthy:
            load = in_flight(w)
            m = held_get(w, 0)
            cost = prompt - per_block * m + lam * load
            if cost < best_cost or (cost == best_cost and load < best_load):
                best_cost, best_load, tied = cost, load, [(w, m)]
            elif cost == best_cost and load == best_load:
                tied.append((w, m))
        if len(tied) == 1:
            worker, m = tied[0]
        else:
            key = request.session_id
            if key is None:
                key = str(blocks[0]) if n else (request.request_id or "")
            worker, m = max(tied, key=lambda c: rendezvous_score(key, c[0]))
        self.decisions["cache_hit" if m else "no_match"] += 1
        self.matched_blocks_total += m
        return Decision(worker, DecisionKind.STATELESS)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.index.remove_worker(worker)
