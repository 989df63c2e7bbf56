"""``trajectory_admission`` (ThunderAgent-style): pause between-turn sessions at the high band,
smallest first; resume below the low band or after the maximum pause; least working set."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.trajectory_admission import TrajectoryAdmissionPolicy

from .conftest import A, B, gauges, make_core, req

CAP: dict[str, Any] = {"kv_capacity_tokens": 1000}


def _policy(core: RoutingCore) -> TrajectoryAdmissionPolicy:
    assert isinstance(core.policy, TrajectoryAdmissionPolicy)
    return core.policy


def _turn(core: RoutingCore, sid: str, tokens: int, *, done: bool = True) -> Reservation:
    res = core.place(req(tokens=tokens, sid=sid), lambda t: None)
    assert isinstance(res, Reservation), f"{sid} was held"
    if done:
        core.complete(res)
    return res


def _fill_one_worker(core: RoutingCore, last: int = 100) -> None:
    """On one worker of capacity 1,000: s1 (300) and s2 (200) between turns, s3 (400) and s4
    (``last``) in flight."""
    _turn(core, "s1", 300)
    _turn(core, "s2", 200)
    _turn(core, "s3", 400, done=False)
    _turn(core, "s4", last, done=False)


def test_at_the_high_band_between_turn_sessions_pause_smallest_first_to_the_target() -> None:
    core = make_core("trajectory_admission", CAP, workers=(A,))
    _fill_one_worker(core)  # working set 1,000 >= 950: pause s2 (200) -> 800 <= 800
    p = _policy(core)
    assert list(p.paused) == ["s2"] and p.stats["paused"] == 1
    assert p.fill(A, core.cluster) == pytest.approx(0.8)


@pytest.mark.parametrize(("threshold", "paused"), [(0.95, ["s2"]), (0.99, [])])
def test_pause_threshold(threshold: float, paused: list[str]) -> None:
    """Working set 960 of 1,000: over 0.95, under 0.99."""
    core = make_core("trajectory_admission", {**CAP, "pause_threshold": threshold}, workers=(A,))
    _fill_one_worker(core, last=60)
    assert list(_policy(core).paused) == paused


@pytest.mark.parametrize(("target", "paused"), [(0.80, ["s2"]), (0.50, ["s2", "s1"])])
def test_pause_target(target: float, paused: list[str]) -> None:
    core = make_core("trajectory_admission", {**CAP, "pause_target": target}, workers=(A,))
    _fill_one_worker(core)
    assert list(_policy(core).paused) == paused  # smallest first; busy sessions never


def test_a_paused_sessions_turn_waits_and_does_not_block_other_sessions() -> None:
    core = make_core("trajectory_admission", CAP, workers=(A,))
    _fill_one_worker(core)
    ready: list[Ticket] = []
    held = core.place(req(tokens=250, sid="s2"), ready.append)  # 800 + 200 >= 850: held
    assert isinstance(held, Ticket) and held.waiting
    other = core.place(req(tokens=350, sid="s1"), ready.append)  # s1 is not paused
    assert isinstance(other, Reservation)
    core.complete(other)
    assert held.waiting and ready == []
    core.finish_session("s3")  # working set 850 - 400 = 450: 450 + 200 < 850
    assert ready == [held] and held.reservation is not None and held.reservation.worker == A
    assert _policy(core).stats["resumed"] == 1 and "s2" not in _policy(core).paused


@pytest.mark.parametrize(("gap", "resumes"), [(0.10, False), (0.0, True)])
def test_resume_gap_is_hysteresis(gap: float, resumes: bool) -> None:
    """s2 (200) paused; s3 released: working set 400... then s5 (300) arrives: 700. With s2
    back the fill would be 0.90: below 0.95 - 0.0, not below 0.95 - 0.10."""
    core = make_core("trajectory_admission", {**CAP, "resume_gap": gap}, workers=(A,))
    _fill_one_worker(core)
    core.finish_session("s3")
    _turn(core, "s5", 300, done=False)  # 400 + 300 = 700
    assert _policy(core).fill(A, core.cluster) == pytest.approx(0.7)
    held = core.place(req(tokens=200, sid="s2"), lambda t: None)
    assert isinstance(held, Reservation) is resumes


@pytest.mark.parametrize(("max_pause", "interval"), [(10.0, 5.0), (1800.0, 5.0), (60.0, 20.0)])
def test_forced_resume_after_the_maximum_pause_by_time_alone(
    max_pause: float, interval: float
) -> None:
    """Nothing completes: the driver's recheck, every check_interval_s, admits the held turn
    once it has been paused for max_pause_s."""
    clock = ManualClock()
    opts = {**CAP, "max_pause_s": max_pause, "check_interval_s": interval}
    core = make_core("trajectory_admission", opts, workers=(A,), clock=clock)
    assert core.admission_recheck_s == interval
    _fill_one_worker(core)
    ready: list[Ticket] = []
    held = core.place(req(tokens=200, sid="s2"), ready.append)
    assert isinstance(held, Ticket)
    for _ in range(int(max_pause // interval) - 1):
        clock.advance(interval)
        core.recheck()
    assert held.waiting
    clock.advance(interval)
    core.recheck()
    assert ready == [held] and held.reservation is not None
    assert _policy(core).stats["forced"] == 1


def test_new_sessions_go_to_the_least_working_set() -> None:
    core = make_core("trajectory_admission", CAP)
    got = [_turn(core, f"s{i}", t).worker for i, t in enumerate([400, 300, 200, 250, 100])]
    # A 400 | B 300 | B 500 | A 650 | B 600
    assert got == [A, B, B, A, B]
    assert _turn(core, "s0", 450).worker == A  # sticky: s0 stays on A
    assert _policy(core).fill(A, core.cluster) == pytest.approx(0.7)  # s0 450 + s3 250


def test_capacity_is_estimated_from_gauges_when_not_configured() -> None:
    core = make_core("trajectory_admission", workers=(A,))
    first = _turn(core, "s1", 500, done=False)
    p = _policy(core)
    assert p.capacity(A, core.cluster) is None and p.fill(A, core.cluster) == 0.0
    gauges(core, A, 0.25)  # 500 tokens in flight at 25 % -> 2,000 tokens of KV
    assert p.capacity(A, core.cluster) == pytest.approx(2000.0)
    gauges(core, A, 0.5)  # -> 1,000; moving average 2000 + 0.2 * (1000 - 2000)
    assert p.capacity(A, core.cluster) == pytest.approx(1800.0)
    gauges(core, A, 0.1)  # too little usage to estimate from: unchanged
    assert p.capacity(A, core.cluster) == pytest.approx(1800.0)
    core.complete(first)


def test_released_and_expired_sessions_leave_the_working_set() -> None:
    clock = ManualClock()
    opts = {**CAP, "session_ttl_s": 10.0}
    core = make_core("trajectory_admission", opts, workers=(A,), clock=clock)
    _turn(core, "s1", 300)
    _turn(core, "s2", 200)
    core.finish_session("s1")
    assert _policy(core).fill(A, core.cluster) == pytest.approx(0.2)
    clock.advance(11.0)
    assert core.sweep(clock.now()) == 1
    assert _policy(core).fill(A, core.cluster) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"pause_threshold": 0.0},
        {"pause_target": 0.99},
        {"resume_gap": -0.1},
        {"max_pause_s": -1.0},
        {"check_interval_s": 0.0},
        {"kv_capacity_tokens": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("trajectory_admission", bad, clock=ManualClock())


def test_sessions_are_pinned_and_counted() -> None:
    core = make_core("trajectory_admission", CAP)
    _turn(core, "x", 10)
    _turn(core, "y", 10)
    assert dict(_policy(core).session_counts()) == {A: 1, B: 1}
    assert _policy(core).worker_of("x") == A and gauges is not None


def test_a_session_that_expires_in_flight_is_forgotten_when_its_turn_completes() -> None:
    clock = ManualClock()
    opts = {**CAP, "session_ttl_s": 10.0}
    core = make_core("trajectory_admission", opts, workers=(A,), clock=clock)
    _turn(core, "idle", 300)
    slow = _turn(core, "slow", 200, done=False)
    clock.advance(11.0)
    assert core.sweep(clock.now()) == 2  # both past the TTL; "slow" still has a turn running
    p = _policy(core)
    assert "idle" not in p._ctx and "slow" in p._ctx
    core.complete(slow)
    assert "slow" not in p._ctx and p.fill(A, core.cluster) == 0.0


def test_removing_a_worker_drops_its_working_set_at_once_and_its_sessions_move_on() -> None:
    core = make_core("trajectory_admission", CAP, workers=(A, B))
    for i in range(6):
        _turn(core, f"s{i}", 100)
    p = _policy(core)
    on_a = [f"s{i}" for i in range(6) if p.worker_of(f"s{i}") == A]
    assert on_a and p.fill(A, core.cluster) == pytest.approx(0.1 * len(on_a))
    core.remove_worker(A)
    assert A not in p._ws and A not in p._on  # O(1): the sessions' entries are not visited
    res = _turn(core, on_a[0], 150)
    assert res.worker == B and p.fill(B, core.cluster) == pytest.approx(
        0.1 * (6 - len(on_a)) + 0.15
    )
