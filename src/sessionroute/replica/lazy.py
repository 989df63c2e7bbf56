"""Lazy decoders of the fast path (see :mod:`sessionroute.replica.fast`): bookkeeping that keeps
per-step work to a count of blocks, plus the decoders whose block work cannot be deferred.

With ``max_num_seqs <= max_num_batched_tokens`` every running request that is decoding gets its
one token in every step, ahead of the (at most one) request still in prefill, which is the
newest. Such decoders form a prefix of ``running`` whose token counts, token times and
inter-token latencies are kept lazily: a decoder that joined at step ``sync`` has decoded
``g - sync`` tokens by step ``g``. Their block work is bucketed by ``(nc - sync) % block_size``.

Most are *block-lazy* (:meth:`LazyCore.blocks_lazy_ok`): their blocks and registration are
functions of the step too (:meth:`LazyCore.sync_blocks`), so a step only takes as many free
blocks as its block-lazy decoders start. The others (``buckets``) allocate and fill block by
block in admission order, exactly when the reference does; a block-lazy decoder joins them when
the pool is about to read its last segment (:meth:`LazyCore.touch`).
"""

from __future__ import annotations

from operator import attrgetter
from typing import cast

from sessionroute.minheap import HeapEntry, MinHeap
from sessionroute.replica.api import ReplicaConfig
from sessionroute.replica.core import RUNNING, Core, Req
from sessionroute.replica.intbisect import bisect_left
from sessionroute.replica.segments import SegmentPool
from sessionroute.replica.segstore import _Ext, _Res

__all__ = ["LazyCore"]

_ORDER = attrgetter("order")


class Due(HeapEntry):
    """A lazy decoder's entry in :attr:`LazyCore.fheap`: ``r`` makes its last token in step
    ``step`` (``t``, exact as a float), entries ordered by ``(step, seq)``; stale once ``r``
    is synced again (the step no longer matches)."""

    __slots__ = ("r", "step")

    def __init__(self, step: int, seq: int, r: Req) -> None:
        super().__init__(float(step), seq)
        self.step = step
        self.r = r


