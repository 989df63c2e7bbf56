"""Run-length KV block pool: the semantics of :class:`~sessionroute.engine.blocks.BlockPool`
(vLLM V1 ``v1/core/block_pool.py``) with work per *run* of blocks, not per block.

A multi-turn request hits thousands of cached blocks but adds only a few dozen. The per-block
pool walks, touches and frees every one of them each turn; this pool keeps blocks in
**segments** (runs of consecutive blocks of one request's chain with one reference count) and
pays per-block work only when a block is created, registered or evicted.

* Each admission opens a *reservation*: an id space for the blocks it allocates, block id
  ``(rix << 32) | position`` where ``position`` is the block's index in the allocating request's
  chain (its key there is ``keys[position]``). Decode blocks extend the request's last segment.
  Block ids are virtual (which physical block holds what is not observable).
* A segment covers positions ``[lo, hi)`` of one reservation; positions ``[lo, creg)`` were
  offered to the cache and are cached except ``holes`` (content already cached by another block,
  which stays uncached as in :class:`BlockPool`). The prefix cache maps ``key -> block id``.
* A request holds *extents* ``(reservation, lo, hi)`` in chain order; each is a union of whole
  segments, because a hit on part of a segment splits it (splits only refine, so extents stay
  valid).
* The LRU free queue is a doubly linked list of idle segments; an idle segment stands for its
  blocks in *descending* position order, so releasing a request's extents deepest first and
  evicting from the *end* (highest position) of the head segment reproduce the per-block
  queue exactly: a finished request's deepest block is evicted first, a hit takes blocks out of
  the queue wherever they are. Never-used blocks sit before everything else (``fresh``).
* Lookup walks the request's keys segment by segment: a dict look-up finds the block of
  ``keys[h]``, then one slice comparison extends the hit over the rest of that segment's
  cached run; it stops at the first key not cached, exactly like the per-block walk.

A property test (``tests/engine/test_engine_segments.py``) checks this pool against
:class:`BlockPool` on random operation sequences.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Sequence, Sized
from operator import ne

from sessionroute.engine.blocks import Holder

__all__ = ["SegmentPool"]

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1


class _Res:
    """A reservation: the id space of one admission's blocks and its segments by position."""

    __slots__ = ("base", "cache", "keys", "lows", "owner", "rix", "segs")

    def __init__(
        self, rix: int, keys: Sequence[int], cache: dict[int, int], owner: Holder | None
    ) -> None:
        self.rix = rix
        self.base = rix << _SHIFT
        self.keys = keys
        self.cache = cache
        self.lows: list[int] = []  # seg.lo of segs, ascending
        self.segs: list[_Seg] = []
        self.owner = owner  # the allocating request while it holds its blocks (appends here)


class _Seg:
    """Blocks at positions ``[lo, hi)`` of a reservation, with one reference count."""

    __slots__ = ("creg", "hi", "holes", "lo", "next", "prev", "ref", "res")

    def __init__(self, res: _Res, lo: int, hi: int, ref: int, creg: int, holes: list[int]) -> None:
        self.res = res
        self.lo = lo
        self.hi = hi
        self.ref = ref
        self.creg = creg  # positions [lo, creg) were offered to the cache
        self.holes = holes  # sorted positions in [lo, creg) left uncached (duplicate content)
        self.prev: _Seg = self
        self.next: _Seg = self


class _Ext:
    """Positions ``[lo, hi)`` of reservation ``res`` held by a request."""

    __slots__ = ("hi", "lo", "res")

    def __init__(self, res: _Res, lo: int, hi: int) -> None:
        self.res = res
        self.lo = lo
        self.hi = hi


def _common(a: Sequence[int], i: int, b: Sequence[int], j: int, m: int) -> int:
    """Length of the common run of ``a[i:i+m]`` and ``b[j:j+m]`` (both at least ``m`` long)."""
    x = a[i : i + m]
    y = b[j : j + m]
    if x == y:
        return m
    if type(x) is not type(y) and list(x) == list(y):
        return m
    diff = list(map(ne, x, y))
    return diff.index(True) if True in diff else min(len(x), len(y))


