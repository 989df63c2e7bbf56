"""The vLLM V1 scheduler of one replica, one engine step at a time (the reference model).

Mechanics follow vLLM ``v1/core/sched/scheduler.py`` and ``v1/core/kv_cache_manager.py`` as
restated in ``shared/ENGINE.md``: running requests first in admission order (a decoding request
takes one token, a prefilling one what it still needs, cut to the token budget); a request that
cannot get its blocks preempts the newest running request (recompute, to the front of the
waiting queue) until it fits or preempted itself; waiting requests are admitted FCFS only in a
step without preemption, while ``running < max_num_seqs`` and budget remains, stopping at the
first that does not fit. Admission looks up the prefix cache (at most ``num_tokens - 1`` tokens
hit) and registers full blocks as they are scheduled.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop

from sessionroute.replica.api import ReplicaConfig, RequestResult
from sessionroute.replica.blocks import BlockPool, KVPool
from sessionroute.replica.request import FINISHED, RUNNING, WAITING, Req
from sessionroute.replica.steps import Step

__all__ = ["Core", "register_blocks"]


def register_blocks(pool: KVPool, bs: int, r: Req, upto_tokens: int) -> None:
    """Offer ``r``'s full blocks up to ``upto_tokens`` tokens (blocks of ``bs`` tokens, those
    with a key) to ``pool``'s prefix cache; ``r.nreg`` advances."""
    full = upto_tokens // bs
    if full > r.nkeys:
        full = r.nkeys
    if full > r.nreg:
        pool.register(r, full)
        r.nreg = full