class LazyCore(Core):
    """:class:`Core` plus the lazy-decoder state of the fast path, on the run-length
    :class:`~sessionroute.replica.segments.SegmentPool`.

    Args:
        config: the replica configuration.

    Attributes:
        g: index of the next step to apply (emulator reads it: a lazy decoder has produced
            ``num_output + g - sync`` tokens).
    """

    def __init__(self, config: ReplicaConfig) -> None:
        spool = SegmentPool(config.num_blocks)
        super().__init__(config, spool)
        self.spool = spool
        self.lazy_ok = self.max_seqs <= self.budget
        self.g = 0  # index of the next step to apply
        self.base = 0  # step index of ends[0]
        self.ends: list[float] = []  # end time of each step from base on
        # suffix maxima of step durations: steps mx_step (ascending) with durations mx_dur
        # (strictly decreasing); the longest step in [i, g) is mx_dur[bisect_left(mx_step, i)]
        self.mx_step: list[int] = []
        self.mx_dur: list[float] = []
        spool.touch = self.touch
        # lazy decoders by phase: per-step block work (eager) or blocks kept lazily too
        self.buckets: list[dict[Req, None]] = [{} for _ in range(self.bs)]
        self.lbuckets: list[dict[Req, None]] = [{} for _ in range(self.bs)]
        self.gb = 0  # steps whose decoders' block work is done (g, or g + 1 inside step g)
        self.n_dec = 0  # lazy decoders: running[:n_dec]
        self.n_eager = 0  # lazy decoders with per-step block work (in buckets)
        self.s0 = 0  # sum over lazy decoders of (tokens at sync - sync)
        # lazy decoders by the step of their last token (t), then admission to the heap (key)
        self.fheap = MinHeap()
        # lazy decoders by the step of their last token: [count, their share of s0]
        self.fsched: dict[int, list[int]] = {}

    # ------------------------------------------------------------ lazy decoders

    def lazify(self, r: Req) -> None:
        """Make ``r`` (decoding, at least one token out) a lazy decoder from step ``g``."""
        g = self.g
        r.lazy = True
        r.sync = g
        ph = (r.nc - g) % self.bs
        r.phase = ph
        if self.blocks_lazy_ok(r):
            r.blazy = True
            last: _Ext = r.blocks[-1]
            last.res.lazy = True
            self.lbuckets[ph][r] = None
        else:
            self.buckets[ph][r] = None
            self.n_eager += 1
        self.n_dec += 1
        share = r.prompt_len + r.num_output - g
        self.s0 += share
        self.seq += 1
        gf = g + r.output_len - r.num_output - 1
        self.fheap.push(Due(gf, self.seq, r))
        f = self.fsched.get(gf)
        if f is None:
            self.fsched[gf] = [1, share]
        else:
            f[0] = f[0] + 1  # (``f[0] += 1`` on a list item is a generic call when compiled)
            f[1] = f[1] + share

    def materialize(self, r: Req) -> None:
        """Bring a lazy decoder's counters and times up to step ``g``."""
        k = self.g - r.sync
        if k > 0:
            i0 = r.sync - self.base
            i1 = i0 + k
            end = self.ends[i1 - 1]
            r.itl_sum += end - r.last_token
            # first gap from its last token (earlier than step sync's start if it was
            # preempted and resumed), then whole steps
            m = self.ends[i0] - r.last_token
            if k > 1:
                m2 = self.mx_dur[bisect_left(self.mx_step, r.sync + 1)]
                if m2 > m:
                    m = m2
            if m > r.itl_max:
                r.itl_max = m
            r.last_token = end
            r.nc += k
            r.num_output += k
            r.sync = self.g

    def blocks_lazy_ok(self, r: Req) -> bool:
        """Whether the block work of ``r`` (becoming a lazy decoder at step ``g``) can be kept
        lazily: every block it allocates extends its own last segment, and every block it fills
        extends its own cached run with a key nobody caches.

        That holds while nobody else reads that segment: its blocks are the request's own
        (owner, ``ref == 1``), it caches the block before the next fill, and none of the keys it
        will fill is a cached start now. Keys are chained, so another request can only come to
        cache one of them, or hold one of its blocks, after reading this segment (a lookup or a
        registration reaching the block before it); the pool calls :meth:`touch` first.
        """
        exts: list[_Ext] = r.blocks
        if not exts:
            return False
        ext = exts[-1]
        res = ext.res
        seg = res.segs[-1]
        if res.owner is not r or seg.ref != 1 or ext.hi != seg.hi or seg.hi != r.nblocks:
            return False
        p = r.nreg
        end: int = (r.prompt_len + r.output_len - 1) // self.bs
        if end > r.nkeys:
            end = r.nkeys
        if p >= end:
            return True
        if seg.creg != p or seg.lo >= p:
            return False
        return self.spool.extends_own_run(r, seg, p, end)

    def sync_blocks(self, r: Req) -> None:
        """Bring a block-lazy decoder's blocks and registration up to step ``gb``: it has
        scheduled ``nc + gb - sync`` tokens, holds a block for each started one and has
        offered each full one with a key to the cache (all in its own last segment)."""
        t = r.nc + self.gb - r.sync
        bs = self.bs
        ext: _Ext = r.blocks[-1]
        seg = ext.res.segs[-1]
        nb = -(-t // bs)
        dn = nb - r.nblocks
        if dn > 0:
            seg.hi += dn
            ext.hi += dn
            r.nblocks = nb
        full = t // bs
        if full > r.nkeys:
            full = r.nkeys
        if full > r.nreg:
            seg.creg = full
            r.nreg = full

    def sync_all_blocks(self) -> None:
        """:meth:`sync_blocks` of every block-lazy decoder (they stay block-lazy), so the pool
        shows the reference's state (for tests and inspection)."""
        for lb in self.lbuckets:
            for r in lb:
                self.sync_blocks(r)

    def eager_blocks(self, r: Req) -> None:
        """Make a block-lazy decoder's blocks exact and its block work per step again (it
        stays a lazy decoder); the phase bucket keeps admission order."""
        self.sync_blocks(r)
        r.blazy = False
        last: _Ext = r.blocks[-1]
        last.res.lazy = False
        ph = r.phase
        del self.lbuckets[ph][r]
        self.n_eager += 1
        b = self.buckets[ph]
        if b and next(reversed(b)).order > r.order:
            rs = sorted([*b, r], key=_ORDER)
            b.clear()
            b.update(dict.fromkeys(rs))
        else:
            b[r] = None

    def touch(self, res: _Res) -> None:
        """The pool's callback before it reads a reservation whose owner is block-lazy.

        Raises:
            RuntimeError: if the owner is not a block-lazy decoder (cannot happen).
        """
        r = res.owner
        if not isinstance(r, Req) or not r.blazy:
            raise RuntimeError(f"reservation {res.rix} is lazy without a block-lazy owner")
        self.eager_blocks(r)

    def eagerize(self, g: int) -> list[Req]:
        """Make the block-lazy decoders that allocate or fill a block in step ``g`` eager, as
        they are before that step's block work; returns those that fill one."""
        bs = self.bs
        gb = self.gb
        self.gb = g
        fillers: list[Req] = []
        pf = (-g - 1) % bs
        for ph in {-g % bs, pf}:
            lb = self.lbuckets[ph]
            if lb:
                rs = list(lb)
                for r in rs:
                    self.eager_blocks(r)
                if ph == pf:
                    fillers = rs
        self.gb = gb
        return fillers

    def delazify(self, r: Req) -> None:
        """Take a (materialized) lazy decoder out of the lazy set, its blocks exact."""
        if r.blazy:
            self.sync_blocks(r)
            r.blazy = False
            last: _Ext = r.blocks[-1]
            last.res.lazy = False
            del self.lbuckets[r.phase][r]
        else:
            del self.buckets[r.phase][r]
            self.n_eager -= 1
        self.n_dec -= 1
        share = r.prompt_len + r.num_output - r.sync
        self.s0 -= share
        gf = r.sync + r.output_len - r.num_output - 1
        f = self.fsched[gf]
        if f[0] == 1:
            del self.fsched[gf]
        else:
            f[0] = f[0] - 1
            f[1] = f[1] - share
        r.lazy = False

    def delazify_all(self) -> None:
        """Materialize every lazy decoder (before a reference step)."""
        for r in self.running[: self.n_dec]:
            self.materialize(r)
            if r.blazy:
                self.sync_blocks(r)
                r.blazy = False
                last: _Ext = r.blocks[-1]
                last.res.lazy = False
            r.lazy = False
        self.buckets = [{} for _ in range(self.bs)]
        self.lbuckets = [{} for _ in range(self.bs)]
        self.n_eager = 0
        self.n_dec = 0
        self.s0 = 0
        self.fheap.clear()
        self.fsched.clear()

    def lazify_front(self) -> None:
        """Lazify the decoders that directly follow the lazy prefix of ``running``."""
        running = self.running
        i = self.n_dec
        while i < len(running):
            r = running[i]
            if r.num_output < 1 or r.nc != r.prompt_len + r.num_output - 1:
                break
            self.lazify(r)
            i += 1

    def decode_blocks(self, g: int, extra: int = 0) -> None:
        """Block work of the lazy decoders in step ``g``, in admission order: allocate a block
        for those starting one, offer a block to the cache for those filling one; then take
        ``extra`` free blocks for the newest request (it puts them in place with
        :meth:`~sessionroute.replica.segments.SegmentPool.extend`).

        A block-lazy decoder's allocation is only its share of the step's eviction (its blocks
        and fills are brought up to date when something reads them, :meth:`sync_blocks`).
        Allocation (which may evict idle cached blocks) and registration of keys nobody has
        cached commute, so they run in two batches unless a filling block's key may be cached
        already (then the reference's admission order matters: one at a time); an eager fill
        that is not in place (it may read other reservations) first makes the block-lazy
        decoders at a boundary in this step eager."""
        bs = self.bs
        pa = -g % bs
        ab = self.buckets[pa]
        fb = self.buckets[(-g - 1) % bs]
        spool = self.spool
        self.gb = g + 1
        if not fb:
            self._allocate(ab, len(self.lbuckets[pa]) + extra)
            return
        if not spool.fills_in_place(fb):
            self.eagerize(g)
        n = len(ab) + len(self.lbuckets[pa]) + extra
        if n and spool.fresh < n:
            # this step's allocations evict cached blocks. A fill that finds its key uncached
            # finds it uncached after any eviction too, so those fills go first; from the first
            # that may find its key cached on, the reference's admission order matters
            if ab is fb:  # block size 1: a decoder allocates and fills the same block
                if spool.fills_may_hit(fb):
                    self.eagerize(g)
                    self.decode_blocks_in_order(g, ab, fb)
                    if extra:
                        spool.take(extra)
                    return
            else:
                rest = spool.fill_each_until_hit(fb)
                if rest:
                    fillers = self.eagerize(g)
                    self.decode_blocks_in_order(g, ab, dict.fromkeys([*rest, *fillers]))
                    if extra:
                        spool.take(extra)
                    return
                self._allocate(ab, n - len(ab))
                return
        self._allocate(ab, n - len(ab))
        spool.fill_each(fb)

    def _allocate(self, ab: dict[Req, None], extra: int) -> None:
        """One block for each decoder of ``ab``, then ``extra`` free blocks taken."""
        if ab:
            self.spool.grow_each(ab, extra)
        elif extra:
            self.spool.take(extra)

    def decode_blocks_in_order(self, g: int, ab: dict[Req, None], fb: dict[Req, None]) -> None:
        """:meth:`decode_blocks` one request at a time in admission order (the reference's)."""
        abp = -g % self.bs
        pool = self.pool
        todo = sorted([*ab, *fb], key=_ORDER) if ab is not fb else list(fb)
        for r in todo:
            if r.phase == abp:
                pool.grow(r, 1)
            if r in fb and r.nreg < r.nkeys:
                self.register(r, r.nc + g - r.sync + 1)

    def push_dur(self, g: int, dur: float) -> None:
        """Record the duration of step ``g`` (the next step index) in the suffix maxima."""
        steps = self.mx_step
        durs = self.mx_dur
        while durs and durs[-1] <= dur:
            durs.pop()
            steps.pop()
        steps.append(g)
        durs.append(dur)

    def finish_lazy(self, g: int, e: float) -> list[Req]:
        """Finish the lazy decoders whose last token came from step ``g`` (ending at ``e``).

        Returns:
            The finished requests (still in ``running``; see :meth:`unrun`).
        """
        heap = self.fheap
        items = heap.items
        finished: list[Req] = []
        while items and items[0].t <= g:
            due = cast(Due, heap.pop())
            r = due.r
            if not r.lazy or due.step != r.sync + r.output_len - r.num_output - 1:
                continue  # stale entry
            self.materialize(r)
            self.delazify(r)
            self.finish(r, e)
            finished.append(r)
        return finished

    def unrun(self, finished: list[Req]) -> None:
        """Take finished requests out of ``running`` (order of the others kept)."""
        if len(finished) > 8:
            self.running = [r for r in self.running if r.status == RUNNING]
        else:
            for r in finished:
                self.take_out(r)

    def trim(self) -> None:
        """Drop step times no lazy decoder needs any more."""
        running = self.running
        lo = running[0].sync if running and running[0].lazy else self.g
        cut = lo - self.base
        if cut > len(self.ends) // 2:
            del self.ends[:cut]
            self.base = lo
            j = bisect_left(self.mx_step, lo)
            del self.mx_step[:j]
            del self.mx_dur[:j]

    def drop(self, r: Req) -> None:
        """Abort a running request now (materializing it first if lazy)."""
        if r.lazy:
            self.materialize(r)
            self.delazify(r)
        Core.drop(self, r)
