"""A binary min-heap of records ordered by ``(t, key)``: the replica model's heap of lazy
decoders' last steps, compiled with it (:mod:`sessionroute.native`).

Written out rather than ``heapq`` over tuples: compiled (mypyc), comparing two entries reads
two unboxed fields, where ``heapq`` compares tuples element by element through Python's rich
comparison. With unique keys
the order of pops does not depend on the heap's layout: it is exactly ``heapq``'s order of the
tuples ``(t, key, ...)``. The sifts follow ``heapq``'s ``heappush`` / ``heappop`` (CPython
``Modules/_heapqmodule.c``).
"""

from __future__ import annotations

__all__ = ["HeapEntry", "MinHeap"]


class HeapEntry:
    """A heap record; subclasses add the payload.

    Attributes:
        t: primary sort key (seconds, or a step index as a float: exact below 2**53).
        key: secondary sort key (e.g. a priority and a sequence number); unique per heap.
    """

    __slots__ = ("key", "t")

    def __init__(self, t: float, key: int) -> None:
        self.t = t
        self.key = key


class MinHeap:
    """Entries with the smallest ``(t, key)`` first.

    Attributes:
        items: the heap array (``items[0]`` is the smallest); read it, do not reorder it.
    """

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[HeapEntry] = []

    def __len__(self) -> int:
        return len(self.items)

    def first(self) -> HeapEntry | None:
        """The smallest entry (not removed), or None when empty."""
        return self.items[0] if self.items else None

    def clear(self) -> None:
        """Remove every entry."""
        self.items.clear()

    def push(self, e: HeapEntry) -> None:
        """Add ``e`` (sift towards the root)."""
        heap = self.items
        heap.append(e)
        i = len(heap) - 1
        t = e.t
        key = e.key
        while i > 0:
            p = (i - 1) >> 1
            parent = heap[p]
            if t < parent.t or (t == parent.t and key < parent.key):
                heap[i] = parent
                i = p
            else:
                break
        heap[i] = e

    def pop(self) -> HeapEntry:
        """Remove and return the smallest entry.

        Raises:
            IndexError: when the heap is empty.
        """
        heap = self.items
        last = heap.pop()
        if not heap:
            return last
        top = heap[0]
        n = len(heap)
        t = last.t
        key = last.key
        i = 0
        c = 1
        while c < n:
            child = heap[c]
            r = c + 1
            if r < n:
                right = heap[r]
                if right.t < child.t or (right.t == child.t and right.key < child.key):
                    c = r
                    child = right
            if child.t < t or (child.t == t and child.key < key):
                heap[i] = child
                i = c
                c = 2 * c + 1
            else:
                break
        heap[i] = last
        return top