class SegmentPool:
    """Fixed number of blocks in segments, an LRU queue of idle segments, per-salt caches.

    Same interface and results as :class:`~sessionroute.engine.blocks.BlockPool`'s
    request-level methods (:class:`~sessionroute.engine.blocks.KVPool`).

    Args:
        num_blocks: blocks in the pool (``kv_capacity_tokens // block_size``), >= 1.

    Attributes:
        num_blocks: total blocks.
        num_free: blocks with no user (never used, or idle cached or not).
        fresh: never-used blocks (allocated before any queued block).

    Raises:
        ValueError: if ``num_blocks < 1``.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.fresh = num_blocks
        self._caches: dict[str | None, dict[int, int]] = {}
        self._res: dict[int, _Res] = {}
        self._rix = 0
        dummy = _Res(-1, (), {}, None)
        self._head = _Seg(dummy, 0, 0, 0, 0, [])  # sentinel of the circular queue

    def cache_for(self, salt: str | None) -> dict[int, int]:
        """The cache dict (key -> block id) of a ``cache_salt``."""
        cache = self._caches.get(salt)
        if cache is None:
            cache = self._caches[salt] = {}
        return cache

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
        up = _Seg(res, m, seg.hi, seg.ref, creg if creg > m else m, upper_holes)
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
        """Take ``n`` free blocks: never-used ones first, then from the queue head, each idle
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
            if top > new_hi:
                cache = res.cache
                keys = res.keys
                holes = seg.holes
                if holes and holes[-1] >= new_hi:
                    base = res.base
                    for p in range(top - 1, new_hi - 1, -1):
                        k = keys[p]
                        if cache.get(k) == base | p:
                            del cache[k]
                    del holes[bisect_left(holes, new_hi) :]
                else:  # every block of the run is cached under its own key
                    deque(map(cache.__delitem__, keys[new_hi:top]), maxlen=0)
                seg.creg = new_hi
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
        res.segs.append(_Seg(res, lo, lo + n, 1, lo, []))
        return _Ext(res, lo, lo + n)

    # ------------------------------------------------------------ request level (KVPool)

    def lookup(
        self, cache: dict[int, int], keys: Sequence[int], limit: int
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
        get = cache.get
        resmap = self._res
        while h < limit:
            b = get(keys[h])
            if b is None:
                break
            res = resmap[b >> _SHIFT]
            p = b & _MASK
            seg = res.segs[bisect_right(res.lows, p) - 1]
            end = seg.creg if seg.creg < seg.hi else seg.hi
            holes = seg.holes
            if holes:
                k = bisect_right(holes, p)
                if k < len(holes) and holes[k] < end:
                    end = holes[k]
            m = end - p
            if m > limit - h:
                m = limit - h
            if m < 1:
                raise RuntimeError(f"cached block {b} outside its segment's cached run")
            d = _common(keys, h, res.keys, p, m) if m > 1 else 1
            pieces.append((res, p, p + d))
            if not seg.ref:
                idle += d
            h += d
        return h, idle, pieces

    def admit(self, r: Holder, token: list[tuple[_Res, int, int]], new: int) -> None:
        """Take a lookup's hit runs into use (splitting segments at their ends, out of the
        queue if idle, ``ref += 1``) and allocate ``new`` more blocks.

        The new blocks continue the reservation of the last hit run when that run ends where
        the new blocks start (the previous turn of a conversation), so a conversation's chain
        stays one reservation and, merged, one segment: lookups, holds and releases then cost
        per conversation, not per turn.
        """
        exts: list[_Ext] = []
        h = 0
        for res, p, q in token:
            self._hold(res, p, q)
            h += q - p
            if exts and exts[-1].res is res and exts[-1].hi == p:
                exts[-1].hi = q
            else:
                exts.append(_Ext(res, p, q))
        if new > 0:
            self._evict(new)
            last = exts[-1] if exts else None
            if last is not None and last.hi == h and self._adopt(last.res, r, last.lo, h):
                res = last.res
                res.lows.append(h)
                res.segs.append(_Seg(res, h, h + new, 1, h, []))
                last.hi = h + new
                self._merge(res, last.lo)
            else:
                exts.append(self._open(r, h, new))
        r.blocks = exts
        r.nblocks = h + new

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
        if lo0 < lo and _common(keys, lo0, res.keys, lo0, lo - lo0) != lo - lo0:
            return False
        if k < len(segs):
            self._rix += 1
            moved = _Res(self._rix, res.keys, res.cache, None)
            self._res[self._rix] = moved
            cache = res.cache
            old_keys = res.keys
            base = res.base
            nbase = moved.base
            for seg in segs[k:]:
                seg.res = moved
                top = seg.creg if seg.creg < seg.hi else seg.hi
                for p in range(seg.lo, top):
                    key = old_keys[p]
                    if cache.get(key) == base | p:
                        cache[key] = nbase | p
            moved.lows = lows[k:]
            moved.segs = segs[k:]
            del lows[k:]
            del segs[k:]
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

    def grow(self, r: Holder, n: int) -> None:
        """Allocate ``n`` blocks at the end of ``r``'s chain."""
        self._evict(n)
        self._extend(r, n)

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
                res.segs.append(_Seg(res, seg.hi, seg.hi + n, 1, seg.hi, []))
            ext.hi += n
        r.nblocks += n

    def grow_each(self, rs: Iterable[Holder]) -> None:
        """Allocate one block for each of ``rs`` (a sized iterable)."""
        n = len(rs) if isinstance(rs, Sized) else None
        if n is None:
            rs = list(rs)
            n = len(rs)
        self._evict(n)
        for r in rs:
            ext: _Ext = r.blocks[-1]
            res = ext.res
            if res.owner is r:
                seg = res.segs[-1]
                if seg.ref == 1:
                    seg.hi += 1
                    ext.hi += 1
                    r.nblocks += 1
                    continue
            self._extend(r, 1)

    def register(self, r: Holder, full: int) -> None:
        """Offer ``r``'s blocks ``r.nreg .. full - 1`` (in its own, last reservation) to the
        cache; a key cached already leaves the block uncached (a hole)."""
        p0 = r.nreg
        res: _Res = r.blocks[-1].res
        if res.owner is not r:
            raise RuntimeError(f"registration at {p0} outside the request's own blocks")
        cache = r.cache
        keys = r.keys
        base = res.base
        segs = res.segs
        i = bisect_right(res.lows, p0) - 1
        while p0 < full:
            seg = segs[i]
            if seg.creg != p0 or p0 < seg.lo:
                raise RuntimeError(f"registration at {p0} not contiguous with {seg.creg}")
            top = full if full < seg.hi else seg.hi
            ids = range(base | p0, base | top)
            # cache each block unless its key is cached already (then it is a hole)
            got = list(map(cache.setdefault, keys[p0:top], ids))
            if any(map(ne, got, ids)):
                seg.holes += [p for p, b in zip(range(p0, top), got, strict=True) if b != base | p]
            seg.creg = top
            p0 = top
            i += 1

    def register_next(self, r: Holder) -> None:
        """:meth:`register` of the single block ``r.nreg`` (a decoder filling its last block)."""
        p = r.nreg
        res: _Res = r.blocks[-1].res
        seg = res.segs[-1]
        if res.owner is not r or seg.creg != p or p < seg.lo or p >= seg.hi:
            self.register(r, p + 1)
            return
        b = res.base | p
        if r.cache.setdefault(r.keys[p], b) != b:
            seg.holes.append(p)
        seg.creg = p + 1

    def release(self, r: Holder) -> None:
        """Free ``r``'s blocks deepest first; segments nobody uses join the queue tail."""
        exts: list[_Ext] = r.blocks
        freed = 0
        for ext in reversed(exts):
            res = ext.res
            lo = ext.lo
            segs = res.segs
            i = bisect_left(res.lows, ext.hi) - 1
            while True:
                seg = segs[i]
                seg.ref -= 1
                if not seg.ref:
                    self._append(seg)
                    freed += seg.hi - seg.lo
                if seg.lo <= lo:
                    break
                i -= 1
        if exts:
            last = exts[-1].res
            if last.owner is r:
                last.owner = None
        self.num_free += freed
        r.blocks = []
        r.nblocks = 0

    def reset_prefix_cache(self) -> int:
        """Uncache every idle block (vLLM ``reset_prefix_cache``); returns how many."""
        dropped = 0
        head = self._head
        seg = head.next
        while seg is not head:
            res = seg.res
            cache = res.cache
            keys = res.keys
            base = res.base
            top = seg.creg if seg.creg < seg.hi else seg.hi
            for p in range(seg.lo, top):
                k = keys[p]
                if cache.get(k) == base | p:
                    del cache[k]
                    dropped += 1
            seg.creg = seg.lo
            seg.holes = []
            seg = seg.next
        return dropped

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (``vllm:kv_cache_usage_perc``; idle cached blocks excluded)."""
        return (self.num_blocks - self.num_free) / self.num_blocks
