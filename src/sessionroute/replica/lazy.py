"""Lazy decoders of the fast path (see :mod:`sessionroute.replica.fast`): token counters, token
times and finishes of the decoding requests, kept per decoder only when something reads them.

With ``max_num_seqs <= max_num_batched_tokens`` every running request that is decoding gets its
one token in every step, ahead of the (at most one) request still in prefill, which is the
newest. Such decoders form a prefix of ``running`` whose token counts, token times and
inter-token latencies are kept lazily: a decoder that joined at step ``sync`` has decoded
``g - sync`` tokens by step ``g`` (the :class:`~sessionroute.replica.steplog.StepLog` has
the step times). Per step the engine needs only aggregates: ``D`` (:attr:`LazyDecoders.n_dec`) and
``C = s0 + D * g``, and the decoders that make their last token in the step (a heap by finishing
step). Their block work is :class:`~sessionroute.replica.decodeblocks.DecoderBlocks`'.
"""

from __future__ import annotations

from typing import cast

from sessionroute.minheap import HeapEntry, MinHeap
from sessionroute.replica.decodeblocks import DecoderBlocks
from sessionroute.replica.request import Req
from sessionroute.replica.steplog import StepLog

__all__ = ["Due", "LazyDecoders"]


class Due(HeapEntry):
    """A lazy decoder's entry in :attr:`LazyDecoders.fheap`: ``r`` makes its last token in
    step ``step`` (``t``, exact as a float), entries ordered by ``(step, seq)``; stale once
    ``r`` is synced again (the step no longer matches)."""

    __slots__ = ("r", "step")

    def __init__(self, step: int, seq: int, r: Req) -> None:
        super().__init__(float(step), seq)
        self.step = step
        self.r = r

    def live(self) -> bool:
        """Whether the entry still describes its request's last step."""
        r = self.r
        return r.lazy and self.step == r.sync + r.output_len - r.num_output - 1


class LazyDecoders:
    """The lazy decoders (a prefix of the scheduler's ``running``) and their aggregates.

    Args:
        log: the applied steps (``log.g`` is the index of the next step to apply).
        blocks: the decoders' block work.
        block_size: tokens per block.

    Attributes:
        n_dec: lazy decoders (``running[:n_dec]``).
        s0: sum over lazy decoders of (tokens at ``sync`` - ``sync``): their context in
            step ``g`` is ``s0 + n_dec * g`` tokens.
        fheap: :class:`Due` entries by finishing step, then by when they were pushed.
        fsched: finishing step -> ``[count, their share of s0]``.
    """

    def __init__(self, log: StepLog, blocks: DecoderBlocks, block_size: int) -> None:
        self.bs = block_size
        self.log = log
        self.blocks = blocks
        self.n_dec = 0
        self.s0 = 0
        self.seq = 0
        self.fheap = MinHeap()
        self.fsched: dict[int, list[int]] = {}

    def lazify(self, r: Req) -> None:
        """Make ``r`` (decoding, at least one token out) a lazy decoder from step ``g``."""
        g = self.log.g
        r.lazy = True
        r.sync = g
        r.phase = (r.nc - g) % self.bs
        self.blocks.add(r)
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
            f[0] = f[0] + 1
            f[1] = f[1] + share

    def step_applied(self, running: list[Req]) -> None:
        """After an ordinary step was applied (and logged): its block work is done, and the
        decoders that now directly follow the lazy prefix of ``running`` become lazy."""
        self.blocks.gb = self.log.g
        self.lazify_front(running)

    def lazify_front(self, running: list[Req]) -> None:
        """Lazify the decoders that directly follow the lazy prefix of ``running``."""
        i = self.n_dec
        while i < len(running):
            r = running[i]
            if r.num_output < 1 or r.nc != r.prompt_len + r.num_output - 1:
                break
            self.lazify(r)
            i += 1

    def materialize(self, r: Req) -> None:
        """Bring a lazy decoder's counters and times up to step ``g``."""
        log = self.log
        k = log.g - r.sync
        if k > 0:
            i0 = r.sync - log.base
            i1 = i0 + k
            end = log.ends[i1 - 1]
            r.itl_sum += end - r.last_token
            # first gap from its last token (earlier than step sync's start if it was
            # preempted and resumed), then whole steps
            m = log.ends[i0] - r.last_token
            if k > 1:
                m2 = log.longest_since(r.sync + 1)
                if m2 > m:
                    m = m2
            if m > r.itl_max:
                r.itl_max = m
            r.last_token = end
            r.nc += k
            r.num_output += k
            r.sync = log.g

    def delazify(self, r: Req) -> None:
        """Take a (materialized) lazy decoder out of the lazy set, its blocks exact."""
        self.blocks.remove(r)
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

    def delazify_all(self, running: list[Req]) -> None:
        """Materialize every lazy decoder (``running[:n_dec]``) and empty the lazy set."""
        rs = running[: self.n_dec]
        for r in rs:
            self.materialize(r)
        self.blocks.remove_all(rs)
        for r in rs:
            r.lazy = False
        self.n_dec = 0
        self.s0 = 0
        self.fheap.clear()
        self.fsched.clear()

    def pop_due(self, g: int) -> list[Req]:
        """Take out the lazy decoders that made their last token in step ``g`` (or before),
        materialized and no longer lazy, in the order of the heap."""
        heap = self.fheap
        items = heap.items
        out: list[Req] = []
        while items and items[0].t <= g:
            due = cast(Due, heap.pop())
            if due.live():
                r = due.r
                self.materialize(r)
                self.delazify(r)
                out.append(r)
        return out

    def next_due_step(self) -> int:
        """The step in which the next lazy decoder makes its last token (``n_dec > 0``); drops
        stale heap entries on the way."""
        heap = self.fheap
        items = heap.items
        while True:
            due = cast(Due, items[0])
            if due.live():
                return due.step
            heap.pop()

    def trim(self, running: list[Req]) -> None:
        """Drop step times no lazy decoder of ``running`` needs any more."""
        self.log.trim(running[0].sync if running and running[0].lazy else self.log.g)
