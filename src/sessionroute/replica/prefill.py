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
flight; see :meth:`~sessionroute.replica.fast.FastCore.run_until`).
"""

from __future__ import annotations

from typing import Final

from sessionroute.replica.core import Req, Step
from sessionroute.replica.intbisect import bisect_left
from sessionroute.replica.lazy import LazyCore
from sessionroute.replica.segstore import _Ext

__all__ = ["PrefillRuns"]

_MAX_STEPS: Final = 64
"""Most steps a prefill run plans."""


class PrefillRuns(LazyCore):
    """:class:`~sessionroute.replica.lazy.LazyCore` plus planning and applying prefill runs."""

    def plan_prefill(self, s: float) -> Step | None:
        """A prefill run of at least two steps starting at ``s``, or None."""
        running = self.running
        d = self.n_dec
        if len(running) != d + 1:
            return None
        r = running[d]
        budget = self.budget
        nc = r.nc
        rem = r.prompt_len + r.num_output - nc
        if rem <= 2 * (budget - d) or d >= budget:
            return None
        g = self.g
        horizon = g + min(_MAX_STEPS, rem // (budget - d) + 1)
        fin = self.fsched  # lazy decoders finishing at a step: [count, their share of s0]
        bs = self.bs
        buckets = self.buckets
        lbuckets = self.lbuckets
        free = self.pool.num_free
        nb = r.nblocks
        profile = self.profile
        b_kv = profile.b_kv_s
        b_pa = profile.b_pa_s
        # every step has N = chunk + D = budget tokens: b0 + max(T_mem(N), b_tok * N) is the
        # same in all (step_time with C = A = 0 is exactly that sum)
        base = profile.step_time(budget - d, d, 0, 0.0)
        slow = self.slowdown
        s0 = self.s0
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
                free -= need + (len(buckets[-gj % bs]) + len(lbuckets[-gj % bs]) if d else 0)
                if free < 0:
                    break
                nb += need
            # StepTimeProfile.step_time(chunk, d, C, A), same operations in the same order
            dt = (base + b_kv * (s0 + d * gj) + b_pa * (chunk * (nc + chunk / 2))) * slow
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

    def event_time(self) -> float | None:
        """End of the step in flight, or of a prefill run's next step with a finish (else of
        the run); None when no step is in flight."""
        st = self.inflight
        if st is None:
            return None
        if st.pre:
            ev = st.ev
            i = bisect_left(ev, st.j)
            if i < len(ev):
                return st.ts[ev[i]]
        return st.end

    def apply_pre(self, st: Step, m: int) -> None:
        """Apply steps ``st.j .. m - 1`` of prefill run ``st`` (schedule and end of each).

        Raises:
            RuntimeError: if the state does not match the plan (cannot happen).
        """
        r = st.req
        if r is None:
            raise RuntimeError("prefill run without its request")
        if m - st.j > 1 and not self.n_eager and self.batchable(st, r, m):
            self.apply_pre_batch(st, r, m)
            return
        bs = self.bs
        spool = self.spool
        ts = st.ts
        dts = st.dts
        chunks = st.chunks
        for j in range(st.j, m):
            g = self.g
            start = ts[j - 1] if j else st.start
            e = ts[j]
            chunk = chunks[j]
            n_dec = self.n_dec
            if n_dec + chunk != self.budget:
                raise RuntimeError(f"prefill run step {j}: {n_dec} decoders, chunk {chunk}")
            # schedule (at the step's start): decoders first, in admission order, then r
            nc = r.nc
            top = nc + chunk
            need = -(-top // bs) - r.nblocks
            if n_dec:
                # the decoders' block work, and the free blocks r needs after them
                self.decode_blocks(g, need if need > 0 else 0)
                if need > 0:
                    spool.extend(r, need)
            elif need > 0:
                spool.grow(r, need)
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

    def batchable(self, st: Step, r: Req, m: int) -> bool:
        """Whether steps ``st.j .. m - 1`` of prefill run ``st`` can be applied in one batch
        (:meth:`apply_pre_batch`): every lazy decoder is block-lazy (the caller checks) and
        ``r``'s registration over the steps extends its own cached run with keys nobody caches
        as a start (so evictions inside the span cannot change it; see
        :meth:`~sessionroute.replica.segments.SegmentPool.register`)."""
        full = (r.nc + sum(st.chunks[st.j : m])) // self.bs
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
        return self.spool.extends_own_run(r, seg, p, full)

    def apply_pre_batch(self, st: Step, r: Req, m: int) -> None:
        """:meth:`apply_pre` of steps ``st.j .. m - 1`` in one batch; same state as step by step.

        Per step only the step end and duration are recorded; between finishes the decoders'
        block allocations are a count (all are block-lazy). The run was planned so that all
        its allocations fit in the blocks free when it was planned, so every eviction of the
        span takes blocks that were free at its start, whatever the interleaving with the
        finishing decoders' releases (which go to the queue tail): all of the span's evictions
        are taken at its end, with ``r``'s blocks and registration (its keys are no cached
        start, so no eviction changes what it caches).

        Raises:
            RuntimeError: if the state does not match the plan (cannot happen).
        """
        bs = self.bs
        spool = self.spool
        lbuckets = self.lbuckets
        ts = st.ts
        dts = st.dts
        chunks = st.chunks
        ev = st.ev
        nev = len(ev)
        ends = self.ends
        mx_step = self.mx_step
        mx_dur = self.mx_dur
        j0 = j = st.j
        g = self.g
        busy = self.busy
        ngen = 0
        take = 0
        i = bisect_left(ev, j)
        prev = ts[j - 1] if j else st.start
        while j < m:
            fin = i < nev and ev[i] < m
            if fin:
                k = ev[i] + 1
                i += 1
            else:
                k = m
            nd = self.n_dec
            if nd + chunks[j] != self.budget:
                raise RuntimeError(f"prefill run step {j}: {nd} decoders, chunk {chunks[j]}")
            if nd:
                for x in range(g, g + k - j):
                    take += len(lbuckets[-x % bs])
            for jj in range(j, k):
                e = ts[jj]
                dur = e - prev
                while mx_dur and mx_dur[-1] <= dur:  # push_dur, inlined
                    mx_dur.pop()
                    mx_step.pop()
                mx_step.append(g)
                mx_dur.append(dur)
                prev = e
                busy += dts[jj]
                g += 1
            ends += ts[j:k]
            ngen += nd * (k - j)
            j = k
            self.g = self.gb = g
            finished = self.finish_lazy(g - 1, ts[k - 1])
            if finished:
                if not fin:
                    raise RuntimeError(f"prefill run step {k - 1}: a finish not in the plan")
                self.unrun(finished)
        total = sum(chunks[j0:m])
        top = r.nc + total
        need = -(-top // bs) - r.nblocks
        if need < 0:
            need = 0
        if take or need:
            spool.take(take + need)
        if need:
            spool.extend(r, need)
        if top // bs > r.nreg and r.nreg < r.nkeys:
            self.register(r, top)
        r.nc = top
        if top >= r.prompt_len + r.num_output:
            raise RuntimeError(f"{r.rid} finished inside a prefill run")
        self.busy = busy
        self.n_steps += m - j0
        self.n_iteration += total + ngen
        self.n_generation += ngen
        if len(ends) > 8192:
            self.trim()
        st.j = m
