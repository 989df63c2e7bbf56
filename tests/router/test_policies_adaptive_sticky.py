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
    core, policy, _ = _core(count_weight=0.0)  # pure token load
    big = _turn(core, "big", 30_000).worker  # completed: only its pinned context remains
    rest = sorted(set(W) - {big})
    seq = [_turn(core, f"s{i}", 10_000).worker for i in range(6)]
    # The other two workers fill up to 30k (three 10k sessions each) before "big"'s worker
    # takes anything: 0/0 -> 10/10 -> 20/20 -> 30/30, each pair in either order.
    assert sorted(seq[0:2]) == sorted(seq[2:4]) == sorted(seq[4:6]) == rest
    assert policy.context_tokens() == {big: 30_000, rest[0]: 30_000, rest[1]: 30_000}
    # A three-way tie: the rendezvous winner of the session id among all three.
    assert _turn(core, "s6", 10_000).worker == rendezvous_winner("s6", list(W))


def test_count_weight_counts_sessions_at_the_mean_context() -> None:
    core, policy, _ = _core(count_weight=1.0)  # every session at the mean: by session count
    big = _turn(core, "big", 60_000).worker
    seq = [_turn(core, f"s{i}", 1000).worker for i in range(2)]
    assert big not in seq  # 1 session vs 0, 0
    # Now one session each: a three-way tie at the mean, however large "big" is.
    assert _turn(core, "s2", 1000).worker == rendezvous_winner("s2", list(W))
    core2, _, _ = _core(count_weight=0.5)
    big2 = _turn(core2, "big", 60_000).worker
    # Half present context (30k), half the mean (60k + 7 x 1k) / 8 per session: the other
    # two workers take 7 small sessions before big's worker is the least loaded.
    small = [_turn(core2, f"t{i}", 1000).worker for i in range(7)]
    assert big2 not in small
    assert policy.context_tokens()[big] == 60_000


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
    core, policy, clock = _core(workers=(A, B), move_interval_s=0.0, working_set_idle_s=1e9)
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


def _at_capacity(core: RoutingCore, kv: float = 0.4) -> list[Reservation]:
    """s0..s2 in flight, one per worker (8000 tokens each), and gauges that make each worker's
    capacity estimate 8000 / kv tokens (20000 at kv 0.4)."""
    held = [core.route(_req(f"s{i}")) for i in range(3)]
    assert sorted(r.worker for r in held) == sorted(W)
    _gauges(core, a=EngineGauges(1, 0, kv), b=EngineGauges(1, 0, kv), c=EngineGauges(1, 0, kv))
    return held


def test_new_sessions_wait_when_every_worker_is_past_its_knee_running_ones_never() -> None:
    core, policy, _ = _core(capacity_alpha=1.0, knee_pressure=1.0, thrash_gate_s=0.0)
    running = _at_capacity(core)
    ready: list[Ticket] = []
    first = [core.place(_req(f"n{i}"), ready.append) for i in range(3)]
    assert all(isinstance(r, Reservation) for r in first)  # 8000 + 8000 < 20000 each
    assert {policy.pressure(w) for w in W} == {0.8}
    t1 = core.place(_req("n3"), ready.append)  # 16000 + 8000 >= 20000 on every worker
    t2 = core.place(_req("n4"), ready.append)
    assert isinstance(t1, Ticket) and isinstance(t2, Ticket) and len(core.admission) == 2
    # A running session's turn and a request without a session are routed at once.
    turn = core.place(_req("s0", 9000), ready.append)
    assert isinstance(turn, Reservation) and turn.worker == running[0].worker
    assert isinstance(core.place(_req(None, rid="x"), ready.append), Reservation)
    assert ready == []
    # A session finishing frees its context: the oldest waiting session takes its place.
    n1 = first[1]
    assert isinstance(n1, Reservation)
    core.complete(n1)
    core.finish_session("n1")
    assert ready == [t1] and t1.reservation is not None and t1.reservation.worker == n1.worker
    assert t2.waiting and core.admission.admitted_after_wait == 1


