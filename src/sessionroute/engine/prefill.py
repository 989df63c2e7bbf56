"""Prefill runs of the fast path (see :mod:`sessionroute.engine.fast`): consecutive steps in
which the lazy decoders decode and one request prefills a full chunk, planned in one go.

Under a prefill-bound load most steps look alike: every running request but the newest is a
lazy decoder (one token each), and the newest is in chunked prefill and takes the rest of the
token budget. Nothing waiting can be admitted (no budget is left), so an arrival does not
change such a step. While the decoders' count is fixed (no finish) and the prefill does not
reach its last chunk, the steps are known in advance: chunk ``budget - D``, ``C`` growing by
``D`` a step, ``A`` by ``chunk**2``. A run plans them until the first step in which a decoder
finishes (inclusive), the step before the prefill's last chunk, or the blocks they allocate no
longer fit in the free ones (then an ordinary step decides on preemption). Step times are
computed step by step with the same arithmetic as an ordinary step, so results are
bit-identical; the block work of each step (decoders' block boundaries, the chunk's blocks and
their registration) is done when the run is applied, in step order.
"""

from __future__ import annotations

import heapq

from sessionroute.engine.core import Step
from sessionroute.engine.lazy import LazyCore

__all__ = ["PrefillRuns"]


class PrefillRuns(LazyCore):
    """:class:`~sessionroute.engine.lazy.LazyCore` plus planning and applying prefill runs."""

    def plan_prefill(self, s: float) -> Step | None:
        """A prefill run of at least two steps starting at ``s``, or None."""
        running = self.running
        d = self.n_dec
        if len(running) != d + 1:
            return None
        r = running[d]
        chunk = self.budget - d
        nc = r.nc
        rem = r.prompt_len + r.num_output - nc
        if chunk <= 0 or rem <= 2 * chunk:
            return None
        k = (rem - 1) // chunk  # steps whose chunk leaves more prefill to do
        g = self.g
        if d:
            heap = self.fheap
            while heap and (
                not heap[0][2].lazy
                or heap[0][0] != heap[0][2].sync + heap[0][2].output_len - heap[0][2].num_output - 1
            ):
                heapq.heappop(heap)
            if heap and heap[0][0] - g + 1 < k:
                k = heap[0][0] - g + 1
        if k < 2:
            return None
        bs = self.bs
        buckets = self.buckets
        free = self.pool.num_free
        nb = r.nblocks
        step_time = self.profile.step_time
        slow = self.slowdown
        s0 = self.s0
        ts: list[float] = []
        dts: list[float] = []
        t = s
        for j in range(k):
            gj = g + j
            top = nc + chunk
            need = -(-top // bs) - nb
            if need < 0:
                need = 0
            free -= need + (len(buckets[-gj % bs]) if d else 0)
            if free < 0:
                break
            dt = step_time(chunk, d, s0 + d * gj, chunk * (nc + chunk / 2)) * slow
            t = t + dt
            ts.append(t)
            dts.append(dt)
            nc = top
            nb += need
        if len(ts) < 2:
            return None
        run = Step(s, ts[-1], [])
        run.pre = True
        run.k = len(ts)
        run.req = r
        run.chunk = chunk
        run.ts = ts
        run.dts = dts
        return run

    def apply_pre(self, st: Step, m: int) -> None:
        """Apply steps ``st.j .. m - 1`` of prefill run ``st`` (schedule and end of each)."""
        r = st.req
        if r is None:
            raise RuntimeError("prefill run without its request")
        chunk = st.chunk
        bs = self.bs
        pool = self.pool
        ts = st.ts
        dts = st.dts
        for j in range(st.j, m):
            g = self.g
            start = ts[j - 1] if j else st.start
            e = ts[j]
            n_dec = self.n_dec
            # schedule (at the step's start): decoders first, in admission order, then r
            if n_dec:
                self.decode_blocks(g)
            nc = r.nc
            top = nc + chunk
            need = -(-top // bs) - r.nblocks
            if need > 0:
                pool.grow(r, need)
            if top // bs > r.nreg and r.nreg < r.nkeys:
                self.register(r, top)
            self.n_steps += 1
            self.n_iteration += chunk + n_dec
            self.busy += dts[j]
            # end of the step
            self.ends.append(e)
            self.push_dur(g, e - start)
            self.g = g + 1
            self.n_generation += n_dec
            finished = self.finish_lazy(g, e)
            if self.credit(r, chunk, e):
                raise RuntimeError(f"{r.rid} finished inside a prefill run")
            if finished:
                self.unrun(finished)
            if len(self.ends) > 8192:
                self.trim()
        st.j = m
