"""``adaptive_sticky``: exact sequences of each rule (placement, escape, admission)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.policies import create_policy
from sessionroute.router.policies._rendezvous import rendezvous_winner
from sessionroute.router.policies.adaptive_sticky import (
    AdaptiveStickyConfig,
    AdaptiveStickyPolicy,
)
from sessionroute.router.state import Cluster
from sessionroute.types import DecisionKind, EngineGauges, RouteRequest

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"
W = (A, B, C)
COOL = EngineGauges(running=10, waiting=0, kv_usage=0.5)
HOT = EngineGauges(running=100, waiting=10, kv_usage=0.95)


def _core(
    workers: tuple[str, ...] = W, clock: ManualClock | None = None, **options: Any
) -> tuple[RoutingCore, AdaptiveStickyPolicy, ManualClock]:
    clock = clock if clock is not None else ManualClock()
    policy = AdaptiveStickyPolicy(
        AdaptiveStickyConfig(**options), clock=clock, rng=random.Random(0)
    )
    core = RoutingCore(policy, Cluster(list(workers)), RouterConfig(), log=[])
    return core, policy, clock


def _req(sid: str | None, tokens: int = 8000, rid: str = "r") -> RouteRequest:
    return RouteRequest(session_id=sid, prompt_tokens=tokens, request_id=rid)


def _turn(core: RoutingCore, sid: str, tokens: int = 8000) -> Reservation:
    """One whole turn: placed and completed."""
    res = core.route(_req(sid, tokens))
    core.complete(res)
    return res


def _gauges(core: RoutingCore, **by_worker: EngineGauges) -> None:
    """A new scrape: every worker gets a fresh gauges object (COOL unless named a/b/c)."""
    names = {"a": A, "b": B, "c": C}
    for key, url in names.items():
        if url in core.cluster:
            g = by_worker.get(key, COOL)
            core.cluster.set_gauges(url, EngineGauges(g.running, g.waiting, g.kv_usage))


# -- rule 1: placement by token load, reservation, rendezvous ties ----------------------------


def test_a_grpo_burst_of_first_turns_spreads_over_the_workers() -> None:
    core, policy, _ = _core()
    held = [core.route(_req(f"g-{i}", 7500)) for i in range(16)]  # all in flight at once
    workers = [r.worker for r in held]
    for k in range(0, 15, 3):  # every round of three covers the three workers
        assert sorted(workers[k : k + 3]) == sorted(W)
    assert sorted(workers.count(w) for w in W) == [5, 5, 6]
    assert policy.context_tokens() == {w: 7500 * workers.count(w) for w in W}


def test_new_sessions_go_to_the_least_token_load_with_pinned_contexts_counted() -> None:
    core, policy, _ = _core()
    big = _turn(core, "big", 30_000).worker  # completed: only its pinned context remains
    rest = sorted(set(W) - {big})
    seq = [_turn(core, f"s{i}", 10_000).worker for i in range(6)]
    # The other two workers fill up to 30k (three 10k sessions each) before "big"'s worker
    # takes anything: 0/0 -> 10/10 -> 20/20 -> 30/30, each pair in either order.
    assert sorted(seq[0:2]) == sorted(seq[2:4]) == sorted(seq[4:6]) == rest
    assert policy.context_tokens() == {big: 30_000, rest[0]: 30_000, rest[1]: 30_000}
    # A three-way tie: the rendezvous winner of the session id among all three.
    assert _turn(core, "s6", 10_000).worker == rendezvous_winner("s6", list(W))


def test_ties_go_to_the_rendezvous_winner_like_sticky_least_loaded() -> None:
    for i in range(20):
        core, _, _ = _core()
        sll = create_policy("sticky_least_loaded", clock=ManualClock(), seed=0)
        sid = f"rollout-{i}"
        expected = sll.select(_req(sid), Cluster(list(W))).worker
        assert core.route(_req(sid)).worker == expected == rendezvous_winner(sid, list(W))


def test_later_turns_stay_and_their_context_grows_the_load() -> None:
    core, policy, _ = _core()
    w = _turn(core, "s", 8000).worker
    for tokens in (9000, 12_000, 20_000):
        res = _turn(core, "s", tokens)
        assert (res.worker, res.kind) == (w, DecisionKind.STICKY)
    assert policy.context_tokens() == {w: 20_000}
    assert core.finish_session("s") and policy.context_tokens() == {}


def test_requests_without_a_session_go_to_the_fewest_in_flight_tokens() -> None:
    core, policy, _ = _core()
    a = core.route(_req(None, 5000, "x1"))
    b = core.route(_req(None, 3000, "x2"))
    c = core.route(_req(None, 1000, "x3"))
    assert len({a.worker, b.worker, c.worker}) == 3
    assert core.route(_req(None, 10, "x4")).worker == c.worker  # 1000 is the least
    assert policy.context_tokens() == {} and policy.session_counts() == {}


# -- rule 2: the gated escape --------------------------------------------------------------


def _pinned(core: RoutingCore, n: int, tokens: int = 8000) -> dict[str, str]:
    return {f"s{i}": _turn(core, f"s{i}", tokens).worker for i in range(n)}


def test_a_turn_on_a_hot_worker_moves_to_the_least_loaded_cool_target() -> None:
    core, policy, clock = _core()
    pins = _pinned(core, 6)  # two per worker
    on_a = [s for s, w in pins.items() if w == A]
    _gauges(core, a=HOT)
    res = _turn(core, on_a[0])
    assert res.kind is DecisionKind.MOVED and res.worker in (B, C)
    assert policy.moves == 1 and core.decisions[DecisionKind.MOVED] == 1
    assert policy.worker_of(on_a[0]) == res.worker
    assert policy.context_tokens()[A] == 8000 and policy.context_tokens()[res.worker] == 24_000
    # The next turn of the moved session stays on its new worker.
    assert _turn(core, on_a[0]).kind is DecisionKind.STICKY
    # A second move off A waits for move_interval_s (gauges are stale).
    assert _turn(core, on_a[1]).kind is DecisionKind.STICKY
    clock.advance(policy.cfg.move_interval_s)
    moved = _turn(core, on_a[1])
    assert moved.kind is DecisionKind.MOVED and moved.worker != res.worker  # least loaded
    assert policy.session_stats().repinned == 2


def test_no_move_without_a_clearly_less_loaded_target() -> None:
    core, policy, _ = _core()
    pins = _pinned(core, 6)
    s = next(s for s, w in pins.items() if w == A)
    warm = EngineGauges(50, 0, 0.8)  # KV above target_kv (0.75)
    queued = EngineGauges(50, 1, 0.5)  # one waiting (> target_waiting 0)
    _gauges(core, a=HOT, b=warm, c=queued)
    assert _turn(core, s).kind is DecisionKind.STICKY
    _gauges(core, a=HOT, b=HOT, c=HOT)
    assert _turn(core, s).kind is DecisionKind.STICKY
    assert policy.moves == 0


def test_the_gate_needs_both_kv_and_queue() -> None:
    core, policy, _ = _core()
    pins = _pinned(core, 6)
    s = next(s for s, w in pins.items() if w == A)
    _gauges(core, a=EngineGauges(100, 50, 0.89))  # long queue, KV below 0.9
    assert _turn(core, s).kind is DecisionKind.STICKY
    _gauges(core, a=EngineGauges(100, 7, 0.99))  # full KV, 7 < 8 waiting
    assert _turn(core, s).kind is DecisionKind.STICKY
    assert policy.hot_episodes == 0


def test_hysteresis_a_hot_worker_stays_hot_until_it_cools() -> None:
    core, policy, _ = _core(move_interval_s=0.0)
    pins = _pinned(core, 30)
    on_a = iter(s for s, w in pins.items() if w == A)

    def turn() -> DecisionKind:
        return _turn(core, next(on_a)).kind

    assert turn() is DecisionKind.STICKY  # no gauges yet
    _gauges(core, a=EngineGauges(100, 4, 0.88))  # below the gate: stays
    assert turn() is DecisionKind.STICKY
    _gauges(core, a=HOT)
    assert turn() is DecisionKind.MOVED
    _gauges(core, a=EngineGauges(100, 4, 0.88))  # below the gate, above cool (0.85, 2)
    assert turn() is DecisionKind.MOVED
    _gauges(core, a=EngineGauges(100, 4, 0.84))  # cooled
    assert turn() is DecisionKind.STICKY
    _gauges(core, a=EngineGauges(100, 4, 0.88))  # must pass the gate again
    assert turn() is DecisionKind.STICKY
    assert policy.hot_episodes == 1 and policy.moves == 2


def test_the_cheapest_sessions_move_first() -> None:
    core, policy, _ = _core(workers=(A, B))
    # Pin three sessions to one worker by placing them while the other holds a huge session.
    busy = _turn(core, "huge", 1_000_000).worker
    small = [_turn(core, f"k{i}", t) for i, t in enumerate((2000, 5000, 14_000))]
    (home,) = {r.worker for r in small}
    assert home != busy
    core.finish_session("huge")  # the other worker is empty now
    _gauges(core, **{("a" if home == A else "b"): HOT})
    mean = (2000 + 5000 + 14_000) / 3  # 7000
    assert _turn(core, "k2", 14_000).kind is DecisionKind.STICKY  # 14k > mean: stays
    assert _turn(core, "k0", 2000).kind is DecisionKind.MOVED  # 2k <= mean: moves
    assert policy.moves == 1 and mean == 7000


def test_a_moved_session_cools_down_before_it_may_move_again() -> None:
    core, policy, clock = _core(workers=(A, B), move_interval_s=0.0)
    _pinned(core, 4)
    s = next(sid for sid in ("s0", "s1", "s2", "s3") if policy.worker_of(sid) == A)
    _gauges(core, a=HOT, b=COOL)
    assert _turn(core, s).worker == B
    _gauges(core, a=COOL, b=HOT)  # now B is the hot one
    assert _turn(core, s).kind is DecisionKind.STICKY  # within session_cooldown_s
    clock.advance(policy.cfg.session_cooldown_s)
    _gauges(core, a=COOL, b=HOT)
    res = _turn(core, s)
    assert (res.kind, res.worker) == (DecisionKind.MOVED, A)


# -- rule 3: admission of new sessions ----------------------------------------------------


PAST_KNEE = EngineGauges(100, 2, 0.95)


def test_new_sessions_wait_when_every_worker_is_past_its_knee_running_ones_never() -> None:
    core, _, _ = _core()
    pins = _pinned(core, 3)
    _gauges(core, a=PAST_KNEE, b=PAST_KNEE, c=PAST_KNEE)
    ready: list[Ticket] = []
    t1 = core.place(_req("new-1"), ready.append)
    t2 = core.place(_req("new-2"), ready.append)
    assert isinstance(t1, Ticket) and isinstance(t2, Ticket) and len(core.admission) == 2
    # A running session's turn is routed at once, ahead of the waiting new sessions.
    running = core.place(_req("s0"), ready.append)
    assert isinstance(running, Reservation) and running.worker == pins["s0"]
    assert isinstance(core.place(_req(None, rid="x"), ready.append), Reservation)
    # One worker falls below its knee: the next completion places the queue, oldest first.
    _gauges(core, a=PAST_KNEE, b=EngineGauges(80, 0, 0.7), c=PAST_KNEE)
    core.complete(running)
    assert ready == [t1, t2]
    assert t1.reservation is not None and t1.reservation.worker == B
    assert core.admission.admitted_after_wait == 2 and core.admission.placed_at_deadline == 0


def test_a_new_session_is_placed_anyway_at_its_maximum_wait() -> None:
    clock = ManualClock()
    core, _, _ = _core(clock=clock)
    _pinned(core, 3)
    _gauges(core, a=PAST_KNEE, b=PAST_KNEE, c=PAST_KNEE)
    ready: list[Ticket] = []
    t = core.place(_req("late"), ready.append)
    assert isinstance(t, Ticket)
    clock.advance(core.config.admission_max_wait_s)
    assert core.withdraw(t) is None  # the deadline places it, no 503
    assert ready == [t] and t.reservation is not None and not t.waiting
    q = core.admission
    assert (q.placed_at_deadline, q.admitted_after_wait, q.refused_timeout) == (1, 1, 0)
    assert q.wait_s_total == core.config.admission_max_wait_s
    assert core.withdraw(t) is None and q.placed_at_deadline == 1  # once


def test_near_the_knee_a_worker_takes_a_bounded_burst_per_scrape() -> None:
    core, _, _ = _core(knee_burst=2)
    near = EngineGauges(100, 0, 0.92)  # KV at the knee, nothing waiting yet
    _gauges(core, a=near, b=near, c=near)
    placed = [core.place(_req(f"n{i}"), lambda t: None) for i in range(7)]
    workers = [p.worker for p in placed if isinstance(p, Reservation)]
    assert sorted(workers.count(w) for w in W) == [2, 2, 2]  # 2 per worker, then held
    assert isinstance(placed[-1], Ticket)
    _gauges(core, a=near, b=near, c=near)  # a new scrape resets the burst
    assert isinstance(core.place(_req(None, rid="x"), lambda t: None), Reservation)
    assert len(core.admission) == 0  # the waiting one was placed first


def test_without_admission_new_sessions_go_to_the_least_loaded_worker() -> None:
    core, _, _ = _core(admission=False)
    _gauges(core, a=PAST_KNEE, b=PAST_KNEE, c=PAST_KNEE)
    assert isinstance(core.place(_req("n"), lambda t: None), Reservation)


def test_placement_skips_workers_past_their_knee() -> None:
    core, policy, _ = _core()
    _gauges(core, a=PAST_KNEE, b=PAST_KNEE, c=COOL)
    assert {_turn(core, f"n{i}").worker for i in range(5)} == {C}
    assert policy.knee_skips == 5


# -- lifecycle, options ---------------------------------------------------------------------


def test_expired_and_removed_sessions_leave_the_load() -> None:
    clock = ManualClock()
    core, policy, _ = _core(clock=clock, session_ttl_s=10.0, sweep_interval_s=1.0)
    pins = _pinned(core, 3)
    clock.advance(11.0)
    assert core.sweep(clock.now()) == 3 and policy.context_tokens() == {}
    _turn(core, "x")
    core.remove_worker(policy.worker_of("x") or "")
    assert policy.context_tokens() == {} and len(pins) == 3
    res = _turn(core, "x")
    assert res.kind is DecisionKind.REPINNED and policy.context_tokens() == {res.worker: 8000}


@pytest.mark.parametrize(
    "options",
    [
        {"escape_kv": 1.5},
        {"cool_kv": 0.95},  # above escape_kv 0.9
        {"cool_waiting": 9},
        {"escape_waiting": 2.5},
        {"knee_burst": 0},
        {"move_interval_s": -1.0},
        {"target_kv": float("nan")},
        {"admission": 1},
        {"session_ttl_s": 0.0},
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(options))):
        create_policy("adaptive_sticky", options, clock=ManualClock(), seed=0)