def test_a_new_session_is_placed_anyway_at_its_maximum_wait() -> None:
    clock = ManualClock()
    core, policy, _ = _core(
        clock=clock, capacity_alpha=1.0, knee_pressure=1.0, max_wait_s=120.0, thrash_gate_s=0.0
    )
    _at_capacity(core, kv=0.8)  # capacity 10000: 8000 + 8000 does not fit anywhere
    assert core.admission_max_wait_s() == 120.0  # the policy's, not the router's 60
    ready: list[Ticket] = []
    assert isinstance(core.place(_req("n0"), ready.append), Reservation)  # no estimate yet
    t = core.place(_req("late"), ready.append)
    assert isinstance(t, Ticket)
    clock.advance(120.0)
    assert core.withdraw(t) is None  # the deadline places it, no 503
    assert ready == [t] and t.reservation is not None and not t.waiting
    q = core.admission
    assert (q.placed_at_deadline, q.admitted_after_wait, q.refused_timeout) == (1, 1, 0)
    assert q.wait_s_total == 120.0
    assert core.withdraw(t) is None and q.placed_at_deadline == 1  # once
    assert policy.worker_of("late") == t.reservation.worker


def test_past_the_knee_new_sessions_wait_only_after_a_scrape_showed_thrash() -> None:
    clock = ManualClock()
    core, _, _ = _core(clock=clock, capacity_alpha=1.0, knee_pressure=1.0, thrash_gate_s=300.0)
    _at_capacity(core, kv=0.8)  # capacity 10000: every worker is past its knee with 8000 more
    ready: list[Ticket] = []
    # no scrape showed thrash: the projection alone does not hold a new session
    assert isinstance(core.place(_req("n0"), ready.append), Reservation)
    # one worker's scrape shows waiting requests: it is no longer calm, the others are
    clock.advance(1.0)
    _gauges(
        core,
        a=EngineGauges(1, 4, 0.8),
        b=EngineGauges(1, 0, 0.8),
        c=EngineGauges(1, 0, 0.8),
    )
    assert isinstance(core.place(_req("n1"), ready.append), Reservation)
    # every worker showed thrash (waiting, or kv_usage at escape_kv): held
    clock.advance(1.0)
    _gauges(
        core,
        a=EngineGauges(1, 4, 0.8),
        b=EngineGauges(1, 0, 0.9),
        c=EngineGauges(1, 4, 0.8),
    )
    t = core.place(_req("n2"), ready.append)
    assert isinstance(t, Ticket)
    # calm scrapes for thrash_gate_s: placed at the next scrape's pump
    clock.advance(299.0)
    _gauges(core, a=EngineGauges(1, 0, 0.8), b=EngineGauges(1, 0, 0.8), c=EngineGauges(1, 0, 0.8))
    core.pump()
    assert t.waiting
    clock.advance(1.0)
    _gauges(core, a=EngineGauges(1, 0, 0.8), b=EngineGauges(1, 0, 0.8), c=EngineGauges(1, 0, 0.8))
    core.pump()
    assert ready == [t] and t.reservation is not None


def test_the_capacity_estimate_is_a_moving_average_of_running_tokens_over_kv() -> None:
    core, policy, _ = _core(capacity_alpha=0.5)
    res = core.route(_req("s0", 8000))
    core.route(_req("s1", 8000))
    w = res.worker
    key = "a" if w == A else "b" if w == B else "c"
    _gauges(core, **{key: EngineGauges(1, 1, 0.2)})  # half of 8000 running: 4000 / 0.2
    core.route(_req("s0", 8000))  # a turn on w reads the new gauges
    assert policy.pressure(w) == 8000 / 20_000
    _gauges(core, **{key: EngineGauges(2, 0, 0.4)})  # 16000 / 0.4 = 40000 -> mean 30000
    core.route(_req("s0", 8000))
    assert policy.pressure(w) == 8000 / 30_000
    _gauges(core, **{key: EngineGauges(2, 0, 0.1)})  # below capacity_min_kv: no sample
    core.route(_req("s0", 8000))
    assert policy.pressure(w) == 8000 / 30_000


def test_without_admission_new_sessions_are_placed_past_the_knee() -> None:
    core, _, _ = _core(admission=False, capacity_alpha=1.0, knee_pressure=1.0)
    _at_capacity(core, kv=0.8)
    core.route(_req("n0"))
    assert isinstance(core.place(_req("n1"), lambda t: None), Reservation)


