"""Lazy decoders of the fast path (see :mod:`sessionroute.engine.fast`): bookkeeping that keeps
per-step work to the decoders that cross a block boundary.

With ``max_num_seqs <= max_num_batched_tokens`` every running request that is decoding gets its
one token in every step, ahead of the (at most one) request still in prefill, which is the
newest. Such decoders form a prefix of ``running`` whose token counts, token times and
inter-token latencies are kept lazily: a decoder that joined at step ``sync`` has decoded
``g - sync`` tokens by step ``g``. Their block work is bucketed by ``(nc - sync) % block_size``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from operator import attrgetter

from sessionroute.engine.api import ReplicaConfig
from sessionroute.engine.core import RUNNING, Core, Req
from sessionroute.engine.segments import SegmentPool

__all__ = ["LazyCore"]

_ORDER = attrgetter("order")


class LazyCore(Core):
    """:class:`Core` plus the lazy-decoder state of the fast path, on the run-length
    :class:`~sessionroute.engine.segments.SegmentPool`.

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
        self.buckets: list[dict[Req, None]] = [{} for _ in range(self.bs)]
        self.n_dec = 0  # lazy decoders: running[:n_dec]
        self.s0 = 0  # sum over lazy decoders of (tokens at sync - sync)
        self.fheap: list[tuple[int, int, Req]] = []  # (step of last token, seq, request)

    # ------------------------------------------------------------ lazy decoders

    def lazify(self, r: Req) -> None:
        """Make ``r`` (decoding, at least one token out) a lazy decoder from step ``g``."""
        g = self.g
        r.lazy = True
        r.sync = g
        ph = (r.nc - g) % self.bs
        r.phase = ph
        self.buckets[ph][r] = None
        self.n_dec += 1
        self.s0 += r.prompt_len + r.num_output - g
        self.seq += 1
        heapq.heappush(self.fheap, (g + r.output_len - r.num_output - 1, self.seq, r))

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

    def delazify(self, r: Req) -> None:
        """Take a (materialized) lazy decoder out of the lazy set."""
        del self.buckets[r.phase][r]
        self.n_dec -= 1
        self.s0 -= r.prompt_len + r.num_output - r.sync
        r.lazy = False

    def delazify_all(self) -> None:
        """Materialize every lazy decoder (before a reference step)."""
        for r in self.running[: self.n_dec]:
            self.materialize(r)
            r.lazy = False
        self.buckets = [{} for _ in range(self.bs)]
        self.n_dec = 0
        self.s0 = 0
        self.fheap.clear()

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
        :meth:`~sessionroute.engine.segments.SegmentPool.extend`).

        Allocation (which may evict idle cached blocks) and registration of keys nobody has
        cached commute, so they run in two batches unless a filling block's key may be cached
        already (then the reference's admission order matters: one at a time)."""
        bs = self.bs
        ab = self.buckets[-g % bs]
        fb = self.buckets[(-g - 1) % bs]
        spool = self.spool
        if not fb:
            if ab:
                spool.grow_each(ab, extra)
            elif extra:
                spool.take(extra)
            return
        n = len(ab) + extra
        if n and spool.fresh < n:
            # this step's allocations evict cached blocks. A fill that finds its key uncached
            # finds it uncached after any eviction too, so those fills go first; from the first
            # that may find its key cached on, the reference's admission order matters
            if ab is fb:  # block size 1: a decoder allocates and fills the same block
                if spool.fills_may_hit(fb):
                    self.decode_blocks_in_order(g, ab, fb)
                    if extra:
                        spool.take(extra)
                    return
            else:
                rest = spool.fill_each_until_hit(fb)
                if rest:
                    self.decode_blocks_in_order(g, ab, dict.fromkeys(rest))
                    if extra:
                        spool.take(extra)
                elif ab:
                    spool.grow_each(ab, extra)
                else:
                    spool.take(extra)
                return
        if ab:
            spool.grow_each(ab, extra)
        elif extra:
            spool.take(extra)
        spool.fill_each(fb)

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
        finished: list[Req] = []
        while heap and heap[0][0] <= g:
            gf, _, r = heapq.heappop(heap)
            if not r.lazy or gf != r.sync + r.output_len - r.num_output - 1:
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
            remove = self.running.remove
            for r in finished:
                remove(r)

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
