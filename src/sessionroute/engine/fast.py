"""Fast path of the replica model (``shared/ENGINE.md``, "Speed"); same results as :class:`Core`.

Two devices, both exact:

* **Lazy decoders.** With ``max_num_seqs <= max_num_batched_tokens`` every running request that
  is decoding gets its one token in every step, ahead of the (at most one) request still in
  prefill, which is the newest. Such decoders form a prefix of ``running`` whose token counts,
  token times and inter-token latencies are kept lazily: a decoder that joined at step ``sync``
  has decoded ``g - sync`` tokens by step ``g``. Per step the engine only touches the decoders
  that cross a block boundary (bucketed by ``(nc - sync) % block_size``; they allocate a block
  or fill one, in admission order, exactly when the reference does), the requests in prefill,
  admissions and completions (a heap by finishing step). ``D`` is a count and
  ``C = s0 + D * g``. A step that would preempt falls back to the reference step.
* **Decode runs in closed form.** When only decoders run and no waiting request can be admitted
  (empty queue, ``max_num_seqs`` reached or decodes use the whole budget), step ``j`` of the run
  lasts ``a + c * j`` with ``a = t_step(0, D, C)`` and ``c = b_kv * D``; the run ends at the
  first completion, the first step whose block allocations no longer fit, or the first step
  starting at or after a known arrival. Anything that must see the state inside a run (an
  arrival, an abort, a gauge read) first splits it into applied steps plus one step in flight.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from operator import attrgetter

from sessionroute.engine.api import ReplicaConfig
from sessionroute.engine.core import RUNNING, Core, Req, Step
from sessionroute.engine.segments import SegmentPool

__all__ = ["FastCore"]

_ORDER = attrgetter("order")


def _run_start(s: float, a: float, c: float, j: int) -> float:
    """Start of step ``j`` of a run that starts at ``s``: ``s + j*a + c*j*(j-1)/2``."""
    return s + j * a + c * (j * (j - 1) // 2)


class FastCore(Core):
    """:class:`Core` with lazy decoders, closed-form decode runs and the run-length
    :class:`~sessionroute.engine.segments.SegmentPool`."""

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

    def decode_blocks(self, g: int) -> None:
        """Block work of the lazy decoders in step ``g``, in admission order: allocate a block
        for those starting one, offer a block to the cache for those filling one.

        Allocation (which may evict idle cached blocks) and registration of keys nobody has
        cached commute, so they run in two batches unless a filling block's key is cached
        already (then the reference's admission order matters: one at a time)."""
        bs = self.bs
        ab = self.buckets[-g % bs]
        fb = self.buckets[(-g - 1) % bs]
        spool = self.spool
        if not fb:
            if ab:
                spool.grow_each(ab)
            return
        fills: list[Req] = []
        for r in fb:
            p = r.nreg
            if p < r.nkeys:
                if (r.nc + g - r.sync + 1) // bs != p + 1:
                    raise RuntimeError(f"{r.rid}: lazy decoder fills block {p} out of turn")
                if ab and r.keys[p] in r.cache and spool.fresh < len(ab):
                    self.decode_blocks_in_order(g, ab, fb)
                    return
                fills.append(r)
        if ab:
            spool.grow_each(ab)
        for r in fills:
            spool.register_next(r)
            r.nreg += 1

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

    # ------------------------------------------------------------ steps

    def start_step(self, s: float) -> None:
        """Queue arrivals up to ``s``; start a run, a fast step or a reference step."""
        self.queue_arrivals(s)
        if not self.lazy_ok:
            self.inflight = self.schedule(s)
            return
        st = self.plan_run(s)
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
        free = pool.num_free - len(self.buckets[-g % bs])
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
        if n_dec:
            self.decode_blocks(g)
        p_tok = d_seq = ctx = 0
        attn = 0.0
        for r, n in plan:
            nc = r.nc
            ntok = r.prompt_len + r.num_output
            need = -(-(nc + n) // bs) - r.nblocks
            if need > 0:
                pool.grow(r, need)
            if (nc + n) // bs > r.nreg and r.nreg < r.nkeys:
                self.register(r, nc + n)
            if n == 1 and nc == ntok - 1:
                d_seq += 1
                ctx += ntok
            else:
                p_tok += n
                attn += n * (nc + n / 2)
        if self.waiting:
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
        if st.k:
            self.apply_run(st, st.k)
            return
        if not st.lazy:
            Core.apply(self, st)
            if self.lazy_ok:
                self.ends.append(st.end)
                self.push_dur(self.g, st.end - st.start)
                self.g += 1
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
            if r.status != RUNNING:
                continue
            r.nc += n
            if r.nc == r.prompt_len + r.num_output:
                r.num_output += 1
                self.n_generation += 1
                if r.num_output == 1:
                    r.first_token = e
                    self.n_prompt += r.prompt_len
                else:
                    gap = e - r.last_token
                    r.itl_sum += gap
                    if gap > r.itl_max:
                        r.itl_max = gap
                r.last_token = e
                if r.num_output == r.output_len:
                    self.finish(r, e)
                    finished.append(r)
        if finished:
            self.unrun(finished)
        self.lazify_front()
        if len(self.ends) > 8192:
            self.trim()

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
        while heap and (
            not heap[0][2].lazy
            or heap[0][0] != heap[0][2].sync + heap[0][2].output_len - heap[0][2].num_output - 1
        ):
            heapq.heappop(heap)
        g = self.g
        rem = heap[0][0] - g + 1
        if rem < 2:
            return None
        bs = self.bs
        q, extra = divmod(self.pool.num_free, d)
        k = rem
        if q * bs < rem:
            # step g + m allocates len(buckets[-(g + m) % bs]) blocks
            m = 0
            buckets = self.buckets
            while m < bs:
                cnt = len(buckets[-(g + m) % bs])
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
        step = self.fast_step(start)
        if step is None:  # cannot happen: the run was planned to fit
            raise RuntimeError("decode run split into a step that does not fit")
        self.inflight = step
