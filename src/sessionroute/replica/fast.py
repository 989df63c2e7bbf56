"""Fast path of the replica model (``shared/ENGINE.md``, "Speed"); same results as :class:`Core`.

:class:`FastCore` is the reference scheduler's state and mechanics with its step hooks replaced;
the work is done by parts it owns, each exact:

* **Run-length KV blocks** (:class:`~sessionroute.replica.segments.SegmentPool`, the pool):
  a multi-turn request's thousands of hit blocks are looked up, taken and freed as a few runs;
  per-block work remains only for blocks created, registered or evicted.
* **Lazy decoders** (:class:`~sessionroute.replica.lazy.LazyDecoders`, with the
  :class:`~sessionroute.replica.steplog.StepLog` of step times): with
  ``max_num_seqs <= max_num_batched_tokens`` the decoding requests form a prefix of ``running``
  whose counters and times are kept per decoder only when read; ``D`` is a count and
  ``C = s0 + D * g``. Their block work (:class:`~sessionroute.replica.decodeblocks.DecoderBlocks`)
  touches only the decoders that start or fill a block in a step, or none at all.
* **Decode runs** (:class:`~sessionroute.replica.decoderuns.DecodeRuns`): runs of pure decode
  steps in closed form.
* **Prefill runs** (:class:`~sessionroute.replica.prefill.PrefillRuns`): runs of steps in which
  the decoders decode and one request prefills full chunks, planned in one go.

Each step starts a decode run, a prefill run, a *fast step* (one step with lazy decoders) or,
when that step would preempt, the reference step. Anything that must see the state inside a run
(an abort, a gauge read, and for decode runs an arrival) first splits it into applied steps
plus one fast step in flight (:meth:`FastCore.split`).
"""

from __future__ import annotations

from typing import Final

from sessionroute.replica.api import ReplicaConfig
from sessionroute.replica.core import Core, register_blocks
from sessionroute.replica.decodeblocks import DecoderBlocks
from sessionroute.replica.decoderuns import DecodeRuns
from sessionroute.replica.lazy import LazyDecoders
from sessionroute.replica.prefill import PrefillRuns
from sessionroute.replica.request import RUNNING, Req
from sessionroute.replica.segments import SegmentPool
from sessionroute.replica.steplog import StepLog
from sessionroute.replica.steps import Step

__all__ = ["FastCore"]

_TRIM_AT: Final = 8192
"""Step times the log keeps before :meth:`FastCore.trim` drops those no decoder needs."""


