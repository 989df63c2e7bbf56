"""``adaptive_hold``'s rule 8 (:mod:`~sessionroute.router.policies._overload`): exact sequences
of the overload latch and its sacrifices with an injected clock, the rule inside the policy
(off by default, on under a serving objective), and an invariant over random sequences."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.core import Reservation
from sessionroute.router.policies import create_policy
from sessionroute.router.policies._overload import Overload
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldConfig, AdaptiveHoldPolicy
from sessionroute.router.state import Cluster
from sessionroute.types import EngineGauges, RouteRequest

A, B, C, D = "http://a:8000", "http://b:8000", "http://c:8000", "http://d:8000"
KEEP = math.exp(-1.0)  # one window's decay


def _overload() -> Overload:
    return Overload(window_s=10.0, level=4.0, spill_s=2.0, max_delay_s=100.0)


def test_the_smallest_queue_averaged_over_the_window_starts_an_episode() -> None:
    """Smallest queue 6 from 0 s: the average is 6 (1 - e^-1) = 3.79 at 10 s (under 4), 5.19
    at 20 s: the worker with the longest queue (B) is given up."""
    o = _overload()
    o.observe(0.0, {A: 10, B: 20, C: 6})  # the first observation starts the clock
    assert o.average == 0.0
    o.observe(10.0, {A: 10, B: 20, C: 6})
    assert o.average == pytest.approx(6 * (1 - KEEP)) and o.sacrifices == []
    o.observe(20.0, {A: 10, B: 20, C: 6})
    assert o.average == pytest.approx(6 * (1 - KEEP) * KEEP + 6 * (1 - KEEP))
    assert o.sacrifices == [B] and o.episodes == 1


def test_one_snapshot_after_a_window_unobserved_starts_no_episode() -> None:
    """Empty queues at 0 s, then nothing observed for 60 s (sessions long, no routing): a
    burst's snapshot at 60 s starts the average anew instead of standing for the whole gap;
    kept up for a window, it starts an episode."""
    o = _overload()
    o.observe(0.0, {A: 0, B: 0})
    o.observe(60.0, {A: 30, B: 30})
    assert o.average == 0.0 and o.sacrifices == []
    o.observe(70.0, {A: 30, B: 30})
    assert o.average == pytest.approx(30 * (1 - KEEP)) and o.sacrifices == [A]


def test_a_burst_that_drains_on_one_worker_starts_none() -> None:
    """Queues of 6 (the average would pass 4 within 11 s), but every other second one is
    empty: the average of the smallest stays under 6 / (1 + e^-0.1) = 3.15."""
    o = _overload()
    for t in range(200):
        o.observe(float(t), {A: 6, B: 0 if t % 2 else 6})
        assert o.sacrifices == []
    assert 2.8 < o.average < 6 / (1 + math.exp(-0.1))


def test_diverts_while_the_bound_worker_queues_and_gives_up_another_at_the_bound() -> None:
    o = _overload()
    o.sacrifices = [A]
    assert o.divert(B, {A: 50.0, B: 1.9, C: 3.0}) == B  # B's queue is short: no diversion
    assert o.divert(A, {A: 50.0, B: 1.9, C: 3.0}) == A
    assert o.divert(C, {A: 50.0, B: 1.9, C: 3.0}) == A and o.diverted == 1
    # A at its bound (100 s): the longest queue of the others (C) is given up too
    assert o.divert(B, {A: 100.0, B: 2.5, C: 3.0}) == C and o.sacrifices == [A, C]
    assert o.divert(B, {A: 100.0, B: 2.5, C: 40.0}) == C and o.diverted == 3
    # both at the bound: B is the last worker not given up; it keeps its turn
    assert o.divert(B, {A: 100.0, B: 2.5, C: 100.0}) == B and o.sacrifices == [A, C]


def test_an_episode_ends_once_each_sacrifice_was_empty_for_a_window() -> None:
    o = _overload()
    o.sacrifices = [A, C]
    o.average, o._at = 5.0, 0.0
    o.observe(1.0, {A: 0, B: 9, C: 3})
    o.observe(5.0, {A: 2, B: 9, C: 0})  # A's queue is back: its empty time starts again
    o.observe(6.0, {A: 0, B: 9, C: 0})
    o.observe(15.0, {A: 0, B: 9, C: 0})  # C empty since 5 s: let go of
    assert o.sacrifices == [A]
    o.observe(16.0, {A: 0, B: 9})  # A empty since 6 s: kept until 16 s, then let go of
    assert o.sacrifices == [] and o.average == 0.0 and o._at is None


def test_a_sacrifice_that_leaves_the_fleet_is_let_go_of() -> None:
    o = _overload()
    o.sacrifices = [A]
    o.observe(1.0, {B: 9, C: 9})  # A not healthy
    assert o.sacrifices == []
    o.sacrifices = [A, B]
    o.forget(A)
    assert o.sacrifices == [B]
    o.forget(B)
    assert o.sacrifices == []


def test_a_sacrifice_let_go_of_and_given_up_again_waits_a_new_window() -> None:
    """A, empty from 0 s, is let go of at 10 s; given up again at 11 s (C at its bound), its
    empty queue at 12 s starts a new window instead of counting from 0 s."""
    o = _overload()
    o.sacrifices = [A, C]
    o.observe(0.0, {A: 0, B: 9, C: 9, D: 9})
    o.observe(10.0, {A: 0, B: 9, C: 9, D: 9})
    assert o.sacrifices == [C]
    assert o.divert(B, {A: 60.0, B: 50.0, C: 200.0, D: 3.0}) == A
    o.observe(12.0, {A: 0, B: 9, C: 9, D: 9})
    assert o.sacrifices == [C, A]


def test_never_every_healthy_worker_is_a_sacrifice() -> None:
    """C leaves while A and B are given up: B, the latest, is let go of; a lone worker never
    starts an episode."""
    o = _overload()
    o.sacrifices = [A]
    assert o.divert(B, {A: 200.0, B: 5.0, C: 3.0}) == B and o.sacrifices == [A, B]
    o.observe(1.0, {A: 9, B: 9})
    assert o.sacrifices == [A]
    o.observe(2.0, {A: 9})
    assert o.sacrifices == [] and o.episodes == 0
    for t in range(10, 200, 10):
        o.observe(float(t), {A: 30})
    assert o.sacrifices == [] and o.episodes == 0


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"overload_window_s": -1.0}, "overload_window_s"),
        ({"overload_waiting": 0.0}, "overload_waiting"),
        ({"spill_delay_s": math.nan}, "spill_delay_s"),
        ({"sacrifice_max_delay_s": 0.0}, "sacrifice_max_delay_s"),
    ],
)
def test_bad_overload_options_are_named(options: dict[str, float], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        create_policy("adaptive_hold", options, clock=ManualClock())


def test_rule_8_without_rule_7_is_refused() -> None:
    """Rule 8 acts only while sessions are short: without ``short_turns`` it could never act."""
    with pytest.raises(ConfigError, match="short_turns > 0, or overload_window_s = 0"):
        create_policy("adaptive_hold", {"overload_window_s": 120.0}, clock=ManualClock())
    for options in ({"overload_window_s": 120.0, "hold": False}, {"short_turns": 0.0}):
        create_policy("adaptive_hold", options, clock=ManualClock())


# -- inside the policy -------------------------------------------------------------------------
def _core(max_delay_s: float = 180.0) -> tuple[RoutingCore, AdaptiveHoldPolicy, ManualClock]:
    clock = ManualClock()
    cfg = AdaptiveHoldConfig(
        knee_pressure=100.0, short_turns=3.0, overload_window_s=10.0, overload_waiting=4.0,
        sacrifice_max_delay_s=max_delay_s,
    )  # fmt: skip
    policy = AdaptiveHoldPolicy(cfg, clock=clock, rng=random.Random(0))
    return RoutingCore(policy, Cluster([A, B]), RouterConfig()), policy, clock


def _new(core: RoutingCore, sid: str) -> str:
    res = core.place(RouteRequest(session_id=sid, prompt_tokens=10, request_id=sid), print)
    assert isinstance(res, Reservation)
    core.complete(res)
    return res.worker


def _short(core: RoutingCore) -> None:
    """Two sessions of one turn each ended: sessions are short (mean 1 < ``short_turns``)."""
    for sid in ("o1", "o2"):
        _new(core, sid)
        assert core.finish_session(sid)


def _queues(core: RoutingCore, clock: ManualClock, t: float, a: int, b: int) -> None:
    clock.set(t)
    core.cluster.set_gauges(A, EngineGauges(running=4, waiting=a, kv_usage=0.5))
    core.cluster.set_gauges(B, EngineGauges(running=4, waiting=b, kv_usage=0.5))


def test_past_capacity_new_sessions_bound_for_a_queueing_worker_go_to_the_sacrifice() -> None:
    """Queues of 30 and 6 from 0 s: at 20 s the average smallest queue passes 4 and A, the
    longest queue, is given up; every new session then goes to A (B's queueing delay, 6
    requests over the few completions seen, is not under 2 s). Once B's queue is empty a new
    session goes where it was bound (its delay is 0)."""
    core, p, clock = _core(max_delay_s=1e6)
    _short(core)
    for t in (0.0, 10.0):
        _queues(core, clock, t, 30, 6)
        _new(core, f"n{t}")
        assert p.counters()["overload_sacrifices"] == []
    _queues(core, clock, 20.0, 30, 6)
    assert [_new(core, f"m{i}") for i in range(4)] == [A] * 4
    c = p.counters()
    assert c["overload_episodes"] == 1 and c["overload_diverted"] >= 1
    assert c["overload_sacrifices"] == [A]
    _queues(core, clock, 21.0, 30, 0)
    placed = [_new(core, f"k{i}") for i in range(6)]
    assert B in placed and p.counters()["overload_diverted"] == c["overload_diverted"]


def test_rule_8_is_off_by_default_and_on_under_a_serving_objective() -> None:
    p = create_policy("adaptive_hold", {}, clock=ManualClock())
    assert isinstance(p, AdaptiveHoldPolicy) and p._overload is None
    assert "overload_episodes" not in p.counters()
    assert AdaptiveHoldPolicy.objective_options["serving"]["overload_window_s"] == 120.0
    assert "overload_window_s" not in AdaptiveHoldPolicy.objective_options.get("rl", {})


def test_while_sessions_are_long_rule_8_diverts_nothing() -> None:
    core, p, clock = _core()
    for t in (0.0, 10.0, 20.0, 30.0):
        _queues(core, clock, t, 30, 6)
        _new(core, f"n{t}")  # no session ended: not short
    assert p.counters()["overload_episodes"] == 0


# -- invariant -------------------------------------------------------------------------------
OPS = st.lists(
    st.tuples(
        st.floats(0.0, 20.0),  # seconds to the next observation
        st.dictionaries(st.sampled_from([A, B, C, D]), st.integers(0, 40), min_size=1),
        st.sampled_from([A, B, C, D]),  # where the next first turn is bound
    ),
    max_size=60,
)


@settings(max_examples=500, deadline=None)
@given(OPS)
def test_a_turn_goes_to_its_worker_or_a_sacrifice_and_one_worker_is_never_given_up(
    ops: list[tuple[float, dict[str, int], str]],
) -> None:
    """Whatever the queues: a first turn goes where it was bound or to a sacrifice; the
    sacrifices are distinct healthy workers, never all of them when two or more are healthy;
    the average stays within the queues seen."""
    o = Overload(window_s=10.0, level=4.0, spill_s=2.0, max_delay_s=30.0)
    now = 0.0
    top = 0
    for dt, waiting, bound in ops:
        now += dt
        delays = {w: q / 2.0 for w, q in waiting.items()}  # 2 requests finish a second
        top = max(top, *waiting.values())
        o.observe(now, waiting)
        assert 0.0 <= o.average <= top
        assert len(set(o.sacrifices)) == len(o.sacrifices)
        assert set(o.sacrifices) <= set(waiting)
        if bound in waiting:
            target = o.divert(bound, delays)
            assert target == bound or target in o.sacrifices
        assert len(waiting) < 2 or len(o.sacrifices) < len(waiting)
