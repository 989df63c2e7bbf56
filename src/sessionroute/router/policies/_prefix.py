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
leaves go first. In ``serve`` a removed worker stops counting at once and its entries leave
the tree in bounded steps (:meth:`ApproxPrefixIndex.tidy`, run by the policy's chunked sweep),
so removing a worker that was sent 50,000 prompts does not block the event loop
(``sessionroute bench stall --policy cache_aware_v2``).

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
    "Tidied",
    "TidiesInSweeps",
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
        self.tenants: dict[int, None] = {}  # the ids of the workers listed here


class ApproxPrefixIndex:
    """The router's approximate view: one radix tree of sent prompts, nodes listing workers.

    Invariant: a worker listed on a node is listed on all of its ancestors (it was sent the
    whole path), so the workers holding at least ``k`` blocks of a prompt are those listed on
    the node covering depth ``k`` of its path.

    Nodes list workers by an id per time a worker joined, so a worker removed and added again
    (the same URL) is a new tenant. :meth:`forget` drops a worker's entries at once, or, after
    :meth:`defer_forgetting` (``serve``), only retires its id (O(1): lookups never see it
    again) and leaves its entries to :meth:`tidy`, which the policy's chunked sweep runs.
    Without eviction the answers are the same either way; with the per-worker bound, entries
    not yet tidied keep their nodes, so which pieces of a live worker's prompts an eviction
    takes can depend on when the tidying ran (the simulator forgets at once).

    Args:
        max_blocks: per-worker bound in content blocks (least recently sent leaves go first).
    """

    __slots__ = ("_defer", "_ids", "_lru", "_max", "_next_id", "_retired", "_root", "_size")

    def __init__(self, max_blocks: int) -> None:
        self._max = max_blocks
        self._root = _Node((), None)
        self._ids: dict[str, int] = {}  # worker -> its id while it is in the cluster
        self._next_id = 0
        self._lru: dict[int, OrderedDict[_Node, None]] = {}  # per id, oldest first
        self._size: dict[int, int] = {}
        self._retired: dict[int, OrderedDict[_Node, None]] = {}
        """Ids of removed workers -> the nodes that still list them, descendants first."""
        self._defer = False

    def defer_forgetting(self) -> None:
        """From now on :meth:`forget` only retires a worker; :meth:`tidy` drops its entries."""
        self._defer = True

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
        wid = self._ids.get(worker)
        depth = 0
        if wid is None:
            return depth
        for node, d in self._path(blocks):
            if wid not in node.tenants:
                break
            depth = d
        return depth

    def _depths(self, blocks: Sequence[int]) -> dict[int, int]:
        """Worker id -> leading blocks of ``blocks`` it was sent (ids sent at least one)."""
        depth: dict[int, int] = {}
        for node, d in self._path(tuple(blocks)):
            for t in node.tenants:
                depth[t] = d
        return depth

    def matched(self, workers: Sequence[str], blocks: Sequence[int]) -> dict[str, int]:
        """Worker -> leading blocks it was sent, for the workers of ``workers`` sent at least
        one."""
        depth = self._depths(blocks)
        if not depth:
            return {}
        ids = self._ids
        out: dict[str, int] = {}
        for w in workers:
            d = depth.get(ids.get(w, -1))
            if d is not None:
                out[w] = d
        return out

    def match_all(self, workers: Sequence[str], blocks: tuple[int, ...]) -> list[int]:
        depth = self._depths(blocks)
        if not depth:
            return [0] * len(workers)
        ids = self._ids
        return [depth.get(ids.get(w, -1), 0) for w in workers]

    def holding(self, workers: Sequence[str], blocks: tuple[int, ...], k: int) -> list[str]:
        """The workers of ``workers`` that were sent at least the first ``k`` (>= 1) of
        ``blocks``, in their order."""
        for node, d in self._path(blocks):
            if d >= k:
                tenants = node.tenants
                ids = self._ids
                return [w for w in workers if ids.get(w, -1) in tenants]
        return []

    def record(self, worker: str, blocks: tuple[int, ...]) -> None:
        """``blocks`` were sent to ``worker``: list it on the prompt's path (splitting the edge
        where the prompt leaves the tree, adding a leaf for the rest) and mark the path most
        recently sent for it; then trim it to the bound."""
        if not blocks:
            return
        wid = self._ids.get(worker)
        if wid is None:
            wid = self._ids[worker] = self._next_id
            self._next_id += 1
            self._lru[wid] = OrderedDict()
            self._size[wid] = 0
        lru = self._lru[wid]
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
            if wid not in child.tenants:
                child.tenants[wid] = None
                self._size[wid] += len(child.label)
            path.append(child)
            node = child
        for nd in reversed(path):  # deepest first: ancestors end up more recent
            lru[nd] = None
            lru.move_to_end(nd)
        if self._size[wid] > self._max:
            self._evict(wid, self._max)

    def _evict(self, wid: int, limit: int) -> None:
        """Unlist worker ``wid`` from its least recently sent leaves until it holds ``limit``."""
        lru = self._lru[wid]
        while self._size[wid] > limit and lru:
            node, _ = lru.popitem(last=False)
            self._size[wid] -= len(node.label)
            self._unlist(wid, node)

    def _unlist(self, wid: int, node: _Node) -> None:
        """Drop worker ``wid`` from ``node`` (and the node, when it is left empty)."""
        del node.tenants[wid]
        if not node.tenants and not node.children and node.parent is not None:
            del node.parent.children[node.label[0]]

    def size(self, worker: str) -> int:
        """Blocks stored for ``worker`` (0 when none)."""
        wid = self._ids.get(worker)
        return 0 if wid is None else self._size[wid]

    def forget(self, worker: str) -> None:
        """``worker`` left: it holds nothing from now on. Its entries are dropped at once, or
        after :meth:`defer_forgetting` left to :meth:`tidy` (O(1) here)."""
        wid = self._ids.pop(worker, None)
        if wid is None:
            return
        del self._size[wid]
        self._retired[wid] = self._lru.pop(wid)
        if not self._defer:
            self.tidy()

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
            wid = next(iter(retired))
            nodes = retired[wid]
            while nodes:
                if limit is not None and done >= limit:
                    return done
                node, _ = nodes.popitem(last=False)
                self._unlist(wid, node)
                done += 1
            del retired[wid]
        return done


class Tidied(Protocol):
    """What a policy forgets of removed workers in bounded steps (:class:`ApproxPrefixIndex`,
    :class:`~sessionroute.router.policies._radix.RetiredTrees`)."""

    def defer_forgetting(self) -> None:
        """Leave what a removed worker held to :meth:`tidy` from now on."""
        ...

    @property
    def pending(self) -> bool:
        """Something is left for :meth:`tidy`."""
        ...

    def tidy(self, limit: int | None = None) -> int:
        """Drop up to ``limit`` entries (all when None); returns how many."""
        ...


class TidiesInSweeps:
    """Mixin of the :class:`~sessionroute.router.policies.base.Policy` hooks for a policy that
    forgets removed workers through :attr:`tidied_index`: once ``serve`` bounds its sweeps
    (``bound_sweeps``) what a removed worker held is dropped in the router's chunked sweep
    (``sweep``, ``sweep_pending``); the simulator, which bounds nothing, forgets at once. List it
    before ``Policy`` among the bases."""

    tidied_index: Tidied

    def bound_sweeps(self, limit: int) -> None:
        self.tidied_index.defer_forgetting()

    def sweep(self, now: float, limit: int | None = None) -> int:
        """No sessions to expire; drops up to ``limit`` index entries of removed workers."""
        self.tidied_index.tidy(limit)
        return 0

    def sweep_pending(self) -> bool:
        return self.tidied_index.pending


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