class FastCore(Core):
    """:class:`Core` on a run-length pool with lazy decoders, decode runs and prefill runs.

    Args:
        config: the replica configuration.

    Attributes:
        spool: the run-length pool (also :attr:`pool`).
        lazy_ok: whether decoders can be lazy (``max_num_seqs <= max_num_batched_tokens``);
            if not, every step is the reference step.
        log: the applied steps.
        blocks: the lazy decoders' block work.
        decoders: the lazy decoders.
        decode_runs: plans and applies decode runs.
        prefill_runs: plans and applies prefill runs.
    """

    def __init__(self, config: ReplicaConfig) -> None:
        spool = SegmentPool(config.num_blocks)
        super().__init__(config, spool)
        self.spool = spool
        self.lazy_ok = self.max_seqs <= self.budget
        self.log = StepLog()
        self.blocks = DecoderBlocks(spool, self.bs)
        self.decoders = LazyDecoders(self.log, self.blocks, self.bs)
        self.decode_runs = DecodeRuns(self)
        self.prefill_runs = PrefillRuns(self)

    @property
    def g(self) -> int:
        """Index of the next step to apply: a lazy decoder has produced
        ``num_output + g - sync`` tokens (the emulator reads it)."""
        return self.log.g

    def sync_all_blocks(self) -> None:
        """Bring every block-lazy decoder's blocks up to date, so the pool shows the
        reference's state (for tests and inspection)."""
        self.blocks.sync_all()

    # ------------------------------------------------------------ step hooks

    def start_step(self, s: float) -> None:
        """Queue arrivals up to ``s``; start a run, a fast step or a reference step."""
        self.queue_arrivals(s)
        if not self.lazy_ok:
            self.inflight = self.schedule(s)
            return
        st = self.decode_runs.plan(s)
        if st is None:
            st = self.prefill_runs.plan(s)
        if st is None:
            st = self.fast_step(s)
        if st is None:
            self.decoders.delazify_all(self.running)
            st = self.schedule(s)
        self.inflight = st

    def event_time(self) -> float | None:
        """End of the step in flight, or of a prefill run's next step with a finish (else of
        the run); None when no step is in flight."""
        st = self.inflight
        if st is None:
            return None
        if st.pre:
            return self.prefill_runs.event_time(st)
        return st.end

    def advance_within(self, st: Step, t: float, inclusive: bool) -> None:
        """:meth:`Core.advance_within`: a prefill run's steps that end by ``t`` are applied
        and the run stays in flight."""
        if st.pre:
            self.prefill_runs.advance_within(st, t, inclusive)

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

    def apply(self, st: Step) -> None:
        """Apply a finished step or run at its end."""
        if st.pre:
            self.prefill_runs.apply(st, st.k)
            return
        if st.k:
            self.decode_runs.apply(st, st.k)
            return
        log = self.log
        if not st.lazy:
            Core.apply(self, st)
            if self.lazy_ok:
                log.step_ended(st.start, st.end)
                self.decoders.step_applied(self.running)
            return
        e = st.end
        g = log.step_ended(st.start, e)
        self.n_generation += self.decoders.n_dec
        finished = self.finish_due(g, e)
        for r, n in st.sched:
            if r.status == RUNNING and self.credit(r, n, e):
                finished.append(r)
        if finished:
            self.unrun(finished)
        self.decoders.step_applied(self.running)
        self.trim()

    def drop(self, r: Req) -> None:
        """Abort a running request now (materializing it first if lazy)."""
        if r.lazy:
            self.decoders.materialize(r)
            self.decoders.delazify(r)
        Core.drop(self, r)

    # ------------------------------------------------------------ one step

    def fast_step(self, s: float) -> Step | None:
        """One step with lazy decoders; None if it would preempt (use the reference step)."""
        g = self.log.g
        bs = self.bs
        pool = self.pool
        running = self.running
        n_dec = self.decoders.n_dec
        budget = self.budget - n_dec
        free = pool.num_free - self.blocks.starting(g)
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
            self.blocks.step(g, taken)
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
                register_blocks(pool, bs, r, nc + n)
            if n == 1 and nc == ntok - 1:
                d_seq += 1
                ctx += ntok
            else:
                p_tok += n
                attn += n * (nc + n / 2)
        new_reqs = 0
        if budget > 0 and self.waiting:
            p2, d2, c2, a2, new_reqs = self.admit(s, budget, plan)
            p_tok += p2
            d_seq += d2
            ctx += c2
            attn += a2
        d_all = n_dec + d_seq
        if not d_all and not p_tok:
            st = Step(s, s, plan)
        else:
            c_all = self.decoders.s0 + n_dec * g + ctx
            dt = self.profile.step_time(p_tok, d_all, c_all, attn, new_reqs) * self.slowdown
            self.n_steps += 1
            self.n_iteration += p_tok + d_all
            self.busy += dt
            st = Step(s, s + dt, plan)
        st.lazy = True
        return st

    # ------------------------------------------------------------ shared by the runs

    def finish_due(self, g: int, e: float) -> list[Req]:
        """Finish the lazy decoders whose last token came from step ``g`` (ending at ``e``,
        seconds).

        Returns:
            The finished requests (still in ``running``; see :meth:`unrun`).
        """
        finished = self.decoders.pop_due(g)
        for r in finished:
            self.finish(r, e)
        return finished

    def unrun(self, finished: list[Req]) -> None:
        """Take finished requests out of ``running`` (order of the others kept)."""
        if len(finished) > 8:
            self.running = [r for r in self.running if r.status == RUNNING]
        else:
            for r in finished:
                self.take_out(r)

    def trim(self) -> None:
        """Drop step times no lazy decoder needs any more, once the log is long."""
        if len(self.log.ends) > _TRIM_AT:
            self.decoders.trim(self.running)

    # ------------------------------------------------------------ splitting a run

    def split(self, x: float, *, arrival: bool = False) -> None:
        """Make the state exact at time ``x``: apply a run's steps that start before ``x``
        except the last, which becomes a fast step in flight.

        With ``arrival`` (a request arrives at ``x``) a prefill run stays whole: no step of it
        can admit anything. When a prefill run's next step has not begun and starts at or
        after ``x``, the rest of the run is dropped: nothing is in progress, and the next step
        is planned afresh.

        Raises:
            RuntimeError: if the step after the applied ones does not fit (cannot happen: the
                run was planned to fit).
        """
        st = self.inflight
        if st is None or not st.k or st.end <= x:
            return
        if st.pre:
            if arrival:
                return
            if not st.begun:
                if x <= st.ts[st.j - 1]:  # nothing in progress: drop the rest of the plan
                    self.inflight = None
                    self.now = st.ts[st.j - 1]
                    return
                st.begun = True
            self.inflight = None
            start = self.prefill_runs.apply_before(st, x)
        else:
            self.inflight = None
            start = self.decode_runs.apply_before(st, x)
        self.now = start
        step = self.fast_step(start)
        if step is None:
            raise RuntimeError("a run split into a step that does not fit")
        self.inflight = step
