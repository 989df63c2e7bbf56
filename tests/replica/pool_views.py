"""The two KV pools' free queues as per-block lists, to compare them in tests."""

from __future__ import annotations

from sessionroute.replica.blocks import BlockPool
from sessionroute.replica.segments import SegmentPool


def block_queue(pool: BlockPool) -> list[int | None]:
    """The per-block free queue in eviction order: blocks never offered to the cache (freed
    ones and never-used ones), then queued ones."""
    out: list[int | None] = [None] * (len(pool._spare) + pool.num_blocks - pool._next)
    for e in pool._queue:
        b = e & 0xFFFF_FFFF
        if e >> 32 == pool.ver[b]:
            out.append(pool.key[b] if pool.owner[b] is not None else None)
    return out


def segment_queue(pool: SegmentPool) -> list[int | None]:
    """The segment pool's queue expanded to blocks in eviction order."""
    out: list[int | None] = [None] * pool.fresh
    head = pool._head
    seg = head.next
    while seg is not head:
        res = seg.res
        for p in range(seg.hi - 1, seg.lo - 1, -1):
            k = res.keys[p] if p < len(res.keys) else None
            cached = p < seg.creg and p not in seg.holes
            out.append(k if k is not None and cached else None)
        seg = seg.next
    return out
