"""Fast path: runs of identical decode steps in closed form (``shared/ENGINE.md``, "Speed").

When every running request is decoding and no waiting request can be admitted (the queue is
empty, ``max_num_seqs`` is reached or decodes use the whole token budget), consecutive steps
differ only in the context term: step ``j`` of the run lasts ``a + c * j`` with
``a = t_step(P=0, D, C)`` and ``c = b_kv * D`` (each step adds ``D`` context tokens). Such a run
ends at the first event: a request's last token, the first step whose block allocations no
longer fit in the free blocks (it may preempt), or the first step starting at or after a known
arrival. The run is applied in one go; anything that must see the state inside the run
(an arrival, an abort, a gauge read) first splits it into applied steps plus one step in flight.
"""

from __future__ import annotations

from sessionroute.engine.core import RUNNING, Core, Step

__all__ = ["FastCore"]


def _run_start(s: float, a: float, c: float, j: int) -> float:
    """Start of step ``j`` of a run that starts at ``s``: ``s + j*a + c*j*(j-1)/2``."""
    return s + j * a + c * (j * (j - 1) // 2)


class FastCore(Core):
    """:class:`Core` that jumps over runs of identical decode steps."""

    def start_step(self, s: float) -> None:
        """Queue arrivals up to ``s``; start a decode run if possible, else one step."""
        self.queue_arrivals(s)
        run = self.plan_run(s)
        self.inflight = run if run is not None else self.schedule(s)

    def plan_run(self, s: float) -> Step | None:
        """A run of at least two identical decode steps starting at ``s``, or None."""
        running = self.running
        d = len(running)
        budget = self.budget
        if d < 1 or d > budget:
            return None
        if self.waiting and d < self.max_seqs and budget > d:
            return None
        bs = self.bs
        rem = 1 << 62
        ctx = 0
        phase = [0] * bs
        for r in running:
            ntok = r.prompt_len + r.num_output
            nc = r.nc
            if nc != ntok - 1:
                return None
            ctx += ntok
            left = r.output_len - r.num_output
            if left < rem:
                rem = left
            phase[-nc % bs] += 1
        if rem < 2:
            return None
        # Step j allocates one block for each request with (nc + j) % bs == 0.
        q, extra = divmod(self.pool.num_free, d)
        k = rem
        if q * bs < rem:
            m = 0
            while m < bs and phase[m] <= extra:
                extra -= phase[m]
                m += 1
            if q * bs + m < k:
                k = q * bs + m
        if k < 2:
            return None
        slow = self.slowdown
        a = self.profile.step_time(0, d, ctx, 0.0) * slow
        c = self.profile.b_kv_s * d * slow
        if self.pending:
            arrival = self.pending[0][0]
            if _run_start(s, a, c, k - 1) >= arrival:
                lo, hi = 0, k - 1  # s_lo < arrival <= s_hi
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if _run_start(s, a, c, mid) < arrival:
                        lo = mid
                    else:
                        hi = mid
                k = hi
                if k < 2:
                    return None
        run = Step(s, _run_start(s, a, c, k), [])
        run.k = k
        run.a = a
        run.c = c
        run.decoders = list(running)
        return run

    def apply(self, st: Step) -> None:
        """Apply a finished step or run at its end."""
        if st.k:
            self.apply_run(st, st.k)
        else:
            Core.apply(self, st)

    def apply_run(self, st: Step, k: int) -> None:
        """Apply the first ``k`` steps of a run (all of it or a prefix, ``1 <= k <= st.k``)."""
        s, a, c = st.start, st.a, st.c
        end = _run_start(s, a, c, k)
        e0 = s + a
        last_gap = a + c * (k - 1)
        bs = self.bs
        pool = self.pool
        finished = False
        for r in st.decoders:
            nc = r.nc + k
            need = -(-nc // bs) - len(r.blocks)
            if need > 0:
                r.blocks += pool.allocate(need)
            if nc // bs > r.nreg and r.nreg < r.nkeys:
                self.register(r, nc)
            r.nc = nc
            if r.num_output == 0:
                r.first_token = e0
                self.n_prompt += r.prompt_len
                if k > 1:
                    r.itl_sum += end - e0
                    if last_gap > r.itl_max:
                        r.itl_max = last_gap
            else:
                r.itl_sum += end - r.last_token
                gap = e0 - r.last_token
                if k > 1 and last_gap > gap:
                    gap = last_gap
                if gap > r.itl_max:
                    r.itl_max = gap
            r.num_output += k
            r.last_token = end
            if r.num_output == r.output_len:
                self.finish(r, end)
                finished = True
        d = len(st.decoders)
        self.n_generation += k * d
        self.n_iteration += k * d
        self.n_steps += k
        self.busy += end - s
        if finished:
            self.running = [r for r in self.running if r.status == RUNNING]

    def split(self, x: float) -> None:
        """Make the state exact at time ``x``: apply a run's steps that start before ``x``
        except the last, which becomes an ordinary step in flight."""
        st = self.inflight
        if st is None or not st.k or st.end <= x:
            return
        s, a, c = st.start, st.a, st.c
        lo, hi = 0, st.k  # s_lo < x <= s_hi (or lo = 0 when x <= s)
        if s < x:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _run_start(s, a, c, mid) < x:
                    lo = mid
                else:
                    hi = mid
        self.inflight = None
        if lo:
            self.apply_run(st, lo)
        start = _run_start(s, a, c, lo)
        self.now = start
        self.inflight = self.schedule(start)