@pytest.mark.parametrize("pack", [False, True])
def test_past_every_knee_pack_past_knee_places_on_the_most_loaded(pack: bool) -> None:
    """Every worker is past its knee with one more session (capacity 10,000 each, 8,000
    pinned): a new session goes to the least token-loaded worker, or with
    ``pack_past_knee`` to the most loaded one (s0's, grown to 9,000)."""
    core, _, _ = _core(admission=False, capacity_alpha=1.0, knee_pressure=1.0, pack_past_knee=pack)
    running = _at_capacity(core, kv=0.8)
    fullest = _turn(core, "s0", 9000).worker
    assert fullest == running[0].worker
    new = _turn(core, "n0", 8000).worker
    assert (new == fullest) is pack


def test_placement_skips_workers_past_their_knee() -> None:
    core, policy, _ = _core(capacity_alpha=1.0, knee_pressure=1.0)
    held = _at_capacity(core)
    small = next(r.worker for r in held if r.worker == A)
    _gauges(core, a=EngineGauges(1, 0, 0.8), b=EngineGauges(1, 0, 0.2))  # C keeps kv 0.4
    # A: 8000 / 0.8 = 10000 capacity, B: 40000, C: 20000 (C's gauges unchanged: no sample).
    workers = [_turn(core, f"n{i}", 4000).worker for i in range(6)]
    assert small not in workers and policy.knee_skips == 6
    assert policy.pressure(A) == 0.8


def test_idle_sessions_leave_the_working_set_until_their_next_turn() -> None:
    clock = ManualClock()
    core, policy, _ = _core(clock=clock, working_set_idle_s=300.0, sweep_interval_s=60.0)
    w = _turn(core, "s", 8000).worker
    clock.advance(300.0)
    core.sweep(clock.now())
    assert policy.context_tokens() == {} and policy.worker_of("s") == w  # still pinned
    res = _turn(core, "s", 9000)
    assert (res.worker, res.kind) == (w, DecisionKind.STICKY)
    assert policy.context_tokens() == {w: 9000}


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
        {"knee_pressure": 0.0},
        {"overflow_pressure": 0.0},
        {"capacity_alpha": 1.5},
        {"move_interval_s": -1.0},
        {"target_kv": float("nan")},
        {"admission": 1},
        {"session_ttl_s": 0.0},
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(options))):
        create_policy("adaptive_sticky", options, clock=ManualClock(), seed=0)


def test_the_projected_working_set_counts_new_sessions_at_the_mean_final_context() -> None:
    core, policy, _ = _core(final_alpha=0.5)
    assert policy.projected(A) == 0
    for sid, tokens in (("f1", 40_000), ("f2", 20_000)):
        _turn(core, sid, tokens)
        core.finish_session(sid)
    # Finished at 40k, then 20k: the moving average is 40k + 0.5 * (20k - 40k) = 30k.
    w = _turn(core, "young", 8000).worker
    assert policy.projected(w) == 30_000  # one session that will grow, not its 8k now
    assert policy.projected(w, tokens=8000, sessions=1) == 60_000
    _turn(core, "young", 50_000)
    assert policy.projected(w) == 50_000  # larger than its projection: its context counts


# -- rule 2b: a worker whose working set overflows its KV capacity ------------------------


def _overflow_setup(
    other_kv: float, overflow_waiting: int = 0
) -> tuple[RoutingCore, AdaptiveStickyPolicy, str, str]:
    """Two workers, s0 pinned on ``home`` (capacity estimate 20000 tokens), s1 on ``other``
    (capacity 8000 / ``other_kv``), 8000 context tokens each, no worker hot."""
    core, policy, _ = _core(
        workers=(A, B),
        capacity_alpha=1.0,
        move_interval_s=0.0,
        overflow_pressure=0.8,
        overflow_waiting=overflow_waiting,
    )
    held = [core.route(_req(f"s{i}")) for i in range(2)]
    home, other = held[0].worker, held[1].worker
    key = {A: "a", B: "b"}
    _gauges(core, **{key[home]: EngineGauges(1, 0, 0.4), key[other]: EngineGauges(1, 0, other_kv)})
    probe = core.route(_req("probe", 1))  # a new session: every worker's gauges are read
    core.complete(probe)
    core.finish_session("probe")
    for r in held:
        core.complete(r)
    assert policy.pressure(home) == 8000 / 20_000
    return core, policy, home, other


