"""Run-length KV block pool: the semantics of :class:`~sessionroute.replica.blocks.BlockPool`
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
  which stays uncached as in :class:`BlockPool`). The prefix cache is run-length: one dict entry
  per run of cached blocks (:mod:`sessionroute.replica.segcache`).
* A request holds *extents* ``(reservation, lo, hi)`` in chain order; each is a union of whole
  segments, because a hit on part of a segment splits it (splits only refine, so extents stay
  valid).
* The LRU free queue is a doubly linked list of idle segments; an idle segment stands for its
  blocks in *descending* position order, so releasing a request's extents deepest first and
  evicting from the *end* (highest position) of the head segment reproduce the per-block
  queue exactly: a finished request's deepest block is evicted first, a hit takes blocks out of
  the queue wherever they are. Never-used blocks, and the blocks a request frees without having
  offered them to the cache (its partial tail), sit before everything else (``fresh``).
* Lookup walks the request's keys segment by segment: a dict look-up (or the next segment of
  the same reservation) finds the block of ``keys[h]``, then one slice comparison extends the
  hit over the rest of that segment's cached run; it stops at the first key not cached, exactly
  like the per-block walk.

Data structures and low-level operations live in :mod:`sessionroute.replica.segstore`. A
property test (``tests/replica/test_engine_segments.py``) checks this pool against
:class:`BlockPool` on random operation sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Final, TypeVar

from sessionroute.replica.blocks import Holder
from sessionroute.replica.intbisect import bisect_left, bisect_right
from sessionroute.replica.segcache import (
    SaltCache,
    add_start,
    audit,
    cached_keys,
    drop_starts,
    find_run,
    restart,
    run_end,
)
from sessionroute.replica.segstore import SHIFT, SegmentStore, _Ext, _Res, _Seg

__all__ = ["SegmentPool"]

_H = TypeVar("_H", bound=Holder)

_MASK: Final = (1 << SHIFT) - 1


class SegmentPool(SegmentStore):
    """Fixed number of blocks in segments, an LRU queue of idle segments, per-salt caches.

    Same interface and results as :class:`~sessionroute.replica.blocks.BlockPool`'s
    request-level methods (:class:`~sessionroute.replica.blocks.KVPool`).

    Args:
        num_blocks: blocks in the pool (``kv_capacity_tokens // block_size``), >= 1.

    Raises:
        ValueError: if ``num_blocks < 1``.
    """

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
                res.segs.append(_Seg(res, h, h + new, 1, h, [], self._head))
                last.hi = h + new
                self._merge(res, last.lo)
            else:
                exts.append(self._open(r, h, new))
        r.blocks = exts
        r.nblocks = h + new

    def grow(self, r: Holder, n: int) -> None:
        """Allocate ``n`` blocks at the end of ``r``'s chain."""
        self._evict(n)
        self._extend(r, n)

    def take(self, n: int) -> None:
        """Take ``n`` free blocks (evicting) for an :meth:`extend` that follows."""
        self._evict(n)

    def extend(self, r: Holder, n: int) -> None:
        """Put ``n`` blocks taken already (:meth:`take`, ``grow_each``'s ``extra``) at the end
        of ``r``'s chain."""
        self._extend(r, n)

    def grow_each(self, rs: Iterable[Holder], extra: int = 0) -> None:
        """Allocate one block for each of ``rs`` (a sized iterable), then take ``extra`` more
        free blocks for a :meth:`extend` that follows."""
        n = len(rs) if isinstance(rs, Sized) else None
        if n is None:
            rs = list(rs)
            n = len(rs)
        self._evict(n + extra)
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
        cache; a key cached already leaves the block uncached (a hole).

        Where the reservation caches the previous position, only a start at the same position
        can hold a key (:mod:`sessionroute.replica.segcache`), so a range without starts is
        registered without touching the dict; duplicate content becomes holes a run at a time.
        """
        p = r.nreg
        res: _Res = r.blocks[-1].res
        if res.owner is not r:
            raise RuntimeError(f"registration at {p} outside the request's own blocks")
        cache: SaltCache = r.cache  # type: ignore[assignment]
        keys = r.keys
        segs = res.segs
        seg = segs[-1]
        if seg.lo < p == seg.creg and full <= seg.hi and seg.ref == 1:
            # the common case: the request's own last segment continues its cached run
            holes = seg.holes
            if not (holes and holes[-1] == p - 1) and cache.first_start_key(keys, p, full) == full:
                seg.creg = full
                if self.kv_listener is not None:
                    self.emit(True, res, p, full, [])
                return
        if self.kv_listener is not None:
            p0 = p
            self._register(r, res, p, full, cache, keys, segs)
            for sg in segs[bisect_right(res.lows, p0) - 1 :]:
                if sg.lo >= full:
                    break
                self.emit(True, res, max(p0, sg.lo), min(full, sg.hi), sg.holes)
            return
        self._register(r, res, p, full, cache, keys, segs)

    def _register(
        self,
        r: Holder,
        res: _Res,
        p: int,
        full: int,
        cache: SaltCache,
        keys: list[int],
        segs: list[_Seg],
    ) -> None:
        """:meth:`register` past its common case."""
        i = bisect_right(res.lows, p) - 1
        seg = segs[i]
        if p > seg.lo:
            own = not (seg.holes and seg.holes[-1] == p - 1)
        elif i > 0:
            prev = segs[i - 1]
            own = prev.hi == p <= prev.creg and not (prev.holes and prev.holes[-1] == p - 1)
        else:
            own = False
        first = not own
        while p < full:
            seg = segs[i]
            if seg.creg != p or p < seg.lo:
                raise RuntimeError(f"registration at {p} not contiguous with {seg.creg}")
            top = full if full < seg.hi else seg.hi
            while p < top:
                s: _Res | None
                if own:
                    q = cache.first_start_key(keys, p, top)
                    if q == top:
                        p = top
                        break
                    p = q
                    b = cache[keys[q]]
                    if b & _MASK != p:
                        raise RuntimeError(f"key at chain position {p} is cached at {b & _MASK}")
                    s = self._res[b >> SHIFT]
                    x = run_end(s, p, keys, top, self.touch)
                else:
                    got = cache.get(keys[p])
                    if got is not None:
                        if got & _MASK != p:
                            raise RuntimeError(
                                f"key at chain position {p} is cached at {got & _MASK}"
                            )
                        s = self._res[got >> SHIFT]
                        x = run_end(s, p, keys, top, self.touch)
                    elif first and p > 0:
                        # keys[p] may continue the run holding keys[p - 1]: the hit block
                        # there (held, so cached), else whoever caches its key
                        exts: list[_Ext] = r.blocks
                        pext = exts[-2] if len(exts) > 1 else None
                        if pext is not None and pext.hi == p and pext.res is not res:
                            s = pext.res
                            rk = s.keys
                            if p < len(rk) and rk[p] == keys[p]:
                                x = run_end(s, p - 1, keys, top, self.touch)
                            else:  # its key at p is not ours: it cannot cache keys[p]
                                s = None
                        else:
                            s, x = find_run(cache, self._res, keys, p - 1, top, self.touch)
                        if s is not None and x <= p:
                            s = None
                    else:
                        s = None
                    first = False
                    if s is None:
                        seg.creg = p + 1
                        add_start(res, p)
                        p += 1
                        own = True
                        continue
                if x <= p:
                    raise RuntimeError(f"cached key at {p} outside its run")
                seg.holes += range(p, x)
                p = x
                own = False
            seg.creg = top
            p = top
            i += 1

    @staticmethod
    def extends_own_run(r: Holder, seg: _Seg, p: int, end: int) -> bool:
        """Whether ``r``'s own last segment ``seg``, offered to the cache up to ``p``
        (``seg.creg == p``), caches positions ``p .. end - 1`` by extending its cached run in
        place: block ``p - 1`` is cached (not a hole) and no start of ``r``'s salt holds any of
        their keys, so no dict entry is touched (see :meth:`register`)."""
        holes = seg.holes
        if holes and holes[-1] == p - 1:
            return False
        cache = r.cache
        if not isinstance(cache, SaltCache):
            return False
        return cache.first_start_key(r.keys, p, end) == end

    @staticmethod
    def _fillable_in_place(r: Holder, p: int) -> _Seg | None:
        """The segment in which ``r``'s block ``p`` extends ``r``'s own cached run, else None.

        That is ``r``'s own last segment, offered to the cache up to ``p`` with ``p - 1``
        cached (not a hole): only a start can then hold ``keys[p]``, so one dict probe decides.
        """
        res: _Res = r.blocks[-1].res
        seg = res.segs[-1]
        if res.owner is r and seg.creg == p and seg.lo < p < seg.hi:
            holes = seg.holes
            if not (holes and holes[-1] == p - 1):
                return seg
        return None

    def fill_each(self, rs: Iterable[Holder]) -> None:
        """Each of ``rs`` (decoders filling their last block) offers block ``r.nreg`` to the
        cache unless it has no key (``r.nreg == r.nkeys``); ``r.nreg`` advances."""
        for r in rs:
            p = r.nreg
            if p >= r.nkeys:
                continue
            seg = self._fillable_in_place(r, p)
            if seg is None:
                self.register(r, p + 1)
            else:
                if r.keys[p] in r.cache:
                    seg.holes.append(p)
                elif self.kv_listener is not None:
                    self.emit(True, seg.res, p, p + 1, [])
                seg.creg = p + 1
            r.nreg = p + 1

    def fills_in_place(self, rs: Iterable[Holder]) -> bool:
        """Whether each of ``rs`` fills block ``r.nreg`` (see :meth:`fill_each`) in place, or
        has no key to fill (then none reads another reservation)."""
        for r in rs:
            p = r.nreg
            if p < r.nkeys and self._fillable_in_place(r, p) is None:
                return False
        return True

    def fill_each_until_hit(self, rs: Iterable[_H]) -> list[_H]:
        """:meth:`fill_each` in order up to the first of ``rs`` whose key may be cached already
        (see :meth:`fills_may_hit`); returns that one and the rest, not filled."""
        it = iter(rs)
        for r in it:
            p = r.nreg
            if p >= r.nkeys:
                continue
            seg = self._fillable_in_place(r, p)
            if seg is None or r.keys[p] in r.cache:
                return [r, *it]
            if self.kv_listener is not None:
                self.emit(True, seg.res, p, p + 1, [])
            seg.creg = p + 1
            r.nreg = p + 1
        return []

    def fills_may_hit(self, rs: Iterable[Holder]) -> bool:
        """Whether filling any of ``rs``' blocks ``r.nreg`` (see :meth:`fill_each`) may find its
        key cached already (False only when none does)."""
        for r in rs:
            p = r.nreg
            if p >= r.nkeys:
                continue
            if r.keys[p] in r.cache or self._fillable_in_place(r, p) is None:
                return True
        return False

    def release(self, r: Holder) -> None:
        """Free ``r``'s blocks deepest first; segments nobody uses join the queue tail, less
        the blocks never offered to the cache (``creg`` and up, the last segment's), which
        become ``fresh``: taken before any queued block, as in :class:`BlockPool`."""
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
                    freed += seg.hi - seg.lo
                    if seg.creg < seg.hi and i == len(segs) - 1:
                        self.fresh += seg.hi - seg.creg
                        seg.hi = seg.creg
                        if seg.hi == seg.lo:
                            del res.lows[i]
                            del segs[i]
                        else:
                            self._append(seg)
                    else:
                        self._append(seg)
                if seg.lo <= lo:
                    break
                i -= 1
        if exts:
            last = exts[-1].res
            if last.owner is r:
                last.owner = None
                if not last.segs:
                    del self._res[last.rix]
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
            lo = seg.lo
            hi = seg.hi
            top = seg.creg if seg.creg < hi else hi
            if top > lo:
                dropped += top - lo - len(seg.holes)
                if self.kv_listener is not None:
                    self.emit(False, res, lo, top, seg.holes)
                drop_starts(res, lo, top)
                seg.creg = lo
                seg.holes = []
                if top == hi:
                    i = bisect_left(res.lows, lo) + 1
                    if i < len(res.segs) and res.lows[i] == hi:
                        restart(res, i)
            seg = seg.next
        return dropped

    # ------------------------------------------------------------ inspection (tests)

    def cached_keys(self, salt: str | None) -> set[int]:
        """Every key cached under ``salt`` (expands the runs; for tests and debugging)."""
        return cached_keys(self._res.values(), self.cache_for(salt))

    def audit(self) -> None:
        """Check the run-length cache against its definition (for tests).

        Raises:
            RuntimeError: if a key is cached twice, a start is missing or extra, or the
                position index disagrees.
        """
        audit(self._res.values(), self._caches.values())
