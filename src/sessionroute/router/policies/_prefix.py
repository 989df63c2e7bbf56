"""Prefix-overlap signals for the peer policies: a prefix index and in-flight uncached prefill.

:class:`PrefixIndex` is the one interface through which a policy asks "how much of this prompt
does worker ``w`` already hold?". :class:`ApproxPrefixIndex` answers it from what the router
itself sent to each worker (one :class:`~sessionroute.router.policies._radix.ApproxRadixTree`
per worker, as ``cache_aware`` does; sglang's and vllm-router's ``src/tree.rs``); an index fed by
the engines' KV events (vllm-router ``kv_aware``, issue 21) can replace it behind the same three
calls. Prompts are the request's chained content-block keys
(:attr:`sessionroute.types.RouteRequest.blocks`), so a match counts whole content blocks.

:class:`InflightPrefill` keeps, per worker, the uncached prompt tokens of the requests a policy
sent there and that have not completed (llm-d's "in-flight uncached prefill tokens"). The router
does not see when a request's prefill ends, so a request counts until it completes (an
over-estimate while it decodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sessionroute.router.policies._radix import ApproxRadixTree
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
    """The router's approximate view: one LRU-bounded radix tree of sent prompts per worker.

    Args:
        max_blocks: per-worker bound in content blocks (least recently used leaves go first).
    """

    __slots__ = ("_max", "_trees")

    def __init__(self, max_blocks: int) -> None:
        self._max = max_blocks
        self._trees: dict[str, ApproxRadixTree] = {}

    def match(self, worker: str, blocks: tuple[int, ...]) -> int:
        tree = self._trees.get(worker)
        return 0 if tree is None or not blocks else tree.match(blocks)

    def match_all(self, workers: Sequence[str], blocks: tuple[int, ...]) -> list[int]:
        if not blocks:
            return [0] * len(workers)
        get = self._trees.get
        return [0 if (t := get(w)) is None else t.match(blocks) for w in workers]

    def record(self, worker: str, blocks: tuple[int, ...]) -> None:
        if not blocks:
            return
        tree = self._trees.get(worker)
        if tree is None:
            tree = self._trees[worker] = ApproxRadixTree()
        tree.insert(blocks)
        if tree.size > self._max:
            tree.evict(self._max)

    def size(self, worker: str) -> int:
        """Blocks stored for ``worker`` (0 when none)."""
        tree = self._trees.get(worker)
        return 0 if tree is None else tree.size

    def forget(self, worker: str) -> None:
        self._trees.pop(worker, None)


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
