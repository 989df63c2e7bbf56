"""The block work of the fast path's lazy decoders (:mod:`sessionroute.replica.lazy`).

A lazy decoder that joined at step ``sync`` has scheduled ``nc + g - sync`` tokens by step
``g``, so it starts a block (allocates one) and fills a block (offers it to the prefix cache)
every ``block_size`` steps, at steps fixed by its *phase* ``(nc - sync) % block_size``. Decoders
are bucketed by phase; a step touches only the two buckets whose decoders start or fill a
block in it.

Most lazy decoders are *block-lazy* (:meth:`DecoderBlocks.blocks_lazy_ok`): their blocks and
registration are functions of the step too (:meth:`DecoderBlocks.sync`), so a step only takes
as many free blocks from the pool as its block-lazy decoders start. The others (``buckets``)
allocate and fill block by block in admission order, exactly when the reference does; a
block-lazy decoder joins them when the pool is about to read its last segment
(:meth:`DecoderBlocks.touch`).
"""

from __future__ import annotations

from operator import attrgetter

from sessionroute.replica.core import register_blocks
from sessionroute.replica.request import Req
from sessionroute.replica.segments import SegmentPool
from sessionroute.replica.segstore import _Ext, _Res

__all__ = ["DecoderBlocks"]

_ORDER = attrgetter("order")


class DecoderBlocks:
    """Blocks of the lazy decoders, by phase, on a run-length pool.

    Args:
        spool: the replica's run-length pool (its ``touch`` callback is set to :meth:`touch`).
        block_size: tokens per block.

    Attributes:
        buckets: per phase, the lazy decoders with per-step block work, in admission order.
        lbuckets: per phase, the block-lazy decoders.
        n_eager: lazy decoders in ``buckets``.
        gb: steps whose decoders' block work is done (``g`` between steps, ``g + 1`` once
            step ``g``'s block work ran).
    """

    def __init__(self, spool: SegmentPool, block_size: int) -> None:
        self.spool = spool
        self.bs = block_size
        self.buckets: list[dict[Req, None]] = [{} for _ in range(block_size)]
        self.lbuckets: list[dict[Req, None]] = [{} for _ in range(block_size)]
        self.n_eager = 0
        self.gb = 0
        spool.touch = self.touch

    def starting(self, g: int) -> int:
        """How many lazy decoders start a block (allocate one) in step ``g``."""
        ph = -g % self.bs
        return len(self.buckets[ph]) + len(self.lbuckets[ph])

    # ------------------------------------------------------------ membership

    def add(self, r: Req) -> None:
        """Track a new lazy decoder (``r.phase`` set): block-lazy when
        :meth:`blocks_lazy_ok`, else with per-step block work."""
        if self.blocks_lazy_ok(r):
            r.blazy = True
            last: _Ext = r.blocks[-1]
            last.res.lazy = True
            self.lbuckets[r.phase][r] = None
        else:
            self.buckets[r.phase][r] = None
            self.n_eager += 1

    def remove(self, r: Req) -> None:
        """Stop tracking a lazy decoder, its blocks brought up to date."""
        if r.blazy:
            self.sync(r)
            r.blazy = False
            last: _Ext = r.blocks[-1]
            last.res.lazy = False
            del self.lbuckets[r.phase][r]
        else:
            del self.buckets[r.phase][r]
            self.n_eager -= 1

    def remove_all(self, rs: list[Req]) -> None:
        """Stop tracking every lazy decoder (``rs``), their blocks brought up to date."""
        for r in rs:
            if r.blazy:
                self.sync(r)
                r.blazy = False
                last: _Ext = r.blocks[-1]
                last.res.lazy = False
        self.buckets = [{} for _ in range(self.bs)]
        self.lbuckets = [{} for _ in range(self.bs)]
        self.n_eager = 0

    def blocks_lazy_ok(self, r: Req) -> bool:
        """Whether the block work of ``r`` (becoming a lazy decoder) can be kept lazily: every
        block it allocates extends its own last segment, and every block it fills extends its
        own cached run with a key nobody caches.

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

    # ------------------------------------------------------------ block-lazy decoders

    def sync(self, r: Req) -> None:
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
            if self.spool.kv_listener is not None:
                self.spool.emit(True, ext.res, r.nreg, full, [])
            seg.creg = full
            r.nreg = full

    def sync_all(self) -> None:
        """:meth:`sync` every block-lazy decoder (they stay block-lazy), so the pool shows the
        reference's state (for tests and inspection)."""
        for lb in self.lbuckets:
            for r in lb:
                self.sync(r)

    def make_eager(self, r: Req) -> None:
        """Make a block-lazy decoder's blocks exact and its block work per step again (it
        stays a lazy decoder); its phase bucket keeps admission order."""
        self.sync(r)
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
        self.make_eager(r)

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
                    self.make_eager(r)
                if ph == pf:
                    fillers = rs
        self.gb = gb
        return fillers

    # ------------------------------------------------------------ one step's block work

    def step(self, g: int, extra: int = 0) -> None:
        """Block work of the lazy decoders in step ``g``, in admission order: allocate a block
        for those starting one, offer a block to the cache for those filling one; then take
        ``extra`` free blocks for the newest request (it puts them in place with
        :meth:`~sessionroute.replica.segments.SegmentPool.extend`).

        A block-lazy decoder's allocation is only its share of the step's eviction (its blocks
        and fills are brought up to date when something reads them, :meth:`sync`). Allocation
        (which may evict idle cached blocks) and registration of keys nobody has cached
        commute, so they run in two batches unless a filling block's key may be cached already
        (then the reference's admission order matters: one at a time); an eager fill that is
        not in place (it may read other reservations) first makes the block-lazy decoders at a
        boundary in this step eager."""
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
                    self._in_order(g, ab, fb)
                    if extra:
                        spool.take(extra)
                    return
            else:
                rest = spool.fill_each_until_hit(fb)
                if rest:
                    fillers = self.eagerize(g)
                    self._in_order(g, ab, dict.fromkeys([*rest, *fillers]))
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

    def _in_order(self, g: int, ab: dict[Req, None], fb: dict[Req, None]) -> None:
        """:meth:`step`'s allocations (``ab``) and fills (``fb``) one request at a time in
        admission order (the reference's)."""
        bs = self.bs
        abp = -g % bs
        spool = self.spool
        todo = sorted([*ab, *fb], key=_ORDER) if ab is not fb else list(fb)
        for r in todo:
            if r.phase == abp:
                spool.grow(r, 1)
            if r in fb and r.nreg < r.nkeys:
                register_blocks(spool, bs, r, r.nc + g - r.sync + 1)
