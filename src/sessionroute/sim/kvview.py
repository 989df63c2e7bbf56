"""The simulated replicas' prefix caches as ``kv_aware`` sees them.

Live, ``kv_aware`` learns each replica's cache from vLLM's KV events
(:class:`~sessionroute.router.kv.KvIndex`). In the simulator it asks each simulated replica's
prefix cache directly (:meth:`sessionroute.replica.Replica.cached_prefix_blocks`): the answer a
lossless event stream with no delay would give. The request's content is the workload's chained
block keys, which play the role of vLLM's block hashes (key ``i`` identifies the prompt's tokens
``0 .. (i + 1) * block_size``; two prompts share key ``i`` exactly when vLLM would give them the
same hash ``i``), and its ``cache_salt`` picks the cache namespace as vLLM's salted first-block
hash does. The router's content blocks must be the replicas' KV blocks
(``router.content_block_tokens`` must divide the replicas' ``block_size``; with equal sizes,
the default, the keys are passed through as they are).
"""

from __future__ import annotations

from collections.abc import Sequence

from sessionroute.errors import ConfigError
from sessionroute.sim.replicas import SimReplica

__all__ = ["ReplicaCacheView"]


class ReplicaCacheView:
    """:class:`~sessionroute.router.kv.PrefixCacheView` over simulated replicas.

    Args:
        replicas: the simulation's replica list (replicas added later are seen too).
        block_size: the replicas' KV block size (tokens).
        content_block_tokens: the router's content block size (tokens).

    Raises:
        ConfigError: if ``content_block_tokens`` does not divide ``block_size`` (the request's
            keys would then not be the replicas' block keys).
    """

    def __init__(
        self, replicas: list[SimReplica], block_size: int, content_block_tokens: int
    ) -> None:
        if block_size % content_block_tokens:
            raise ConfigError(
                f"kv_aware in the simulator needs router.content_block_tokens "
                f"({content_block_tokens}) to divide the replicas' block_size ({block_size})"
            )
        self._replicas = replicas
        self._by_url: dict[str, SimReplica] = {}

    def matched_blocks(
        self, hashes: Sequence[int], workers: Sequence[str], salt: str | None = None
    ) -> dict[str, int]:
        """Worker -> leading blocks of ``hashes`` its engine caches now, for the workers
        caching at least one (a replica that is down caches nothing)."""
        by_url = self._by_url
        if len(by_url) != len(self._replicas):
            self._by_url = by_url = {r.url: r for r in self._replicas}
        out: dict[str, int] = {}
        for w in workers:
            rep = by_url.get(w)
            engine = rep.engine if rep is not None else None
            if engine is not None:
                m = engine.cached_prefix_blocks(hashes, salt)
                if m:
                    out[w] = m
        return out
