"""``adaptive_hold``: ``adaptive_sticky`` that also holds and resumes running sessions.

Past the knee, holding only *new* sessions (``adaptive_sticky``'s rule 3) is not enough: the
sessions already running keep growing their context, the working set outgrows the KV cache,
every turn re-prefills, and throughput falls off a cliff. ThunderAgent (Dynamo's agent router,
arXiv 2602.13692) pauses whole trajectories at a KV watermark and resumes them below a lower
one. This policy adds that to ``adaptive_sticky``, whose three rules it keeps unchanged
(:mod:`~sessionroute.router.policies.adaptive_sticky`; options in
:class:`~sessionroute.router.policies._hold_config.AdaptiveHoldConfig`):

4. **Hold the next turns of running sessions past a learned ceiling.** Each worker's scraped
   gauges show *thrash* when ``waiting >= hold_waiting`` or ``kv_usage >= hold_kv`` (the
   queue and KV watermarks). Then the worker gets a *ceiling* on its working set (the
   context tokens of its pinned sessions, as ``adaptive_sticky`` counts them): ``hold_cut``
   times its present working set, lowered again the same way while thrash goes on, at most
   once per ``hold_interval_s``; scrapes showing a calm worker (``kv_usage < resume_kv``,
   fewer than ``resume_waiting`` waiting) raise it by ``hold_raise`` per interval, and it
   goes away at ``lift_pressure`` times the capacity estimate with nothing held; it is never
   cut below ``ceiling_floor`` times that estimate (0 by default). While the
   working set is above the ceiling, sessions pinned there are *held*, the newest first
   (``hold_pick``), until it is not: a held session leaves the working set and its next turn
   waits in the router core's admission queue (:meth:`AdaptiveHoldPolicy.admit` is False).
   Held sessions resume *in hold order*, each once the working set with it is at most
   ``resume_fraction`` of the ceiling (a session finishing or going idle frees room), and no
   new session is placed on a worker that holds any or is at its ceiling.
5. **Every hold is bounded.** A hold ends after ``hold_max_s``; one session is held at most
   ``hold_total_max_s`` over its life; none is held once ``hold_age_max_s`` have passed since
   its first turn was placed, and a hold in progress ends then. A rollout that finishes within
   its timeout minus ``hold_total_max_s`` when never held therefore finishes within its
   timeout: holding never times it out by itself. The drivers re-check held turns every
   ``hold_check_s`` (:attr:`~sessionroute.router.policies.Policy.admission_recheck_s`), so a
   held turn leaves at most that long after its bound. Releasing a session
   (``/finish_session``), its expiry, and its worker's removal or failure end its hold.
6. **A held turn waits at the router no longer than the engine's queue would make it wait**
   (``wait_bound``; off by default, on under a serving objective: see
   :class:`AdaptiveHoldConfig` for the trade-off). A
   held session's turn (rule 4) leaves the router once it has waited ``wait_queue_factor``
   times its worker's queueing delay: Little's law on what the router
   observes, the scraped waiting requests over the rate at which requests finish there
   (:class:`~sessionroute.router.policies._queue_delay.QueueDelay`). Why: a hold trades the
   held turn's latency for the other sessions' cache; placed instead, the turn would have
   waited in the engine's queue. Once it has waited longer at the router than that, holding
   it on makes it the slowest turn of the fleet (the latency tail becomes the router's, not
   the engines'), for a session that was admitted already. With nothing waiting in the
   engine the bound is 0 and a hold delays no turn; it still keeps the session's context out
   of the worker's working set until its turn comes, and new sessions off the worker. A new
   session's first turn (rule 3) is bounded by ``max_wait_s`` instead (``wait_bound_new``
   applies rule 6 to it too: see :class:`AdaptiveHoldConfig` for why that is off).
7. **Short sessions are not held** (``short_turns``; 0, off, by default; 3 under a serving
   objective): while the sessions that ended had fewer turns than that on average, rule 4
   holds nothing and keeps no new session off a worker; with ``short_place =
   "cache_aware_v2"`` a new session then goes where ``cache_aware_v2`` would send its first
   turn (:class:`~sessionroute.router.policies._content_placer.ContentPlacer`; the policy
   then reads prompt content, :attr:`needs_content`).
8. **A fleet past its capacity for good gives one worker up** (``overload_window_s``; off by
   default, on under a serving objective): while sessions are short, once every worker's
   queue stays long (the smallest, averaged over the window, reaches ``overload_waiting``)
   new sessions bound for a queueing worker go to a *sacrifice*, the longest queue, so the
   other workers stay inside the TTFT SLO; a sacrifice at ``sacrifice_max_delay_s`` gives up
   another (:mod:`~sessionroute.router.policies._overload`).

Deviations from ThunderAgent: the watermarks are read from the engines' scraped gauges, the
ceiling is learned per worker from them (the router's working set is an estimate of a cache
it does not see), and a session with a turn in flight may be held (its next turn waits).
:meth:`AdaptiveHoldPolicy.counters` reports holds, their time and which sessions were held.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies._hold_book import Hold, HoldBook
from sessionroute.router.policies._hold_config import AdaptiveHoldConfig
from sessionroute.router.policies._overload import Overload, waiting
from sessionroute.router.policies._queue_delay import QueueDelay
from sessionroute.router.policies._short_sessions import ShortSessions
from sessionroute.router.policies.adaptive_sticky import AdaptiveStickyPolicy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, EngineGauges, RouteRequest

__all__ = ["AdaptiveHoldConfig", "AdaptiveHoldPolicy", "Hold"]


class AdaptiveHoldPolicy(AdaptiveStickyPolicy):
    """``adaptive_sticky`` with trajectory-level hold and resume (module docstring).

    Each worker's sessions, the holds and their counters are kept in a
    :class:`~sessionroute.router.policies._hold_book.HoldBook`, rule 7's session lengths and
    placer in a :class:`~sessionroute.router.policies._short_sessions.ShortSessions`; this
    class decides.

    Attributes:
        ceiling: worker -> its working-set ceiling in tokens (absent: none).
        holds, held_sessions, released, hold_s_total, held_turns, held_turn_wait_s_total:
            the hold book's counters (:class:`HoldBook`; read-only).
        mean_turns: mean turns of the ended sessions (rule 7; None before one ended).
        cuts: times a ceiling was set or lowered.
        new_at_wait_bound: new sessions admitted because their first turn waited the
            fleet's queueing delay (``wait_bound_new``).
    """

    name: ClassVar[str] = "adaptive_hold"
    Config: ClassVar[type[Any] | None] = AdaptiveHoldConfig
    objective_options: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "serving": {
            "wait_bound": True,
            "max_wait_s": 900.0,
            "short_turns": 3.0,
            "short_place": "cache_aware_v2",
            "ceiling_floor": 0.5,
            "pack_past_knee": True,
            "knee_pressure": 0.8,
            "count_weight": 0.0,
            "overload_window_s": 120.0,
        },
    }
    """Under a serving objective: rule 6 on (it bounds the TTFT tail of the trace replays and
    costs RL step time past the knee), rule 3's wait up to 900 s (on the closed-loop Weka
    replay a longer wait keeps more SLO goodput), rule 7 with short sessions placed as
    ``cache_aware_v2`` places them, rule 4's ceilings no lower than half the capacity, a knee
    at 0.8 of the capacity with load counted in context tokens alone (``knee_pressure``,
    ``count_weight`` 0), new sessions packed when every worker is past that knee, and rule 8;
    each measured in
    docs/policies.md, "adaptive_hold: measurements"."""

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self.hcfg: AdaptiveHoldConfig = self.config
        c = self.hcfg
        self._bound_new = c.wait_bound and c.wait_bound_new
        if c.hold or self._bound_new:
            self.admission_recheck_s = c.hold_check_s
        self._delay = QueueDelay(self.hcfg.wait_rate_window_s)
        self._overload = Overload.of(c)  # rule 8 (None: off)
        self._rates = c.wait_bound or self._overload is not None  # queueing delays kept
        self._book = HoldBook()
        # rule 7 learns session lengths only while holding (hold = false: adaptive_sticky)
        self._short = ShortSessions(
            c.short_turns,
            place_by_content=c.hold and bool(c.short_turns) and c.short_place == "cache_aware_v2",
            clock=clock,
            rng=rng,
        )
        if self._short.placer is not None:
            self.needs_content = True
        self._asked: dict[str, float] = {}  # new session -> when its first turn first waited
        self._overdue: set[str] = set()  # new sessions admitted by rule 6, not yet placed
        self._changed: dict[str, float] = {}  # worker -> last change of its ceiling
        self._passed: dict[str, float] = {}  # worker -> last hold pass
        self._hseen: dict[str, EngineGauges] = {}  # worker -> gauges last adjusted on
        self.ceiling: dict[str, float] = {}
        self.table.on_drop = self._dropped
        self.cuts = 0
        self.new_at_wait_bound = 0

    # -- routing --------------------------------------------------------------------------
    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        """Route as ``adaptive_sticky``; then resume and hold on the chosen worker (rule 4).
        A turn of a session still held (placed at the router's maximum wait) ends its hold.

        Raises:
            NoWorkerAvailable: when no worker is healthy.
        """
        sid = request.session_id
        if sid is None:
            return super().select(request, cluster)
        if self._asked and self._asked.pop(sid, None) is not None and sid in self._overdue:
            self._overdue.discard(sid)
            self.new_at_wait_bound += 1
        if not self.hcfg.hold:
            return super().select(request, cluster)
        hold = self._book.get(sid)
        if hold is not None:
            self._end(hold, "placed")
        decision = super().select(request, cluster)
        now = self.clock.now()
        worker = decision.worker
        self._book.place(sid, worker, now)
        self._short.turn(sid)
        self._resume(worker, now, cluster)
        self._hold_over(worker, now)
        return decision

    def admission_applies(self, request: RouteRequest) -> bool:
        """First turns of new sessions (rule 3) and turns of held sessions (rule 4)."""
        sid = request.session_id
        return (sid is not None and sid in self._book) or super().admission_applies(request)

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        """A held session's turn is admitted once its hold ends (rules 4 to 6); a new
        session's first turn as ``adaptive_sticky`` admits it, or (``wait_bound_new``) once it
        has waited the fleet's queueing delay. Ending holds that are due and noting when a new
        session first waited are the only state it changes: asking again at the same time and
        load gives the same answer."""
        sid = request.session_id
        hold = None if sid is None else self._book.get(sid)
        if hold is None:
            admitted = super().admit(request, cluster)
            if admitted or not self._bound_new:
                return admitted
            assert sid is not None  # only a new session's first turn is held by rule 3
            now = self.clock.now()
            asked = self._asked.setdefault(sid, now)
            return self._waited_out(sid, now - asked, cluster)
        now = self.clock.now()
        if hold.asked is None:
            hold.asked = now
        self._resume(hold.worker, now, cluster)
        return sid not in self._book

    def first_admitted(self, requests: Sequence[RouteRequest], cluster: ClusterView) -> int | None:
        """:meth:`admit` over a queue: the holds due on the held requests' workers end first
        (once per worker), then the first request not held is found as ``adaptive_sticky``
        does (a turn whose hold just ended is a known session's: admitted), or, if earlier,
        the first new session that waited out rule 6's bound. Only the oldest waiting new
        session needs asking: each was first asked when it arrived (the router core asks
        :meth:`admit` before queueing it), so the queue holds them longest-waiting first."""
        holds = self._book
        if holds:
            now = self.clock.now()
            workers: dict[str, None] = {}
            for r in requests:
                hold = holds.get(r.session_id) if r.session_id is not None else None
                if hold is not None:
                    if hold.asked is None:
                        hold.asked = now
                    workers[hold.worker] = None
            for w in workers:
                self._resume(w, now, cluster)
        if holds:
            index = [i for i, r in enumerate(requests) if r.session_id not in holds]
            j = super().first_admitted([requests[i] for i in index], cluster)
            j = None if j is None else index[j]
        else:
            j = super().first_admitted(requests, cluster)
        asked = self._asked
        if not asked or not self._bound_new:
            return j
        now = self.clock.now()
        for i, r in enumerate(requests if j is None else requests[:j]):
            sid = r.session_id
            if sid is not None and sid not in holds and sid in asked:
                return i if self._waited_out(sid, now - asked[sid], cluster) else j
        return j

    def _waited_out(self, sid: str, waited: float, cluster: ClusterView) -> bool:
        """Rule 6 for a new session (``wait_bound_new``): whether its first turn, after
        ``waited`` seconds at the router, has waited ``wait_queue_factor`` times the fleet's
        queueing delay."""
        c = self.hcfg
        if not self._bound_new:
            return False
        healthy = cluster.healthy()
        for w in healthy:
            self._refresh(w, cluster)
        if waited < c.wait_queue_factor * self._delay.fleet_delay(healthy, cluster):
            return False
        self._overdue.add(sid)
        return True

    # -- rule 3, with held sessions and ceilings -------------------------------------------
    def _past_knee(self, worker: str, tokens: int = 0) -> bool:
        """Past its knee as ``adaptive_sticky`` says, or holding sessions, or at its ceiling
        with ``tokens`` more (not while sessions are short: ``short_turns``)."""
        if self._short.applies():
            return super()._past_knee(worker, tokens)
        if self._book.holding(worker):
            return True
        ceiling = self.ceiling.get(worker)
        if ceiling is not None and self._context.get(worker, 0) + tokens > ceiling:
            return True
        return super()._past_knee(worker, tokens)

    def _calm(self, worker: str, cluster: ClusterView) -> bool:
        """Never calm while it holds sessions or has a ceiling (it thrashed: its held
        sessions and its ceiling decide), unless sessions are short (``short_turns``)."""
        if not self._short.applies() and (self._book.holding(worker) or worker in self.ceiling):
            self._refresh(worker, cluster)
            return False
        return super()._calm(worker, cluster)

    def _worker_bound(self, worker: str, bound: int) -> int | None:
        """``adaptive_sticky``'s bound with :meth:`_past_knee`'s additions: a worker holding
        sessions takes none; one with a ceiling takes ``t`` only while ``context + t <=
        ceiling``, i.e. ``t < floor(ceiling) - context + 1`` (not while sessions are short:
        ``short_turns``)."""
        if self._short.applies():
            return bound
        if self._book.holding(worker):
            return None
        ceiling = self.ceiling.get(worker)
        if ceiling is None:
            return bound
        return min(bound, math.floor(ceiling) - self._context.get(worker, 0) + 1)

    # -- rule 4: ceilings, holds, resumes --------------------------------------------------
    def _refresh(self, worker: str, cluster: ClusterView) -> EngineGauges | None:
        g = super()._refresh(worker, cluster)
        if g is not None and self._hseen.get(worker) is not g:
            self._hseen[worker] = g
            if self._rates:
                self._delay.observe(worker, self.clock.now())
            if self.hcfg.hold:
                self._adjust(worker, g)
            if self._overload is not None and self._short.applies():
                self._overload.observe(self.clock.now(), waiting(cluster))
        return g

    def _redirect(
        self, healthy: tuple[str, ...], cluster: ClusterView
    ) -> Callable[[str], str] | None:
        """Rule 8, after a look at every new scrape: where a new session's first turn bound
        for a worker goes instead (None: there, outside an episode)."""
        overload = self._overload
        if overload is None:
            return None
        for w in healthy:
            self._refresh(w, cluster)
        if not overload.sacrifices:
            return None
        delays = {w: self._delay.delay(w, cluster) for w in healthy}
        return partial(overload.divert, delays=delays)

    def _adjust(self, worker: str, g: EngineGauges) -> None:
        """Set, lower, raise or lift ``worker``'s ceiling from one new scrape (rule 4)."""
        cap = self._capacity.get(worker)
        if cap is None:
            return
        c = self.hcfg
        now = self.clock.now()
        if now - self._changed.get(worker, -math.inf) < c.hold_interval_s:
            return
        ceiling = self.ceiling.get(worker)
        kv = g.kv_usage
        if kv >= c.hold_kv or (g.waiting >= c.hold_waiting and kv >= c.hold_queue_kv):
            active = float(self._context.get(worker, 0))
            base = active if ceiling is None else min(active, ceiling)
            self.ceiling[worker] = max(c.hold_cut * base, c.ceiling_floor * cap)
            self._changed[worker] = now
            self.cuts += 1
        elif ceiling is not None and g.waiting < c.resume_waiting and kv < c.resume_kv:
            ceiling *= 1.0 + c.hold_raise
            self._changed[worker] = now
            if ceiling >= c.lift_pressure * cap and not self._book.holding(worker):
                del self.ceiling[worker]
            else:
                self.ceiling[worker] = ceiling

    def _hold_over(self, worker: str, now: float) -> None:
        """Hold sessions of ``worker`` (``hold_pick`` order) while its working set is above
        its ceiling; at most one pass per ``hold_check_s``; none while sessions are short."""
        if self._short.applies():
            return
        ceiling = self.ceiling.get(worker)
        context = self._context
        if ceiling is None or context.get(worker, 0) <= ceiling:
            return
        if now - self._passed.get(worker, -math.inf) < self.hcfg.hold_check_s:
            return
        self._passed[worker] = now
        book = self._book
        members = book.members(worker)
        if not members:
            return
        ledger = self._ledger
        if self.hcfg.hold_pick == "newest":
            order: list[str] = list(reversed(members))
        else:
            order = sorted(members, key=lambda s: -self._tokens(s))
        for sid in order:
            if context.get(worker, 0) <= ceiling:
                return
            if sid in book:
                continue
            entry = ledger.get(sid)
            if entry is None or entry.worker != worker or entry.tokens <= 0:
                continue
            until = self._bound(sid, now)
            if until <= now:
                continue
            book.begin(sid, worker, entry.tokens, now, until)
            ledger.resize(entry, 0)

    def place_new(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """As ``adaptive_sticky`` (rule 1), but while sessions are short (rule 7) where
        ``cache_aware_v2`` would send the turn, with ``short_place = "cache_aware_v2"``, and
        then to the sacrifice where rule 8 says so."""
        if not self._short.applies():
            return super().place_new(request, healthy, cluster)
        redirect = self._redirect(healthy, cluster)
        placer = self._short.placer
        if placer is not None:
            return placer.place(request, cluster, redirect)
        worker = super().place_new(request, healthy, cluster)
        return worker if redirect is None else redirect(worker)

    def _tokens(self, sid: str) -> int:
        entry = self._ledger.get(sid)
        return 0 if entry is None else entry.tokens

    def _bound(self, sid: str, now: float) -> float:
        """The latest a hold of ``sid`` beginning ``now`` may end (rule 5)."""
        c = self.hcfg
        until = now + min(c.hold_max_s, c.hold_total_max_s - self._book.held_s(sid))
        born = self._book.born(sid)
        return until if born is None else min(until, born + c.hold_age_max_s)

    def _resume(self, worker: str, now: float, cluster: ClusterView) -> None:
        """End the holds on ``worker`` that are due: past their bound (any of them), those
        whose turn waited ``wait_queue_factor`` times the worker's queueing delay (rule 6),
        then the oldest ones while each fits under ``resume_fraction`` of the ceiling (all,
        when the worker has no ceiling or is not healthy, or sessions are short)."""
        queue = self._book.queue(worker)
        if not queue:
            return
        self._refresh(worker, cluster)
        for hold in [h for h in queue.values() if now >= h.until]:
            self._end(hold, "bound")
        if self.hcfg.wait_bound and queue:
            limit = self.hcfg.wait_queue_factor * self._delay.delay(worker, cluster)
            for hold in list(queue.values()):
                if hold.asked is not None and now - hold.asked >= limit:
                    self._end(hold, "waited")
        ceiling = self.ceiling.get(worker)
        free = ceiling is None or not cluster.is_healthy(worker) or self._short.applies()
        room = math.inf if free or ceiling is None else self.hcfg.resume_fraction * ceiling
        while queue:
            hold = next(iter(queue.values()))
            if self._context.get(worker, 0) + hold.tokens > room:
                return
            self._end(hold, "resumed")

    def _end(self, hold: Hold, how: str) -> None:
        """End ``hold`` (``how``: :data:`~._hold_book.ENDINGS`): its tokens count in its
        worker's working set again."""
        self._book.end(hold, how, self.clock.now())
        entry = self._ledger.get(hold.sid)
        if entry is not None and entry.worker == hold.worker and entry.tokens == 0:
            self._ledger.resize(entry, hold.tokens)

    # -- queries --------------------------------------------------------------------------
    # the hold book's counters and rule 7's mean (read-only): HoldBook, ShortSessions
    @property
    def holds(self) -> int:
        return self._book.holds

    @property
    def held_sessions(self) -> int:
        return self._book.held_sessions

    @property
    def released(self) -> dict[str, int]:
        return self._book.released

    @property
    def hold_s_total(self) -> float:
        return self._book.hold_s_total

    @property
    def held_turns(self) -> int:
        return self._book.held_turns

    @property
    def held_turn_wait_s_total(self) -> float:
        return self._book.held_turn_wait_s_total

    @property
    def mean_turns(self) -> float | None:
        return self._short.mean_turns

    def held(self) -> dict[str, Hold]:
        """Session id -> its hold, for sessions held now (a copy; holds past their bound end
        at the next check of their worker)."""
        return self._book.held()

    def held_s(self, session_id: str) -> float:
        """Seconds ``session_id`` was held in its ended holds."""
        return self._book.held_s(session_id)

    def counters(self) -> dict[str, Any]:
        """``adaptive_sticky``'s counters and rule 4's: holds, how they ended, hold time,
        held turns and their wait, ceilings, and which sessions were held (count, mean
        context and age when held, the first ids)."""
        out = super().counters()
        out.update(self._book.counters())
        out["ceiling_cuts"] = self.cuts
        out["new_at_wait_bound"] = self.new_at_wait_bound
        out.update(self._short.counters())
        if self._overload is not None:
            out.update(self._overload.counters())
        out.update(self._book.profile())
        return out

    # -- lifecycle ------------------------------------------------------------------------
    def on_complete(self, request: RouteRequest, worker: str) -> None:
        """A request finished on ``worker``: it counts in that worker's completion rate
        (rule 6, when on)."""
        if self._rates:
            self._delay.done(worker)
        self._short.on_complete(request, worker)
        super().on_complete(request, worker)

    def release_session(self, session_id: str) -> bool:
        """End its hold (it is free), then forget it as ``adaptive_sticky`` does."""
        self._gone(session_id)
        return super().release_session(session_id)

    def _dropped(self, sid: str) -> None:
        """The session table dropped ``sid`` (expired, evicted)."""
        self._gone(sid)
        self._ledger.forget(sid)

    def _gone(self, sid: str) -> None:
        """``sid`` is released or dropped: end its hold, forget what rule 4 kept of it."""
        hold = self._book.get(sid)
        if hold is not None:
            self._end(hold, "gone")
        self._book.forget(sid)
        self._short.ended(sid)
        self._asked.pop(sid, None)
        self._overdue.discard(sid)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        """Its holds end (their turns are placed again), its ceiling and lists go."""
        for hold in list((self._book.queue(worker) or {}).values()):
            self._end(hold, "gone")
        super().on_worker_removed(worker, cluster)
        self._book.remove_worker(worker)
        for d in (self.ceiling, self._changed, self._passed, self._hseen):
            d.pop(worker, None)
        self._delay.forget(worker)
        if self._overload is not None:
            self._overload.forget(worker)
        self._short.on_worker_removed(worker, cluster)

    def sweep(self, now: float, limit: int | None = None) -> int:
        """``adaptive_sticky``'s sweep, and the short-session placer's index (rule 7)."""
        self._short.sweep(now, limit)
        return super().sweep(now, limit)

    def sweep_pending(self) -> bool:
        return super().sweep_pending() or self._short.sweep_pending()

    def bound_sweeps(self, limit: int) -> None:
        super().bound_sweeps(limit)
        self._short.bound_sweeps(limit)
