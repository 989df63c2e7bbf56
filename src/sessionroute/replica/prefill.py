"""Prefill runs of the fast path (see :mod:`sessionroute.replica.fast`): consecutive steps in
which the lazy decoders decode and one request prefills a full chunk, planned in one go.

Under a prefill-bound load most steps look alike: every running request but the newest is a
lazy decoder (one token each), and the newest is in chunked prefill and takes the rest of the
token budget. Nothing waiting can be admitted (no budget is left), so an arrival does not
change such a step. Until the prefill reaches its last chunk the steps are known in advance:
chunk ``budget - D``, ``C = s0 + D * g``, ``A = chunk * (computed + chunk / 2)``, with ``D`` and
``s0`` dropping at the known steps where lazy decoders finish (the lazy-decoder heap). A run
plans them (at most ``_MAX_STEPS``) until the step before the prefill's last chunk or until the
blocks they allocate no longer fit in the free ones (then an ordinary step decides on
preemption). Step times are computed step by step with the same arithmetic as an ordinary
step, so results are bit-identical. The block work of each step (decoders' block boundaries,
the chunk's blocks and their registration) and its end (tokens, finishes) are done when the
run is applied, in step order, up to each time the replica is advanced to (the run stays in
flight; see :meth:`PrefillRuns.advance_within`).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Final

from sessionroute.replica.core import register_blocks
from sessionroute.replica.intbisect import bisect_left
from sessionroute.replica.request import Req
from sessionroute.replica.segstore import _Ext
from sessionroute.replica.steps import Step

if TYPE_CHECKING:
    from sessionroute.replica.fast import FastCore

__all__ = ["PrefillRuns"]

_MAX_STEPS: Final = 64
"""Most steps a prefill run plans."""


class PrefillRuns:
    """Plans and applies the prefill runs of ``core``.

    Args:
        core: the fast scheduler whose state the runs read and advance.
    """

    def __init__(self, core: FastCore) -> None:
        self.core = core

    def plan(self, s: float) -> Step | None:
        """A prefill run of at least two steps starting at ``s``, or None."""
        core = self.core
        dec = core.decoders
        running = core.running
        d = dec.n_dec
        if len(running) != d + 1:
            return None
        r = running[d]
        budget = core.budget
        nc = r.nc
        rem = r.prompt_len + r.num_output - nc
        if rem <= 2 * (budget - d) or d >= budget:
            return None
        g = core.log.g
        horizon = g + min(_MAX_STEPS, rem // (budget - d) + 1)
        fin = dec.fsched  # lazy decoders finishing at a step: [count, their share of s0]
        bs = core.bs
        blocks = core.blocks
        free = core.pool.num_free
        nb = r.nblocks
        profile = core.profile
        b_seq = profile.b_seq_s
        b_kv = profile.b_kv_s
        b_pa = profile.b_pa_s
        # every step has N = chunk + D = budget tokens: b0 + max(T_mem(N), b_tok * N) is the
        # same in all (step_time with D = C = A = R = 0 is exactly that sum; no step of the run
        # admits a request, so R = 0 in each)
        base = profile.step_time(budget, 0, 0, 0.0)
        slow = core.slowdown
        s0 = dec.s0
        ts: list[float] = []
        dts: list[float] = []
        chunks: list[int] = []
        ev: list[int] = []
        t = s
        # the most blocks the run can take: the prefill's up to its end, and one per decoder
        # every block_size steps; with that many free, no step needs the free-block check
        track = free < -(-(nc + rem) // bs) - nb + d * -(-(horizon - g) // bs)
        for gj in range(g, horizon):
            chunk = budget - d
            if rem <= chunk:
                break  # the prefill's last chunk: an ordinary step (first token, admissions)
            top = nc + chunk
            if track:
                need = -(-top // bs) - nb
                if need < 0:
                    need = 0
                free -= need + (blocks.starting(gj) if d else 0)
                if free < 0:
                    break
                nb += need
            # StepTimeProfile.step_time(chunk, d, C, A), same operations in the same order (its
            # b_req * 0 term adds exactly 0.0)
            dt = (
                base + b_seq * d + b_kv * (s0 + d * gj) + b_pa * (chunk * (nc + chunk / 2))
            ) * slow
            t = t + dt
            ts.append(t)
            dts.append(dt)
            chunks.append(chunk)
            nc = top
            rem -= chunk
            f = fin.get(gj)
            if f is not None:
                ev.append(gj - g)
                d -= f[0]
                s0 -= f[1]
        if len(ts) < 2:
            return None
        run = Step(s, ts[-1], [])
        run.pre = True
        run.k = len(ts)
        run.req = r
        run.ts = ts
        run.dts = dts
        run.chunks = chunks
        run.ev = ev
        return run

    @staticmethod
    def event_time(st: Step) -> float:
        """End of run ``st``'s next step with a finish, else of the run, seconds."""
        ev = st.ev
        i = bisect_left(ev, st.j)
        if i < len(ev):
            return st.ts[ev[i]]
        return st.end

    def advance_within(self, st: Step, t: float, inclusive: bool) -> None:
        """Apply run ``st``'s steps that end by ``t`` (it ends after ``t`` and stays in flight;
        its next step has begun if it starts before ``t``, or at ``t`` with ``inclusive``)."""
        ts = st.ts
        if ts[st.j] <= t:
            m = bisect.bisect_right(ts, t, st.j)
            self.apply(st, m)
            self.core.now = ts[m - 1]
            st.begun = ts[m - 1] < t or inclusive
        elif not st.begun and (ts[st.j - 1] < t or inclusive):
            st.begun = True

    def apply_before(self, st: Step, x: float) -> float:
        """Apply run ``st``'s steps that start before ``x`` except the last (``x`` is inside
        step ``st.j`` or later); returns the start of that last step, seconds."""
        ts = st.ts
        m = bisect.bisect_left(ts, x, st.j)  # steps before m end before x; step m starts before x
        if m >= st.k:
            m = st.k - 1
        self.apply(st, m)
        return ts[m - 1] if m else st.start

    def apply(self, st: Step, m: int) -> None:
        """Apply steps ``st.j .. m - 1`` of prefill run ``st`` (schedule and end of each).

        Raises:
            RuntimeError: if the state does not match the plan (cannot happen).
        """
        r = st.req
        if r is None:
            raise RuntimeError("prefill run without its request")
        core = self.core
        if m - st.j > 1 and not core.blocks.n_eager and self.batchable(st, r, m):
            self.apply_batch(st, r, m)
            return
        bs = core.bs
        spool = core.spool
        dec = core.decoders
        log = core.log
        ts = st.ts
        dts = st.dts
        chunks = st.chunks
        for j in range(st.j, m):
            g = log.g
            start = ts[j - 1] if j else st.start
            e = ts[j]
            chunk = chunks[j]
            n_dec = dec.n_dec
            if n_dec + chunk != core.budget:
                raise RuntimeError(f"prefill run step {j}: {n_dec} decoders, chunk {chunk}")
            # schedule (at the step's start): decoders first, in admission order, then r
            nc = r.nc
            top = nc + chunk
            need = -(-top // bs) - r.nblocks
            if n_dec:
                # the decoders' block work, and the free blocks r needs after them
                core.blocks.step(g, need if need > 0 else 0)
                if need > 0:
                    spool.extend(r, need)
            elif need > 0:
                spool.grow(r, need)
            if top // bs > r.nreg and r.nreg < r.nkeys:
                register_blocks(spool, bs, r, top)
            core.n_steps += 1
            core.n_iteration += chunk + n_dec
            core.busy += dts[j]
            # end of the step
            log.step_ended(start, e)
            core.n_generation += n_dec
            finished = core.finish_due(g, e)
            if core.credit(r, chunk, e):
                raise RuntimeError(f"{r.rid} finished inside a prefill run")
            if finished:
                core.unrun(finished)
            core.trim()
        st.j = m

    def batchable(self, st: Step, r: Req, m: int) -> bool:
        """Whether steps ``st.j .. m - 1`` of prefill run ``st`` can be applied in one batch
        (:meth:`apply_batch`): every lazy decoder is block-lazy (the caller checks) and
        ``r``'s registration over the steps extends its own cached run with keys nobody caches
        as a start (so evictions inside the span cannot change it; see
        :meth:`~sessionroute.replica.segments.SegmentPool.register`)."""
        full = (r.nc + sum(st.chunks[st.j : m])) // self.core.bs
        if full > r.nkeys:
            full = r.nkeys
        p = r.nreg
        if full <= p:
            return True
        exts: list[_Ext] = r.blocks
        if not exts:
            return False
        res = exts[-1].res
        seg = res.segs[-1]
        if res.owner is not r or seg.ref != 1 or not seg.lo < p == seg.creg:
            return False
        return self.core.spool.extends_own_run(r, seg, p, full)

    def apply_batch(self, st: Step, r: Req, m: int) -> None:
        """:meth:`apply` of steps ``st.j .. m - 1`` in one batch; same state as step by step.

        Per step only the step end and duration are recorded; between finishes the decoders'
        block allocations are a count (all are block-lazy). The run was planned so that all
        its allocations fit in the blocks free when it was planned, so every eviction of the
        span takes blocks that were free at its start. A finishing decoder's release puts its
        blocks offered to the cache at the queue tail and the rest (its partial tail) before
        the queue, where later allocations take them first, so what the steps up to a finish
        allocated is taken at the finish and the rest at the span's end, with ``r``'s blocks
        and registration (its keys are no cached start, so no eviction changes what it
        caches).

        Raises:
            RuntimeError: if the state does not match the plan (cannot happen).
        """
        core = self.core
        bs = core.bs
        spool = core.spool
        dec = core.decoders
        blocks = core.blocks
        lbuckets = blocks.lbuckets
        log = core.log
        ts = st.ts
        dts = st.dts
        chunks = st.chunks
        ev = st.ev
        nev = len(ev)
        ends = log.ends
        j0 = j = st.j
        g = log.g
        busy = core.busy
        ngen = 0
        take = 0
        taken = 0  # blocks of r's chain taken already (at finishes)
        i = bisect_left(ev, j)
        prev = ts[j - 1] if j else st.start
        while j < m:
            fin = i < nev and ev[i] < m
            if fin:
                k = ev[i] + 1
                i += 1
            else:
                k = m
            nd = dec.n_dec
            if nd + chunks[j] != core.budget:
                raise RuntimeError(f"prefill run step {j}: {nd} decoders, chunk {chunks[j]}")
            if nd:
                for x in range(g, g + k - j):
                    take += len(lbuckets[-x % bs])
            for jj in range(j, k):
                e = ts[jj]
                log.push_dur(g, e - prev)
                prev = e
                busy += dts[jj]
                g += 1
            ends += ts[j:k]
            ngen += nd * (k - j)
            j = k
            log.g = blocks.gb = g
            if fin:
                # a finishing decoder frees its partial tail to the front of the free blocks,
                # where allocations after the finish take it first: what the steps up to the
                # finish allocated is taken before
                need = -(-(r.nc + sum(chunks[j0:k])) // bs) - r.nblocks - taken
                if need < 0:
                    need = 0
                if take or need:
                    spool.take(take + need)
                    taken += need
                    take = 0
            finished = core.finish_due(g - 1, ts[k - 1])
            if finished:
                if not fin:
                    raise RuntimeError(f"prefill run step {k - 1}: a finish not in the plan")
                core.unrun(finished)
        total = sum(chunks[j0:m])
        top = r.nc + total
        need = -(-top // bs) - r.nblocks
        if need < 0:
            need = 0
        if take or need > taken:
            spool.take(take + need - taken)
        if need:
            spool.extend(r, need)
        if top // bs > r.nreg and r.nreg < r.nkeys:
            register_blocks(spool, bs, r, top)
        r.nc = top
        if top >= r.prompt_len + r.num_output:
            raise RuntimeError(f"{r.rid} finished inside a prefill run")
        core.busy = busy
        core.n_steps += m - j0
        core.n_iteration += total + ngen
        core.n_generation += ngen
        core.trim()
        st.j = m
