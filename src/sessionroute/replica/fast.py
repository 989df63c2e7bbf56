"""Fast path of the replica model (``shared/ENGINE.md``, "Speed"); same results as :class:`Core`.

Three devices, all exact:

* **Run-length KV blocks.** :class:`~sessionroute.replica.segments.SegmentPool` replaces the
  per-block pool: a multi-turn request's thousands of hit blocks are looked up, taken and
  freed as a few runs; per-block work remains only for blocks created, registered or evicted.

* **Lazy decoders.** With ``max_num_seqs <= max_num_batched_tokens`` every running request that
  is decoding gets its one token in every step, ahead of the (at most one) request still in
  prefill, which is the newest. Such decoders form a prefix of ``running`` whose token counts,
  token times and inter-token latencies are kept lazily: a decoder that joined at step ``sync``
  has decoded ``g - sync`` tokens by step ``g``. Per step the engine only takes a count of free
  blocks for the block-lazy decoders (their blocks are functions of the step,
  :mod:`sessionroute.replica.lazy`) and touches the other decoders that cross a block boundary
  (bucketed by ``(nc - sync) % block_size``; they allocate a block or fill one, in admission
  order, exactly when the reference does), the requests in prefill, admissions and completions
  (a heap by finishing step). ``D`` is a count and
  ``C = s0 + D * g``. A step that would preempt falls back to the reference step.
* **Decode runs in closed form.** When only decoders run and no waiting request can be admitted
  (empty queue, ``max_num_seqs`` reached or decodes use the whole budget), step ``j`` of the run
  lasts ``a + c * j`` with ``a = t_step(0, D, C)`` and ``c = b_kv * D``; the run ends at the
  first completion, the first step whose block allocations no longer fit, or the first step
  starting at or after a known arrival. Anything that must see the state inside a run (an
  arrival, an abort, a gauge read) first splits it into applied steps plus one step in flight.
"""

from __future__ import annotations

import bisect
from typing import Final, cast

from sessionroute.replica.core import RUNNING, Core, Req, Step
from sessionroute.replica.lazy import Due
from sessionroute.replica.prefill import PrefillRuns

# C functions bound once (a module global is a dict lookup at every call when compiled)
bisect_left: Final = bisect.bisect_left
bisect_right: Final = bisect.bisect_right


__all__ = ["FastCore"]


