"""The compiled search structures agree with the standard library: MinHeap pops in exactly
heapq's order of ``(t, key)`` tuples; intbisect bisects like :mod:`bisect`."""

from __future__ import annotations

import bisect
import heapq

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.minheap import HeapEntry, MinHeap
from sessionroute.replica import intbisect

_OPS = st.lists(
    st.one_of(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0, 1e9]), st.integers(0, 4)), st.none()),
    max_size=300,
)


@given(_OPS)
def test_pops_follow_heapq_order(ops: list[tuple[float, int] | None]) -> None:
    heap = MinHeap()
    ref: list[tuple[float, int, int]] = []
    seq = 0
    for op in ops:
        if op is None:
            if ref:
                t, key, _ = heapq.heappop(ref)
                e = heap.pop()
                assert (e.t, e.key) == (t, key)
            else:
                assert heap.first() is None and len(heap) == 0
            continue
        seq += 1
        t, prio = op
        key = prio << 32 | seq  # unique, like the event queue's priority and sequence number
        heap.push(HeapEntry(t, key))
        heapq.heappush(ref, (t, key, seq))
        head = heap.first()
        assert head is not None and (head.t, head.key) == ref[0][:2]
    rest = [(e.t, e.key) for e in (heap.pop() for _ in range(len(heap)))]
    assert rest == [(t, k) for t, k, _ in sorted(ref)]


def test_pop_on_empty_raises() -> None:
    heap = MinHeap()
    heap.push(HeapEntry(1.0, 1))
    assert heap.pop().key == 1
    with pytest.raises(IndexError):
        heap.pop()


@given(st.lists(st.integers(-5, 5)), st.integers(-6, 6), st.integers(0, 12))
def test_int_bisect_matches_the_standard_library(a: list[int], x: int, lo: int) -> None:
    a.sort()
    lo = min(lo, len(a))
    assert intbisect.bisect_left(a, x) == bisect.bisect_left(a, x)
    assert intbisect.bisect_right(a, x) == bisect.bisect_right(a, x)
    assert intbisect.bisect_left(a, x, lo) == bisect.bisect_left(a, x, lo)
    assert intbisect.bisect_right(a, x, lo) == bisect.bisect_right(a, x, lo)
