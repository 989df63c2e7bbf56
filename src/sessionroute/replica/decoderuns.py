"""Closed-form decode runs of the fast path (see :mod:`sessionroute.replica.fast`).

When only lazy decoders run and no waiting request can be admitted (empty queue,
``max_num_seqs`` reached or decodes use the whole budget), consecutive steps differ only in
their context: each of the ``D`` decoders adds one token a step, so step ``j`` of the run lasts
``a + c * j`` seconds with ``a = t_step(0, D, C)`` and ``c = b_kv * D`` (``shared/ENGINE.md``,
"Step time") and starts at ``s + j * a + c * j * (j - 1) / 2``. A run ends at the first
completion, the first step whose block allocations no longer fit, or the first step starting at
or after a known arrival.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessionroute.replica.steps import Step

if TYPE_CHECKING:
    from sessionroute.replica.fast import FastCore

__all__ = ["DecodeRuns", "run_start"]


def run_start(s: float, a: float, c: float, j: int) -> float:
    """Start of step ``j`` of a run that starts at ``s``: ``s + j*a + c*j*(j-1)/2`` seconds."""
    return s + j * a + c * (j * (j - 1) // 2)


class DecodeRuns:
    """Plans and applies the closed-form decode runs of ``core``.

    Args:
        core: the fast scheduler whose state the runs read and advance.
    """

    def __init__(self, core: FastCore) -> None:
        self.core = core

    def plan(self, s: float) -> Step | None:
        """A run of at least two identical decode steps starting at ``s``, or None."""
        core = self.core
        dec = core.decoders
        d = dec.n_dec
        if not d or len(core.running) != d:
            return None
        if core.waiting and d < core.max_seqs and core.budget > d:
            return None
        g = core.log.g
        rem = dec.next_due_step() - g + 1
        if rem < 2:
            return None
        bs = core.bs
        free = core.pool.num_free
        q = free // d
        extra = free - q * d
        k = rem
        if q * bs < rem:
            # every block_size steps each decoder takes one block: q whole rounds fit, then
            # the steps of the next round whose allocations fit in the rest
            m = 0
            blocks = core.blocks
            while m < bs:
                cnt = blocks.starting(g + m)
                if cnt > extra:
                    break
                extra -= cnt
                m += 1
            if q * bs + m < k:
                k = q * bs + m
        if k < 2:
            return None
        slow = core.slowdown
        a = core.profile.step_time(0, d, dec.s0 + d * g, 0.0) * slow
        c = core.profile.b_kv_s * d * slow
        if core.pending:
            arrival = core.pending[0][0]
            if run_start(s, a, c, k - 1) >= arrival:
                lo, hi = 0, k - 1  # s_lo < arrival <= s_hi
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if run_start(s, a, c, mid) < arrival:
                        lo = mid
                    else:
                        hi = mid
                k = hi
                if k < 2:
                    return None
        run = Step(s, run_start(s, a, c, k), [])
        run.k = k
        run.a = a
        run.c = c
        return run

    def apply(self, st: Step, k: int) -> None:
        """Apply the first ``k`` steps of run ``st`` (all of it or a prefix, ``1 <= k <= st.k``)."""
        core = self.core
        log = core.log
        blocks = core.blocks
        s, a, c = st.start, st.a, st.c
        g0 = log.g
        for j in range(k):
            blocks.step(g0 + j)
        log.ends += [s + (j + 1) * a + c * (j * (j + 1) // 2) for j in range(k)]
        # durations a + c*j never decrease (c >= 0): the last is the run's suffix maximum
        log.push_dur(g0 + k - 1, a + c * (k - 1))
        log.g = g0 + k
        d = core.decoders.n_dec
        end = run_start(s, a, c, k)
        core.n_generation += k * d
        core.n_iteration += k * d
        core.n_steps += k
        core.busy += end - s
        finished = core.finish_due(g0 + k - 1, end)
        if finished:
            core.unrun(finished)
        core.trim()

    def apply_before(self, st: Step, x: float) -> float:
        """Apply run ``st``'s steps that start before ``x`` except the last (none when
        ``x <= st.start``); returns the start of that last step, seconds."""
        s, a, c = st.start, st.a, st.c
        lo, hi = 0, st.k  # s_lo < x <= s_hi (or lo = 0 when x <= s)
        if s < x:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if run_start(s, a, c, mid) < x:
                    lo = mid
                else:
                    hi = mid
        if lo:
            self.apply(st, lo)
        return run_start(s, a, c, lo)
