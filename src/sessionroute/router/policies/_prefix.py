"""Prefix-overlap signals for the peer policies: a prefix index and in-flight uncached prefill.

:class:`PrefixIndex` is the one interface through which a policy asks "how much of this prompt
does worker ``w`` already hold?". :class:`ApproxPrefixIndex` answers it from what the router
itself sent to each worker (as ``cache_aware``'s radix trees do; sglang's and vllm-router's
``src/tree.rs``), in one radix tree shared by all workers whose nodes list the workers
("tenants") that were sent them, as SGLang's multi-tenant tree does. Prompts are the request's
content-block keys (:attr:`sessionroute.types.RouteRequest.blocks`), so a match counts whole
content blocks. One walk down the tree answers for every worker at once (a worker's match is
the depth of the deepest node on the prompt's path that lists it), where a tree per worker
costs a walk per worker; recording a prompt adds a tenant to the nodes on its path (and one
leaf for its new tail). Each worker's part is bounded: past the bound its least recently sent
leaves go first. A removed worker stops counting at once; its entries leave the tree in
bounded steps (:meth:`ApproxPrefixIndex.tidy`, run by the policy's chunked sweep), so removing
a worker that was sent 50,000 prompts does not block the event loop (``sessionroute bench
stall --policy cache_aware_v2``).

:class:`InflightPrefill` keeps, per worker, the uncached prompt tokens of the requests a policy
sent there and that have not completed (llm-d's "in-flight uncached prefill tokens"). The router
does not see when a request's prefill ends, so a request counts until it completes (an
over-estimate while it decodes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from sessionroute.router.policies._radix import common_prefix_len
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


class _Node:
    __slots__ = ("children", "label", "parent", "tenants")

    def __init__(self, label: tuple[int, ...], parent: _Node | None) -> None:
        self.label = label
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.tenants: dict[str, None] = {}


class ApproxPrefixIndex:
    """The router's approximate view: one radix tree of sent prompts, nodes listing workers.

    Invariant: a worker listed on a node is listed on all of its ancestors (it was sent the
    whole path), so the workers holding at least ``k`` blocks of a prompt are those listed on
    the node covering depth ``k`` of its path.

    A worker that was :meth:`forget`-ten may stay listed on nodes until :meth:`tidy` drops
    it ("retired"); every lookup and :meth:`record` first settles a retired worker it is
    asked about (one that came back before its entries were dropped), so answers are exact
    whenever the tidying runs.

    Args:
        max_blocks: per-worker bound in content blocks (least recently sent leaves go first).
    """

    __slots__ = ("_lru", "_max", "_retired", "_root", "_size")

    def __init__(self, max_blocks: int) -> None:
        self._max = max_blocks
        self._root = _Node((), None)
        self._lru: dict[str, OrderedDict[_Node, None]] = {}  # per worker, oldest first
        self._size: dict[str, int] = {}
        self._retired: dict[str, OrderedDict[_Node, None]] = {}
        """Removed workers -> the nodes that still list them, descendants first."""

    def _settle(self, workers: Sequence[str]) -> None:
        """Drop at once the entries of the retired workers among ``workers``."""
        retired = self._retired
        for w in workers:
            nodes = retired.pop(w, None)
            if nodes is not None:
                for node in nodes:
                    self._unlist(w, node)

    def _path(self, blocks: tuple[int, ...]) -> list[tuple[_Node, int]]:
        """The nodes the prompt enters, each with the prompt's depth at its end (the last one
        may be entered part way)."""
        out: list[tuple[_Node, int]] = []
        node, pos, n = self._root, 0, len(blocks)
        while pos < n:
            child = node.children.get(blocks[pos])
            if child is None:
                break
            label = child.label
            m = len(label)
            if blocks[pos : pos + m] == label:
                pos += m
                out.append((child, pos))
                node = child
                continue
            out.append((child, pos + common_prefix_len(label, blocks[pos : pos + m])))
            break
        return out

    def match(self, worker: str, blocks: tuple[int, ...]) -> int:
        """Leading blocks of ``blocks`` that ``worker`` was sent."""
        if self._retired:
            self._settle((worker,))
        depth = 0
        for node, d in self._path(blocks):
            if worker not in node.tenants:
                break
            depth = d
        return depth

    def matched(self, workers: Sequence[str], blocks: Sequence[int]) -> dict[str, int]:
        """Worker -> leading blocks it was sent, for the workers of ``workers`` sent at least
        one."""
        if self._retired:
            self._settle(workers)
        depth: dict[str, int] = {}
        for node, d in self._path(tuple(blocks)):
            for w in node.tenants:
                depth[w] = d
        if not depth:
            return depth
        wanted = set(workers)
        return {w: d for w, d in depth.items() if w in wanted}

    def match_all(self, workers: Sequence[str], blocks: tuple[int, ...]) -> list[int]:
        if self._retired:
            self._settle(workers)
        depth: dict[str, int] = {}
        for node, d in self._path(blocks):
            for w in node.tenants:
                depth[w] = d
        if not depth:
            return [0] * len(workers)
        get = depth.get
        return [get(w, 0) for w in workers]

    def holding(self, workers: Sequence[str], blocks: tuple[int, ...], k: int) -> list[str]:
        """The workers of ``workers`` that were sent at least the first ``k`` (>= 1) of
        ``blocks``, in their order."""
        if self._retired:
            self._settle(workers)
        for node, d in self._path(blocks):
            if d >= k:
                tenants = node.tenants
                return [w for w in workers if w in tenants]
        return []

    def record(self, worker: str, blocks: tuple[int, ...]) -> None:
        """``blocks`` were sent to ``worker``: list it on the prompt's path (splitting the edge
        where the prompt leaves the tree, adding a leaf for the rest) and mark the path most
        recently sent for it; then trim it to the bound."""
        if not blocks:
            return
        if self._retired:
            self._settle((worker,))
        lru = self._lru.get(worker)
        if lru is None:
            lru = self._lru[worker] = OrderedDict()
            self._size[worker] = 0
        node, pos, n = self._root, 0, len(blocks)
        path: list[_Node] = []
        while pos < n:
            first = blocks[pos]
            child = node.children.get(first)
            if child is None:
                child = _Node(blocks[pos:], node)
                node.children[first] = child
                pos = n
            else:
                label = child.label
                m = len(label)
                seg = blocks[pos : pos + m]
                if seg != label:  # the prompt leaves the tree inside this edge: split it
                    k = common_prefix_len(label, seg)
                    mid = _Node(label[:k], node)
                    mid.tenants = dict(child.tenants)
                    child.label = label[k:]
                    child.parent = mid
                    mid.children[child.label[0]] = child
                    node.children[first] = mid
                    for t in mid.tenants:
                        nodes = self._lru.get(t)
                        if nodes is None:  # a retired worker: tidy drops it here too
                            nodes = self._retired[t]
                        # descendants before ancestors in every worker's order: mid goes after
                        # child, and mid's ancestors (all listing t) after mid
                        nodes[mid] = None
                        up = node
                        while up.parent is not None and t in up.tenants:
                            nodes.move_to_end(up)
                            up = up.parent
                    child = mid
                    m = k
                pos += m
            if worker not in child.tenants:
                child.tenants[worker] = None
                self._size[worker] += len(child.label)
            path.append(child)
            node = child
        for nd in reversed(path):  # deepest first: ancestors end up more recent
            lru[nd] = None
            lru.move_to_end(nd)
        if self._size[worker] > self._max:
            self._evict(worker, self._max)

    def _evict(self, worker: str, limit: int) -> None:
        """Unlist ``worker`` from its least recently sent leaves until it holds ``limit``."""
        lru = self._lru[worker]
        while self._size[worker] > limit and lru:
            node, _ = lru.popitem(last=False)
            self._drop(worker, node)

    def _drop(self, worker: str, node: _Node) -> None:
        del node.tenants[worker]
        self._size[worker] -= len(node.label)
        if not node.tenants and not node.children and node.parent is not None:
            del node.parent.children[node.label[0]]

    def size(self, worker: str) -> int:
        """Blocks stored for ``worker`` (0 when none)."""
        return self._size.get(worker, 0)

    def _unlist(self, worker: str, node: _Node) -> None:
        """Drop a retired ``worker`` from ``node`` (and the node, when it is left empty)."""
        node.tenants.pop(worker, None)
        if not node.tenants and not node.children and node.parent is not None:
            del node.parent.children[node.label[0]]

    def forget(self, worker: str) -> None:
        """``worker`` left: it holds nothing from now on, O(1). Its entries stay in the tree,
        invisible to lookups, until :meth:`tidy` drops them."""
        lru = self._lru.pop(worker, None)
        if lru is None:
            return
        del self._size[worker]
        self._retired[worker] = lru  # (never already retired: record() settled it first)

    @property
    def pending(self) -> bool:
        """Entries of removed workers are left for :meth:`tidy`."""
        return bool(self._retired)

    def tidy(self, limit: int | None = None) -> int:
        """Drop up to ``limit`` (all when None) entries of removed workers from the tree,
        descendants before ancestors; returns how many were dropped."""
        done = 0
        retired = self._retired
        while retired:
            worker = next(iter(retired))
            nodes = retired[worker]
            while nodes:
                if limit is not None and done >= limit:
                    return done
                node, _ = nodes.popitem(last=False)
                self._unlist(worker, node)
                done += 1
            del retired[worker]
        return done


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
