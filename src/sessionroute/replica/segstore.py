"""Segment store: the data structures and low-level operations of
:class:`~sessionroute.replica.segments.SegmentPool` (see that module for the design).

* A *reservation* (:class:`_Res`) is the id space of one admission's blocks: block id
  ``(rix << 32) | position`` where ``position`` is the block's index in the allocating request's
  chain (its key there is ``keys[position]``). Block ids are virtual (which physical block holds
  what is not observable).
* A *segment* (:class:`_Seg`) covers positions ``[lo, hi)`` of one reservation with one reference
  count; positions ``[lo, creg)`` were offered to the cache and are cached except ``holes``
  (content already cached by another block, which stays uncached as in
  :class:`~sessionroute.replica.blocks.BlockPool`).
* A request holds *extents* (:class:`_Ext`) ``(reservation, lo, hi)`` in chain order, each a
  union of whole segments (splits only refine, so extents stay valid).
* The LRU free queue is a circular doubly linked list of idle segments; an idle segment stands
  for its blocks in *descending* position order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from sessionroute.replica.blocks import Holder, KVPool
from sessionroute.replica.intbisect import bisect_left, bisect_right
from sessionroute.replica.segcache import SaltCache, common_run, drop_starts, restart, run_keys

__all__ = ["SHIFT", "SegmentStore", "common_run"]


SHIFT: Final = 32
"""Bits of the position in a block id ``(rix << SHIFT) | position``."""
_MASK: Final = (1 << SHIFT) - 1


def _no_touch(res: _Res) -> None:
    raise RuntimeError(f"reservation {res.rix} is lazy but the pool has no touch callback")


class _Res:
    """A reservation: the id space of one admission's blocks and its segments by position."""

    __slots__ = ("base", "cache", "keys", "lazy", "lows", "owner", "rix", "segs", "starts")

    def __init__(
        self, rix: int, keys: list[int], cache: dict[int, int], owner: Holder | None
    ) -> None:
        self.rix = rix
        self.base = rix << SHIFT
        self.keys = keys
        self.cache = cache
        self.lows: list[int] = []  # seg.lo of segs, ascending
        self.segs: list[_Seg] = []
        self.starts: list[int] = []  # cached positions whose predecessor it does not cache
        self.owner = owner  # the allocating request while it holds its blocks (appends here)
        # the owner's last segment grows lazily (fast path): call the pool's touch first
        self.lazy = False


class _Seg:
    """Blocks at positions ``[lo, hi)`` of a reservation, with one reference count."""

    __slots__ = ("creg", "hi", "holes", "lo", "next", "prev", "ref", "res")

    def __init__(
        self, res: _Res, lo: int, hi: int, ref: int, creg: int, holes: list[int], link: _Seg | None
    ) -> None:
        self.res = res
        self.lo = lo
        self.hi = hi
        self.ref = ref
        self.creg = creg  # positions [lo, creg) were offered to the cache
        self.holes = holes  # sorted positions in [lo, creg) left uncached (duplicate content)
        # Queue neighbours, meaningful only while the segment is idle in the queue. A new
        # segment points at ``link`` (the queue's sentinel, or the segment it was split from),
        # not at itself: a self-reference would make each dropped segment cyclic garbage that
        # only the cyclic GC frees (~1 per request, ~10 % of a run's time in the collector).
        # Only the sentinel (``link=None``) points at itself. Only queued (idle) segments are
        # ever unlinked, so a stale link is never followed.
        nb = self if link is None else link
        self.prev: _Seg = nb
        self.next: _Seg = nb


class _Ext:
    """Positions ``[lo, hi)`` of reservation ``res`` held by a request."""

    __slots__ = ("hi", "lo", "res")

    def __init__(self, res: _Res, lo: int, hi: int) -> None:
        self.res = res
        self.lo = lo
        self.hi = hi