def test_a_turn_on_an_overflowing_worker_moves_to_a_worker_with_room() -> None:
    core, policy, _home, other = _overflow_setup(other_kv=0.2)  # other: capacity 40000
    assert _turn(core, "s0", 15_000).kind is DecisionKind.STICKY  # 15000 < 0.8 x 20000
    res = _turn(core, "s0", 16_000)  # 16000 >= 0.8 x 20000: home overflows
    assert (res.kind, res.worker) == (DecisionKind.MOVED, other)
    assert policy.moves == 1 and policy.overflow_moves == 1 and policy.hot_episodes == 0
    assert policy.context_tokens() == {other: 24_000}
    assert _turn(core, "s0", 17_000).kind is DecisionKind.STICKY  # other: 25000 < 32000


def test_no_overflow_move_onto_a_worker_that_would_pass_its_knee() -> None:
    core, policy, home, _other = _overflow_setup(other_kv=0.4)  # other: capacity 20000
    res = _turn(core, "s0", 16_000)  # home overflows, but 8000 + 16000 >= 20000 on other
    assert (res.kind, res.worker) == (DecisionKind.STICKY, home)
    assert policy.moves == 0 and policy.overflow_moves == 0


def test_an_overflow_move_needs_requests_waiting_on_the_overflowing_worker() -> None:
    core, policy, home, other = _overflow_setup(other_kv=0.2, overflow_waiting=4)
    key = {A: "a", B: "b"}
    assert _turn(core, "s0", 16_000).kind is DecisionKind.STICKY  # waiting 0 < 4
    _gauges(core, **{key[home]: EngineGauges(1, 3, 0.4)})
    assert _turn(core, "s0", 16_000).kind is DecisionKind.STICKY  # 3 < 4
    _gauges(core, **{key[home]: EngineGauges(1, 4, 0.4)})
    res = _turn(core, "s0", 16_000)
    assert (res.kind, res.worker) == (DecisionKind.MOVED, other)
    assert policy.overflow_moves == 1 and policy.hot_episodes == 0


def test_a_chunked_sweep_stops_counting_idle_sessions_a_chunk_at_a_time() -> None:
    clock = ManualClock()
    core, policy, _ = _core(clock=clock, working_set_idle_s=300.0, sweep_interval_s=60.0)
    for i in range(10):
        _turn(core, f"s{i}", 1000)
    whole = sum(policy.context_tokens().values())
    clock.advance(301.0)
    chunks = core.sweep_chunks(clock.now(), 4)
    assert next(chunks) == 0 and policy.sweep_pending()  # nothing expired; 4 went idle
    assert sum(policy.context_tokens().values()) == whole - 4000
    assert list(chunks) == [0, 0]  # the core goes on while the policy has work left: 4, 2
    assert policy.context_tokens() == {} and not policy.sweep_pending()
    assert all(policy.worker_of(f"s{i}") is not None for i in range(10))  # still pinned


def test_removing_a_worker_is_o1_its_sessions_leave_the_load_and_move_on_their_next_turn() -> None:
    core, policy, _ = _core(workers=(A, B))
    sids = [f"s{i}" for i in range(6)]
    for sid in sids:
        _turn(core, sid, 1000)
    on_a = [s for s in sids if policy.worker_of(s) == A]
    assert on_a and policy.context_tokens()[A] == 1000 * len(on_a)
    core.remove_worker(A)
    assert A not in policy.context_tokens()
    assert policy.context_tokens() == {B: 1000 * (len(sids) - len(on_a))}
    assert len(policy._ledger) == len(sids)  # the removed worker's entries stay, stale
    res = _turn(core, on_a[0], 1200)
    assert (res.worker, res.kind) == (B, DecisionKind.REPINNED)
    assert policy.context_tokens() == {B: 1000 * (len(sids) - len(on_a)) + 1200}
    assert policy.release_session(on_a[1]) is False  # a stale session: forgotten, not counted
    assert len(policy._ledger) == len(sids) - 1
