"""Prefix-overlap signals for the peer policies: a prefix index and in-flight uncached prefill.

:class:`PrefixIndex` is the one interface through which a policy asks "how much of this prompt
does worker ``w`` already hold?". :class:`ApproxPrefixIndex` answers it from what the router
itself sent to each worker (as ``cache_aware``'s radix trees do; sglang's and vllm-router's
``src/tree.rs``). Prompts are the request's chained content-block keys
(:attr:`sessionroute.types.RouteRequest.blocks`: key ``i`` identifies the prompt's first
``i + 1`` blocks), so a worker that was sent key ``i`` was sent the whole prefix up to it, and a
match counts whole content blocks. That makes an inverted index exact where a radix tree per
worker would be: one map from block key to the workers holding it (the
:class:`~sessionroute.router.kv.KvIndex` that KV events feed, here fed by the router's own
sends), searched by bisection over the prompt for all workers at once. Matching costs
``O(log(prompt blocks))`` set operations however many workers there are, where one tree per
worker costs a walk per worker (64 walks at 64 workers). Each worker's set is bounded; past the
bound its oldest keys go first (a key sent again is not refreshed, unlike an LRU tree).

:class:`InflightPrefill` keeps, per worker, the uncached prompt tokens of the requests a policy
sent there and that have not completed (llm-d's "in-flight uncached prefill tokens"). The router
does not see when a request's prefill ends, so a request counts until it completes (an
over-estimate while it decodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sessionroute.router.kv.index import KvIndex
from sessionroute.types import RouteRequest

__all__ = [
    "ApproxPrefixIndex",
    "InflightPrefill",
    "PrefixIndex",
    "prompt_blocks",
    "uncached_tokens",
]


def prompt_blocks(request: RouteRequest) -> tuple[int, ...]:
    """The request's content-block keys as a tuple (empty when it has none)."""
    return () if request.blocks is None else tuple(request.blocks)


class PrefixIndex(Protocol):
    """Which prompt prefixes each worker holds, in content blocks."""

    def match(self, worker: str, blocks: tuple[int, ...]) -> int:
        """Leading blocks of ``blocks`` that ``worker`` holds (0 for an unknown worker)."""
        ...

    def match_all(self, workers: Sequence[str], blocks: tuple[int, ...]) -> list[int]:
        """:meth:`match` for each of ``workers``, in order."""
        ...

    def record(self, worker: str, blocks: tuple[int, ...]) -> None:
        """``blocks`` were sent to ``worker`` (the router's own view; a KV-event index may
        ignore this)."""
        ...

    def forget(self, worker: str) -> None:
        """``worker`` left the cluster: drop what is known of it."""
        ...


class ApproxPrefixIndex:
    """The router's approximate view: which chained block keys it sent to each worker.

    Args:
        max_blocks: per-worker bound in content blocks (the oldest keys go first).
    """

    __slots__ = ("_index",)

    def __init__(self, max_blocks: int) -> None:
        self._index = KvIndex(max_blocks)

    def match(self, worker: str, blocks: tuple[int, ...]) -> int:
        """Leading blocks of ``blocks`` that ``worker`` was sent (bisection on its keys)."""
        holds = self._index.holds
        lo, hi = 0, len(blocks)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if holds(worker, blocks[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def matched(self, workers: Sequence[str], blocks: Sequence[int]) -> dict[str, int]:
        """Worker -> leading blocks held, for the workers of ``workers`` holding at least one."""
        return self._index.matched_blocks(blocks, workers) if blocks else {}

    def match_all(self, workers: Sequence[str], blocks: tuple[int, ...]) -> list[int]:
        if not blocks:
            return [0] * len(workers)
        held = self._index.matched_blocks(blocks, workers)
        if not held:
            return [0] * len(workers)
        get = held.get
        return [get(w, 0) for w in workers]

    def holding(self, workers: Sequence[str], blocks: tuple[int, ...], k: int) -> list[str]:
        """The workers of ``workers`` holding at least the first ``k`` (>= 1) of ``blocks``, in
        their order (one lookup of block ``k - 1``: the keys are chained)."""
        return self._index.holders(blocks[k - 1], workers)

    def record(self, worker: str, blocks: tuple[int, ...]) -> None:
        m = self.match(worker, blocks)
        if m < len(blocks):
            self._index.store(worker, blocks[m:])

    def size(self, worker: str) -> int:
        """Blocks stored for ``worker`` (0 when none)."""
        return self._index.size(worker)

    def forget(self, worker: str) -> None:
        self._index.remove_worker(worker)


def uncached_tokens(prompt_tokens: int, n_blocks: int, matched: int) -> int:
    """The prompt tokens not covered by ``matched`` of its ``n_blocks`` content blocks
    (all of them when the prompt has no blocks)."""
    if n_blocks <= 0 or matched <= 0:
        return prompt_tokens
    return prompt_tokens - prompt_tokens * min(matched, n_blocks) // n_blocks


class InflightPrefill:
    """Uncached prompt tokens per worker of requests sent and not yet completed.

    A request is keyed by identity: the router core hands the same :class:`RouteRequest` to
    ``select`` and ``on_complete``, and holds it (in its reservation) until then.
    """

    __slots__ = ("_by_request", "_by_worker")

    def __init__(self) -> None:
        self._by_worker: dict[str, int] = {}
        self._by_request: dict[int, tuple[str, int]] = {}

    @property
    def totals(self) -> dict[str, int]:
        """Worker -> uncached tokens in flight (absent: 0); read-only by convention, for
        policies' inner loops."""
        return self._by_worker

    def __getitem__(self, worker: str) -> int:
        return self._by_worker.get(worker, 0)

    def add(self, request: RouteRequest, worker: str, tokens: int) -> None:
        """``request`` was sent to ``worker`` with ``tokens`` uncached prompt tokens."""
        self._by_request[id(request)] = (worker, tokens)
        self._by_worker[worker] = self._by_worker.get(worker, 0) + tokens

    def done(self, request: RouteRequest) -> None:
        """``request`` completed (a request never added, or done twice, is ignored)."""
        entry = self._by_request.pop(id(request), None)
        if entry is not None:
            worker, tokens = entry
            left = self._by_worker.get(worker, 0) - tokens
            self._by_worker[worker] = left if left > 0 else 0

    def forget(self, worker: str) -> None:
        """Drop ``worker``'s total (its requests' later completions subtract nothing)."""
        self._by_worker.pop(worker, None)
        self._by_request = {k: v for k, v in self._by_request.items() if v[0] != worker}