class SegmentStore(KVPool):
    """Blocks in segments, an LRU queue of idle segments and per-salt caches (no request-level
    API; :class:`~sessionroute.replica.segments.SegmentPool` adds it).

    Args:
        num_blocks: blocks in the pool (``kv_capacity_tokens // block_size``), >= 1.

    Attributes:
        num_blocks: total blocks.
        num_free: blocks with no user (never used, or idle cached or not).
        fresh: idle blocks no cache entry can reach, never used or freed without being
            offered to the cache (allocated before any queued block).

    Raises:
        ValueError: if ``num_blocks < 1``.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.fresh = num_blocks
        self._caches: dict[str | None, SaltCache] = {}
        self._res: dict[int, _Res] = {}
        self._rix = 0
        dummy = _Res(-1, [], SaltCache(), None)
        self._head = _Seg(dummy, 0, 0, 0, 0, [], None)  # sentinel of the circular queue
        self.touch: Callable[[_Res], None] = _no_touch
        self._salt_of: dict[int, str | None] = {}  # id(SaltCache) -> its salt (events)
        self.kv_listener = None

    def cache_for(self, salt: str | None) -> SaltCache:
        """The cache of a ``cache_salt`` (key -> block id of each run start; see
        :mod:`sessionroute.replica.segcache`)."""
        cache = self._caches.get(salt)
        if cache is None:
            cache = self._caches[salt] = SaltCache()
            self._salt_of[id(cache)] = salt
        return cache

    def emit(self, stored: bool, res: _Res, a: int, b: int, holes: list[int]) -> None:
        """Tell the listener that ``res``'s positions ``[a, b)`` except ``holes`` entered
        (``stored``) or left the cache; callers test ``kv_listener is not None`` first."""
        listener = self.kv_listener
        if listener is not None and b > a:
            keys = run_keys(res.keys, a, b, holes)
            if keys:
                listener(stored, keys, self._salt_of.get(id(res.cache)))

    # ------------------------------------------------------------ queue and segments

    def _append(self, seg: _Seg) -> None:
        """Put an idle segment at the queue tail."""
        head = self._head
        last = head.prev
        seg.prev = last
        seg.next = head
        last.next = seg
        head.prev = seg

    @staticmethod
    def _unlink(seg: _Seg) -> None:
        p = seg.prev
        n = seg.next
        p.next = n
        n.prev = p

    @staticmethod
    def _split(res: _Res, i: int, m: int) -> _Seg:
        """Split ``res.segs[i]`` at position ``m`` (``lo < m < hi``); return the upper part.

        An idle segment's blocks are queued deepest first, so the upper part goes right
        before the lower one in the queue.
        """
        seg = res.segs[i]
        creg = seg.creg
        holes = seg.holes
        if holes:
            k = bisect_left(holes, m)
            upper_holes = holes[k:]
            del holes[k:]
        else:
            upper_holes = []
        up = _Seg(res, m, seg.hi, seg.ref, creg if creg > m else m, upper_holes, seg)
        seg.hi = m
        if creg > m:
            seg.creg = m
        res.lows.insert(i + 1, m)
        res.segs.insert(i + 1, up)
        if seg.ref == 0:
            p = seg.prev
            up.prev = p
            up.next = seg
            p.next = up
            seg.prev = up
        return up

    def _evict(self, n: int) -> None:
        """Take ``n`` free blocks: ``fresh`` ones first, then from the queue head, each idle
        segment from its deepest block; evicted blocks leave the cache."""
        if n > self.num_free:
            raise ValueError(f"cannot allocate {n} blocks, {self.num_free} free")
        self.num_free -= n
        f = self.fresh
        if f:
            if n <= f:
                self.fresh = f - n
                return
            self.fresh = 0
            n -= f
        head = self._head
        while n:
            seg = head.next
            lo = seg.lo
            hi = seg.hi
            new_hi = hi - n if hi - n > lo else lo
            n -= hi - new_hi
            res = seg.res
            creg = seg.creg
            top = creg if creg < hi else hi
            if top > new_hi:  # evicted blocks leave the cache: only run starts are entries
                if self.kv_listener is not None:
                    self.emit(False, res, new_hi, top, seg.holes)
                st = res.starts
                if st and st[-1] >= new_hi:
                    drop_starts(res, new_hi, top)
                holes = seg.holes
                if holes and holes[-1] >= new_hi:
                    del holes[bisect_left(holes, new_hi) :]
                seg.creg = new_hi
                if top == hi and res.segs[-1] is not seg:
                    i = bisect_left(res.lows, lo) + 1
                    if res.lows[i] == hi:
                        restart(res, i)
            seg.hi = new_hi
            if new_hi == lo:
                self._unlink(seg)
                i = bisect_left(res.lows, lo)
                del res.lows[i]
                del res.segs[i]
                if not res.segs and res.owner is None:
                    del self._res[res.rix]

    def _open(self, r: Holder, lo: int, n: int) -> _Ext:
        """A new reservation for ``r`` with one in-use segment of ``n`` blocks at ``lo``."""
        self._rix += 1
        res = _Res(self._rix, r.keys, r.cache, r)
        self._res[self._rix] = res
        res.lows.append(lo)
        res.segs.append(_Seg(res, lo, lo + n, 1, lo, [], self._head))
        return _Ext(res, lo, lo + n)

    def _adopt(self, res: _Res, r: Holder, lo: int, h: int) -> bool:
        """Make closed reservation ``res`` ``r``'s own from position ``h`` on, if possible.

        Its idle segments at ``h`` and beyond move to a new reservation (same positions and
        queue places, cached keys re-pointed); ``res`` then takes ``r``'s keys, which must
        equal its own over its remaining positions (``r`` hit ``[lo, h)``, so those are).
        """
        if res.owner is not None or res.cache is not r.cache:
            return False
        lows = res.lows
        segs = res.segs
        k = bisect_left(lows, h)
        for seg in segs[k:]:
            if seg.ref:
                return False
        lo0 = lows[0]
        keys = r.keys
        if lo0 < lo and common_run(keys, lo0, res.keys, lo0, lo - lo0) != lo - lo0:
            return False
        if k < len(segs):
            self._rix += 1
            moved = _Res(self._rix, res.keys, res.cache, None)
            self._res[self._rix] = moved
            for seg in segs[k:]:
                seg.res = moved
            moved.lows = lows[k:]
            moved.segs = segs[k:]
            del lows[k:]
            del segs[k:]
            st = res.starts
            j = bisect_left(st, moved.lows[0])
            moved.starts = st[j:]
            del st[j:]
            cache = res.cache
            old_keys = res.keys
            nbase = moved.base
            for p in moved.starts:
                cache[old_keys[p]] = nbase | p
            restart(moved, 0)
        res.keys = keys
        res.owner = r
        return True

    @staticmethod
    def _merge(res: _Res, lo: int) -> None:
        """Merge neighbouring segments of ``res`` from position ``lo`` on that only one request
        holds (``ref == 1``; the caller holds all of them)."""
        lows = res.lows
        segs = res.segs
        i = bisect_right(lows, lo) - 1
        j = i + 1
        while j < len(segs):
            a = segs[i]
            b = segs[j]
            if a.ref == 1 and b.ref == 1 and a.hi == b.lo:
                if a.creg < a.hi:
                    a.holes += range(a.creg, a.hi)
                a.holes += b.holes
                a.creg = b.creg
                a.hi = b.hi
                del lows[j]
                del segs[j]
            else:
                i = j
                j += 1

    def _hold(self, res: _Res, p: int, q: int) -> None:
        """``ref += 1`` on positions ``[p, q)`` of ``res`` (cached, so present)."""
        lows = res.lows
        segs = res.segs
        i = bisect_right(lows, p) - 1
        seg = segs[i]
        if seg.lo < p:
            seg = self._split(res, i, p)
            i += 1
        while True:
            if seg.hi > q:
                self._split(res, i, q)
            if not seg.ref:
                self._unlink(seg)
                self.num_free -= seg.hi - seg.lo
            seg.ref += 1
            if seg.hi >= q:
                return
            i += 1
            nxt = segs[i]
            if nxt.lo != seg.hi:
                raise RuntimeError(f"hit run [{p}, {q}) crosses a gap at {seg.hi}")
            seg = nxt

    def _extend(self, r: Holder, n: int) -> None:
        exts: list[_Ext] = r.blocks
        ext = exts[-1] if exts else None
        if ext is None or ext.res.owner is not r:
            exts.append(self._open(r, r.nblocks, n))
        else:
            res = ext.res
            seg = res.segs[-1]
            if seg.ref == 1:
                seg.hi += n
            else:  # another request holds the segment too: new blocks get their own
                res.lows.append(seg.hi)
                res.segs.append(_Seg(res, seg.hi, seg.hi + n, 1, seg.hi, [], self._head))
            ext.hi += n
        r.nblocks += n

    # ------------------------------------------------------------ lookup

    def lookup(
        self, cache: dict[int, int], keys: list[int], limit: int
    ) -> tuple[int, int, list[tuple[_Res, int, int]]]:
        """Longest cached prefix of ``keys`` up to ``limit`` blocks (vLLM
        ``find_longest_cache_hit``), without side effects.

        Returns:
            ``(hit_blocks, idle_hit_blocks, pieces)``, ``pieces`` the hit as
            ``(reservation, lo, hi)`` runs in chain order.
        """
        pieces: list[tuple[_Res, int, int]] = []
        h = 0
        idle = 0
        resmap = self._res
        cres: _Res | None = None  # the last run reached the end of cres.segs[ci - 1] at cp
        ci = cp = 0
        while h < limit:
            seg = None
            if cres is not None:
                segs = cres.segs
                if ci < len(segs):
                    nxt = segs[ci]
                    holes = nxt.holes
                    if (
                        nxt.lo == cp < nxt.creg
                        and not (holes and holes[0] == cp)
                        and cres.keys[cp] == keys[h]
                    ):
                        seg = nxt
                        res = cres
                        p = cp
                        i = ci
                        if res.lazy and ci == len(segs) - 1:
                            self.touch(res)
                cres = None
            if seg is None:
                b = cache.get(keys[h])
                if b is None:
                    break
                res = resmap[b >> SHIFT]
                p = b & _MASK
                i = bisect_right(res.lows, p) - 1
                seg = res.segs[i]
                if res.lazy and i == len(res.segs) - 1:
                    self.touch(res)
            hi = seg.hi
            end = seg.creg if seg.creg < hi else hi
            holes = seg.holes
            if holes:
                k = bisect_right(holes, p)
                if k < len(holes) and holes[k] < end:
                    end = holes[k]
            m = end - p
            if m > limit - h:
                m = limit - h
            if m < 1:
                raise RuntimeError(f"cached block {res.base | p} outside its segment's cached run")
            d = common_run(keys, h, res.keys, p, m) if m > 1 else 1
            pieces.append((res, p, p + d))
            if not seg.ref:
                idle += d
            h += d
            if p + d == hi:
                cres = res
                ci = i + 1
                cp = hi
        return h, idle, pieces

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (``vllm:kv_cache_usage_perc``; idle cached blocks excluded)."""
        return (self.num_blocks - self.num_free) / self.num_blocks
