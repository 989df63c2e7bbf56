"""An approximate radix tree of the content one worker has seen (for ``cache_aware``).

The router cannot see a replica's prefix cache, so, like sglang's router (``sgl-router``
``src/tree.rs``) and vllm-router (``src/tree.rs``), it remembers the prompts it sent to each
worker in a radix tree and assumes the longest stored prefix is still cached there. Keys are
``tuple[int, ...]`` of content-block keys (:attr:`sessionroute.types.RouteRequest.blocks`) or
``str`` (characters, as sglang's tree); a tree's :attr:`ApproxRadixTree.size` counts stored
ids or characters.

Size is bounded like sglang's ``evict_tenant_by_size``: least recently used *leaves* are
removed until the size is at most the limit. Here eviction runs synchronously after each insert
(sglang runs it from a background thread every ``eviction_interval_secs``). Recency is one
ordered map of nodes: an insert touches its path deepest-first, so every node is more recent
than all of its descendants and the oldest node is always a leaf.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["ApproxRadixTree", "Content", "RetiredTrees", "common_prefix_len"]

Content = str | tuple[int, ...]
"""A prompt as characters or as token/block ids."""


def common_prefix_len(a: Content, b: Content) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search on slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Node:
    __slots__ = ("children", "label", "parent")

    def __init__(self, label: Content, parent: _Node | None) -> None:
        self.label = label
        self.parent = parent
        self.children: dict[Hashable, _Node] = {}


class ApproxRadixTree:
    """Prefixes sent to one worker, with LRU leaf eviction.

    Attributes:
        size: stored characters or ids (sum of edge label lengths).
    """

    __slots__ = ("_lru", "_root", "size")

    def __init__(self) -> None:
        self._root = _Node("", None)
        self._lru: OrderedDict[_Node, None] = OrderedDict()  # oldest first; never the root
        self.size = 0

    def __len__(self) -> int:
        """Number of nodes below the root."""
        return len(self._lru)

    def match(self, key: Content) -> int:
        """Length of the longest prefix of ``key`` stored in the tree (no side effects)."""
        node = self._root
        pos = 0
        n = len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            label = child.label
            m = len(label)
            seg = key[pos : pos + m]
            if seg != label:
                return pos + common_prefix_len(label, seg)
            pos += m
            node = child
        return pos

    def insert(self, key: Content) -> None:
        """Store ``key`` (splitting an edge where it diverges) and mark its path most recent."""
        node = self._root
        pos = 0
        n = len(key)
        path: list[_Node] = []
        while pos < n:
            first = key[pos]
            child = node.children.get(first)
            if child is None:
                leaf = _Node(key[pos:], node)
                node.children[first] = leaf
                self.size += n - pos
                path.append(leaf)
                break
            label = child.label
            m = len(label)
            seg = key[pos : pos + m]
            if seg == label:
                pos += m
                node = child
                path.append(child)
                continue
            k = common_prefix_len(label, seg)  # 1 <= k < m: the first element matched
            mid = _Node(label[:k], node)
            child.label = label[k:]
            child.parent = mid
            mid.children[child.label[0]] = child
            node.children[first] = mid
            path.append(mid)
            pos += k
            node = mid
        lru = self._lru
        for nd in reversed(path):  # deepest first: ancestors end up more recent
            lru[nd] = None
            lru.move_to_end(nd)

    def evict(self, max_size: int) -> int:
        """Remove least recently used leaves until ``size <= max_size``; returns nodes removed."""
        removed = 0
        while self.size > max_size and self._lru:
            self._remove_oldest()
            removed += 1
        return removed

    def drain(self, limit: int | None = None) -> int:
        """Remove up to ``limit`` nodes (all when None), least recently used first; returns
        how many. A removed node is freed at once: nothing is left for the cyclic garbage
        collector (a node and its parent refer to each other)."""
        removed = 0
        while self._lru and (limit is None or removed < limit):
            self._remove_oldest()
            removed += 1
        return removed

    def _remove_oldest(self) -> None:
        leaf, _ = self._lru.popitem(last=False)
        if leaf.children:  # cannot happen (see module docstring); keep the tree sound
            raise RuntimeError("radix tree LRU order broken: oldest node has children")
        parent = leaf.parent
        if parent is not None:
            del parent.children[leaf.label[0]]
            leaf.parent = None
        self.size -= len(leaf.label)


class RetiredTrees:
    """The trees of removed workers, taken apart at once, or, after :meth:`defer_forgetting`
    (``serve``), by :meth:`tidy` in bounded steps (a 50,000-session tree freed in one call
    blocked ~8 ms and left its nodes to the cyclic garbage collector)."""

    __slots__ = ("_defer", "_trees")

    def __init__(self) -> None:
        self._trees: list[ApproxRadixTree] = []
        self._defer = False

    def defer_forgetting(self) -> None:
        """From now on :meth:`retire` keeps a tree for :meth:`tidy`."""
        self._defer = True

    def retire(self, tree: ApproxRadixTree) -> None:
        """``tree``'s worker left: take it apart now, or keep it for :meth:`tidy`."""
        if self._defer:
            self._trees.append(tree)
        else:
            tree.drain()

    @property
    def pending(self) -> bool:
        """Retired trees are left for :meth:`tidy`."""
        return bool(self._trees)

    def tidy(self, limit: int | None = None) -> int:
        """Remove up to ``limit`` nodes (all when None) of the retired trees; returns how
        many were removed."""
        done = 0
        trees = self._trees
        while trees and (limit is None or done < limit):
            done += trees[-1].drain(None if limit is None else limit - done)
            if not len(trees[-1]):
                trees.pop()
        return done
