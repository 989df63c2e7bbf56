"""Prefill runs of the fast path (see :mod:`sessionroute.engine.fast`): consecutive steps in
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
flight; see :meth:`~sessionroute.engine.fast.FastCore.run_until`).
"""

from __future__ import annotations

from bisect import bisect_left

from sessionroute.engine.core import Req, Step
from sessionroute.engine.lazy import LazyCore

__all__ = ["PrefillRuns"]

_MAX_STEPS = 64
"""Most steps a prefill run plans."""


class PrefillRuns(LazyCore):
    """:class:`~sessionroute.engine.lazy.LazyCore` plus planning and applying prefill runs."""

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
        # lazy decoders finishing within the horizon: step -> (count, their share of s0)
        # the heap's entries below the horizon: a walk of the heap tree that stops at larger ones
        heap = self.fheap
        size = len(heap)
        last: dict[Req, int] = {}
        todo = [0] if size and heap[0][0] < horizon else []
        while todo:
            i = todo.pop()
            gf, _, q = heap[i]
            if q.lazy and gf == q.sync + q.output_len - q.num_output - 1:
                last[q] = gf
            i = 2 * i + 1
            if i < size and heap[i][0] < horizon:
                todo.append(i)
            i += 1
            if i < size and heap[i][0] < horizon:
                todo.append(i)
        fin: dict[int, tuple[int, int]] = {}
        for q, gf in last.items():
            n0, c0 = fin.get(gf, (0, 0))
            fin[gf] = (n0 + 1, c0 + q.prompt_len + q.num_output - q.sync)
        bs = self.bs
        buckets = self.buckets
        lbuckets = self.lbuckets
        free = self.pool.num_free
        nb = r.nblocks
        step_time = self.profile.step_time
        slow = self.slowdown
        s0 = self.s0
        ts: list[float] = []
        dts: list[float] = []
        chunks: list[int] = []
        ev: list[int] = []
        t = s
        for gj in range(g, horizon):
            chunk = budget - d
            if rem <= chunk:
                break  # the prefill's last chunk: an ordinary step (first token, admissions)
            top = nc + chunk
            need = -(-top // bs) - nb
            if need < 0:
                need = 0
            free -= need + (len(buckets[-gj % bs]) + len(lbuckets[-gj % bs]) if d else 0)
            if free < 0:
                break
            dt = step_time(chunk, d, s0 + d * gj, chunk * (nc + chunk / 2)) * slow
            t = t + dt
            ts.append(t)
            dts.append(dt)
            chunks.append(chunk)
            nc = top
            rem -= chunk
            nb += need
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
