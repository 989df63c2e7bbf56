"""``adaptive_sticky``: token-aware sticky placement, a gated overload escape, and admission.

A session-keeping policy (the lifecycle of :class:`~._sessions.SessionPolicy`: TTL, sweeps,
re-pin after a failure or removal) with three rules of its own (issue 18; the measurements
behind every default are in :class:`AdaptiveStickyConfig` and ``docs/policies.md``):

1. **Placement by token load, with herd protection.** A new session goes to the healthy worker
   with the least estimated load in tokens (:meth:`AdaptiveStickyPolicy.load`): the context
   of the sessions pinned there (each session's latest prompt estimate,
   ``RouteRequest.prompt_tokens``), half as it is and half as their count times the mean
   context (``count_weight``), plus the router's in-flight prompt tokens. The session's own
   estimate is added to its worker's load in the same call (a reservation), so a burst of
   first turns (a GRPO group of 16) spreads instead of landing on the momentarily lightest
   worker. Workers past their knee (rule 3) are skipped
   while another worker is not; when every one is, ``pack_past_knee`` (off by default)
   picks the *most* loaded instead: the excess then thrashes one cache, not all of them.
   Ties go to the highest rendezvous hash of (session id, worker), as
   ``sticky_least_loaded``.
2. **Stay, unless a gated escape fires.** Later turns stay on their worker. A worker becomes
   *hot* when its scraped gauges show ``kv_usage >= escape_kv`` and ``waiting >=
   escape_waiting``, and stays hot until ``kv_usage < cool_kv`` or ``waiting < cool_waiting``
   (hysteresis). A turn of a session on a hot worker moves when (a) the session is cheap to
   move, its context at most ``move_context_factor`` times the mean context on that worker
   (the shortest contexts move first, re-prefilling the least), (b) the session has not moved
   in the last ``session_cooldown_s``, (c) no session left that worker in the last
   ``move_interval_s`` (gauges are ~1 s stale: moves are paced, not herded), and (d) a clearly
   less loaded target exists: a healthy, not hot worker with ``kv_usage < target_kv`` and at
   most ``target_waiting`` waiting, and room under its knee (rule 3) with the session; the
   least token-loaded such target wins. The same move is allowed off a worker that
   *overflows*: its pinned sessions' present context reaches ``overflow_pressure`` times its
   estimated KV capacity while at least ``overflow_waiting`` requests wait there. Its cache
   cannot hold its sessions between turns, so their turns re-prefill anyway and a move costs
   little; this is what rebalances sessions left behind when others finish (a trace's tail),
   where the gauges' KV gate rarely fires. A move is a
   :attr:`~sessionroute.types.DecisionKind.MOVED` decision, counted in
   :attr:`AdaptiveStickyPolicy.moves` (those off an overflowing, not hot, worker also in
   :attr:`AdaptiveStickyPolicy.overflow_moves`) and, like other policies' turns moved, in the
   session stats' ``repinned``.
3. **Admission for new sessions.** A worker is *past its knee* when its pinned sessions'
   context tokens reach ``knee_pressure`` times its estimated KV capacity: the working set no
   longer fits, so the prefix cache evicts sessions between turns and every turn re-prefills.
   The capacity is learned from the gauges, as a moving average of the router's in-flight
   tokens that are running (``in_flight_tokens * running / (running + waiting)``) over
   ``kv_usage``. A new session's first turn is held in the router core's admission queue while
   every healthy worker would be past its knee with it; it is placed, oldest first, as soon as
   one is not (a session finishing or going idle frees its context), and placed anyway after
   ``max_wait_s`` (:attr:`places_at_max_wait`). The projection is a forecast: a worker whose
   scraped gauges showed no thrash (``waiting >= overflow_waiting`` or ``kv_usage >=
   escape_kv``) in the last ``thrash_gate_s`` seconds still admits (:meth:`_calm`). Turns of
   running sessions and requests without a session are never held
   (:meth:`AdaptiveStickyPolicy.admission_applies`).

Without gauges (none scraped yet, or ``scrape_interval_s = None``) rules 2 and 3 never fire and
the policy is token-balanced sticky placement. Requests without a session go to the worker
with the fewest in-flight prompt tokens, ties by rendezvous on the request id.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies._adaptive_config import AdaptiveStickyConfig
from sessionroute.router.policies._context_ledger import ContextLedger, LedgerEntry
from sessionroute.router.policies._gauge_signals import GaugeSignals
from sessionroute.router.policies._rendezvous import rendezvous_winner
from sessionroute.router.policies._sessions import SessionPolicy
from sessionroute.router.policies.base import require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, EngineGauges, RouteRequest

__all__ = ["AdaptiveStickyConfig", "AdaptiveStickyPolicy"]


class AdaptiveStickyPolicy(SessionPolicy):
    """Token-aware sticky placement with a gated escape and admission (module docstring).

    What it reads from the gauges (hot flags, last thrash, KV capacity) is kept in a
    :class:`~sessionroute.router.policies._gauge_signals.GaugeSignals`.

    Attributes:
        moves: turns moved off a hot or overflowing worker (``moved`` decisions).
        overflow_moves: of those, turns moved off an overflowing worker that was not hot.
        hot_episodes: times a worker turned hot (read-only).
        knee_skips: new sessions placed away from a worker past its knee (another was not).
    """

    name: ClassVar[str] = "adaptive_sticky"
    Config: ClassVar[type[Any] | None] = AdaptiveStickyConfig
    places_at_max_wait: ClassVar[bool] = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self.cfg: AdaptiveStickyConfig = self.config
        # pinned sessions' context tokens per worker; the table tells it what it drops itself
        self._ledger = ContextLedger()
        self._context = self._ledger.context  # read-only alias: worker -> context tokens
        self.table.on_drop = self._ledger.forget
        self._idle_more = False  # the last limited sweep left idle sessions still counted
        self._signals = GaugeSignals(self.cfg, clock)
        self._capacity = self._signals.capacity  # read-only alias: worker -> KV tokens
        self._final = 0.0  # moving average of finished sessions' last context, tokens
        self._last_move: dict[str, float] = {}  # worker -> time of the last move off it
        self._moved = DecisionKind.MOVED
        self.moves = 0
        self.overflow_moves = 0
        self.knee_skips = 0

    @property
    def hot_episodes(self) -> int:
        return self._signals.hot_episodes

    # -- the three rules ----------------------------------------------------------------------
    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        """Route one request (module docstring); pins, moves and reserves in this call.

        Raises:
            NoWorkerAvailable: when no worker is healthy.
        """
        sid = request.session_id
        if sid is None:
            return super().select(request, cluster)
        healthy = require_healthy(cluster)
        now = self.clock.now()
        self._maybe_sweep(now)
        table = self.table
        worker = table.lookup(sid, now)
        ledger = self._ledger
        if worker is None or not cluster.is_healthy(worker):
            decision = super().select(request, cluster)  # new or re-pinned: place_new
            ledger.track(sid, decision.worker, request.prompt_tokens, now)
            return decision
        sess = ledger.get(sid)
        if sess is None or sess.worker != worker:  # pinned before we tracked it (defensive)
            sess = ledger.track(sid, worker, request.prompt_tokens, now)
        else:
            ledger.turn(sid, sess, request.prompt_tokens, now)
        hot = self._is_hot(worker, cluster)
        if hot or self._overflowing(worker, cluster):
            target = self._escape(sess, worker, now, healthy, cluster)
            if target is not None:
                table.pin(sid, target, now)
                ledger.move(sess, target, now)
                self._last_move[worker] = now
                self.moves += 1
                if not hot:
                    self.overflow_moves += 1
                table.stats.repinned += 1  # a turn moved, as other policies' re-pins
                return Decision(target, self._moved)
        table.touch(sid, now)
        table.stats.sticky += 1
        return self._sticky(worker)

    def place_new(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The least token-loaded worker not past its knee (any, when all are; the most
        loaded with ``pack_past_knee`` when every one is beyond its knee), ties by
        rendezvous on the session id."""
        for w in healthy:
            self._refresh(w, cluster)
        open_ = [w for w in healthy if not self._past_knee(w, request.prompt_tokens)]
        if open_ and len(open_) < len(healthy):
            self.knee_skips += 1
        if (
            not open_
            and self.cfg.pack_past_knee
            and all(self.beyond_knee(w, request.prompt_tokens) for w in healthy)
        ):
            return self._least_loaded(list(healthy), cluster, request.session_id or "", most=True)
        return self._least_loaded(open_ or list(healthy), cluster, request.session_id or "")

    def place_stateless(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The fewest in-flight prompt tokens, ties by rendezvous on the request id."""
        tokens = cluster.in_flight_tokens
        best = min(tokens(w) for w in healthy)
        tied = [w for w in healthy if tokens(w) == best]
        return tied[0] if len(tied) == 1 else rendezvous_winner(request.request_id or "", tied)

    def admission_applies(self, request: RouteRequest) -> bool:
        """Only first turns of new sessions are ever held (rule 3)."""
        sid = request.session_id
        return self.cfg.admission and sid is not None and sid not in self.table

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        """A new session is admitted while some healthy worker is below its knee (or has no
        gauges) or calm (:meth:`_calm`); turns of known sessions and stateless requests always
        are."""
        if not self.admission_applies(request):
            return True
        healthy = cluster.healthy()
        tokens = request.prompt_tokens
        return not healthy or any(
            not self._past_knee(w, tokens) or self._calm(w, cluster) for w in healthy
        )

    def _calm(self, worker: str, cluster: ClusterView) -> bool:
        """With ``thrash_gate_s``: the worker showed no thrash (waiting >= overflow_waiting
        or kv_usage >= escape_kv) in its scrapes of the last ``thrash_gate_s`` seconds."""
        gate = self.cfg.thrash_gate_s
        if gate <= 0:
            return False
        self._refresh(worker, cluster)
        return self.clock.now() - self._signals.last_thrash(worker) >= gate

    def first_admitted(self, requests: Sequence[RouteRequest], cluster: ClusterView) -> int | None:
        """:meth:`admit` for a queue of requests, in closed form: a worker takes one more
        session of ``t > 0`` tokens unless it is past its knee with it (:meth:`_past_knee`),
        i.e. while ``n * final < knee`` and ``context + t < knee``, where ``n`` counts the
        session, ``knee = knee_pressure * capacity``, and ``context + t`` is an int, so it is
        below ``knee`` exactly when ``t < ceil(knee) - context``. The largest such bound over
        the healthy workers is computed once; each request is then one comparison. While
        some healthy worker is calm (:meth:`_calm`) there is no bound. Same answers as
        :meth:`admit` (``tests/sim/test_sim_adaptive_sticky.py``)."""
        healthy = cluster.healthy()
        if not healthy:
            return 0 if requests else None
        calm = any(self._calm(w, cluster) for w in healthy)
        limit = None if calm else self._admit_limit(healthy)
        applies = self.admission_applies
        for i, request in enumerate(requests):
            t = request.prompt_tokens
            if t <= 0:  # projected without a session (`_past_knee`): no closed form, ask
                if self.admit(request, cluster):
                    return i
            elif not applies(request) or limit is None or t < limit:
                return i
        return None

    def _admit_limit(self, healthy: Sequence[str]) -> int | None:
        """The bound of :meth:`first_admitted`: a first turn of ``t > 0`` tokens is admitted
        exactly when ``t`` is below it; None when some healthy worker has no capacity estimate
        (it is never past its knee)."""
        kp = self.cfg.knee_pressure
        count = self.table.count
        final = self._final
        context = self._context
        best: int | None = None
        for w in healthy:
            cap = self._capacity.get(w)
            if cap is None:
                return None
            knee = kp * cap
            if (count(w) + 1) * final >= knee:
                continue
            bound = self._worker_bound(w, math.ceil(knee) - context.get(w, 0))
            if bound is not None and (best is None or bound > best):
                best = bound
        return 0 if best is None else best

    def _worker_bound(self, worker: str, bound: int) -> int | None:
        """``worker``'s part of :meth:`_admit_limit`: it takes a first turn of ``t`` tokens
        when ``t < bound`` (``bound``: its knee less its context), or None when it takes none;
        a subclass that adds to :meth:`_past_knee` narrows it here."""
        return bound

    def admission_max_wait_s(self) -> float | None:
        """``max_wait_s``: then the held session is placed anyway (:attr:`places_at_max_wait`)."""
        return self.cfg.max_wait_s

    # -- signals ------------------------------------------------------------------------------
    def load(self, worker: str, cluster: ClusterView) -> float:
        """Estimated token load of ``worker``: ``(1 - count_weight)`` times its pinned
        sessions' context tokens plus ``count_weight`` times its pinned sessions counted at the
        mean context over all workers (what they will grow to), plus ``inflight_weight`` times
        the router's in-flight prompt tokens."""
        c = self.cfg
        table = self.table
        n = len(table)
        mean = self._ledger.total / n if n else 0.0
        return (
            (1.0 - c.count_weight) * self._context.get(worker, 0)
            + c.count_weight * table.count(worker) * mean
            + c.inflight_weight * cluster.in_flight_tokens(worker)
        )

    def _least_loaded(
        self, candidates: list[str], cluster: ClusterView, key: str, most: bool = False
    ) -> str:
        """The candidate of least :meth:`load` (``most``: of most), ties by rendezvous on
        ``key``."""
        loads = [self.load(w, cluster) for w in candidates]
        best = max(loads) if most else min(loads)
        tied = [w for w, v in zip(candidates, loads, strict=True) if v == best]
        return tied[0] if len(tied) == 1 else rendezvous_winner(key, tied)

    def _refresh(self, worker: str, cluster: ClusterView) -> EngineGauges | None:
        """The worker's gauges; on a new scrape, its signals are re-evaluated
        (:meth:`GaugeSignals.refresh`). A subclass adds what it derives from a new scrape."""
        return self._signals.refresh(worker, cluster)

    def _is_hot(self, worker: str, cluster: ClusterView) -> bool:
        self._refresh(worker, cluster)
        return self._signals.hot(worker)

    def projected(self, worker: str, tokens: int = 0, sessions: int = 0) -> float:
        """The working set ``worker``'s pinned sessions grow to, in tokens: their context now,
        or their count times the mean final context of finished sessions, whichever is larger
        (with ``sessions`` more sessions of ``tokens`` more context)."""
        n = self.table.count(worker) + sessions
        return max(self._context.get(worker, 0) + tokens, n * self._final)

    def _past_knee(self, worker: str, tokens: int = 0) -> bool:
        """Whether ``worker`` takes no new session of ``tokens`` (:meth:`beyond_knee`; a
        subclass adds its own reasons)."""
        return self.beyond_knee(worker, tokens)

    def beyond_knee(self, worker: str, tokens: int = 0) -> bool:
        """Whether ``worker``'s projected working set, with one more session of ``tokens``,
        reaches ``knee_pressure`` times its estimated KV capacity (never before a capacity
        estimate exists)."""
        cap = self._capacity.get(worker)
        return cap is not None and self.projected(worker, tokens, 1 if tokens else 0) >= (
            self.cfg.knee_pressure * cap
        )

    def _overflowing(self, worker: str, cluster: ClusterView) -> bool:
        """Whether ``worker``'s pinned sessions' context tokens now reach ``overflow_pressure``
        times its estimated KV capacity while its gauges show at least ``overflow_waiting``
        requests waiting (never before a capacity estimate and gauges exist)."""
        cap = self._capacity.get(worker)
        g = cluster.gauges(worker)
        c = self.cfg
        return (
            cap is not None
            and g is not None
            and g.waiting >= c.overflow_waiting
            and self._context.get(worker, 0) >= c.overflow_pressure * cap
        )

    def pressure(self, worker: str) -> float | None:
        """Projected working set over estimated KV capacity, or None before an estimate."""
        cap = self._capacity.get(worker)
        return None if cap is None else self.projected(worker) / cap

    def _escape(
        self,
        sess: LedgerEntry,
        worker: str,
        now: float,
        healthy: tuple[str, ...],
        cluster: ClusterView,
    ) -> str | None:
        """The target of a move for ``sess`` off hot ``worker``, or None (stay)."""
        c = self.cfg
        if now - self._last_move.get(worker, -math.inf) < c.move_interval_s:
            return None
        if now - sess.moved_at < c.session_cooldown_s:
            return None
        count = self.table.count(worker)
        if count and sess.tokens > c.move_context_factor * self._context.get(worker, 0) / count:
            return None
        best: str | None = None
        best_load = math.inf
        for t in healthy:
            if t == worker:
                continue
            g = self._refresh(t, cluster)
            if g is None or self._signals.hot(t):
                continue
            if g.kv_usage >= c.target_kv or g.waiting > c.target_waiting:
                continue
            if self._past_knee(t, sess.tokens):
                continue
            load = self.load(t, cluster)
            if load < best_load:
                best, best_load = t, load
        return best

    def release_session(self, session_id: str) -> bool:
        """Forget a finished session; its last context feeds the mean final context (a moving
        average, weight ``final_alpha``)."""
        sess = self._ledger.get(session_id)
        if sess is not None and sess.tokens > 0:
            a = self.cfg.final_alpha
            self._final = (
                sess.tokens if self._final == 0 else self._final + a * (sess.tokens - self._final)
            )
        self._ledger.forget(session_id)
        return super().release_session(session_id)

    def sweep(self, now: float, limit: int | None = None) -> int:
        """Expire idle sessions (the table drops them and tells the ledger, ``on_drop``) and
        stop counting sessions idle for ``working_set_idle_s`` (counted again on their next
        turn): work in proportion to the sessions concerned, at most ``limit`` of each per
        call (:meth:`sweep_pending` says when idle ones are left)."""
        n = super().sweep(now, limit)
        self._idle_more = self._ledger.idle_pass(now - self.cfg.working_set_idle_s, limit)
        return n

    def sweep_pending(self) -> bool:
        return self._idle_more

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        """O(1): the table's pins and the ledger's entries of ``worker`` go stale."""
        super().on_worker_removed(worker, cluster)
        self._ledger.remove_worker(worker)
        self._signals.forget(worker)
        self._last_move.pop(worker, None)

    def counters(self) -> dict[str, Any]:
        """Moves (of them off an overflowing worker), hot episodes and knee skips."""
        return {
            "moves": self.moves,
            "overflow_moves": self.overflow_moves,
            "hot_episodes": self.hot_episodes,
            "knee_skips": self.knee_skips,
        }

    def context_tokens(self) -> dict[str, int]:
        """Worker -> context tokens of its pinned sessions (a copy; for metrics and tests)."""
        return dict(self._context)