class Core:
    """Scheduler state and the one-step-per-iteration reference mechanics.

    The fast path (:class:`~sessionroute.replica.fast.FastCore`) shares this state and these
    mechanics and replaces the step hooks: :meth:`start_step`, :meth:`apply`,
    :meth:`event_time`, :meth:`advance_within`, :meth:`next_event` and :meth:`drop`.

    Args:
        config: the replica configuration.
        pool: the KV block pool with ``config.num_blocks`` blocks (default: a new per-block
            :class:`BlockPool`, the reference).
    """

    def __init__(self, config: ReplicaConfig, pool: KVPool | None = None) -> None:
        self.config = config
        self.bs = config.block_size
        self.budget = config.batched_tokens
        self.max_seqs = config.seqs
        self.profile = config.profile
        self.slowdown = config.slowdown
        self.pool: KVPool = BlockPool(config.num_blocks) if pool is None else pool
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.pending: list[tuple[float, int, Req]] = []  # heap of arrivals not yet queued
        self.seq = 0
        self.reqs: dict[str, Req] = {}
        self.inflight: Step | None = None
        self.now = float("-inf")  # end of the last applied step
        self.done: deque[RequestResult] = deque()
        # counters
        self.n_queries = 0
        self.n_hits = 0
        self.n_preemptions = 0
        self.n_prompt = 0
        self.n_generation = 0
        self.n_iteration = 0
        self.n_steps = 0
        self.busy = 0.0
        self.n_finished = 0

    # ----------------------------------------------------------------- event loop

    def next_start(self) -> float | None:
        """Start time of the next step if nothing else arrives, or None when idle."""
        if self.running or self.waiting:
            return self.now
        if self.pending:
            a = self.pending[0][0]
            return a if a > self.now else self.now
        return None

    def next_event(self, now: float) -> float | None:
        """:meth:`~sessionroute.replica.replica.Replica.next_event_time` at engine time ``now``:
        starts a step due at ``now``; returns when the engine next has something to report."""
        if self.inflight is None:
            s = self.next_start()
            if s is None:
                return None
            if s > now:
                return s
            self.run_until(s, inclusive=True)
        t = self.event_time()
        return self.next_start() if t is None else t

    def event_time(self) -> float | None:
        """When the engine next has something to report: the end of the step in flight (None
        when none is)."""
        st = self.inflight
        return None if st is None else st.end

    def current_step(self) -> Step | None:
        """The step in progress (scheduled, not yet applied), or None."""
        return self.inflight

    def run_until(self, t: float, inclusive: bool = False) -> None:
        """Apply steps ending at or before ``t``; start steps starting before ``t``.

        With ``inclusive`` a step starting exactly at ``t`` starts too.
        """
        while True:
            st = self.inflight
            if st is not None:
                if st.end > t:
                    self.advance_within(st, t, inclusive)
                    return
                self.inflight = None
                self.apply(st)
                self.now = st.end
                continue
            s = self.next_start()
            if s is None or s > t or (s == t and not inclusive):
                return
            self.start_step(s)

    def advance_within(self, st: Step, t: float, inclusive: bool) -> None:
        """Hook of :meth:`run_until` for the step in flight ``st`` that ends after ``t``:
        nothing here (one step is atomic); the fast path applies a prefill run's steps that
        end by ``t``."""

    def start_step(self, s: float) -> None:
        """Queue arrivals up to ``s`` and schedule the step starting at ``s``."""
        self.queue_arrivals(s)
        self.inflight = self.schedule(s)

    def queue_arrivals(self, s: float) -> None:
        """Move requests that arrived at or before ``s`` to the waiting queue (FCFS)."""
        pending = self.pending
        while pending and pending[0][0] <= s:
            self.waiting.append(heappop(pending)[2])

    # ----------------------------------------------------------------- mechanics

    def preempt(self, r: Req) -> None:
        """Preempt ``r`` by recompute: free its blocks, reset progress, front of the queue."""
        self.pool.release(r)
        r.nc = 0
        r.nreg = 0
        r.status = WAITING
        r.preemptions += 1
        self.n_preemptions += 1
        self.waiting.appendleft(r)

    def schedule(self, s: float) -> Step:
        """Schedule one step starting at ``s`` (vLLM ``Scheduler.schedule``)."""
        bs = self.bs
        pool = self.pool
        running = self.running
        budget = self.budget
        sched: list[tuple[Req, int]] = []
        preempted = False
        p_tok = d_seq = ctx = 0
        attn = 0.0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            ntok = r.prompt_len + r.num_output
            nc = r.nc
            n = ntok - nc
            if n > budget:
                n = budget
            need = -(-(nc + n) // bs) - r.nblocks
            if need > pool.num_free:
                while need > pool.num_free:
                    victim = running.pop()
                    self.preempt(victim)
                    preempted = True
                    if victim is r:
                        break
                if r.status != RUNNING:
                    break
            if need > 0:
                pool.grow(r, need)
            if (nc + n) // bs > r.nreg and r.nreg < r.nkeys:
                register_blocks(pool, bs, r, nc + n)
            sched.append((r, n))
            budget -= n
            i += 1
            if n == 1 and nc == ntok - 1:
                d_seq += 1
                ctx += ntok
            else:
                p_tok += n
                attn += n * (nc + n / 2)
        new_reqs = 0
        if not preempted and self.waiting:
            p2, d2, c2, a2, new_reqs = self.admit(s, budget, sched)
            p_tok += p2
            d_seq += d2
            ctx += c2
            attn += a2
        if not sched:
            return Step(s, s, sched)
        dt = self.profile.step_time(p_tok, d_seq, ctx, attn, new_reqs) * self.slowdown
        self.n_steps += 1
        self.n_iteration += p_tok + d_seq
        self.busy += dt
        return Step(s, s + dt, sched)

    def admit(
        self, s: float, budget: int, sched: list[tuple[Req, int]]
    ) -> tuple[int, int, int, float, int]:
        """Admit waiting requests FCFS into a step starting at ``s`` with ``budget`` tokens left.

        Stops at ``max_num_seqs``, an empty budget or the first request whose blocks do not fit
        (head-of-line). Appends to ``sched``; returns ``(P, D, C, A, R)`` of what it scheduled
        (``R``: requests scheduled for the first time, not re-admitted after a preemption).
        """
        bs = self.bs
        pool = self.pool
        running = self.running
        waiting = self.waiting
        p_tok = d_seq = ctx = new_reqs = 0
        attn = 0.0
        while waiting and budget > 0 and len(running) < self.max_seqs:
            w = waiting[0]
            ntok = w.prompt_len + w.num_output
            limit = (ntok - 1) // bs
            if limit > w.nkeys:
                limit = w.nkeys
            h, idle, hit = pool.lookup(w.cache, w.keys, limit)
            nc = h * bs
            n = ntok - nc
            if n > budget:
                n = budget
            new = -(-(nc + n) // bs) - h
            if new + idle > pool.num_free:
                break
            waiting.popleft()
            pool.admit(w, hit, new)
            w.nc = nc
            w.nreg = h
            w.status = RUNNING
            self.seq += 1
            w.order = self.seq
            running.append(w)
            register_blocks(pool, bs, w, nc + n)
            if w.cached_tokens < 0:
                new_reqs += 1
                w.cached_tokens = nc
                w.first_sched = s
                self.n_queries += ntok
                self.n_hits += nc
            sched.append((w, n))
            budget -= n
            if n == 1 and nc == ntok - 1:
                d_seq += 1
                ctx += ntok
            else:
                p_tok += n
                attn += n * (nc + n / 2)
        return p_tok, d_seq, ctx, attn, new_reqs

    def apply(self, st: Step) -> None:
        """Apply a finished single step at its end (vLLM ``update_from_output``)."""
        e = st.end
        finished = False
        for r, n in st.sched:
            if r.status != RUNNING:
                continue  # aborted while the step was in flight
            if self.credit(r, n, e):
                finished = True
        if finished:
            self.running = [r for r in self.running if r.status == RUNNING]

    def credit(self, r: Req, n: int, e: float) -> bool:
        """Credit ``n`` computed tokens to ``r`` at step end ``e`` (seconds); a request whose
        computed tokens reach prompt + output so far emits a token. True when ``r`` finished."""
        r.nc += n
        if r.nc != r.prompt_len + r.num_output:
            return False
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
            return True
        return False

    def drop(self, r: Req) -> None:
        """Abort a running request now: out of ``running``, blocks freed."""
        self.take_out(r)
        self.pool.release(r)

    def take_out(self, r: Req) -> None:
        """Remove ``r`` from ``running``, the others' order kept.

        ``running`` is in admission order, i.e. ascending :attr:`Req.order` (admissions append,
        preemptions pop the end, finishes filter), so ``r`` is found by bisection rather than
        by comparing it with every running request.

        Raises:
            RuntimeError: if ``r`` is not in ``running`` (cannot happen).
        """
        running = self.running
        order = r.order
        lo = 0
        hi = len(running)
        while lo < hi:  # bisect_left on .order
            mid = (lo + hi) >> 1
            m: Req = running[mid]
            if m.order < order:
                lo = mid + 1
            else:
                hi = mid
        i = lo
        if i == len(running) or running[i] is not r:
            raise RuntimeError(f"{r.rid} is not running")
        del running[i]

    def finish(self, r: Req, e: float) -> None:
        """Mark ``r`` finished at ``e``, free its blocks and buffer its result.

        The caller removes it from ``running``.
        """
        r.status = FINISHED
        self.pool.release(r)
        del self.reqs[r.rid]
        self.n_finished += 1
        self.done.append(r.result(e))