def _run_start(s: float, a: float, c: float, j: int) -> float:
    """Start of step ``j`` of a run that starts at ``s``: ``s + j*a + c*j*(j-1)/2``."""
    return s + j * a + c * (j * (j - 1) // 2)


class FastCore(PrefillRuns):
    """:class:`Core` with lazy decoders (:class:`~sessionroute.replica.lazy.LazyCore`),
    closed-form decode runs, prefill runs (:class:`~sessionroute.replica.prefill.PrefillRuns`)
    and the run-length :class:`~sessionroute.replica.segments.SegmentPool`."""

    # ------------------------------------------------------------ steps

    def advance_within(self, st: Step, t: float, inclusive: bool) -> None:
        """:meth:`Core.advance_within`: a prefill run's steps that end by ``t`` are applied and
        the run stays in flight (its next step has begun if it starts before ``t``, or at ``t``
        with ``inclusive``)."""
        if not st.pre:
            return
        ts = st.ts
        if ts[st.j] <= t:
            m = bisect_right(ts, t, st.j)
            self.apply_pre(st, m)
            self.now = ts[m - 1]
            st.begun = ts[m - 1] < t or inclusive
        elif not st.begun and (ts[st.j - 1] < t or inclusive):
            st.begun = True

    def next_event(self, now: float) -> float | None:
        """:meth:`Core.next_event`: a prefill run's next step due at ``now`` begins."""
        st = self.inflight
        if st is not None and st.pre and not st.begun:
            s = st.ts[st.j - 1]
            if s > now:
                return s
            st.begun = True
            return self.event_time()
        return Core.next_event(self, now)

    def start_step(self, s: float) -> None:
        """Queue arrivals up to ``s``; start a run, a fast step or a reference step."""
        self.queue_arrivals(s)
        if not self.lazy_ok:
            self.inflight = self.schedule(s)
            return
        st = self.plan_run(s)
        if st is None:
            st = self.plan_prefill(s)
        if st is None:
            st = self.fast_step(s)
        if st is None:
            self.delazify_all()
            st = self.schedule(s)
        self.inflight = st

    def fast_step(self, s: float) -> Step | None:
        """One step with lazy decoders; None if it would preempt (use the reference step)."""
        g = self.g
        bs = self.bs
        pool = self.pool
        running = self.running
        n_dec = self.n_dec
        budget = self.budget - n_dec
        free = pool.num_free - len(self.buckets[-g % bs]) - len(self.lbuckets[-g % bs])
        if free < 0:
            return None
        plan: list[tuple[Req, int]] = []
        for i in range(n_dec, len(running)):
            if budget <= 0:
                break
            r = running[i]
            n = r.prompt_len + r.num_output - r.nc
            if n > budget:
                n = budget
            free -= -(-(r.nc + n) // bs) - r.nblocks
            if free < 0:
                return None
            plan.append((r, n))
            budget -= n
        taken = 0  # blocks plan[0] needs, taken in the decoders' eviction (it comes next)
        if n_dec:
            if plan:
                r, n = plan[0]
                taken = -(-(r.nc + n) // bs) - r.nblocks
                if taken < 0:
                    taken = 0
            self.decode_blocks(g, taken)
        p_tok = d_seq = ctx = 0
        attn = 0.0
        for r, n in plan:
            nc = r.nc
            ntok = r.prompt_len + r.num_output
            need = -(-(nc + n) // bs) - r.nblocks
            if taken:
                self.spool.extend(r, taken)
                taken = 0
            elif need > 0:
                pool.grow(r, need)
            if (nc + n) // bs > r.nreg and r.nreg < r.nkeys:
                self.register(r, nc + n)
            if n == 1 and nc == ntok - 1:
                d_seq += 1
                ctx += ntok
            else:
                p_tok += n
                attn += n * (nc + n / 2)
        if budget > 0 and self.waiting:
            p2, d2, c2, a2 = self.admit(s, budget, plan)
            p_tok += p2
            d_seq += d2
            ctx += c2
            attn += a2
        d_all = n_dec + d_seq
        if not d_all and not p_tok:
            st = Step(s, s, plan)
        else:
            dt = (
                self.profile.step_time(p_tok, d_all, self.s0 + n_dec * g + ctx, attn)
                * self.slowdown
            )
            self.n_steps += 1
            self.n_iteration += p_tok + d_all
            self.busy += dt
            st = Step(s, s + dt, plan)
        st.lazy = True
        return st

    def apply(self, st: Step) -> None:
        """Apply a finished step or run at its end."""
        if st.pre:
            self.apply_pre(st, st.k)
            return
        if st.k:
            self.apply_run(st, st.k)
            return
        if not st.lazy:
            Core.apply(self, st)
            if self.lazy_ok:
                self.ends.append(st.end)
                self.push_dur(self.g, st.end - st.start)
                self.g += 1
                self.gb = self.g
                self.lazify_front()
            return
        e = st.end
        self.ends.append(e)
        g = self.g
        self.push_dur(g, e - st.start)
        self.g = g + 1
        self.n_generation += self.n_dec
        finished = self.finish_lazy(g, e)
        for r, n in st.sched:
            if r.status == RUNNING and self.credit(r, n, e):
                finished.append(r)
        if finished:
            self.unrun(finished)
        self.gb = self.g
        self.lazify_front()
        if len(self.ends) > 8192:
            self.trim()

    # ------------------------------------------------------------ closed-form runs

    def plan_run(self, s: float) -> Step | None:
        """A run of at least two identical decode steps starting at ``s``, or None."""
        running = self.running
        d = self.n_dec
        if not d or len(running) != d:
            return None
        if self.waiting and d < self.max_seqs and self.budget > d:
            return None
        heap = self.fheap
        items = heap.items
        while items:
            due = cast(Due, items[0])
            r = due.r
            if r.lazy and due.step == r.sync + r.output_len - r.num_output - 1:
                break
            heap.pop()  # stale
        g = self.g
        rem = cast(Due, items[0]).step - g + 1
        if rem < 2:
            return None
        bs = self.bs
        free = self.pool.num_free
        q = free // d  # divmod(free, d) without the generic call (a tuple of boxed ints)
        extra = free - q * d
        k = rem
        if q * bs < rem:
            # step g + m allocates len(buckets[-(g + m) % bs]) blocks
            m = 0
            buckets = self.buckets
            lbuckets = self.lbuckets
            while m < bs:
                cnt = len(buckets[-(g + m) % bs]) + len(lbuckets[-(g + m) % bs])
                if cnt > extra:
                    break
                extra -= cnt
                m += 1
            if q * bs + m < k:
                k = q * bs + m
        if k < 2:
            return None
        slow = self.slowdown
        a = self.profile.step_time(0, d, self.s0 + d * g, 0.0) * slow
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
        return run

    def apply_run(self, st: Step, k: int) -> None:
        """Apply the first ``k`` steps of a run (all of it or a prefix, ``1 <= k <= st.k``)."""
        s, a, c = st.start, st.a, st.c
        g0 = self.g
        for j in range(k):
            self.decode_blocks(g0 + j)
        self.ends += [s + (j + 1) * a + c * (j * (j + 1) // 2) for j in range(k)]
        # durations a + c*j never decrease (c >= 0): the last is the run's suffix maximum
        self.push_dur(g0 + k - 1, a + c * (k - 1))
        self.g = g0 + k
        d = self.n_dec
        end = _run_start(s, a, c, k)
        self.n_generation += k * d
        self.n_iteration += k * d
        self.n_steps += k
        self.busy += end - s
        finished = self.finish_lazy(g0 + k - 1, end)
        if finished:
            self.unrun(finished)
        if len(self.ends) > 8192:
            self.trim()

    def split(self, x: float, *, arrival: bool = False) -> None:
        """Make the state exact at time ``x``: apply a run's steps that start before ``x``
        except the last, which becomes an ordinary step in flight.

        With ``arrival`` (a request arrives at ``x``) a prefill run stays whole: no step of it
        can admit anything.
        """
        st = self.inflight
        if st is None or not st.k or st.end <= x:
            return
        if st.pre:
            if not arrival:
                self.split_pre(st, x)
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
        step = self.fast_step(start)
        if step is None:  # cannot happen: the run was planned to fit
            raise RuntimeError("decode run split into a step that does not fit")
        self.inflight = step

    def split_pre(self, st: Step, x: float) -> None:
        """:meth:`split` of a prefill run: steps that start before ``x`` are applied except
        the last, which becomes an ordinary step in flight (when the run's next step has not
        begun and starts at or after ``x``, the rest of the run is dropped: nothing is in
        progress, and the next step is planned afresh)."""
        ts = st.ts
        if not st.begun:
            if x <= ts[st.j - 1]:  # nothing in progress: drop the rest of the plan
                self.inflight = None
                self.now = ts[st.j - 1]
                return
            st.begun = True
        m = bisect_left(ts, x, st.j)  # steps before m end before x; step m starts before x
        if m >= st.k:
            m = st.k - 1
        self.inflight = None
        self.apply_pre(st, m)
        start = ts[m - 1] if m else st.start
        self.now = start
        step = self.fast_step(start)
        if step is None:  # cannot happen: the run was planned to fit
            raise RuntimeError("prefill run split into a step that does not fit")
        self.inflight = step
